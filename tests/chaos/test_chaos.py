"""Faults injected into real ``runworkers`` processes on every store there is; nothing may be lost.

Per store: three workers (``runworkers --count 1`` each; interval 0.5 s, expiry 3 s) on an embedded
hub of 8 partitions, a producer writing one numbered event per partition every 20 ms, then one
fault after another, each phase ending only when the fleet has recovered (every partition owned by
a running worker, balanced, checkpoints caught up). The short version (``make test``) runs each
fault once on PostgreSQL, and on the other stores the kill, the corrupt record, the stalls of issue 35
(a wedged reader, a stuck handler, a slow handler, a failing reader) and both outages (twice the
expiry, and ``CHAOS_OUTAGE_SECONDS``); with ``CHAOS_SECONDS=N`` (``make chaos``) random
faults follow each other for N seconds per store.

All the while a dashboard process on the same store (``console``) is polled: ``/api/state`` and
``/metrics`` twice a second each, every answer recorded.

At the end every worker is stopped with SIGTERM and ``invariants.check`` judges the recordings, the
samples and the console's answers; the test prints one line per fault, a summary line (produced,
landed, missing, duplicates and moves per fault, console errors) and fails on any broken invariant.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chaos import rules
from tests.chaos.console import Console
from tests.chaos.evidence import taken_over
from tests.chaos.faults import FAULTS, PostCheck, injector, new_name
from tests.chaos.fleet import Fleet
from tests.chaos.invariants import Report, check
from tests.chaos.recording import read_handlings
from tests.chaos.stores import available_kits, make_kit, migrated_cluster
from tests.support.postgres import Postgres

pytestmark = pytest.mark.slow

CHAOS_SECONDS = float(os.environ.get("CHAOS_SECONDS") or 0)
OUTAGE_SECONDS = float(os.environ.get("CHAOS_OUTAGE_SECONDS") or 20)
KITS = available_kits()
# The faults every store's run plays, in this order after its first SIGKILL; PostgreSQL's also plays
# stopped processes, skewed clocks, a growing hub and malformed events.
EVERY_STORE = [
    "corrupt-record",
    "wedged-reader",
    "stuck-handler",
    "slow-handler",
    "failing-reader",
    "short-outage",
    "outage",
]
SHORT = {
    "postgresql": ["sigkill", "sigstop", "clock-skew", "add-partitions", "malformed", *EVERY_STORE],
    "blob": ["sigkill", *EVERY_STORE],
    "redis": ["sigkill", *EVERY_STORE],
}
MAX_PARTITIONS = 24


@pytest.fixture(scope="module")
def cluster(django_db_blocker: Any) -> Iterator[tuple[Postgres, str]]:
    """One PostgreSQL cluster for the module: the SQL store's database, and the dashboard tables
    (event log) of the workers on the other stores."""
    with django_db_blocker.unblock(), migrated_cluster() as made:
        yield made


def test_the_suite_says_which_stores_it_runs_on(capsys: pytest.CaptureFixture[str]) -> None:
    with capsys.disabled():
        left_out = "; ".join(f"{name} not run: {why}" for name, why in KITS.missing.items())
        print(f"\nchaos: stores {', '.join(KITS.names)}{'; ' + left_out if left_out else ''}")
    assert {"postgresql", "blob"} <= set(KITS.names)
    assert set(KITS.names) | set(KITS.missing) == {"postgresql", "blob", "redis"}


def plan(store: str, fleet: Fleet, started: float) -> Iterator[str]:
    chosen = os.environ.get("CHAOS_FAULTS")  # e.g. "sigkill,outage": these, once each, in this order
    if chosen:
        yield from (name.strip() for name in chosen.split(",") if name.strip())
        return
    if not CHAOS_SECONDS:
        yield from SHORT[store]
        return
    choices = [*FAULTS, "short-outage", "outage"]
    while time.monotonic() - started < CHAOS_SECONDS:
        choice = fleet.rng.choice(choices)
        if choice == "add-partitions" and len(fleet.hub.partition_ids()) + 4 > MAX_PARTITIONS:
            continue
        yield choice


@pytest.mark.timeout(600 + 3 * CHAOS_SECONDS)
@pytest.mark.parametrize("store", KITS.names)
async def test_no_event_is_lost_and_no_invariant_breaks_under_faults(
    store: str,
    cluster: tuple[Postgres, str],
    tmp_path: Path,
    django_db_blocker: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    kit = make_kit(store, *cluster)
    checks: list[PostCheck] = []
    with django_db_blocker.unblock():
        opened = await kit.open()
        fleet = Fleet(kit, tmp_path, opened)
        console = Console(tmp_path, {**fleet.env, "LEASEBOARD_STORE": kit.store}, fleet.ref)
        sampler = asyncio.create_task(fleet.sample())
        try:
            started, wall_from = time.monotonic(), time.time()
            console.start()
            for _ in range(3):
                fleet.start(new_name())
            await console.ready()
            console.poll()
            fleet.start_producing()

            async def nothing() -> None:
                pass

            await fleet.phase("start", nothing)
            for name in plan(store, fleet, started):
                inject = injector(name, fleet, OUTAGE_SECONDS)
                await fleet.phase(name, lambda inject=inject: inject(fleet, checks))  # type: ignore[misc]
            problems = await finish(fleet)
            events = await asyncio.to_thread(console.events)
            problems += rules.event_clock(events, wall_from, time.time())
            probes = await asyncio.to_thread(console.stop_polling)
            evidence = await fleet.evidence()
            evidence.console = probes
            evidence.taken_over = taken_over(events, wall_from - started, evidence.store_tick)
            slowest = max((c.seconds for c in evidence.cycles), default=0.0)  # what starvation bounds allowed
            fleet.notes.append(
                f"{len(evidence.cycles)} cycles logged, the slowest {slowest:.2f}s (with its late wake-up)"
            )
            if console.tracebacks():
                fleet.notes.append(f"the console logged {console.tracebacks()} tracebacks (see {console.log})")
        finally:
            console.stop()
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            fleet.shutdown()
            await kit.close(opened)
            getattr(kit, "finish", lambda: None)()
    report = check(evidence)
    problems += [problem for post in checks for problem in post(evidence)]
    problems += crash_loops(fleet)
    report.violations += problems + fleet.problems
    elapsed = time.monotonic() - started
    told = io.StringIO()  # the report, printed and, for a failed run, in its assertion (xdist shows no print)
    with contextlib.redirect_stdout(told):
        print_report(store, report, fleet, elapsed)
    with capsys.disabled():
        print(told.getvalue(), end="")
    # All on the first line too: a run that keeps only pytest's summary line (CI) still says what broke.
    headline = f"[{store}] {len(report.violations)} broken invariants: " + " | ".join(report.violations)
    assert not report.violations, headline + "\n" + "\n".join(report.violations) + "\n" + told.getvalue()


async def finish(fleet: Fleet) -> list[str]:
    """Stop producing, send one marker per partition, let them be handled, stop every worker with
    SIGTERM. Returns problems: a marker handled by other than its partition's one owner."""
    markers: dict[str, int] = {}

    async def last_events() -> None:
        fleet.stop_producing()
        for pid in fleet.hub.partition_ids():
            fleet.send(pid, malformed=False)
        markers.update(fleet.last())

    started = time.monotonic()
    await fleet.phase("final", last_events)
    owners = fleet.owners()
    handled = read_handlings(fleet.root / "records")
    problems = []
    for pid, sequence in markers.items():
        by = [h.owner for h in handled if h.partition == pid and h.sequence == sequence]
        # Handled once, by its owner: the one now, or one before a planned move within the phase (a
        # slow fleet may still even out after the marker; leases never overlap, as checked elsewhere).
        held = {owners.get(pid)} | {
            s.leases[pid].owner for s in fleet.ownership_samples if s.at >= started and pid in s.leases
        }
        if len(by) != 1 or by[0] not in held:
            problems.append(
                f"partition {pid}: its last event was handled by {by}, its one owner is {owners.get(pid)}"
                f" (owners in the final phase: {sorted(o for o in held if o)})"
            )
    stopping = fleet.running()
    stopped_at = time.monotonic()
    for worker in stopping:
        fleet.fault("sigterm", stopped_at, {worker.owner}, planned=True)
    durations = await asyncio.gather(*(asyncio.to_thread(fleet.terminate, w) for w in stopping))
    for worker, took in zip(stopping, durations, strict=True):
        if took > 15:  # with its own account of the stop: which step took the time
            told = [line for line in worker.log.read_text(errors="replace").splitlines() if "SIGTERM" in line]
            after = worker.log.read_text(errors="replace").split(told[-1], 1)[-1] if told else ""
            problems.append(f"SIGTERM took {took:.1f}s to drain {worker.owner} (bound: 15s); its log then:{after}")
    return problems


