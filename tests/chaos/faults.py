"""The faults, one async function each, injected into a running ``Fleet``.

Each logs itself with ``fleet.fault`` (who it struck, unplanned or planned) and may leave a check
for the end of the run in ``post_checks`` (a function of the recorded handlings returning problems),
for what only that fault promises: a worker woken from SIGSTOP handles nothing before it has
re-checked its leases; through a store outage workers keep handling until their leases would
expire, stop there, and say what fails in one line rather than a traceback per retry.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path

from tests.chaos.evidence import Evidence
from tests.chaos.fleet import HANDLER_TIMEOUT, READER_STUCK, WEDGED, Fleet
from tests.chaos.recording import fast, slow, stall
from tests.chaos.rules import CheckpointHistory
from tests.support import waiting

PostCheck = Callable[[Evidence], list[str]]
SKEW = 180.0  # seconds: "one worker's clock skewed by ±3 minutes"
SHORT_OUTAGE = 2.0  # expiries: "short-outage" (within what rules.SHORT_OUTAGE says moves nothing)
_names = iter(f"w{i}" for i in range(1000))


def new_name() -> str:
    return next(_names)


async def sigkill(fleet: Fleet, checks: list[PostCheck]) -> None:
    """SIGKILL a random worker, start a replacement; again a few cycles later."""
    for _ in range(2):
        victim = fleet.pick()
        killed = await asyncio.to_thread(fleet.kill, victim)
        fleet.fault("sigkill", killed, {victim.owner})
        fleet.start(new_name())
        await asyncio.sleep(4 * fleet.interval)


async def sigstop(fleet: Fleet, checks: list[PostCheck]) -> None:
    """SIGSTOP a worker for 10 cycles, then SIGCONT: it must find its leases gone before handling more."""
    victim = fleet.pick()
    held = {pid for pid, owner in fleet.owners().items() if owner == victim.owner}
    victim.process.send_signal(signal.SIGSTOP)
    victim.stopped = True
    stopped = time.monotonic()
    await asyncio.sleep(10 * fleet.interval)
    victim.process.send_signal(signal.SIGCONT)
    victim.stopped = False
    resumed = time.monotonic()
    fleet.fault("sigstop", stopped, {victim.owner}, ended=resumed)

    def resumed_from_the_store_not_from_memory(evidence: Evidence) -> list[str]:
        """After SIGCONT the stopped worker may handle a partition it held only once it has taken it
        again: its first event there is the one after the latest checkpoint, never the one after the
        event it was handling when it was stopped (the others have moved on meanwhile)."""
        history = CheckpointHistory(evidence.checkpoint_samples)
        problems = []
        for pid in sorted(held, key=int):
            mine = sorted(
                (h for h in evidence.handlings if h.owner == victim.owner and h.partition == pid), key=lambda h: h.at
            )
            before = [h for h in mine if h.at < stopped]
            after = [h for h in mine if h.at >= resumed]
            if not after:
                continue
            latest = history.before(pid, after[0].at)
            if after[0].sequence - 1 < latest:
                last = before[-1].sequence if before else None
                problems.append(
                    f"{victim.owner} handled partition {pid} event {after[0].sequence} "
                    f"{after[0].at - resumed:.3f}s after SIGCONT (its last before SIGSTOP: {last}), although "
                    f"checkpoint {latest} was stored: it went on from memory instead of re-checking its lease"
                )
        return problems

    checks.append(resumed_from_the_store_not_from_memory)


async def skew(fleet: Fleet, checks: list[PostCheck]) -> None:
    """Replace two workers (SIGTERM: planned moves) by one whose wall clock is 3 minutes ahead and
    one 3 minutes behind. Leases are judged by the store's clock: nothing may change."""
    victims = [fleet.pick() for _ in range(2)]
    while victims[0] is victims[1]:
        victims[1] = fleet.pick()
    started = time.monotonic()
    for victim in victims:
        fleet.fault("sigterm", started, {victim.owner}, planned=True)
    await asyncio.gather(*(asyncio.to_thread(fleet.terminate, victim) for victim in victims))
    for offset in (SKEW, -SKEW):
        fleet.start(new_name(), skew=offset)


