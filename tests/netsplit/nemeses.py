"""Network faults between the hosts of ``cluster.py``, one async function each, like the chaos suite's.

Each cuts links (``Network.cut``: silent drops, both ways), holds the cut, heals it and logs itself
with ``fleet.fault`` (its victims: the workers cut off from something). A worker cut from the store
or from everything is an unplanned failure: what it handled after its last checkpoint may be
handled again by the next owner, inside the expiry (the checker's rule 1). Workers split from each
other while each sees the store and the hub lose nothing and move nothing: they renew their leases
throughout. A worker cut from the hub only renews its leases too, but its readers get nothing: once
the hub has not answered it for ``LEASEBOARD_READER_STUCK`` (``cluster.READER_STUCK``) it hands its
partitions over with their checkpoints, and takes its share back once the hub answers again.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable

from tests.chaos.evidence import Evidence
from tests.chaos.faults import SKEW, PostCheck, new_name
from tests.chaos.rules import ownership_moves
from tests.netsplit.cluster import WORKER_HOSTS, NetFleet
from tests.netsplit.eventlog import taken_after_expiry

Nemesis = Callable[[NetFleet, list[PostCheck]], Awaitable[None]]
HOLD = 4.0  # expiries a cut lasts: long enough for every lease of a cut-off worker to expire


async def console_tells_the_truth(fleet: NetFleet, owner: str) -> list[str]:
    """While ``owner`` is cut from the store: within expiry plus two intervals (and a second for the
    console's own sampling, and one tick of the store's clock: Blob's Last-Modified and Date count
    whole seconds, so the console judges a lease up to a second late; ci-under-load saw 5.0 s pass on
    Blob) the console shows it not alive and owning nothing, and by the end of the
    cut its event log (``/api/events``) shows each partition it held expired from it and claimed by
    another worker, the reason naming it (``eventlog.taken_after_expiry``). Returns what it got wrong."""
    assert fleet.console is not None
    console = fleet.console
    held = {pid for pid, o in fleet.owners().items() if o == owner}
    tick = float(getattr(fleet.store, "clock_resolution", None) or 0.0)
    deadline = fleet.expiry + 2 * fleet.interval + 1.0 + tick
    started, wall_from = time.monotonic(), time.time() - 1.0

    def shown() -> tuple[bool | None, int | None]:
        state = console.state()
        row = next((w for w in state.get("workers", []) if w.get("id") == owner), None) if state else None
        return (row.get("alive"), row.get("owned")) if row else (None, None)

    seen: tuple[bool | None, int | None] = (None, None)
    while time.monotonic() - started < deadline:
        seen = await asyncio.to_thread(shown)
        if seen == (False, 0):
            break
        await asyncio.sleep(0.25)  # the poll's period
    problems = []
    if seen not in ((False, 0), (None, None)):
        problems.append(
            f"console: {owner} cut from the store still shown alive={seen[0]} owning {seen[1]} "
            f"{deadline:.1f}s after the cut"
        )
    await asyncio.sleep(max(0.0, HOLD * fleet.expiry - 1.0 - (time.monotonic() - started)))  # to the cut's end
    since = [e for e in await asyncio.to_thread(console.events) if float(e.get("at") or 0) >= wall_from]  # type: ignore[arg-type]
    return problems + taken_after_expiry(since, owner, held)


def _victim(fleet: NetFleet) -> tuple[str, str]:
    """(owner id, host) of a running worker, chosen by the fleet's seeded generator."""
    worker = fleet.pick()
    return worker.owner, fleet.host_of(worker.owner)


async def _hold(
    fleet: NetFleet,
    cut: Callable[[], None],
    heal: Callable[[], None],
    kind: str,
    victims: set[str],
    cut_off: str | None = None,
) -> None:
    """Cut, hold for HOLD expiries, heal. ``cut_off``: a worker that cannot reach the store meanwhile;
    the console must show it as it is by the end of the hold (``console_tells_the_truth``)."""
    assert fleet.net is not None
    started = time.monotonic()
    cut()
    try:
        watch = asyncio.create_task(console_tells_the_truth(fleet, cut_off)) if cut_off else None
        await asyncio.sleep(HOLD * fleet.expiry)  # the fault's own length, not a wait for a condition
        if watch is not None:
            fleet.problems.extend(await watch)
    finally:
        heal()
    fleet.fault(kind, started, victims, ended=time.monotonic())
    fleet.notes.append(f"{kind}: {', '.join(sorted(victims)) or 'no worker'} for {time.monotonic() - started:.1f}s")


async def worker_from_store(fleet: NetFleet, checks: list[PostCheck]) -> None:
    """One worker cut from the store only: it must stop handling before its leases can have expired."""
    assert fleet.net is not None
    owner, host = _victim(fleet)
    net = fleet.net
    await _hold(fleet, lambda: net.cut(host, "store"), lambda: net.heal(host, "store"), "cut-store", {owner}, owner)


async def worker_from_hub(fleet: NetFleet, checks: list[PostCheck]) -> None:
    """One worker cut from the hub only: it reaches the store, so it hands its partitions over once the
    hub has been silent for ``READER_STUCK`` (the others read them meanwhile), and is given its share
    back after the heal."""
    assert fleet.net is not None
    owner, host = _victim(fleet)
    net = fleet.net
    await _hold(fleet, lambda: net.cut(host, "hub"), lambda: net.heal(host, "hub"), "cut-hub", {owner})


async def worker_from_everything(fleet: NetFleet, checks: list[PostCheck]) -> None:
    await worker_isolated(fleet, _victim(fleet)[0])


