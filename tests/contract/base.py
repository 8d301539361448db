"""The store contract: what every adapter of ``balancer.protocol`` must do, whatever holds the data.

Subclass ``StoreContract`` once per adapter (and per backing server) and provide:

- a ``store`` fixture yielding a fresh, empty store that serves all three protocols;
- ``connect(store)``: another client of the same backing data with its own connection, as an
  async context manager; the race test opens one per thread, each thread with its own event loop;
- ``damages``: the damages (``(kind, edit)`` pairs of ``EDITS``) the store can hold, a comment
  beside the declaration saying why each one left out cannot be; every test marked
  ``@pytest.mark.damage(kind, *edits)`` runs once per edit of its kind declared there, and a test
  none of whose edits is declared is not collected for that store (see conftest.py);
- ``corrupt(store, kind, key, edit)``: damage one record of ``REF`` as an operator's hand edit in
  that store's own tool would (raw SQL, redis-cli, blob metadata), for every damage declared.

Nothing here knows which adapter it tests. Tests name what holds.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from typing import Any, ClassVar

import pytest

from balancer.errors import OwnershipLost, StoreError
from balancer.model import RESET_OWNER, Checkpoint, Control, ControlKind, HubRef, Member, OwnershipRecord
from balancer.notices import Released, release_channel
from balancer.protocol import CheckpointStore, ControlStore, OwnershipStore, SnapshotStore, by_partition, snapshot
from tests.support.notices import listening
from tests.support.waiting import until

Store = Any  # one object serving OwnershipStore, CheckpointStore and ControlStore

REF = HubRef("contract.example", "sensors", "$Default")
# Keys that differ from REF in exactly one part of the scope.
NEIGHBOURS = (
    HubRef("contract.example", "sensors", "analytics"),
    HubRef("contract.example", "doorbells", "$Default"),
    HubRef("other.example", "sensors", "$Default"),
)
RACE_ROUNDS = 30

# The hand edits ``corrupt`` makes, by kind of record. Ownership (``key`` a partition id):
#   time:nan, time:inf, time:-inf, time:garbage (text), time:missing   last_modified replaced so
#   etag:garbage  the ETag replaced by GARBAGE_ETAG     etag:missing  the ETag removed (or emptied)
#   ghost         owner GHOST, ETag GARBAGE_ETAG, last_modified NaN (all at once, as in issue 14)
#   future        last_modified FUTURE (a number: valid, passed through for the balancer to judge)
#   unreadable    the record cannot be read at all (e.g. not JSON, no owner)
#   partition     a record is added under the partition id ``key``, which is none (e.g. "abc")
# Checkpoint (``key`` a partition id): time (last_modified not a number), sequence (sequence
# number not one). Member (``key`` an owner id): time (last_seen not a number), info (garbage).
EDITS = {
    "ownership": (
        "time:nan",
        "time:inf",
        "time:-inf",
        "time:garbage",
        "time:missing",
        "etag:garbage",
        "etag:missing",
        "ghost",
        "future",
        "unreadable",
        "partition",
    ),
    "checkpoint": ("time", "sequence"),
    "member": ("time", "info"),
}
Damage = tuple[str, str]  # (kind, edit): one hand edit of EDITS
DAMAGES: frozenset[Damage] = frozenset((kind, edit) for kind, edits in EDITS.items() for edit in edits)
GARBAGE_ETAG = "#!garbage etag, hand-edited!#"
GHOST = "ghost-of-a-hand-edit"
FUTURE = 4102444800.0  # 2100-01-01


def store_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The warnings the stores logged (not the SDKs')."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith(("balancer.", "dashboard."))
    ]


async def heard_after_publishing(channel: Any, notice: Released, heard: list[Released], what: str) -> None:
    """Publish ``notice`` until the listener filling ``heard`` has it (a subscription starts in the
    background, and one that was cut comes back after a backoff)."""

    async def got_it() -> bool:
        await channel.publish(notice)
        return notice in heard

    await until(got_it, what, 15, step=0.1)


class StoreContract:
    """The shared contract suite (async tests). Subclasses provide ``store``, ``connect``, ``damages``
    and ``corrupt``."""

    damages: ClassVar[frozenset[Damage]]  # what ``corrupt`` can do to this store (see the module docstring)
    notices: ClassVar[bool] = False  # whether the store has a release channel (``balancer.notices``)
    # whether a checkpoint below the stored one is refused (only an operator's reset moves it back)
    refuses_going_back: ClassVar[bool] = False

    @pytest.fixture
    async def store(self) -> AsyncIterator[Store]:
        raise NotImplementedError("a StoreContract subclass provides the store fixture")
        yield

    def connect(self, store: Store) -> AbstractAsyncContextManager[Store]:
        raise NotImplementedError("a StoreContract subclass provides connect()")

    async def corrupt(self, store: Store, kind: str, key: str, edit: str) -> None:
        """Damage ``kind``'s record ``key`` of ``REF`` by hand edit ``edit``, one of ``damages``."""
        raise NotImplementedError("a StoreContract subclass provides corrupt()")

    # helpers -------------------------------------------------------------------------------

    @staticmethod
    async def claim_one(store: Store, record: OwnershipRecord) -> OwnershipRecord | None:
        won = await store.claim_ownership([record])
        assert len(won) <= 1
        return won[0] if won else None

    @staticmethod
    async def listed(store: Store, ref: HubRef = REF) -> dict[str, OwnershipRecord]:
        records = await store.list_ownership(ref)
        assert len(records) == len({r.partition_id for r in records}), "one record per partition"
        return by_partition(records)

    # the protocols -------------------------------------------------------------------------

    async def test_the_store_serves_all_three_protocols(self, store: Store) -> None:
        assert isinstance(store, OwnershipStore)
        assert isinstance(store, CheckpointStore)
        assert isinstance(store, ControlStore)
        assert await store.list_ownership(REF) == []
        assert await store.list_checkpoints(REF) == []
        assert await store.list_members(REF) == []
        assert await store.list_controls(REF) == []

    # release notices -----------------------------------------------------------------------

    async def test_a_release_notice_reaches_a_listener_or_the_store_says_it_has_no_channel(self, store: Store) -> None:
        channel = release_channel(store, REF)
        if not self.notices:
            assert channel is None
            return
        assert channel is not None
        heard: list[Released] = []
        listener = listening(channel, heard)
        try:
            notice = Released(REF, ("0", "7"), "a")

            async def heard_one() -> bool:  # a listener subscribes in the background: say it until heard
                await channel.publish(notice)
                return notice in heard

            await until(heard_one, "the listener to hear a notice", 10, step=0.1)
            assert set(heard) == {notice}
            many = Released(REF, tuple(str(p) for p in range(2000)), "b")  # far past one NOTIFY's 8000 bytes
            await channel.publish(many)
            await until(
                lambda: {p for n in heard if n.by == "b" for p in n.partition_ids} == set(many.partition_ids),
                "every partition of a long notice",
                10,
            )
        finally:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)
            await channel.aclose()

    # ownership -----------------------------------------------------------------------------

    async def test_list_returns_exactly_what_was_claimed(self, store: Store) -> None:
        requests = [OwnershipRecord(REF, str(p), f"w{p % 3}", owner_level=p) for p in range(7)]
        won = await store.claim_ownership(requests)
        assert [(r.partition_id, r.owner_id, r.owner_level) for r in won] == [
            (r.partition_id, r.owner_id, r.owner_level) for r in requests
        ]
        assert all(r.etag and r.last_modified is not None for r in won)
        assert await self.listed(store) == by_partition(won)

    async def test_a_first_claim_wins_once_and_a_second_first_claim_loses(self, store: Store) -> None:
        first = await self.claim_one(store, OwnershipRecord(REF, "0", "a"))
        assert first is not None and first.owner_id == "a"
        assert await self.claim_one(store, OwnershipRecord(REF, "0", "b")) is None
        assert await self.claim_one(store, OwnershipRecord(REF, "0", "a")) is None
        assert await self.listed(store) == {"0": first}

    async def test_a_claim_with_a_stale_etag_loses_and_changes_nothing(self, store: Store) -> None:
        seen = await self.claim_one(store, OwnershipRecord(REF, "0", "a"))
        assert seen is not None
        renewed = await self.claim_one(store, seen)
        assert renewed is not None and renewed.etag != seen.etag
        assert await self.claim_one(store, seen.claimed_by("b")) is None
        assert await self.listed(store) == {"0": renewed}

    async def test_a_claim_with_an_etag_the_store_never_issued_loses(self, store: Store) -> None:
        assert await self.claim_one(store, OwnershipRecord(REF, "0", "a", etag="made-up")) is None
        held = await self.claim_one(store, OwnershipRecord(REF, "1", "a"))
        assert held is not None
        assert await self.claim_one(store, replace(held, owner_id="b", etag="made-up")) is None
        assert await self.listed(store) == {"1": held}

    async def test_every_winning_write_gets_a_new_etag(self, store: Store) -> None:
        record = await self.claim_one(store, OwnershipRecord(REF, "0", "a"))
        etags = set()
        for _ in range(5):
            assert record is not None
            etags.add(record.etag)
            previous = record
            record = await self.claim_one(store, record)
            assert record is not None and record.last_modified is not None
            assert previous.last_modified is not None and record.last_modified >= previous.last_modified
        assert len(etags) == 5

    async def test_a_claim_returns_only_the_records_it_won(self, store: Store) -> None:
        held = await store.claim_ownership([OwnershipRecord(REF, p, "a") for p in "0123"])
        stale = held[1]
        [moved] = await store.claim_ownership([stale])  # "a" renews 1: the ETag others saw is stale
        requests = [
            held[0].claimed_by("b"),  # current ETag: wins
            stale.claimed_by("b"),  # stale ETag: loses
            OwnershipRecord(REF, "2", "b"),  # first claim of an owned partition: loses
            held[3].claimed_by("b"),  # wins
            OwnershipRecord(REF, "4", "b"),  # first claim of a new partition: wins
        ]
        won = await store.claim_ownership(requests)
        assert [(r.partition_id, r.owner_id) for r in won] == [("0", "b"), ("3", "b"), ("4", "b")]
        listed = await self.listed(store)
        assert {p: r.owner_id for p, r in listed.items()} == {"0": "b", "1": "a", "2": "a", "3": "b", "4": "b"}
        assert listed["1"] == moved and listed["2"] == held[2]
        assert all(listed[r.partition_id] == r for r in won)

    async def test_of_two_concurrent_claims_of_one_partition_exactly_one_wins(self, store: Store) -> None:
        # Even rounds race two first claims (no ETag) of a new partition; odd rounds race two
        # steals carrying the same, current ETag. Each contender is a real thread with its own
        # event loop and its own client; a barrier releases them together.
        seen = await store.claim_ownership([OwnershipRecord(REF, str(i), "old") for i in range(1, RACE_ROUNDS, 2)])
        by_pid = by_partition(seen)
        contested = [by_pid.get(str(i), OwnershipRecord(REF, str(i), "")) for i in range(RACE_ROUNDS)]
        barrier = threading.Barrier(2, timeout=30)
        results: dict[str, list[list[OwnershipRecord]]] = {}
        errors: list[BaseException] = []

        async def contend(name: str) -> None:
            async with self.connect(store) as client:
                await client.list_ownership(REF)  # connect before the race starts
                for record in contested:
                    barrier.wait()
                    results[name].append(await client.claim_ownership([record.claimed_by(name)]))

        def run(name: str) -> None:
            results[name] = []
            try:
                asyncio.run(contend(name))
            except BaseException as exc:
                errors.append(exc)
                barrier.abort()

        threads = [threading.Thread(target=run, args=(name,)) for name in ("a", "b")]
        for thread in threads:
            thread.start()
        for thread in threads:
            await asyncio.to_thread(thread.join, 60)
        assert not errors, errors
        listed = await self.listed(store)
        for i in range(RACE_ROUNDS):
            winners = results["a"][i] + results["b"][i]
            assert len(winners) == 1, f"round {i}: {winners}"
            assert listed[str(i)] == winners[0]

    async def test_a_release_is_listed_as_released_and_another_worker_may_claim_it(self, store: Store) -> None:
        held = await self.claim_one(store, OwnershipRecord(REF, "0", "a"))
        assert held is not None
        released = await self.claim_one(store, held.claimed_by(""))
        assert released is not None and released.owner_id == "" and released.etag != held.etag
        listed = await self.listed(store)
        assert listed == {"0": released}
        assert listed["0"].expired(await store.now(), expiry=3600)
        assert await self.claim_one(store, held.claimed_by("b")) is None  # the ETag before the release
        taken = await self.claim_one(store, listed["0"].claimed_by("b"))
        assert taken is not None and taken.owner_id == "b"

    async def test_now_is_the_clock_last_modified_is_written_with(self, store: Store) -> None:
        before = await store.now()
        held = await self.claim_one(store, OwnershipRecord(REF, "0", "a"))
        after = await store.now()
        assert held is not None and held.last_modified is not None
        assert before <= held.last_modified <= after
        assert abs(after - time.time()) < 60  # seconds since the epoch, not some other scale
        checkpoint = await store.update_checkpoint(Checkpoint(REF, "0", 5), "a")
        await store.heartbeat(Member(REF, "a", 0.0))
        [member] = await store.list_members(REF)
        last = await store.now()
        assert checkpoint.last_modified is not None
        assert after <= checkpoint.last_modified <= member.last_seen <= last

    # checkpoints ---------------------------------------------------------------------------

    async def test_the_owners_checkpoint_update_stores_it_and_moves_last_modified(self, store: Store) -> None:
        assert await self.claim_one(store, OwnershipRecord(REF, "3", "a")) is not None
        first = await store.update_checkpoint(Checkpoint(REF, "3", 41, "4100"), "a")
        assert (first.sequence_number, first.offset) == (41, "4100") and first.last_modified is not None
        assert await store.list_checkpoints(REF) == [first]

        async def clock_moved() -> bool:
            return bool(await store.now() > first.last_modified)

        await until(clock_moved, "the store's clock to pass the first checkpoint's last_modified", 5)
        second = await store.update_checkpoint(Checkpoint(REF, "3", 42, None), "a")
        assert second.last_modified is not None and second.last_modified > first.last_modified
        assert await store.list_checkpoints(REF) == [second]

    async def test_a_checkpoint_update_by_a_worker_that_no_longer_owns_the_partition_raises_and_changes_nothing(
        self, store: Store
    ) -> None:
        held = await self.claim_one(store, OwnershipRecord(REF, "0", "a"))
        assert held is not None
        kept = await store.update_checkpoint(Checkpoint(REF, "0", 10, "1000"), "a")
        assert await self.claim_one(store, held.claimed_by("b")) is not None  # b steals it
        with pytest.raises(OwnershipLost) as lost:
            await store.update_checkpoint(Checkpoint(REF, "0", 99, "9900"), "a")
        assert (lost.value.partition_id, lost.value.caller, lost.value.current_owner) == ("0", "a", "b")
        assert "'a'" in str(lost.value) and "'b'" in str(lost.value) and "partition 0" in str(lost.value)
        assert await store.list_checkpoints(REF) == [kept]

    async def test_a_checkpoint_below_the_stored_one_is_refused_or_the_store_says_it_does_not_refuse_it(
        self, store: Store
    ) -> None:
        # A write sent before its worker was cut off, delivered after the heal, when that worker holds
        # the partition again: the owner's name matches, only the sequence gives it away.
        held = await self.claim_one(store, OwnershipRecord(REF, "0", "a"))
        assert held is not None
        await store.update_checkpoint(Checkpoint(REF, "0", 1499), "a")
        if self.refuses_going_back:
            with pytest.raises(StoreError, match="would go back from 1499 to 945: refused"):
                await store.update_checkpoint(Checkpoint(REF, "0", 945), "a")
            assert [c.sequence_number for c in await store.list_checkpoints(REF)] == [1499]
        else:
            await store.update_checkpoint(Checkpoint(REF, "0", 945), "a")  # the owner's check only
            assert [c.sequence_number for c in await store.list_checkpoints(REF)] == [945]
        assert await self.claim_one(store, held.claimed_by(RESET_OWNER)) is not None
        await store.update_checkpoint(Checkpoint(REF, "0", 10), RESET_OWNER)  # an operator's replay
        assert [c.sequence_number for c in await store.list_checkpoints(REF)] == [10]

    async def test_a_checkpoint_of_a_released_or_never_owned_partition_raises_and_writes_nothing(
        self, store: Store
    ) -> None:
        with pytest.raises(OwnershipLost) as never:
            await store.update_checkpoint(Checkpoint(REF, "0", 1), "a")
        assert never.value.current_owner is None
        held = await self.claim_one(store, OwnershipRecord(REF, "1", "a"))
        assert held is not None
        assert await self.claim_one(store, held.claimed_by("")) is not None
        with pytest.raises(OwnershipLost) as released:
            await store.update_checkpoint(Checkpoint(REF, "1", 1), "a")
        assert released.value.current_owner is None
        with pytest.raises(OwnershipLost):
            await store.update_checkpoint(Checkpoint(REF, "1", 1), "")  # "" owns nothing
        assert await store.list_checkpoints(REF) == []

    # scope ---------------------------------------------------------------------------------

    async def test_keys_of_another_hub_or_consumer_group_are_never_seen_or_touched(self, store: Store) -> None:
        mine = await store.claim_ownership([OwnershipRecord(REF, p, "a") for p in "01"])
        checkpoint = await store.update_checkpoint(Checkpoint(REF, "0", 7), "a")
        await store.heartbeat(Member(REF, "a", 0.0))
        await store.put_control(Control(REF, ControlKind.PIN, "0", "a"))
        for other in NEIGHBOURS:
            # the same partition ids, owners, members and controls, elsewhere
            theirs = await store.claim_ownership([OwnershipRecord(other, p, "a") for p in "012"])
            assert len(theirs) == 3  # a first claim there does not collide with REF's records
            await store.claim_ownership([theirs[0].claimed_by("")])
            await store.update_checkpoint(Checkpoint(other, "1", 1000), "a")
            await store.heartbeat(Member(other, "a", 0.0))
            await store.heartbeat(Member(other, "z", 0.0))
            await store.remove_member(other, "a")
            await store.put_control(Control(other, ControlKind.PIN, "0", "z"))
            await store.delete_control(other, "pin", "0")
            await store.put_control(Control(other, ControlKind.DRAIN, "a"))
            with pytest.raises(OwnershipLost):
                await store.update_checkpoint(Checkpoint(other, "0", 5), "a")  # released there
        assert await self.listed(store) == by_partition(mine)
        assert await store.list_checkpoints(REF) == [checkpoint]
        assert [m.owner_id for m in await store.list_members(REF)] == ["a"]
        assert [(c.kind, c.target, c.value) for c in await store.list_controls(REF)] == [(ControlKind.PIN, "0", "a")]
        for other in NEIGHBOURS:
            assert {r.partition_id: r.owner_id for r in await store.list_ownership(other)} == {
                "0": "",
                "1": "a",
                "2": "a",
            }
            assert [(c.partition_id, c.sequence_number) for c in await store.list_checkpoints(other)] == [("1", 1000)]
            assert [m.owner_id for m in await store.list_members(other)] == ["z"]
            assert [(c.kind, c.target) for c in await store.list_controls(other)] == [(ControlKind.DRAIN, "a")]

    # members and controls ------------------------------------------------------------------

    async def test_a_members_info_is_the_callers_own_on_the_way_in_and_out(self, store: Store) -> None:
        given = {"host": "h1"}
        await store.heartbeat(Member(REF, "w1", last_seen=0.0, info=given))
        given["host"] = "changed after the heartbeat"
        [listed] = await store.list_members(REF)
        listed.info["host"] = "changed by a reader"
        [again] = await store.list_members(REF)
        assert again.info == {"host": "h1"}

    async def test_members_round_trip(self, store: Store) -> None:
        before = await store.now()
        await store.heartbeat(Member(REF, "w1", last_seen=0.0, info={"host": "h1", "pid": "11"}))
        await store.heartbeat(Member(REF, "w2", last_seen=0.0))
        members = {m.owner_id: m for m in await store.list_members(REF)}
        assert set(members) == {"w1", "w2"}
        assert members["w1"].info == {"host": "h1", "pid": "11"} and members["w2"].info == {}
        assert all(m.last_seen >= before for m in members.values())  # store clock, not the caller's 0.0

        async def clock_moved() -> bool:
            return bool(await store.now() > members["w1"].last_seen)

        await until(clock_moved, "the store's clock to pass w1's last_seen", 5)
        await store.heartbeat(Member(REF, "w1", last_seen=0.0, info={"host": "h2"}))
        [w1] = [m for m in await store.list_members(REF) if m.owner_id == "w1"]
        assert w1.last_seen > members["w1"].last_seen and w1.info == {"host": "h2"}
        await store.remove_member(REF, "w2")
        await store.remove_member(REF, "never-seen")
        assert [m.owner_id for m in await store.list_members(REF)] == ["w1"]

    async def test_controls_round_trip(self, store: Store) -> None:
        before = await store.now()
        await store.put_control(Control(REF, ControlKind.DRAIN, "w1"))
        await store.put_control(Control(REF, ControlKind.PIN, "3", "w2"))
        await store.put_control(Control(REF, ControlKind.PIN, "4", "w2"))
        await store.put_control(Control(REF, ControlKind.REBALANCE, "*", "token-1"))
        await store.put_control(Control(REF, ControlKind.PIN, "3", "w3"))  # replaces the pin of 3
        await store.put_control(Control(REF, ControlKind.REBALANCE, "*", "token-2"))
        controls = await store.list_controls(REF)
        assert sorted((c.kind.value, c.target, c.value) for c in controls) == [
            ("drain", "w1", ""),
            ("pin", "3", "w3"),
            ("pin", "4", "w2"),
            ("rebalance", "*", "token-2"),
        ]
        assert all(c.ref == REF and c.created is not None and c.created >= before for c in controls)
        await store.delete_control(REF, "pin", "3")
        await store.delete_control(REF, ControlKind.DRAIN, "w1")
        await store.delete_control(REF, "pin", "not-there")
        assert sorted((c.kind.value, c.target) for c in await store.list_controls(REF)) == [
            ("pin", "4"),
            ("rebalance", "*"),
        ]

    async def test_a_snapshot_shows_what_the_separate_listings_show_in_one_request(self, store: Store) -> None:
        await store.claim_ownership([OwnershipRecord(REF, "0", "w1"), OwnershipRecord(REF, "1", "w2")])
        await store.update_checkpoint(Checkpoint(REF, "0", 5, "500"), "w1")  # must not show up as ownership
        await store.heartbeat(Member(REF, "w1", last_seen=0.0))
        await store.put_control(Control(REF, ControlKind.PIN, "1", "w1"))
        await store.put_control(Control(NEIGHBOURS[0], ControlKind.DRAIN, "w9"))
        before = await store.now()
        requests = getattr(store, "requests", None)
        one_read = isinstance(store, SnapshotStore)  # (not narrowing ``store``: it keeps its ``requests``)
        snap, counted = await snapshot(store, store, REF)
        if requests is not None and one_read:
            assert counted == 1 and store.requests - requests == 1
        assert by_partition(snap.ownership) == by_partition(await store.list_ownership(REF))
        assert [m.owner_id for m in snap.members] == ["w1"]
        assert [(c.kind, c.target, c.value) for c in snap.controls] == [(ControlKind.PIN, "1", "w1")]
        assert snap.now >= before

    # corrupt records: one costs only itself --------------------------------------------------

    async def listed_thrice(self, store: Store) -> dict[str, OwnershipRecord]:
        """Ownership listed twice and read once in a snapshot: all three must agree."""
        first = await self.listed(store)
        assert await self.listed(store) == first
        snap, _ = await snapshot(store, store, REF)
        assert by_partition(snap.ownership) == first
        return first

    @pytest.mark.damage("ownership", "time:nan", "time:inf", "time:-inf", "time:garbage", "time:missing", "ghost")
    async def test_a_record_whose_time_is_no_number_is_listed_expired_and_the_claim_with_its_etag_takes_it(
        self, store: Store, edit: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        stale, other = await store.claim_ownership([OwnershipRecord(REF, "0", "a"), OwnershipRecord(REF, "1", "a")])
        held = await self.claim_one(store, stale)
        assert held is not None
        await self.corrupt(store, "ownership", "0", edit)
        with caplog.at_level(logging.WARNING):
            listed = await self.listed_thrice(store)
        assert set(listed) == {"0", "1"} and listed["1"] == other
        corrupt = listed["0"]
        assert corrupt.last_modified is None and corrupt.expired(await store.now(), expiry=3600)
        assert corrupt.owner_id == (GHOST if edit == "ghost" else "a")
        assert corrupt.etag == (GARBAGE_ETAG if edit == "ghost" else held.etag)
        [warning] = store_warnings(caplog)  # once, though read three times
        assert "last_modified" in warning or "'modified'" in warning, warning
        # only the ETag listed takes it: a stale one, a made-up one or a first claim lose
        for loser in (
            stale.claimed_by("b"),
            replace(held, owner_id="b", etag="made-up"),
            OwnershipRecord(REF, "0", "b"),
        ):
            assert await self.claim_one(store, loser) is None
        taken = await self.claim_one(store, corrupt.claimed_by("b"))
        assert taken is not None and taken.owner_id == "b" and taken.last_modified is not None
        assert await self.listed(store) == {"0": taken, "1": other}

    @pytest.mark.damage("ownership", "etag:garbage", "etag:missing")
    async def test_a_record_whose_etag_is_garbage_is_listed_with_text_the_claim_carrying_it_wins_with(
        self, store: Store, edit: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        [stale] = await store.claim_ownership([OwnershipRecord(REF, "0", "a")])
        await self.corrupt(store, "ownership", "0", edit)
        with caplog.at_level(logging.WARNING):
            listed = (await self.listed_thrice(store))["0"]
        assert listed.owner_id == "a" and isinstance(listed.etag, str)
        if edit == "etag:garbage":
            assert listed.etag == GARBAGE_ETAG and store_warnings(caplog) == []  # text, as far as a store can tell
        else:
            assert len(store_warnings(caplog)) <= 1
        for loser in (
            stale.claimed_by("b"),
            replace(stale, owner_id="b", etag="made-up"),
            OwnershipRecord(REF, "0", "b"),
        ):
            assert await self.claim_one(store, loser) is None
        taken = await self.claim_one(store, listed.claimed_by("b"))
        assert taken is not None and taken.owner_id == "b"
        assert await self.listed(store) == {"0": taken}

    @pytest.mark.damage("ownership", "future")
    async def test_a_record_modified_in_the_future_is_passed_through_for_the_balancer_to_judge(
        self, store: Store, edit: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        await store.claim_ownership([OwnershipRecord(REF, "0", "a")])
        await self.corrupt(store, "ownership", "0", edit)
        with caplog.at_level(logging.WARNING):
            listed = (await self.listed_thrice(store))["0"]
        assert listed.last_modified == FUTURE and store_warnings(caplog) == []
        taken = await self.claim_one(store, listed.claimed_by("b"))
        assert taken is not None and taken.last_modified is not None and taken.last_modified < FUTURE

    @pytest.mark.damage("ownership", "unreadable")
    async def test_a_record_that_cannot_be_read_at_all_is_skipped_and_a_first_claim_replaces_it(
        self, store: Store, edit: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        [stale, other] = await store.claim_ownership([OwnershipRecord(REF, "0", "a"), OwnershipRecord(REF, "1", "a")])
        await self.corrupt(store, "ownership", "0", edit)
        with caplog.at_level(logging.WARNING):
            assert await self.listed_thrice(store) == {"1": other}
        assert len(store_warnings(caplog)) == 1
        # it looks never owned: a first claim takes it, one carrying an ETag does not
        for loser in (stale.claimed_by("b"), replace(stale, owner_id="b", etag="made-up")):
            assert await self.claim_one(store, loser) is None
        taken = await self.claim_one(store, OwnershipRecord(REF, "0", "b"))
        assert taken is not None and taken.owner_id == "b"
        assert await self.claim_one(store, OwnershipRecord(REF, "0", "c")) is None
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert await self.listed_thrice(store) == {"0": taken, "1": other}
        assert store_warnings(caplog) == []

    @pytest.mark.damage("ownership", "partition")
    async def test_a_record_whose_partition_id_is_none_is_skipped_with_one_warning(
        self, store: Store, edit: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        [held] = await store.claim_ownership([OwnershipRecord(REF, "0", "a")])
        await self.corrupt(store, "ownership", "abc", edit)
        with caplog.at_level(logging.WARNING):
            assert await self.listed_thrice(store) == {"0": held}
        [warning] = store_warnings(caplog)
        assert "abc" in warning, warning
        assert await self.claim_one(store, held) is not None  # the rest goes on as ever

    async def checkpoint_corrupted(self, store: Store, edit: str) -> Checkpoint:
        """Checkpoints of partitions 0 (at 7, "700") and 1 of worker "a", then ``edit`` done to 0's;
        returns 1's, untouched."""
        await store.claim_ownership([OwnershipRecord(REF, "0", "a"), OwnershipRecord(REF, "1", "a")])
        await store.update_checkpoint(Checkpoint(REF, "0", 7, "700"), "a")
        kept: Checkpoint = await store.update_checkpoint(Checkpoint(REF, "1", 9, "900"), "a")
        await self.corrupt(store, "checkpoint", "0", edit)
        return kept

    @pytest.mark.damage("checkpoint", "time")
    async def test_a_checkpoint_whose_time_is_no_number_keeps_its_position(
        self, store: Store, edit: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        kept = await self.checkpoint_corrupted(store, edit)
        with caplog.at_level(logging.WARNING):
            for _ in range(2):
                listed = {c.partition_id: c for c in await store.list_checkpoints(REF)}
                assert listed["1"] == kept
                assert (listed["0"].sequence_number, listed["0"].offset, listed["0"].last_modified) == (7, "700", None)
        assert len(store_warnings(caplog)) == 1
        written = await store.update_checkpoint(Checkpoint(REF, "0", 8, "800"), "a")
        assert written.last_modified is not None
        assert {c.partition_id: c for c in await store.list_checkpoints(REF)} == {"0": written, "1": kept}

    @pytest.mark.damage("checkpoint", "sequence")
    async def test_a_checkpoint_without_a_sequence_number_reads_as_absent_until_rewritten(
        self, store: Store, edit: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        # Absent, not an error: a reader that raised would stall its partition for good; absent, it
        # resumes from the processor's starting position, as a partition never checkpointed.
        kept = await self.checkpoint_corrupted(store, edit)
        with caplog.at_level(logging.WARNING):
            for _ in range(2):
                assert await store.list_checkpoints(REF) == [kept]
        assert len(store_warnings(caplog)) == 1
        written = await store.update_checkpoint(Checkpoint(REF, "0", 8, "800"), "a")
        assert sorted(await store.list_checkpoints(REF), key=lambda c: c.partition_id) == [written, kept]

    @pytest.mark.damage("member", *EDITS["member"])
    async def test_a_member_that_cannot_be_read_is_not_alive_until_its_next_heartbeat(
        self, store: Store, edit: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        await store.heartbeat(Member(REF, "w1", 0.0))
        await store.heartbeat(Member(REF, "w2", 0.0))
        await self.corrupt(store, "member", "w1", edit)
        with caplog.at_level(logging.WARNING):
            assert [m.owner_id for m in await store.list_members(REF)] == ["w2"]
            snap, _ = await snapshot(store, store, REF)
            assert [m.owner_id for m in snap.members] == ["w2"]
        assert len(store_warnings(caplog)) == 1
        await store.heartbeat(Member(REF, "w1", 0.0, {"pid": "1"}))
        now = await store.now()
        members = {m.owner_id: m for m in await store.list_members(REF)}
        assert set(members) == {"w1", "w2"} and members["w1"].alive(now, expiry=60)