async def add_partitions(fleet: Fleet, checks: list[PostCheck]) -> None:
    count = len(fleet.hub.partition_ids())
    fleet.hub.add_partitions(count + 4)
    fleet.fault("add-partitions", time.monotonic(), set())


async def malformed(fleet: Fleet, checks: list[PostCheck]) -> None:
    """Events whose bodies are not JSON: the handler refuses them and the pump sets them aside."""
    for _ in range(5):
        fleet.send(fleet.rng.choice(fleet.hub.partition_ids()), malformed=True)
    fleet.fault("malformed", time.monotonic(), set())


async def corrupt(fleet: Fleet, checks: list[PostCheck]) -> None:
    """Damage one owned partition's ownership record: its owner loses it; it must be owned again,
    within one expiry (``rules.bad_records`` judges that, and that no other partition moves).

    Should nobody have taken it back after twice the expiry, the test clears the record as an
    operator would (noted in the output), so that the run goes on and the faults after it are
    judged too."""
    owners = fleet.owners()
    pid = fleet.rng.choice(sorted(owners, key=int))
    before = await fleet.store.now()
    done = await fleet.kit.corrupt(fleet.store, fleet.ref, pid)
    fleet.fault("corrupt", time.monotonic(), {owners[pid]}, partitions=frozenset({pid}))
    fleet.notes.append(f"corrupted partition {pid} of {owners[pid]}: {done}")

    def taken_back() -> bool:
        sample = fleet.ownership_samples[-1] if fleet.ownership_samples else None
        lease = sample.leases.get(pid) if sample else None
        running = {w.owner for w in fleet.running()}
        fresh = lease is not None and lease.last_modified is not None and lease.last_modified >= before
        return fresh and fleet.owners().get(pid) in running

    waited = 2 * fleet.expiry + 1
    try:
        await waiting.until(taken_back, f"partition {pid} to be owned again", waited, step=0.05)
    except AssertionError:
        cleared = await fleet.kit.clear(fleet.store, fleet.ref, pid)
        fleet.notes.append(f"nobody took partition {pid} back in {waited:g}s: the test {cleared}, as an operator would")


async def wedged_reader(fleet: Fleet, checks: list[PostCheck]) -> None:
    """The hub stops answering one owned partition's open reader (``EmbeddedHub.wedge``: its link stays
    open and gives nothing, the silent stall): its owner must find it wedged (``LEASEBOARD_READER_WEDGED``)
    and read it again on a new link, with nothing lost and no overlap. Noted: how long after the wedge
    the partition's checkpoint passed the events that had waited behind it."""
    await _stall_one(
        fleet,
        "wedged-reader",
        WEDGED,
        lambda pid, owner: fleet.hub.wedge(pid),
        fleet.hub.unwedge,
        ("wedged", "read again", f"the wedge (LEASEBOARD_READER_WEDGED {WEDGED:g}s)", "not read again"),
    )


async def stuck_handler(fleet: Fleet, checks: list[PostCheck]) -> None:
    """One handler call on one owned partition never returns (``recording.stall``): its worker must give
    the call up after ``LEASEBOARD_HANDLER_TIMEOUT`` and start the partition again from its checkpoint
    on a new thread, with nothing lost and no overlap (what the stuck call would do later is fenced).
    Noted: how long after the stall the partition's checkpoint passed the events that had waited."""
    await _stall_one(
        fleet,
        "stuck-handler",
        HANDLER_TIMEOUT,
        lambda pid, owner: stall(fleet.root / "records", pid),
        lambda pid: None,
        ("stuck", "moving again", f"its handler stuck (LEASEBOARD_HANDLER_TIMEOUT {HANDLER_TIMEOUT:g}s)", "not moving"),
    )


