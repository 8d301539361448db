"""Races the fault-injection suite found: an expired lease whose owner comes back, and the deadline
a pump reads in place of ``holds``."""

from __future__ import annotations

import math
import random
from dataclasses import replace

from balancer.model import EventKind, OwnershipRecord
from balancer.strategies import Claim, Plan, Strategy, View

from .cluster import REF, Cluster


def scripted(*plans: Plan) -> Strategy:
    queue = list(plans)

    def plan(view: View, rng: random.Random) -> Plan:
        return queue.pop(0) if queue else Plan()

    return Strategy("scripted", plan, store_clock=False, summary="test")


async def test_a_claim_of_an_expired_lease_that_its_owner_renewed_meanwhile_is_not_retried() -> None:
    # After a store outage every worker renews and claims at once: the owner of an expired lease
    # renews it between the claimer's listing and its claim. Retrying with the fresh ETag would
    # take a lease its owner has just renewed, and both would process the partition.
    cluster = Cluster(1, expiry=3.0)
    [held] = await cluster.store.claim_ownership([OwnershipRecord(REF, "0", "owner")])
    cluster.now += 10  # expired by the store's clock
    [renewed] = await cluster.store.claim_ownership([held])  # the owner is back and renews
    claimer = cluster.add("claimer")
    claimer.strategy = scripted(Plan(claims=(Claim("0", EventKind.EXPIRE, held, "expired"),)))
    before = cluster.store.requests
    report = await claimer.cycle()
    assert report.owned == frozenset() and cluster.events == []
    assert cluster.store.requests - before == 2  # the listing and the one claim: no re-read, no retry
    assert await cluster.store.list_ownership(REF) == [renewed]


async def test_a_steal_still_goes_round_the_etag_loop() -> None:
    cluster = Cluster(1)
    [held] = await cluster.store.claim_ownership([OwnershipRecord(REF, "0", "victim")])
    await cluster.store.claim_ownership([held])
    stealer = cluster.add("stealer")
    stealer.strategy = scripted(Plan(claims=(Claim("0", EventKind.STEAL, held, "test"),)))
    assert (await stealer.cycle()).owned == {"0"}


async def test_the_deadline_is_where_holds_turns_false() -> None:
    cluster = Cluster(1, expiry=30.0, interval=10.0)
    a = cluster.add("a")
    assert a.deadline("0") == -math.inf and not a.holds("0")
    await a.cycle()
    renewed_at = cluster.now
    assert a.deadline("0") == renewed_at + 30.0
    cluster.now = renewed_at + 29.9
    assert a.holds("0")
    cluster.now = renewed_at + 30.0
    assert not a.holds("0")


def test_a_record_whose_last_modified_is_not_a_number_counts_as_expired() -> None:
    now = 1_700_000_000.0
    assert OwnershipRecord(REF, "0", "ghost", "e", math.nan).expired(now, 30.0)
    assert OwnershipRecord(REF, "0", "ghost", "e", math.inf).expired(now, 30.0)
    assert not OwnershipRecord(REF, "0", "live", "e", now - 29.0).expired(now, 30.0)


async def test_cooperative_workers_take_back_a_partition_a_corrupt_record_gives_to_an_unknown_owner() -> None:
    # Seen by the fault-injection suite on PostgreSQL: a hand-edited row (unknown owner, last
    # modified NaN) never expired; the unknown owner counted as a member, was assigned a second
    # partition too, and neither was processed again.
    cluster = Cluster(4, strategy="cooperative")
    cluster.add("a")
    cluster.add("b")
    await cluster.settle()
    [record] = [r for r in await cluster.store.list_ownership(REF) if r.partition_id == "0"]
    cluster.store._ownership[(REF, "0")] = replace(record, owner_id="ghost", etag="corrupt", last_modified=math.nan)
    await cluster.settle()
    assert set((await cluster.owners()).values()) == {"a", "b"} and len(await cluster.owners()) == 4
