"""The coordinator loop: concurrency rule, ETag retry loop, losses, releases and the local lease."""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace

import pytest

from balancer.errors import StoreUnavailable
from balancer.lease import Coordinator
from balancer.model import EventKind, OwnershipRecord
from balancer.protocol import Driver
from balancer.strategies import Claim, Plan, Strategy, View

from .cluster import REF, Cluster


def scripted(*plans: Plan) -> Strategy:
    """A strategy that returns the given plans in turn, then nothing."""
    queue = list(plans)

    def plan(view: View, rng: random.Random) -> Plan:
        return queue.pop(0) if queue else Plan()

    return Strategy("scripted", plan, store_clock=False, summary="test")


async def test_two_workers_claiming_the_same_partition_at_once_exactly_one_wins() -> None:
    # The concurrency rule of 000: both send the ETag they saw (none); the store's compare-and-set
    # lets one through and the other claim fails without error.
    cluster = Cluster(1)
    a, b = cluster.add("a"), cluster.add("b")
    listed_a = await cluster.store.list_ownership(REF)
    listed_b = await cluster.store.list_ownership(REF)
    assert listed_a == listed_b == []
    won_a = await cluster.store.claim_ownership([OwnershipRecord(REF, "0", "a")])
    won_b = await cluster.store.claim_ownership([OwnershipRecord(REF, "0", "b")])
    assert [r.owner_id for r in won_a + won_b] == ["a"]
    # and through the coordinators: whichever cycles first wins, the other gains nothing
    cluster2 = Cluster(1)
    a, b = cluster2.add("a"), cluster2.add("b")
    reports = [await a.cycle(), await b.cycle()]
    assert [len(r.owned) for r in reports] == [1, 0]
    assert [e.kind for e in cluster2.events] == [EventKind.CLAIM]


async def test_a_claim_with_a_stale_etag_loses_and_changes_nothing() -> None:
    cluster = Cluster(1)
    [first] = await cluster.store.claim_ownership([OwnershipRecord(REF, "0", "a")])
    [renewed] = await cluster.store.claim_ownership([first])
    assert renewed.etag != first.etag
    assert await cluster.store.claim_ownership([first.claimed_by("b")]) == []
    assert [r.owner_id for r in await cluster.store.list_ownership(REF)] == ["a"]


async def test_etag_retry_loop_retries_while_the_old_owner_only_renewed() -> None:
    # 000 "ETag and checkpoint": the victim renews between the stealer's listing and its claim, so
    # the ETag moved but the owner did not; the stealer re-reads and tries again with the new ETag.
    cluster = Cluster(1)
    [held] = await cluster.store.claim_ownership([OwnershipRecord(REF, "0", "victim")])
    stale_view = held
    await cluster.store.claim_ownership([held])  # the victim's renewal moves the ETag
    steal = Claim("0", EventKind.STEAL, stale_view, "test steal")
    stealer = cluster.add("stealer")
    stealer.strategy = scripted(Plan(claims=(steal,)))
    report = await stealer.cycle()
    assert report.owned == {"0"}
    assert [(e.kind, e.previous_owner) for e in cluster.events] == [(EventKind.STEAL, "victim")]


async def test_etag_retry_loop_stops_when_a_third_worker_won() -> None:
    cluster = Cluster(1)
    [held] = await cluster.store.claim_ownership([OwnershipRecord(REF, "0", "victim")])
    await cluster.store.claim_ownership([held.claimed_by("third")])
    stealer = cluster.add("stealer")
    stealer.strategy = scripted(Plan(claims=(Claim("0", EventKind.STEAL, held, "test"),)))
    before = cluster.store.requests
    report = await stealer.cycle()
    # list, claim, then one re-read that shows the third owner: no second claim is sent
    assert cluster.store.requests - before == 3
    assert report.owned == frozenset()
    assert [r.owner_id for r in await cluster.store.list_ownership(REF)] == ["third"]
    assert cluster.events == []


async def test_a_worker_notices_its_partition_was_taken_and_reports_it_lost() -> None:
    cluster = Cluster(2)
    a = cluster.add("a")
    await cluster.cycle(2)
    assert a.owned == {"0", "1"}
    listed = {r.partition_id: r for r in await cluster.store.list_ownership(REF)}
    await cluster.store.claim_ownership([listed["1"].claimed_by("b")])
    await a.cycle()
    assert a.owned == {"0"}
    lost = [e for e in cluster.events if e.kind is EventKind.LOST]
    assert [(e.partition_id, e.previous_owner, e.owner_id) for e in lost] == [("1", "a", "b")]