async def worker_isolated(fleet: NetFleet, owner: str) -> None:
    assert fleet.net is not None
    host = fleet.host_of(owner)
    net = fleet.net

    def heal() -> None:
        for other in net.hosts:
            if other != host:
                net.heal(host, other)

    await _hold(fleet, lambda: net.isolate(host), heal, "isolated", {owner}, owner)


async def store_from_workers(fleet: NetFleet, checks: list[PostCheck]) -> None:
    """The store cut from every worker (an outage that is a partition, not a stop)."""
    assert fleet.net is not None
    net = fleet.net
    owners = {w.owner for w in fleet.running()}
    hosts = [fleet.host_of(o) for o in owners]

    def cut() -> None:
        for host in hosts:
            net.cut(host, "store")

    def heal() -> None:
        for host in hosts:
            net.heal(host, "store")

    await _hold(fleet, cut, heal, "store-cut", owners)


async def workers_split(fleet: NetFleet, checks: list[PostCheck]) -> None:
    """The workers split in two groups that cannot reach each other; each still sees store and hub.
    Workers never talk to each other directly, so nothing may move: no victims."""
    assert fleet.net is not None
    net = fleet.net
    left, right = WORKER_HOSTS[:1], WORKER_HOSTS[1:]

    def each(action: Callable[[str, str], None]) -> None:
        for a in left:
            for b in right:
                action(a, b)

    await _hold(fleet, lambda: each(net.cut), lambda: each(net.heal), "split", set())


async def flapping_store_link(fleet: NetFleet, checks: list[PostCheck]) -> None:
    """One worker's link to the store cut and healed every second, for HOLD expiries."""
    assert fleet.net is not None
    owner, host = _victim(fleet)
    net = fleet.net
    started = time.monotonic()
    try:
        while time.monotonic() - started < HOLD * fleet.expiry:
            net.cut(host, "store")
            await asyncio.sleep(1.0)  # the flap's own rhythm
            net.heal(host, "store")
            await asyncio.sleep(1.0)
    finally:
        net.heal(host, "store")
    fleet.fault("flapping", started, {owner}, ended=time.monotonic())
    fleet.notes.append(f"flapping: {owner}'s store link, {time.monotonic() - started:.1f}s")


async def cut_while_another_stops(fleet: NetFleet, checks: list[PostCheck]) -> None:
    """One worker cut from the store while another is SIGSTOPped: two failures at once, the third
    worker takes everything; both come back."""
    assert fleet.net is not None
    net = fleet.net
    cut_owner, host = _victim(fleet)
    stopped = next(w for w in sorted(fleet.running(), key=lambda w: w.name) if w.owner != cut_owner)

    def cut() -> None:
        net.cut(host, "store")
        stopped.process.send_signal(signal.SIGSTOP)
        stopped.stopped = True

    def heal() -> None:
        stopped.process.send_signal(signal.SIGCONT)
        stopped.stopped = False
        net.heal(host, "store")

    await _hold(fleet, cut, heal, "cut-store+sigstop", {cut_owner, stopped.owner}, cut_owner)


async def skewed_worker_isolated(fleet: NetFleet, checks: list[PostCheck]) -> None:
    """A worker replaced (SIGTERM: a planned move) by one whose wall clock runs 3 minutes ahead,
    which is then cut off from everything: leases are judged by the store's clock either way."""
    assert fleet.net is not None
    old = fleet.pick()
    fleet.fault("sigterm", time.monotonic(), {old.owner}, planned=True)
    await asyncio.to_thread(fleet.terminate, old)
    skewed = fleet.start(new_name(), skew=SKEW)
    await fleet.settle()
    await worker_isolated(fleet, skewed.owner)


async def console_from_store(fleet: NetFleet, checks: list[PostCheck]) -> None:
    """The console host cut from the store host (the store and the console's own database), the
    workers reaching both: nothing may move, and the console keeps answering (polled all the while:
    ``/metrics`` 200, ``/api/state`` 200 or 503, never a 500 nor no answer: the chaos rule 8) and
    shows the store down (``leaseboard_store_up 0``) before the cut heals. No victims."""
    assert fleet.net is not None
    net = fleet.net
    started = time.monotonic()
    net.cut("console", "store")
    try:
        await asyncio.sleep(HOLD * fleet.expiry)  # the fault's own length, not a wait for a condition
    finally:
        net.heal("console", "store")
    ended = time.monotonic()
    fleet.fault("console-cut", started, set(), ended=ended)
    fleet.notes.append(f"console-cut: the console host from the store host for {ended - started:.1f}s")

    def console_shown_the_cut(evidence: Evidence) -> list[str]:
        problems = []
        scrapes = [p for p in evidence.console if p.path == "/metrics" and started <= p.at <= ended]
        if not any(p.store_up == 0 for p in scrapes):
            seen = sorted({p.store_up for p in scrapes}, key=str)
            problems.append(
                f"console-cut: /metrics never showed leaseboard_store_up 0 while the console was cut "
                f"from the store ({len(scrapes)} scrapes, store_up {seen})"
            )
        moved = [m for m in ownership_moves(evidence) if started <= m.at <= ended]
        problems += [
            f"console-cut: partition {m.partition} moved from {m.source} to {m.target} while only the "
            "console was cut off"
            for m in moved[:5]
        ]
        return problems

    checks.append(console_shown_the_cut)


NEMESES: dict[str, Nemesis] = {
    "cut-store": worker_from_store,
    "cut-hub": worker_from_hub,
    "isolated": worker_from_everything,
    "store-cut": store_from_workers,
    "split": workers_split,
    "flapping": flapping_store_link,
    "cut-store+sigstop": cut_while_another_stops,
    "skewed-isolated": skewed_worker_isolated,
    "console-cut": console_from_store,
}