def crash_loops(fleet: Fleet) -> list[str]:
    """A process the test did not end, or a pump that kept failing, is a crash loop. Not the pumps of a
    partition whose reads a "failing-reader" fault refused in that worker: they fail by design."""
    refused = {(o, p) for f in fleet.faults if f.kind == "failing-reader" for o in f.victims for p in f.partitions}
    problems = []
    for worker in fleet.workers.values():
        if worker.expected_end is None:
            problems.append(f"{worker.owner} ended without the test ending it ({worker.process.returncode})")
        text = worker.log.read_text(errors="replace")
        # A pump that raised, logged once per run of failures.
        failures = [p for p in PUMP_FAILED.findall(text) if (worker.owner, p) not in refused]
        if failures:
            which = ", ".join(sorted(set(failures)))
            problems.append(f"{worker.owner}: a pump failed {len(failures)} time(s) (partition {which}): {worker.log}")
    return problems


PUMP_FAILED = re.compile(r": pump of partition (\w+)")


def print_report(store: str, report: Report, fleet: Fleet, elapsed: float) -> None:
    print(
        f"\nchaos [{store}] {len(fleet.workers)} worker processes, {len(fleet.hub.partition_ids())} partitions, "
        f"{elapsed:.0f}s"
    )
    for figures in report.figures:
        print("  " + figures.line(store))
    for note in fleet.notes:
        print(f"  {store:<10} note: {note}")
    total = sum(len(events) for events in fleet.produced.values())
    print(
        f"  {store:<10} total: produced {total}, duplicates {report.duplicates}, "
        f"broken invariants {len(report.violations)}"
    )
    for violation in report.violations:
        print(f"  {store:<10} BROKEN: {violation}")
    print(f"  {report.summary(store)}")
