"""Network faults between the hosts of ``cluster.py``, one async function each, like the chaos suite's.

Each cuts links (``Network.cut``: silent drops, both ways), holds the cut, heals it and logs itself
with ``fleet.fault`` (its victims: the workers cut off from something). A worker cut from the store
or from everything is an unplanned failure: what it handled after its last checkpoint may be
handled again by the next owner, inside the expiry (the checker's rule 1). A worker cut from the
hub only, or workers split from each other while each sees the store and the hub, lose nothing
and move nothing for long: they renew their leases throughout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from tests.chaos.faults import PostCheck
from tests.netsplit.cluster import WORKER_HOSTS, NetFleet

Nemesis = Callable[[NetFleet, list[PostCheck]], Awaitable[None]]
HOLD = 4.0  # expiries a cut lasts: long enough for every lease of a cut-off worker to expire


def _victim(fleet: NetFleet) -> tuple[str, str]:
    """(owner id, host) of a running worker, chosen by the fleet's seeded generator."""
    worker = fleet.pick()
    return worker.owner, fleet.host_of(worker.owner)


async def _hold(
    fleet: NetFleet, cut: Callable[[], None], heal: Callable[[], None], kind: str, victims: set[str]
) -> None:
    assert fleet.net is not None
    started = time.monotonic()
    cut()
    try:
        await asyncio.sleep(HOLD * fleet.expiry)  # the fault's own length, not a wait for a condition
    finally:
        heal()
    fleet.fault(kind, started, victims, ended=time.monotonic())
    fleet.notes.append(f"{kind}: {', '.join(sorted(victims)) or 'no worker'} for {time.monotonic() - started:.1f}s")


async def worker_from_store(fleet: NetFleet, checks: list[PostCheck]) -> None:
    """One worker cut from the store only: it must stop handling before its leases can have expired."""
    assert fleet.net is not None
    owner, host = _victim(fleet)
    net = fleet.net
    await _hold(fleet, lambda: net.cut(host, "store"), lambda: net.heal(host, "store"), "cut-store", {owner})


async def worker_from_hub(fleet: NetFleet, checks: list[PostCheck]) -> None:
    """One worker cut from the hub only: it keeps its leases (it reaches the store) and resumes."""
    assert fleet.net is not None
    owner, host = _victim(fleet)
    net = fleet.net
    await _hold(fleet, lambda: net.cut(host, "hub"), lambda: net.heal(host, "hub"), "cut-hub", {owner})


async def worker_from_everything(fleet: NetFleet, checks: list[PostCheck]) -> None:
    assert fleet.net is not None
    owner, host = _victim(fleet)
    net = fleet.net

    def heal() -> None:
        for other in net.hosts:
            if other != host:
                net.heal(host, other)

    await _hold(fleet, lambda: net.isolate(host), heal, "isolated", {owner})


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


NEMESES: dict[str, Nemesis] = {
    "cut-store": worker_from_store,
    "cut-hub": worker_from_hub,
    "isolated": worker_from_everything,
    "store-cut": store_from_workers,
    "split": workers_split,
    "flapping": flapping_store_link,
}
