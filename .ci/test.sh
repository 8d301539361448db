#!/usr/bin/env bash
# `make test`: lint, the migrations check and the whole suite on the default Python, then the fast
# suites on the other supported Pythons (.ci/test-pythons.sh).
#
# The other Pythons' virtual environments are built in the background from the start, beside lint
# and the whole suite, which leaves about a third of the two cores idle while its tests wait on
# servers and processes (PYTEST_TIMELINE); building them one after another at the end added about
# 1.5 min to a fresh clone's run. Their output is printed when they are done. A run that is stopped or fails half way
# stops the builds too (their own process group), so no pip is left behind.
#
#   bash .ci/test.sh PY VENV TEST_WORKERS FAST_WORKERS
set -uo pipefail
cd "$(dirname "$0")/.."

py=$1 venv=$2 workers=$3 fast_workers=$4
builds_log=$(mktemp)
# setsid: the builds get a process group of their own, which the trap stops whole; nice: they take
# only the CPU the suite leaves, not its tests' (whose timing bounds a busy machine already strains).
DEFAULT_PYTHON="$py" setsid nice -n 19 bash .ci/test-pythons.sh --build-only >"$builds_log" 2>&1 &
builds=$!
stop_builds() {
  kill -TERM -- "-$builds" 2>/dev/null
  wait "$builds" 2>/dev/null
  rm -f "$builds_log"
}
trap stop_builds EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step() {  # step COMMAND...: runs it; the run stops on its failure
  "$@" || exit $?
}

step make --no-print-directory lint
step "$py" manage.py makemigrations --check --dry-run -v 0
# --tb=short: a failure shows its assertion and message, not its whole test function's source, which
# filled the part of a failed run's output that CI keeps (the netsplit test's headline, seed and notes were cut).
step "$venv/bin/pytest" -n "$workers" --dist loadgroup --durations=25 --tb=short

wait "$builds"
built=$?
echo "== the other Pythons' environments, built beside the suite:"
cat "$builds_log"
[ "$built" = 0 ] || echo "(some could not be built: their suites are reported as such below)"
DEFAULT_PYTHON="$py" FAST_WORKERS="$fast_workers" bash .ci/test-pythons.sh