async def slow_handler(fleet: Fleet, checks: list[PostCheck]) -> None:
    """In its owner's process, every handler call on one owned partition takes a second longer than
    ``LEASEBOARD_HANDLER_TIMEOUT`` (``recording.slow``): the worker abandons the call and restarts the
    partition, and when the restarted call sticks on the same event gives the partition up ("stuck:
    handler running"), so another worker handles it, with nothing lost and no overlap. Noted: how long
    after the fault the partition's checkpoint passed the events that had waited behind it."""
    records = fleet.root / "records"
    await _stall_one(
        fleet,
        "slow-handler",
        2 * HANDLER_TIMEOUT,
        lambda pid, owner: slow(records, pid, fleet.workers[owner.rsplit("-", 1)[0]].process.pid, HANDLER_TIMEOUT + 1),
        lambda pid: fast(records, pid),
        ("slow", "handled elsewhere", f"its handler slowed (LEASEBOARD_HANDLER_TIMEOUT {HANDLER_TIMEOUT:g}s)", "not"),
        lead=HANDLER_TIMEOUT,  # what waited while the first slow call ran, not one event it got through
    )


async def failing_reader(fleet: Fleet, checks: list[PostCheck]) -> None:
    """Every read of one owned partition fails in its owner's process (``EmbeddedHub.refuse``: that
    worker's link to it keeps failing): the owner restarts the reader, still failing gives the partition
    up after ``LEASEBOARD_READER_STUCK`` ("stuck: reader failing"), and another worker reads it, with
    nothing lost and no overlap. Noted: how long after the fault the partition's checkpoint passed the
    events that had waited behind it."""
    await _stall_one(
        fleet,
        "failing-reader",
        READER_STUCK,
        lambda pid, owner: fleet.hub.refuse(pid, fleet.workers[owner.rsplit("-", 1)[0]].process.pid),
        fleet.hub.admit,
        ("failing", "read elsewhere", f"its reads failed (LEASEBOARD_READER_STUCK {READER_STUCK:g}s)", "not read"),
    )


async def _stall_one(
    fleet: Fleet,
    kind: str,
    bound: float,
    start: Callable[[str, str], None],
    end: Callable[[str], None],
    words: tuple[str, str, str, str],
    lead: float = 0.0,
) -> None:
    """Stall one owned partition (``start``, given it and its owner), wait up to six ``bound``s for its
    checkpoint to pass what was produced in the first ``lead`` seconds of the stall (at least one
    event: a slowed partition moves, only slowly), note how long that took (or a problem), ``end`` the
    stall and log the fault.
    ``words``: (the state, what moving is called, what the time is counted after, what not moving is)."""
    state, moving, after, stuck = words
    owners = fleet.owners()
    pid = fleet.rng.choice(sorted(owners, key=int))
    started = time.monotonic()
    start(pid, owners[pid])
    behind = [fleet.last().get(pid, -1) + 1]  # produced while stalled: at least this one

    def passed() -> bool:
        if time.monotonic() < started + lead:
            behind[0] = fleet.last().get(pid, -1) + 1
            return False
        return _passed(fleet, pid, behind[0], started)

    waited = 6 * bound
    try:
        await waiting.until(passed, f"partition {pid}, {state}, to move", waited)
        fleet.notes.append(
            f"{kind}: partition {pid} of {owners[pid]} {moving} {time.monotonic() - started:.1f}s after {after}"
        )
    except AssertionError:
        fleet.problems.append(f"{kind}: partition {pid} of {owners[pid]} {stuck} within {waited:g}s")
    finally:
        end(pid)
        fleet.fault(kind, started, {owners[pid]}, ended=time.monotonic(), partitions=frozenset({pid}))


def _passed(fleet: Fleet, pid: str, sequence: int, since: float) -> bool:
    """Whether a checkpoint sample taken after ``since`` shows ``pid`` checkpointed at ``sequence`` or past it."""
    sample = fleet.checkpoint_samples[-1] if fleet.checkpoint_samples else None
    return sample is not None and sample.at > since and sample.checkpoints.get(pid, -1) >= sequence


