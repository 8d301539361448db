#!/usr/bin/env bash
# `make test-pythons` (the end of `make test`): the fast suite, everything not marked slow, on each
# supported Python other than the default one that this machine has (.ci/pythons.sh), each in its
# own virtual environment .venv-X.Y (`make venv-X.Y`: built once, rebuilt when pyproject.toml
# changes). Says which Pythons were found and which were run; fails when a suite fails, never
# because a Python is missing.
#
# Environment: DEFAULT_PYTHON (the interpreter of the whole suite: .venv/bin/python, else python3),
# FAST_WORKERS (pytest-xdist workers per suite, default 2; 0 runs each suite in one process).
set -uo pipefail
cd "$(dirname "$0")/.."

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
if [ "$workers" != 0 ]; then xdist=(-n "$workers"); fi
for minor in "${found[@]}"; do
  echo "== Python $minor: the fast suite (-m 'not slow') in .venv-$minor"
  started=$SECONDS
  if make --no-print-directory "venv-$minor" \
    && ".venv-$minor/bin/pytest" -p no:cacheprovider -q -m "not slow" "${xdist[@]}"; then
    results+=("$minor (fast suite passed in $((SECONDS - started)) s)")
  else
    results+=("$minor (fast suite FAILED)")
    failed=1
  fi
done

summary="$version (whole suite)"
for result in "${results[@]}"; do summary+=", $result"; done
echo "Pythons run: $summary; not found here, not run: ${missing[*]:-none}"
exit $failed