async def test_holds_turns_false_once_the_lease_could_have_expired_without_renewal() -> None:
    cluster = Cluster(1, expiry=30.0)
    a = cluster.add("a")
    renewed_at = cluster.now
    await cluster.cycle()
    assert a.holds("0")
    cluster.now = renewed_at + 29.0
    assert a.holds("0")
    cluster.now = renewed_at + 31.0  # e.g. the process was stopped: no renewal was sent in time
    assert not a.holds("0")
    assert not a.holds("1")


async def test_release_all_lets_another_worker_claim_at_once_not_after_expiry() -> None:
    cluster = Cluster(4, expiry=300.0)
    a = cluster.add("a")
    await cluster.cycle(4)
    events = await a.release_all()
    assert {e.kind for e in events} == {EventKind.RELEASE} and a.owned == frozenset()
    assert not any(e.handoff for e in events)  # a shutdown, not a planned handoff
    cluster.crash("a")
    b = cluster.add("b")
    await cluster.cycle(4)  # 40 s, far below the 300 s expiry
    assert b.owned == {"0", "1", "2", "3"}
    claims = [e for e in cluster.events if e.kind is EventKind.CLAIM and e.owner_id == "b"]
    assert {e.reason for e in claims} == {"released"}


async def test_planned_release_hands_the_partition_off() -> None:
    cluster = Cluster(1)
    a = cluster.add("a")
    await cluster.cycle()
    a.strategy = scripted(Plan(releases=("0",)))
    report = await a.cycle()
    assert report.owned == frozenset()
    [record] = await cluster.store.list_ownership(REF)
    assert record.owner_id == "" and cluster.events[-1].kind is EventKind.RELEASE


async def test_renewal_refreshes_the_etag_it_listed() -> None:
    # A renewal must carry the ETag of the current listing, not the one won long ago.
    cluster = Cluster(1)
    a = cluster.add("a")
    await cluster.cycle()
    [record] = await cluster.store.list_ownership(REF)
    await cluster.store.claim_ownership([replace(record)])  # some other write by "a"'s own hand
    await a.cycle()
    assert a.owned == {"0"}
    assert not [e for e in cluster.events if e.kind is EventKind.LOST]


async def test_one_cycle_costs_one_list_and_one_claim_request_in_steady_state() -> None:
    cluster = Cluster(8)
    for w in "ab":
        cluster.add(w)
    await cluster.settle()
    report = await cluster.workers["a"].cycle()
    assert report.requests == 2


