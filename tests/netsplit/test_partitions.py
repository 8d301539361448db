"""Network partitions between hosts (issue 19, first slice): workers on hosts of their own, cut off
from the store, the hub or everything, the store cut from every worker, the workers split, a
flapping link; nothing may be lost and no invariant of the chaos suite may break.

The hosts are network namespaces (``cluster.py``); the workers read the hub over AMQP and the store
over TCP, so every fault is a real partition: packets dropped silently, connections hanging until
their timeouts. One nemesis after another (``NETSPLIT_NEMESES=a,b`` chooses; ``NETSPLIT_SECONDS=N``
runs random ones for N seconds with the seed printed; ``CHAOS_SEED`` replays; ``NETSPLIT_EXPIRY``
sets the workers' lease expiry, 3 s by default), each phase ending
only when the fleet has recovered: every partition owned by a running worker, balanced, every
checkpoint caught up. The chaos suite's checker (``tests.chaos.invariants``) then judges what the
workers recorded, the store's ownership and checkpoints sampled by the observer, and the console's
answers: no event lost, no event handled twice except within the expiry after an unplanned failure
of its handler (a worker cut from the store or from everything is one), checkpoints never going
back, and the console never a 500.

The store's own history (``store_history``: a trigger in PostgreSQL, ``MONITOR`` on Redis, Azurite's
request log) is judged too (``history``), by the store's clock and nothing the workers wrote: per
partition no two workers handling at once (a lease taken from a live owner, a steal, fences its new
owner for one expiry; to within the resolution of the history's stamps), checkpoints never going
back, every ownership write coming from the host of the worker it names, and
every event a worker recorded handling inside a lease the store gave it (the workers' monotonic
readings put on the store's clock, which here is the machine's wall clock).

The workers land what they read (``landing.LandingRecorder``: the production landing, every file
naming its writer), and the landing files are judged against that history (``landed``): every file
written by a worker of the fleet inside a lease the store gave it there, no event produced and never
landed, and every event processed twice (in the files of two writers) counted against the fault
that cut its first writer off after processing and before its checkpoint; one without such a cause
fails the run. The console's event log, read over HTTP from the observer (``/api/events``), must hold
every change of owner the store recorded with a reason that fits it (``eventlog``). The run prints,
per nemesis, events produced, lost, processed twice, the longest time a partition went unprocessed,
the longest overlap of two leases (0 but for a steal) and the time to balance after the heal.

Every await has a deadline (``deadlines.within``): past it, the run fails naming what it waited for,
with the stack of every task and thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chaos import rules
from tests.chaos.cycles import cycles
from tests.chaos.evidence import Evidence, taken_over
from tests.chaos.faults import PostCheck, new_name
from tests.chaos.invariants import Report, check
from tests.chaos.stores import DASHBOARD_ALIAS, migrated_database
from tests.chaos.test_chaos import finish, print_report
from tests.netsplit.checks import (
    OVERLAP_SLACK,
    crash_loops,
    overlaps,
    recovery,
    recovery_problems,
    sequence_jumps,
    worker_lines,
)
from tests.netsplit.cluster import HOSTS, READER_STUCK, HostedConsole, NetFleet, make_kit, start_hub, start_store
from tests.netsplit.deadlines import within
from tests.netsplit.eventlog import unlogged
from tests.netsplit.history import History, handled_outside, summary
from tests.netsplit.landed import duplicates, landed_outside, lost, per_nemesis, stale_pumps, unsigned
from tests.netsplit.landing import read_landing
from tests.netsplit.nemeses import NEMESES
from tests.netsplit.rules import judge
from tests.netsplit.store_history import recorder_for
from tests.support.databases import remove_django_database
from tests.support.netns import Network, available
from tests.support.postgres import Postgres

pytestmark = pytest.mark.slow

SECONDS = float(os.environ.get("NETSPLIT_SECONDS") or 0)
EXPIRY = float(os.environ.get("NETSPLIT_EXPIRY") or 3.0)  # the fleet's lease expiry, seconds
# The short version (make test): every nemesis on PostgreSQL, one after another, then two chosen at
# random from the seed; on the others, the faults whose outcome depends on the store's client: one
# worker cut from it, cut from everything, its link flapping, and the store cut from every worker; and
# one worker cut from the hub while it reaches the store, whose hand-over goes through the store.
# (NETSPLIT_NEMESES=cut-store,cut-hub,... runs a list of your own on every store.)
ON_THE_STORE = ["cut-store", "cut-hub", "isolated", "flapping", "store-cut"]
# In a cut of the hub from one worker (4 expiries, 12 s) the worker hands its partitions over once the
# hub has been silent for READER_STUCK (2.5 s): no partition may go longer than READER_STUCK and two
# expiries without an event processed. That fails a hand-over that does not happen (before it, the
# cut-off worker kept its partitions for the whole cut: 14.8-20.6 s), not a slow machine. Issue 35's
# target is 5 s: quietly, three stores side by side, 2.6-5.1 s over six cuts (printed per nemesis).
HUB_CUT_UNPROCESSED = READER_STUCK + 2 * EXPIRY
SHORT = {"postgresql": list(NEMESES), "redis": ON_THE_STORE, "blob": ON_THE_STORE}
# Deadlines of the awaits (seconds): a phase is a nemesis (a hold of 4 expiries, or a SIGTERM, a
# restart and a settle before one) and a settle of at most 45 s.
PHASE = 240.0
STEP = 60.0  # one request, one start, one stop
HEALED = {*NEMESES, "store-cut", "split", "flapping"}  # the faults after whose heal ownership must balance


def plan(store: str, fleet: NetFleet, started: float) -> Iterator[str]:
    chosen = os.environ.get("NETSPLIT_NEMESES")
    if chosen:
        yield from (name.strip() for name in chosen.split(",") if name.strip())
        return
    if not SECONDS:
        yield from SHORT[store]
        if store == "postgresql":  # and two more at random, from the printed seed
            yield from (fleet.rng.choice(sorted(NEMESES)) for _ in range(2))
        return
    while time.monotonic() - started < SECONDS:
        yield fleet.rng.choice(sorted(NEMESES))


def test_this_machine_can_make_hosts() -> None:
    assert available() is None, available()


@pytest.fixture
def hosts(django_db_blocker: Any) -> Iterator[tuple[Network, Postgres, str]]:
    """The hosts, with PostgreSQL serving on the store host, its database migrated (sync: Django's
    migrations), removed after the test whatever happened."""
    home = Path(tempfile.mkdtemp(prefix="leaseboard-netsplit-pg-"))
    with Network(HOSTS) as net, django_db_blocker.unblock():
        server = start_store(net["store"], home)
        try:
            yield net, server, migrated_database(server)
        finally:
            remove_django_database(DASHBOARD_ALIAS)
            server.kill()
            shutil.rmtree(home, ignore_errors=True)
    assert net.leftovers() == [], f"the network left {net.leftovers()} behind"


@pytest.mark.timeout(900 + 3 * SECONDS)
@pytest.mark.parametrize("store", list(SHORT))
async def test_no_event_is_lost_and_no_invariant_breaks_under_network_partitions(
    store: str,
    hosts: tuple[Network, Postgres, str],
    tmp_path: Path,
    django_db_blocker: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    net, server, url = hosts
    seed = int(os.environ.get("CHAOS_SEED") or time.time_ns() % 1_000_000)
    os.environ["CHAOS_SEED"] = str(seed)  # the fleet's generator reads it
    with capsys.disabled():
        print(f"\nnetsplit: seed {seed} (CHAOS_SEED={seed} replays the choices)")
    checks: list[PostCheck] = []
    kit = make_kit(store, net["store"], server, url)
    recorder = recorder_for(store, kit, url, tmp_path)
    # The stores' clocks are this machine's wall clock: the workers' monotonic readings map onto it.
    offsets = [time.time() - time.monotonic()]
    try:
        await within(STEP, f"the {store} store's history to start recording", asyncio.to_thread(recorder.start))
    except BaseException:
        getattr(kit, "finish", lambda: None)()
        raise
    history: History | None = None
    with django_db_blocker.unblock():
        opened = await within(STEP, "the observer to open the store", kit.open())
        fleet = NetFleet(kit, tmp_path, opened, net=net, expiry=EXPIRY)
        fleet.hub_server = start_hub(net["hub"], tmp_path, fleet.partitions, fleet.env)
        # The console keeps its default expiry (30 s): it judges heartbeats by the expiry they name.
        console = HostedConsole(tmp_path, {**fleet.env, "LEASEBOARD_STORE": kit.store}, fleet.ref)
        console.host = net["console"]
        fleet.console = console
        sampler = asyncio.create_task(fleet.sample())
        try:
            started, wall_from = time.monotonic(), time.time()
            console.start()
            for _ in range(3):
                fleet.start(new_name())
            await within(STEP + 10, "the console to answer", console.ready())
            console.poll()
            fleet.start_producing()

            async def nothing() -> None:
                pass

            await within(PHASE, "phase start (the fleet to settle)", fleet.phase("start", nothing))
            for name in plan(store, fleet, started):
                nemesis = NEMESES[name]
                phase = fleet.phase(name, lambda nemesis=nemesis: nemesis(fleet, checks))  # type: ignore[misc]
                await within(PHASE, f"phase {name} (the nemesis, then the fleet to settle)", phase)
            problems = await within(PHASE, "the final phase and every worker's SIGTERM", finish(fleet))
            events = await within(STEP, "the console's event log", asyncio.to_thread(console.events))
            problems += rules.event_clock(events, wall_from, time.time())
            probes = await within(STEP, "the console's pollers to stop", asyncio.to_thread(console.stop_polling))
            evidence = await within(STEP, "the store's final checkpoints", fleet.evidence())
            # Every worker has stopped: the store's records are where its history must end.
            records = await within(STEP, "the store's final ownership", fleet.store.list_ownership(fleet.ref))
            final = {r.partition_id: (r.owner_id, r.etag or "") for r in records}
            evidence.console = probes
        finally:
            console.stop()
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError, AssertionError):
                await within(STEP, "the sampler to stop", sampler)
            fleet.shutdown()
            try:  # after every worker is gone (nothing more to record), before the store goes
                reading = asyncio.to_thread(recorder.history, fleet.ref)
                history = await within(STEP, f"the {store} store's history", reading)
            finally:
                recorder.stop()
                await within(STEP, "the observer to close the store", kit.close(opened))
                getattr(kit, "finish", lambda: None)()
    evidence.taken_over = taken_over(events, offsets[0], evidence.store_tick)
    report = check(evidence)
    report.violations += problems + [p for post in checks for p in post(evidence)] + fleet.problems
    report.violations += crash_loops(fleet, evidence) + sequence_jumps(fleet.root)[:5]
    offsets.append(time.time() - time.monotonic())
    offset, drift = sum(offsets) / 2, abs(offsets[1] - offsets[0])
    healed = recovery(fleet, evidence, HEALED, cycles(fleet.root, offset))
    report.violations += recovery_problems(fleet, healed) + overlaps(evidence)
    assert net is not None
    addresses = {f"{name}-0": net[host].address for name, host in fleet.placed.items()}
    report.violations += judge(history, fleet.expiry, addresses, final)
    outside = handled_outside(history, evidence.handlings, offset, fleet.expiry, OVERLAP_SLACK + drift)
    report.violations += [f"store history: {p}" for p in outside[:5]]
    # The landing files: their writers, against the store's history; every duplicate against its cause.
    files, unreadable = read_landing(fleet.landing, fleet.ref.hub)
    report.violations += unreadable[:5] + unsigned(files, evidence.workers)[:5]
    report.violations += landed_outside(history, files, fleet.expiry, OVERLAP_SLACK + drift)[:5]
    report.violations += stale_pumps(history, files, fleet.expiry, OVERLAP_SLACK + drift)[:5]
    report.violations += lost(evidence.produced, evidence.dead_letters, files)
    causes = evidence.faults + evidence.taken_over
    twice, unexplained = duplicates(files, causes, history, offset, OVERLAP_SLACK + drift, fleet.expiry)
    report.violations += unexplained
    # The console's event log (read over HTTP from the observer) against the store's history.
    unreported, unsent = unlogged(history, events, fleet.expiry, evidence.faults, offset)
    report.violations += unreported[:5]
    healing = [f for f in evidence.faults if f.kind in HEALED]
    balanced = dict(zip(healing, (r.seconds for r in healed), strict=True))
    figures = per_nemesis(
        fleet.phases,
        evidence.produced,
        evidence.dead_letters,
        files,
        evidence.handlings,
        twice,
        history,
        fleet.expiry,
        offset,
        balanced,
    )
    report.violations += [
        f"{f.phase}: a partition went {f.unprocessed:.2f}s unprocessed (at most {HUB_CUT_UNPROCESSED:g}s)"
        for f in figures
        if f.phase.startswith("cut-hub") and f.unprocessed > HUB_CUT_UNPROCESSED
    ]
    told = io.StringIO()  # the report, printed and, for a failed run, in its assertion (xdist shows no print)
    with contextlib.redirect_stdout(told):
        print_report(f"netsplit {store}", report, fleet, time.monotonic() - started)
        print(f"  {summary(history, fleet.expiry)}; its last writes compared with the store's {len(final)} records")
        print(
            f"  handled outside the store's leases: {len(outside)} runs of events (wall minus monotonic clock moved "
            f"{drift * 1000:.3f} ms over the run; allowed {OVERLAP_SLACK:g}s + that)"
        )
        heals = ", ".join(
            f"{r.kind} {'never' if r.seconds is None else f'{r.seconds:.1f}s'} (slowest cycle {r.slowest:.2f}s)"
            for r in healed
        )
        print(f"  recovery after each heal (expiry + 2 intervals = {fleet.expiry + 2 * fleet.interval:g}s): {heals}")
        writers = {f.writer for f in files}
        print(
            f"  landing: {len(files)} files by {len(writers)} writers (owner, tenure), "
            f"{sum(1 for f in files if f.name.startswith('.'))} kept beside a range landed before; "
            f"{len(twice)} events processed twice, {sum(1 for d in twice if d.cause is None)} without a cause; "
            f"console event log: {len(events)} events, {len(unsent)} changes of owner missing from it because their "
            f"reporter was killed right after them"
        )
        for line in unsent:
            print(f"    never reported: {line}")
        print(f"  per nemesis [{store}]:")
        for figure in figures:
            print(f"    {figure.line()}")
        if report.violations:  # what the workers involved logged: the run's files go with its clone
            for line in worker_lines(fleet.root, report.violations):
                print(line)
    with capsys.disabled():
        print(told.getvalue(), end="")
    # All on the first line too: a run that keeps only pytest's summary line (CI) still says what broke.
    headline = f"{len(report.violations)} broken invariants (CHAOS_SEED={seed}): " + " | ".join(report.violations)
    assert not report.violations, (
        headline + "\n" + "\n".join(report.violations) + "\n" + told.getvalue() + tail(seed, fleet, evidence, report)
    )


def tail(seed: int, fleet: NetFleet, evidence: Evidence, report: Report) -> str:
    """The end of a failed run's message, where CI's cut keeps it: the seed, every phase and fault on
    the workers' monotonic clock (the times the violations give) and each violation's first line."""
    lines = [f"\n--- netsplit summary (CHAOS_SEED={seed}; times monotonic, as in the violations) ---"]
    lines += [f"  phase {p.name:<18} {p.started:.2f} .. {p.ended:.2f}" for p in fleet.phases]
    lines += [
        f"  fault {f.kind:<18} {f.started:.2f} .. {f.ended:.2f} {'planned ' * f.planned}{','.join(sorted(f.victims))}"
        for f in evidence.faults + evidence.taken_over
    ]
    lines += [f"  broken: {v.splitlines()[0][:400]}" for v in report.violations[:12]]
    return "\n".join(lines) + "\n"
