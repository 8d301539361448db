#!/usr/bin/env bash
# Installs the servers and browser the test suite starts itself, only where missing:
# redis-server, PostgreSQL 15 server binaries, Debian Chromium, promtool (Debian's prometheus package,
# for the alert rule tests) and Azurite (npm).
# Idempotent and quick on a second run. Needs root (or sudo) for apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
[ -x /usr/lib/postgresql/15/bin/initdb ] || missing+=(postgresql-15)
[ -x /usr/bin/chromium ] || missing+=(chromium)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
if ((${#missing[@]})); then
  started=$SECONDS
  echo "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # apt starts no server we rely on; make sure a packaged PostgreSQL does not hold port 5432 either.
  if command -v pg_lsclusters >/dev/null 2>&1; then $SUDO pg_ctlcluster --force 15 main stop 2>/dev/null || true; fi
  # Nor a packaged Prometheus port 9090 (only promtool is wanted); where no init system runs, it never started.
  if [[ " ${missing[*]} " == *" prometheus "* ]] && command -v systemctl >/dev/null 2>&1; then
    $SUDO systemctl disable --now prometheus prometheus-node-exporter 2>/dev/null || true
  fi
  echo "installed Debian packages in $((SECONDS - started)) s"
fi

if [ ! -x var/node/node_modules/.bin/azurite-blob ]; then
  if ! command -v npm >/dev/null 2>&1; then
    echo "npm is missing: install Node 20 (Debian: apt-get install nodejs npm)" >&2
    exit 1
  fi
  started=$SECONDS
  echo "installing Azurite from npm into var/node"
  mkdir -p var/node
  npm install --silent --no-audit --no-fund --prefix var/node azurite@3 >/dev/null
  echo "installed Azurite in $((SECONDS - started)) s"
fi