def test_every_core_module_but_the_adapters_imports_without_django_or_an_sdk() -> None:
    # import-linter (`make lint`) checks the import statements; this checks what really gets imported,
    # lazy imports included, for every module of the core that is not an adapter of a client library.
    adapters = {
        "balancer.stores.redis.connection",
        "balancer.stores.redis.notices",
        "balancer.stores.redis.store",
        "balancer.stores.blob.checkpoints",
        "balancer.stores.blob.service",
        "balancer.stores.blob.store",
        "balancer.race.redis",
    }
    code = (
        "import importlib, pkgutil, sys\n"
        "for name in ('django', 'channels', 'azure', 'redis', 'pyspark', 'prometheus_client'):\n"
        "    sys.modules[name] = None\n"
        "import balancer\n"
        f"adapters = {sorted(adapters)!r}\n"
        "names = [m.name for m in pkgutil.walk_packages(balancer.__path__, 'balancer.') if m.name not in adapters]\n"
        "for name in names: importlib.import_module(name)\n"
        "print(len(names))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) >= 25  # every module of the core was imported, not an empty walk


def test_coordinator_is_a_plain_dataclass_with_injected_time() -> None:
    fields = Coordinator.__dataclass_fields__
    assert {"clock", "monotonic", "rng"} <= set(fields)


async def test_a_drivers_handoff_hook_is_told_of_a_planned_move_unless_the_coordinator_was_built_with_its_own() -> None:
    cluster = Cluster(2, expiry=30.0)
    own: list[str] = []
    a, b = cluster.add("a"), cluster.add("b", on_handoff=own.append)
    await cluster.cycle(2)
    [held_a], [held_b] = a.owned, b.owned
    driven: list[str] = []
    driver = Driver(on_handoff=driven.append)
    a.strategy, b.strategy = scripted(Plan(releases=(held_a,))), scripted(Plan(releases=(held_b,)))
    await a.cycle(driver)
    await b.cycle(driver)
    assert driven == [held_a] and own == [held_b]
    assert a.handing_off(held_a) and a.holds(held_a) and b.handing_off(held_b) and b.holds(held_b)
    a.strategy = scripted(Plan(releases=(held_a,)))
    await a.cycle()  # a driver that hands nothing off: released in the cycle itself
    assert a.owned == frozenset() and driven == [held_a]


async def test_with_a_handoff_hook_the_lease_is_kept_until_the_runtime_releases_it() -> None:
    cluster = Cluster(1, expiry=30.0)
    started: list[str] = []
    a = cluster.add("a", on_handoff=started.append)
    await cluster.cycle()
    a.strategy = scripted(Plan(releases=("0",)), Plan(releases=("0",)), Plan(releases=("0",)))
    await cluster.cycle(3)  # 30 s: renewed every cycle while the pump winds down
    assert started == ["0"] and a.handing_off("0") and a.holds("0")
    [record] = await cluster.store.list_ownership(REF)
    assert record.owner_id == "a" and not record.expired(cluster.now, 30.0)
    event = await a.release("0")
    assert event is not None and event.kind is EventKind.RELEASE and event.handoff
    assert not a.handing_off("0") and a.owned == frozenset()
    [record] = await cluster.store.list_ownership(REF)
    assert record.owner_id == ""


async def test_release_many_hands_partitions_over_in_one_request() -> None:
    cluster = Cluster(4, expiry=30.0)
    a = cluster.add("a")
    await cluster.cycle(4)
    assert a.owned == {"0", "1", "2", "3"}
    [taken] = [r for r in await cluster.store.list_ownership(REF) if r.partition_id == "2"]
    await cluster.store.claim_ownership([replace(taken, owner_id="b")])  # behind a's back
    requests: list[list[OwnershipRecord]] = []
    claim = cluster.store.claim_ownership

    async def counted(records: Sequence[OwnershipRecord]) -> list[OwnershipRecord]:
        requests.append(list(records))
        return await claim(records)

    cluster.store.claim_ownership = counted  # type: ignore[method-assign]
    events = await a.release_many(["2", "0", "1", "9"], "handed off")
    assert len(requests) == 1 and sorted(r.partition_id for r in requests[0]) == ["0", "1", "2"]
    assert [(e.partition_id, e.kind, e.handoff) for e in events] == [
        ("2", EventKind.LOST, False),
        ("0", EventKind.RELEASE, True),
        ("1", EventKind.RELEASE, True),
    ]
    assert a.owned == {"3"}
    owners = {r.partition_id: r.owner_id for r in await cluster.store.list_ownership(REF)}
    assert owners == {"0": "", "1": "", "2": "b", "3": "a"}


async def test_release_many_keeps_every_lease_when_the_store_is_down() -> None:
    cluster = Cluster(2, expiry=30.0)
    a = cluster.add("a")
    await cluster.cycle(2)

    async def down(records: Sequence[OwnershipRecord]) -> list[OwnershipRecord]:
        raise StoreUnavailable("down")

    claim, cluster.store.claim_ownership = cluster.store.claim_ownership, down  # type: ignore[method-assign]
    with pytest.raises(StoreUnavailable):
        await a.release_many(["0", "1"])
    assert a.owned == {"0", "1"}  # kept: renewed next cycle, the handoff planned again
    cluster.store.claim_ownership = claim  # type: ignore[method-assign]
    assert [e.kind for e in await a.release_many(["0", "1"])] == [EventKind.RELEASE] * 2


async def _b_waits_for_a() -> tuple[Cluster, Coordinator, Coordinator, str]:
    """a holds both partitions and never hands over (renews only); b has announced itself and waits
    for the partition the shared plan gives it: (cluster, a, b, that partition)."""
    cluster = Cluster(2, strategy="cooperative", expiry=30.0, interval=10.0)
    a = cluster.add("a")
    await a.cycle()
    await a.cycle()
    assert a.owned == {"0", "1"}
    a.strategy = scripted()  # renews what it holds, hands nothing over
    b = cluster.add("b")
    await b.cycle()  # announces itself
    cluster.now += 1.0
    await b.cycle()  # waits for the partition the shared plan gives it
    [waited] = list(b._waiting)
    return cluster, a, b, waited


async def test_the_handoff_timeout_runs_per_holder_not_from_the_first_holder_waited_for() -> None:
    # b waits for a partition a holds (a renews and never hands over: an older strategy). Just before
    # the timeout another holder, c, has it instead (here a record written for c; in the field a
    # worker that took it when a's lease ran out): b must wait for c afresh, not take it from c at
    # once on a's account (two live leases at once: found by the partition suite's store history).
    cluster, a, b, waited = await _b_waits_for_a()
    started = cluster.now
    cluster.now = started + 25.0
    await a.cycle()
    [record] = [r for r in await cluster.store.list_ownership(REF) if r.partition_id == waited]
    assert await cluster.store.claim_ownership([replace(record, owner_id="c")])
    cluster.now = started + 30.0  # a's timeout would be up
    await a.cycle()
    await b.cycle()
    owners = {r.partition_id: r.owner_id for r in await cluster.store.list_ownership(REF)}
    assert owners[waited] == "c" and waited not in b.owned
    assert not [e for e in cluster.events if e.kind is EventKind.STEAL]


async def test_a_receiver_absent_for_longer_than_the_expiry_waits_afresh_before_taking_over() -> None:
    # b waits for a partition a holds (a renews and never hands over). Then nothing shows b alive for
    # longer than the expiry (cut off: no cycle, no heartbeat): a may have counted it gone and taken back
    # what it was handing over, a new lease the store cannot tell from a renewal. Back, b must not take
    # the lease on the old account (a flapping link made it steal a lease claimed 0.3 s before); it
    # waits the whole timeout again, and only then takes over.
    cluster, a, b, waited = await _b_waits_for_a()
    started = cluster.now
    for step in (10.0, 20.0, 31.0):  # b absent for 31 s; a renews all along
        cluster.now = started + step
        await a.cycle()
    await b.cycle()  # the timeout (the expiry, 30 s) would be up, but b was gone meanwhile
    assert waited not in b.owned and not [e for e in cluster.events if e.kind is EventKind.STEAL]
    for step in (41.0, 51.0, 61.0):  # present: a heartbeat every cycle
        cluster.now = started + step
        await a.cycle()
        await b.cycle()
    assert waited in b.owned  # 30 s of waiting while present: the timeout takes over as before
    [steal] = [e for e in cluster.events if e.kind is EventKind.STEAL]
    assert steal.partition_id == waited and "did not hand over" in steal.reason


async def test_a_stolen_lease_is_handled_only_once_the_holders_own_lease_has_run_out() -> None:
    # b takes the partition a never handed over. a renewed it just before (its renewal steps run on
    # their own), and judges its lease by its own clock: it may handle events for up to one expiry
    # after its last renewal, hearing of the steal only at its next one. b owns the partition at
    # once but holds it (handles, checkpoints) only one expiry after its steal came back; a cycle
    # then starts its pump, and no quiet wait runs past that moment.
    cluster, a, b, waited = await _b_waits_for_a()
    started = cluster.now
    for step in (10.0, 20.0, 30.0):
        cluster.now = started + step
        await a.cycle()
        await b.cycle()
    [steal] = [e for e in cluster.events if e.kind is EventKind.STEAL]
    assert steal.partition_id == waited and waited in b.owned
    stolen_at = cluster.now
    assert a.holds(waited), "a renewed at the same moment: by its own clock it may still handle"
    assert not b.holds(waited) and b.fenced_until() == stolen_at + cluster.expiry
    cluster.now = stolen_at + 10.0
    await b.cycle()  # a renewal of the stolen lease keeps its fence
    assert waited in b.owned and not b.holds(waited)
    quiet = b.quiet_until(10.0)
    assert quiet is None or quiet <= stolen_at + cluster.expiry
    cluster.now = stolen_at + cluster.expiry - 0.001
    assert a.holds(waited) and not b.holds(waited)  # never both
    cluster.now = stolen_at + cluster.expiry
    assert not a.holds(waited) and b.holds(waited) and b.fenced_until() is None


async def test_a_stolen_lease_is_fenced_only_until_the_replaced_record_would_have_expired() -> None:
    # a last renewed 10 s before b's steal: by the store's clock its lease had 20 s left, and a's own
    # clock gives it no more. b is fenced for those 20 s, not a whole expiry (a record nobody renews,
    # a hand-edited owner say, is taken with almost no fence at all).
    cluster, a, b, waited = await _b_waits_for_a()
    started = cluster.now
    for step in (10.0, 20.0):
        cluster.now = started + step
        await a.cycle()
        await b.cycle()
    [record] = [r for r in await cluster.store.list_ownership(REF) if r.partition_id == waited]
    assert record.owner_id == "a" and record.last_modified is not None
    cluster.now = started + 31.0  # b's timeout is up; a has not written since
    await b.cycle()
    assert waited in b.owned and [e.kind for e in cluster.events if e.partition_id == waited][-1] is EventKind.STEAL
    until = record.last_modified + cluster.expiry
    assert cluster.now < until < cluster.now + cluster.expiry
    assert b.fenced_until() == pytest.approx(until)
    cluster.now = until - 0.001
    assert a.holds(waited) and not b.holds(waited)  # never both
    cluster.now = until
    assert not a.holds(waited) and b.holds(waited)
