#!/usr/bin/env bash
# The other supported Pythons this machine has, for `make test`'s fast suites.
#
#   bash .ci/pythons.sh DEFAULT_PYTHON|-
#
# Supported versions are read from pyproject.toml's "Programming Language :: Python :: X.Y"
# classifiers. For each one other than DEFAULT_PYTHON's (every one for "-"), prints
# "X.Y INTERPRETER" when found, else "X.Y -". Looks in pyenv first (its newest X.Y.*, via
# `pyenv prefix`), then for pythonX.Y on PATH.
# A candidate counts only if it runs, is X.Y and can make a virtual environment: pyenv puts a
# pythonX.Y shim on PATH for every version it has installed, selected or not, and Debian's Pythons
# lack ensurepip until their -venv package is installed. No pyenv at all is fine.
set -euo pipefail
cd "$(dirname "$0")/.."

default=${1:-python3}
default_minor=""
if [ "$default" != - ]; then default_minor=$("$default" -c 'import sys; print("%d.%d" % sys.version_info[:2])'); fi
supported=$(sed -n 's/^ *"Programming Language :: Python :: \(3\.[0-9][0-9]*\)",\{0,1\} *$/\1/p' pyproject.toml)

usable() {  # usable INTERPRETER X.Y
  [ -x "$1" ] && "$1" - "$2" 2>/dev/null <<'EOF'
import sys
import ensurepip, venv  # noqa: F401  (python -m venv needs both)
sys.exit(f"{sys.version_info[0]}.{sys.version_info[1]}" != sys.argv[1])
EOF
}

find_python() {  # find_python X.Y: prints an interpreter, or fails
  local minor=$1 version prefix candidate
  if command -v pyenv >/dev/null 2>&1; then
    version=$(pyenv versions --bare 2>/dev/null | grep -E "^${minor//./\\.}\.[0-9]+$" | sort -V | tail -n 1 || true)
    if [ -n "$version" ] && prefix=$(pyenv prefix "$version" 2>/dev/null); then
      for candidate in "$prefix/bin/python$minor" "$prefix/bin/python3"; do
        if usable "$candidate" "$minor"; then echo "$candidate"; return 0; fi
      done
    fi
  fi
  candidate=$(command -v "python$minor" 2>/dev/null || true)
  if [ -n "$candidate" ] && usable "$candidate" "$minor"; then echo "$candidate"; return 0; fi
  return 1
}

for minor in $supported; do
  [ "$minor" = "$default_minor" ] && continue
  if interpreter=$(find_python "$minor"); then echo "$minor $interpreter"; else echo "$minor -"; fi
done