def outage_of(seconds: float) -> Callable[[Fleet, list[PostCheck]], Awaitable[None]]:
    async def outage(fleet: Fleet, checks: list[PostCheck]) -> None:
        """The store goes away for ``seconds`` and comes back on the same port with its data."""
        victims = fleet.running()
        held = {w.owner: {p for p, o in fleet.owners().items() if o == w.owner} for w in victims}
        wall = time.time()
        started = time.monotonic()
        await asyncio.to_thread(fleet.kit.down)
        await asyncio.sleep(max(0.0, seconds - (time.monotonic() - started)))
        restarting = time.monotonic()  # the store may answer before up() returns
        await asyncio.to_thread(fleet.kit.up)
        ended = time.monotonic()
        fleet.fault("outage", started, {w.owner for w in victims}, ended=ended)
        expiry, slack = fleet.expiry, 0.5

        def kept_on_then_stopped(evidence: Evidence) -> list[str]:
            problems = []
            for worker in victims:
                mine = [h for h in evidence.handlings if h.owner == worker.owner and h.partition in held[worker.owner]]
                if held[worker.owner] and not any(started + 0.5 <= h.at <= started + expiry - 1.0 for h in mine):
                    problems.append(f"{worker.owner} stopped handling its partitions as soon as the store went down")
                late = [h for h in mine if started + expiry + slack < h.at < restarting]
                if late:
                    problems.append(
                        f"{worker.owner} handled partition {late[0].partition} {late[0].at - started:.1f}s into the "
                        f"outage, after its lease would have expired ({expiry:g}s)"
                    )
                later = [f.started for f in evidence.faults if f.started > ended]  # its log lines are not ours
                until = wall + (min(later) - started) if later else float("inf")
                problems += _outage_log_problems(worker.log, worker.owner, wall, wall + (ended - started), until)
            return problems

        checks.append(kept_on_then_stopped)

    return outage


_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def _outage_log_problems(log: Path, owner: str, wall_from: float, wall_to: float, until: float) -> list[str]:
    """One line saying the cycle fails (not one per retry), at most one saying checkpoints fail (not
    one per partition), no traceback, and one line when it works again: the lines from the outage's
    start to 10 s after it, but not from ``until`` on (the next fault's; one may follow at once)."""
    failed, tracebacks, recovered, checkpoints = 0, 0, 0, 0
    when = 0.0
    for line in log.read_text(errors="replace").splitlines():
        stamp = _STAMP.match(line)
        if stamp:
            when = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if not wall_from - 0.01 <= when <= min(wall_to + 10, until):  # stamps are cut to the millisecond
            continue
        if f"worker {owner}: load-balancing cycle failed" in line:
            failed += 1
        elif f"worker {owner}: load-balancing cycle works again" in line:
            recovered += 1
        elif f"worker {owner}: checkpoint store failed" in line or "): checkpoint store failed" in line:
            checkpoints += 1
        elif line.startswith("Traceback"):
            tracebacks += 1
    problems = []
    if failed != 1:
        problems.append(f"{owner} logged the failing cycle {failed} times during one outage (want exactly once)")
    if recovered != 1:
        problems.append(f"{owner} logged {recovered} 'works again' lines after the outage (want one)")
    if checkpoints > 1:
        problems.append(f"{owner} logged failing checkpoints {checkpoints} times during one outage (want once)")
    if tracebacks:
        problems.append(f"{owner} logged {tracebacks} tracebacks during the outage")
    return problems


def injector(name: str, fleet: Fleet, outage_seconds: float) -> Callable[[Fleet, list[PostCheck]], Awaitable[None]]:
    """The fault called ``name``: one of ``FAULTS``, "outage" (``outage_seconds`` long) or
    "short-outage" (``SHORT_OUTAGE`` expiries long)."""
    if name == "outage":
        return outage_of(outage_seconds)
    if name == "short-outage":
        return outage_of(SHORT_OUTAGE * fleet.expiry)
    return FAULTS[name]


FAULTS: dict[str, Callable[[Fleet, list[PostCheck]], Awaitable[None]]] = {
    "sigkill": sigkill,
    "sigstop": sigstop,
    "clock-skew": skew,
    "add-partitions": add_partitions,
    "malformed": malformed,
    "corrupt-record": corrupt,
    "wedged-reader": wedged_reader,
    "stuck-handler": stuck_handler,
    "failing-reader": failing_reader,
    "slow-handler": slow_handler,
}
