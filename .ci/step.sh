#!/usr/bin/env bash
# One install step of `make` (a virtual environment, pip), with its progress in two lines: what
# it runs, then how long it took (or that it failed). No progress bar: CI logs stay short, and
# timing costs nothing.
#
#   bash .ci/step.sh "WHAT" COMMAND [ARGS...]
#
# Exits with COMMAND's status.
set -uo pipefail

what=$1
shift
started=$SECONDS
echo "== $what: $*"
"$@"
status=$?
if [ "$status" = 0 ]; then
  echo "== $what: done in $((SECONDS - started)) s"
else
  echo "== $what: FAILED (exit $status) after $((SECONDS - started)) s" >&2
fi
exit "$status"
