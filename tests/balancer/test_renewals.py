"""Leases cheaper than Microsoft's (issue 15, item 2): with renewal steps (the runtime's loop calls
``renew()`` at ``next_renewal()`` between cycles) a lease is renewed once 65 % of the expiry has passed,
at that moment and not at the next cycle, without a listing, a failed renewal tried again after a short
backoff while the lease holds; driven by cycles alone, once half the expiry has passed (or sooner, when
one more late cycle and a failed renewal could let it lapse). A worker holding partitions sends no
heartbeat (its renewals show it alive); crash detection stays within the expiry plus one interval."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import pytest

from balancer.errors import StoreUnavailable
from balancer.lease import RENEW_SHARE, Coordinator
from balancer.lease.options import CLOCK_RENEW_SHARE
from balancer.model import EventKind, Member, OwnershipRecord, alive_workers, partition_ids, signs_of_life
from balancer.stores.memory import MemoryStore
from balancer.strategies import get_strategy

from .cluster import REF, Cluster


async def test_at_a_2s_interval_and_10s_expiry_a_lease_is_renewed_every_third_cycle() -> None:
    cluster = Cluster(4, strategy="cooperative", interval=2.0, expiry=10.0)
    a = cluster.add("a")
    a.controls = cluster.store
    await cluster.settle()
    written = {r.partition_id: r.last_modified for r in await cluster.store.list_ownership(REF)}
    renewals, heartbeats = [], []
    for _ in range(12):
        members = {m.owner_id: m.last_seen for m in await cluster.store.list_members(REF)}
        requests = cluster.store.requests
        await cluster.cycle()
        spent = cluster.store.requests - requests
        records = {r.partition_id: r.last_modified for r in await cluster.store.list_ownership(REF)}
        renewals.append(records != written)
        heartbeats.append({m.owner_id: m.last_seen for m in await cluster.store.list_members(REF)} != members)
        written = records
        assert spent == (2 if renewals[-1] else 1)  # a snapshot, and the renewals' one claim when due
        assert all(at is not None and cluster.now - at < 10.0 for at in records.values())  # never near expiring
    assert renewals.count(True) == 4, renewals  # at 6 s of age each time: 12 cycles, 4 renewals
    assert not any(heartbeats)  # it holds partitions: its renewals are its heartbeat


async def test_at_the_defaults_every_cycle_still_renews_two_cycles_ahead_of_expiry() -> None:
    cluster = Cluster(2, strategy="cooperative", interval=10.0, expiry=30.0)
    a = cluster.add("a")
    a.controls = cluster.store
    await cluster.settle()
    for _ in range(3):
        before = {r.partition_id: r.last_modified for r in await cluster.store.list_ownership(REF)}
        await cluster.cycle()
        after = {r.partition_id: r.last_modified for r in await cluster.store.list_ownership(REF)}
        assert all(after[p] != before[p] for p in after)


def test_a_worker_holding_leases_is_alive_by_them_and_a_phantom_is_not() -> None:
    members = [Member(REF, "w1", 100.0, {"expiry": "10"}), Member(REF, "w2", 100.0, {"expiry": "10"})]
    records = [OwnershipRecord(REF, "0", "w1", "e", 125.0), OwnershipRecord(REF, "1", "ghost", "e", 129.0)]
    assert signs_of_life(members, records) == {"w1": 125.0, "w2": 100.0}
    assert alive_workers(members, records, 130.0, 30.0) == {"w1"}  # w2: heartbeat 30 s old, expiry 10 s


async def test_a_crashed_holder_is_replaced_within_the_expiry_and_one_interval() -> None:
    cluster = Cluster(4, strategy="cooperative", interval=2.0, expiry=10.0)
    for name in ("a", "b"):
        cluster.add(name).controls = cluster.store
    await cluster.settle()
    await cluster.cycle(5)
    crashed_at = cluster.now
    cluster.crash("a")
    while sorted((await cluster.owners()).values()) != ["b"] * 4:
        await cluster.cycle()
        assert cluster.now - crashed_at <= 10.0 + 2.0 + 2.0, "slower than expiry + one interval (+ the cycle step)"
    assert get_strategy("cooperative").uses_members


# renewal steps -------------------------------------------------------------------------------------


def written(records: list[OwnershipRecord]) -> dict[str, float | None]:
    return {r.partition_id: r.last_modified for r in records}


async def test_with_renewal_steps_a_lease_is_renewed_at_65_percent_of_the_expiry_between_cycles() -> None:
    cluster = Cluster(4, strategy="cooperative", interval=2.0, expiry=10.0, renewal_steps=True)
    a = cluster.add("a")
    a.controls = cluster.store
    await cluster.settle()
    claimed_at = a.deadline("0") - 10.0
    assert a.next_renewal() == pytest.approx(claimed_at + 6.5)
    cluster.renewed.clear()
    requests, started = cluster.store.requests, cluster.now
    writes: list[tuple[float, frozenset[str]]] = []
    claim = cluster.store.claim_ownership

    async def recording(records: Sequence[OwnershipRecord]) -> list[OwnershipRecord]:
        writes.append((cluster.now, frozenset(r.partition_id for r in records)))
        return await claim(records)

    cluster.store.claim_ownership = recording  # type: ignore[method-assign]
    await cluster.cycle(30)  # a minute
    # Every write is a renewal step's, of all four leases at once, 6.5 s after the one before: none
    # at a cycle (cycles at 2 s steps would have renewed at 6 s or 8 s).
    assert [p for _, p in writes] == [frozenset("0123")] * len(writes)
    times = [claimed_at + 6.5 * k for k in range(1, len(writes) + 1)]
    assert [t for t, _ in writes] == pytest.approx(times)
    assert len(writes) == math.floor((started + 60.0 - claimed_at) / 6.5)  # 9 a minute, not 10
    # Each step is one write, no listing; a lease due just as a cycle starts is renewed by that cycle.
    assert all(name == "a" and spent == 1 for _, name, spent in cluster.renewed)
    assert len(cluster.renewed) >= len(writes) - 60 / 13
    assert cluster.store.requests - requests == 30 + len(writes)  # one snapshot a cycle, one write a renewal
    assert all(a.holds(p) for p in "0123")
    assert a.deadline("0") == pytest.approx(times[-1] + 10.0)  # from the winning write's send time


async def test_a_renewal_step_renews_nothing_before_its_time_and_a_cycle_renews_what_is_due() -> None:
    cluster = Cluster(2, strategy="cooperative", interval=2.0, expiry=10.0, renewal_steps=True)
    a = cluster.add("a")
    a.controls = cluster.store
    await cluster.settle()
    due = a.next_renewal()
    assert due is not None
    cluster.now = due - 0.1
    before = written(await cluster.store.list_ownership(REF))
    requests = cluster.store.requests
    report = await a.renew()
    assert report.requests == 0 and cluster.store.requests == requests and not report.lost
    assert written(await cluster.store.list_ownership(REF)) == before
    cluster.now = due + 0.5  # the driver was late: the cycle renews what is due, in its one write
    cycle = await a.cycle()
    assert cycle.requests == 2  # its read and that write
    assert a.deadline("0") == pytest.approx(due + 0.5 + 10.0)
    assert a.next_renewal() == pytest.approx(due + 0.5 + 6.5)


async def test_a_failed_renewal_is_retried_after_a_backoff_while_the_lease_holds_then_left_to_cycles() -> None:
    cluster = Cluster(2, strategy="cooperative", interval=2.0, expiry=10.0, renewal_steps=True)
    a = cluster.add("a")
    a.controls = cluster.store
    await cluster.settle()
    renewed_at = a.deadline("0") - 10.0
    cluster.store.down = True
    tries = []
    while (at := a.next_renewal()) is not None:
        cluster.now = at
        tries.append(at - renewed_at)
        with pytest.raises(StoreUnavailable):
            await a.renew()
        assert a.owned == frozenset("01")  # kept: nothing changed in the store
    assert tries == pytest.approx([6.5, 7.0, 8.0])  # then 10 s: past the deadline, the cycles try
    cluster.now = renewed_at + 10.0
    assert not a.holds("0")
    cluster.store.down = False
    await a.cycle()  # nobody took them: the cycle renews them with the ETags it holds
    assert a.holds("0") and a.holds("1")
    assert a.next_renewal() == pytest.approx(cluster.now + 6.5)  # and the backoff is over


async def test_a_renewal_that_works_on_a_retry_moves_the_deadline_and_ends_the_backoff() -> None:
    cluster = Cluster(2, strategy="cooperative", interval=2.0, expiry=10.0, renewal_steps=True)
    a = cluster.add("a")
    a.controls = cluster.store
    await cluster.settle()
    due = a.next_renewal()
    assert due is not None
    cluster.now = due
    cluster.store.down = True
    with pytest.raises(StoreUnavailable):
        await a.renew()
    assert a.next_renewal() == pytest.approx(due + 0.5)
    cluster.store.down = False
    cluster.now = due + 0.5
    report = await a.renew()
    assert report.requests == 1 and a.owned == frozenset("01")
    assert a.deadline("0") == pytest.approx(due + 10.5)
    assert a.next_renewal() == pytest.approx(due + 0.5 + 6.5)


async def test_a_renewal_step_that_lost_to_another_worker_reports_the_loss() -> None:
    cluster = Cluster(2, strategy="cooperative", interval=2.0, expiry=10.0, renewal_steps=True)
    a = cluster.add("a")
    a.controls = cluster.store
    await cluster.settle()
    seen = {r.partition_id: r for r in await cluster.store.list_ownership(REF)}
    assert await cluster.store.claim_ownership([seen["1"].claimed_by("b")])  # behind a's back
    due = a.next_renewal()
    assert due is not None
    cluster.now = due
    report = await a.renew()
    assert [(e.kind, e.partition_id) for e in report.lost] == [(EventKind.LOST, "1")]
    assert "renewal refused" in report.lost[0].reason
    assert a.owned == frozenset("0") and not a.holds("1") and a.holds("0")
    assert (await cluster.owners())["1"] == "b"
    assert cluster.events[-1] == report.lost[0]  # reported like a cycle's loss


async def test_a_release_after_a_renewal_step_carries_the_fresh_etag_and_wins() -> None:
    cluster = Cluster(2, strategy="cooperative", interval=2.0, expiry=10.0, renewal_steps=True)
    a = cluster.add("a")
    a.controls = cluster.store
    await cluster.settle()
    due = a.next_renewal()
    assert due is not None
    cluster.now = due
    await a.renew()
    event = await a.release("0")
    assert event is not None and event.kind is EventKind.RELEASE
    assert "0" not in await cluster.owners()


async def test_renewal_steps_gather_leases_claimed_cycles_apart_into_one_write() -> None:
    # balanced claims one partition a cycle: three leases 2 s apart. A renewal takes every lease at least
    # half as old as a due one, and from then on they are renewed together (balanced judges by its own
    # clock: a renewal period is a quarter of the expiry, CLOCK_RENEW_SHARE).
    cluster = Cluster(3, strategy="balanced", interval=2.0, expiry=10.0, renewal_steps=True)
    a = cluster.add("a")
    await cluster.settle()
    await cluster.cycle(15)
    steps = [(round(t - cluster.renewed[0][0], 3), spent) for t, _, spent in cluster.renewed]
    assert all(spent == 1 for _, spent in steps)
    assert len(a.owned) == 3 and len({a.deadline(p) for p in a.owned}) == 1  # one group now
    assert a.share == CLOCK_RENEW_SHARE
    assert len(steps) <= 2 + 30 / (a.share * 10.0)  # a step or two to gather them, then one a renewal period


async def test_with_renewal_steps_a_crashed_holder_is_replaced_within_the_expiry_and_one_interval() -> None:
    cluster = Cluster(4, strategy="cooperative", interval=2.0, expiry=10.0, renewal_steps=True)
    for name in ("a", "b"):
        cluster.add(name).controls = cluster.store
    await cluster.settle()
    await cluster.cycle(5)
    due = cluster.workers["a"].next_renewal()
    assert due is not None
    await cluster.advance(due - cluster.now + 0.01)  # just renewed: the worst case for detection
    crashed_at = cluster.now
    cluster.crash("a")
    while sorted((await cluster.owners()).values()) != ["b"] * 4:
        await cluster.cycle()
        assert cluster.now - crashed_at <= 10.0 + 2.0 + 2.0, "slower than expiry + one interval (+ the cycle step)"


@pytest.mark.parametrize("share", [0.0, 1.0, 1.5, -0.1, math.nan])
def test_a_renewal_share_outside_0_to_1_is_refused_in_one_line(share: float) -> None:
    async def partitions() -> tuple[str, ...]:
        return partition_ids(2)

    with pytest.raises(ValueError, match=r"renew_share .* more than 0 and less than 1, got") as caught:
        Coordinator(
            REF,
            "a",
            MemoryStore(),
            partitions,
            get_strategy("cooperative"),
            expiry=10.0,
            renew_share=share,
            rng=random.Random(0),
        )
    assert "\n" not in str(caught.value)


def test_the_renewal_share_is_what_the_bench_target_needs() -> None:
    # 2 idle workers, 8 partitions, a listing a cycle at 2 s: 60 listings + 8 * 60 / (0.65 * 10) renewals
    # a minute, about 134, under half of Microsoft's 270-odd (a listing and 8 renewals a cycle).
    assert 60 + 8 * 60 / (RENEW_SHARE * 10.0) <= 0.5 * (30 * 2 + 8 * 30)
