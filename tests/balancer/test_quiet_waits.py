"""Quiet waits (``Coordinator.quiet_until``): after a steady cycle whose quiet read listed nothing, a
driver that hears every other change by notice may read the store again only by ``quiet_until``,
longer than one interval. A lease whose holder stopped must still be taken as soon as when every
worker reads each interval: within the expiry and one interval of its last renewal."""

from __future__ import annotations

import itertools
import random

import pytest

from balancer.lease import Coordinator
from balancer.notices import Released

from .cluster import REF, Cluster

EXPIRY, INTERVAL = 10.0, 2.0


def fleet(partitions: int, names: str, seed: int = 3) -> tuple[Cluster, dict[str, Coordinator]]:
    cluster = Cluster(
        partitions, strategy="cooperative", expiry=EXPIRY, interval=INTERVAL, seed=seed, renewal_steps=True
    )
    return cluster, {name: cluster.add(name) for name in names}


async def test_after_a_steady_cycle_the_next_read_may_wait_until_an_interval_after_a_lease_may_expire() -> None:
    cluster, workers = fleet(8, "ab")
    await cluster.settle()
    a = workers["a"]
    quiet = []
    for _ in range(4):
        read_at = cluster.now
        report = await a.cycle()
        quiet.append((report.planned, a.quiet_until(), read_at))
        await cluster.advance(INTERVAL)
    steady = [(until, read_at) for planned, until, read_at in quiet if not planned]
    assert steady, quiet
    # stale_after is 0.85 of the expiry: a record left out was written within 8.5 s of the read, so
    # expires 1.5 s after it at the earliest; one interval more is what reading every interval allows.
    assert all(until == pytest.approx(read_at + 1.5 + INTERVAL) for until, read_at in steady)
    assert all(until is None for planned, until, _ in quiet if planned)


async def test_a_cycle_that_read_a_record_or_planned_waits_one_interval() -> None:
    cluster, workers = fleet(8, "ab")
    await cluster.settle()
    a = workers["a"]
    await cluster.cycle(2)
    assert a.quiet_until() is not None
    cluster.crash("b")
    await cluster.advance(EXPIRY * 0.9)  # b's records are stale now: the quiet read lists them
    report = await a.cycle()
    assert report.rows > 0 and a.quiet_until() is None
    a.interval = None  # no interval known: nothing to measure a quiet wait by
    await cluster.settle()
    await a.cycle()
    assert a.quiet_until() is None


async def quiet_life(seed: int) -> tuple[float, float, list[float]]:
    """Two workers cycling as a driver that waits quietly does (until ``quiet_until`` when set, else one
    interval, renewing in between); b stops at a random moment. Returns when b last wrote (its last
    renewal), when a held every partition, and the gaps between a's reads before b stopped."""
    rng = random.Random(seed)
    cluster, workers = fleet(8, "ab", seed)
    a = workers["a"]
    next_cycle = {"a": cluster.now, "b": cluster.now + rng.uniform(0, INTERVAL)}
    stop_at = cluster.now + rng.uniform(30.0, 60.0)
    reads: list[float] = []
    while True:
        due = [(at, name) for name, at in next_cycle.items() if name in cluster.workers]
        due += [(at, f"renew {n}") for n, c in cluster.workers.items() if (at := c.next_renewal()) is not None]
        at, what = min(due)
        if "b" in cluster.workers and at >= stop_at:
            cluster.now = max(cluster.now, stop_at)
            records = await cluster.store.list_ownership(REF)
            last_write = max(r.last_modified or 0.0 for r in records if r.owner_id == "b")
            cluster.crash("b")
            continue
        cluster.now = max(cluster.now, at)
        if what.startswith("renew"):
            await cluster.workers[what.split()[1]].renew()
            continue
        coordinator = cluster.workers[what]
        await coordinator.cycle()
        if what == "a" and "b" in cluster.workers:
            reads.append(cluster.now)
        quiet = coordinator.quiet_until()
        next_cycle[what] = cluster.now + (INTERVAL if quiet is None else max(INTERVAL, quiet - cluster.now))
        if "b" not in cluster.workers and len(a.owned) == 8:
            return last_write, cluster.now, [later - earlier for earlier, later in itertools.pairwise(reads)]


@pytest.mark.parametrize("seed", range(20))
async def test_waiting_quietly_a_stopped_workers_leases_are_taken_within_the_expiry_and_one_interval(seed: int) -> None:
    last_write, taken, gaps = await quiet_life(seed)
    assert taken <= last_write + EXPIRY + INTERVAL + 1e-6, (last_write, taken)
    assert max(gaps[-5:]) == pytest.approx(1.5 + INTERVAL)  # steady by then: a read every 3.5 s, not 2


async def test_a_coordinator_announcing_joins_tells_the_others_after_its_second_cycle_only() -> None:
    # Its first cycle announces it; the second shows it alive and ready for partitions, which is when
    # the holders will hand it some (``cooperative.unproven``): the news for the quiet comes then.
    cluster, _ = fleet(4, "a")
    await cluster.settle()
    told: list[Released] = []
    b = cluster.add("b", on_released=told.append, announce_joining=True)
    await b.cycle()
    assert told == []
    await b.cycle()
    assert told == [Released(REF, (), "b")]  # after its heartbeat was written: a reader sees it
    assert "b" in {m.owner_id for m in await cluster.store.list_members(REF)}
    await cluster.cycle(3)
    assert told == [Released(REF, (), "b")]
    c = cluster.add("c", on_released=told.append)  # not announcing joins (the default): no such notice
    await c.cycle()
    assert told == [Released(REF, (), "b")]
