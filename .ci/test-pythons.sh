#!/usr/bin/env bash
# `make test-pythons` (the end of `make test`): the fast suite, everything not marked slow, on each
# supported Python other than the default one that this machine has (.ci/pythons.sh), each in its
# own virtual environment .venv-X.Y (`make venv-X.Y`: built once, rebuilt when pyproject.toml
# changes); the suites run side by side. Says which Pythons were found and which were run; fails when a suite fails, never
# because a Python is missing.
#
#   bash .ci/test-pythons.sh [--build-only]
#
# --build-only builds (or finds up to date) each environment and runs nothing: `make test` builds
# them in the background beside the whole suite (.ci/test.sh); the run after it then finds them ready.
#
# Environment: DEFAULT_PYTHON (the interpreter of the whole suite: .venv/bin/python, else python3),
# FAST_WORKERS (pytest-xdist workers per suite, default 2; 0 runs each suite in one process).
set -uo pipefail
cd "$(dirname "$0")/.."
build_only=0
if [ "${1:-}" = --build-only ]; then build_only=1; fi

default=${DEFAULT_PYTHON:-.venv/bin/python}
[ -x "$default" ] || command -v "$default" >/dev/null 2>&1 || default=python3
workers=${FAST_WORKERS:-2}
found=() missing=() results=() failed=0
while read -r minor interpreter; do
  if [ "$interpreter" = - ]; then missing+=("$minor"); else found+=("$minor"); fi
done < <(bash .ci/pythons.sh "$default")

version=$("$default" -c 'import platform; print(platform.python_version())')
echo "Pythons: $version is the default (the whole suite); other supported Pythons found here:" \
  "${found[*]:-none}; not found: ${missing[*]:-none}"

xdist=()
if [ "$workers" != 0 ]; then xdist=(-n "$workers" --dist loadgroup); fi
# Each environment is built first (one after another: pip's cache is shared), then the fast suites
# run side by side, each into a log of its own printed whole when it ends: they mostly wait
# (servers, processes, timeouts), so two at once take little longer than one.
ready=()
for minor in "${found[@]}"; do
  if make --no-print-directory "venv-$minor"; then
    ready+=("$minor")
  else
    results+=("$minor (its environment could not be built)")
    failed=1
  fi
done
if [ "$build_only" = 1 ]; then
  for result in "${results[@]}"; do echo "not built: $result"; done
  exit $failed
fi
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
pids=()
for minor in "${ready[@]}"; do
  (
    started=$SECONDS
    ".venv-$minor/bin/pytest" -p no:cacheprovider -q -m "not slow" "${xdist[@]}" >"$logs/$minor.log" 2>&1
    status=$?
    echo "$status $((SECONDS - started))" >"$logs/$minor.status"
  ) &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
for minor in "${ready[@]}"; do
  echo "== Python $minor: the fast suite (-m 'not slow') in .venv-$minor"
  cat "$logs/$minor.log"
  read -r status took <"$logs/$minor.status" || status=1
  if [ "$status" = 0 ]; then
    results+=("$minor (fast suite passed in ${took} s)")
  else
    results+=("$minor (fast suite FAILED)")
    failed=1
  fi
done

summary="$version (whole suite)"
for result in "${results[@]}"; do summary+=", $result"; done
echo "Pythons run: $summary; not found here, not run: ${missing[*]:-none}"
exit $failed
