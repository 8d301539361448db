"""The change-feed contract (``balancer.changes``): what every store that reads only what changed must do.

Mixed into the contract classes of the stores that have a feed (memory, SQLite, PostgreSQL, Redis; not
Blob, where a listing is one request either way). Besides ``StoreContract``'s hooks a class provides:

- ``delete_by_hand(store, pid)``: remove one ownership record of ``REF`` behind the store's back, as an
  operator's tool would (raw SQL, redis-cli);
- ``start_over(store)``: what a store that lost its data does (a FLUSHALL, a restart without
  persistence, tables emptied): afterwards the store holds nothing of ``REF``; returns the store to
  use from then on.

The bar everywhere: the copy a worker keeps from the changes is exactly the table a full listing
gives, records and order, whatever interleaving of writers came before.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import replace
from typing import Any

import pytest

from balancer.changes import ChangeFeed, OwnershipTable, read
from balancer.model import Control, ControlKind, Member, OwnershipRecord, partition_ids
from balancer.protocol import OwnershipStore

from .base import REF, Store

PARTITIONS = 12


def ticking() -> Any:
    """A local monotonic clock that never reaches a safety-net resync (the table never gets that old)."""
    return lambda: 0.0


async def brought_up_to_date(
    store: Store, table: OwnershipTable, stale_after: float | None = None
) -> tuple[list[OwnershipRecord], bool]:
    """``table`` after reading ``store``'s changes, and whether that read was a delta (not full)."""
    done = await read(store, REF, table, ticking(), stale_after)
    assert done.ownership is not None, "the copy disagreed with the store even after a full read"
    return done.ownership, not done.changes.full


def assert_agrees(copy: list[OwnershipRecord], table: OwnershipTable, listed: list[OwnershipRecord]) -> None:
    """The copy is the listing, record for record and in its order; after a delta that left renewals out
    (``table.fresh_after``), every record has the listing's owner and level, those the delta brought
    are the listing's own, and every other one was last written at or after the bound in the store."""
    if table.fresh_after is None:
        assert as_listed(copy) == as_listed(listed)
        return
    assert [(r.partition_id, r.owner_id, r.owner_level) for r in copy] == [
        (r.partition_id, r.owner_id, r.owner_level) for r in listed
    ]
    for mine, theirs in zip(copy, listed, strict=True):
        if mine.partition_id in table.exact:
            assert as_listed([mine]) == as_listed([theirs])
        else:
            assert theirs.last_modified is not None and theirs.last_modified >= table.fresh_after, (mine, theirs)


async def kept_as_listed(store: Store, table: OwnershipTable, kind: str, seen: Callable[[Any], Any]) -> Any:
    """``table`` brought up to date: its ``kind`` ("members" or "controls") are what the store lists
    (as ``seen`` shows each), and the ``Changes`` read are returned."""
    done = await read(store, REF, table, ticking())
    listed = await getattr(store, f"list_{kind}")(REF)
    assert [seen(row) for row in getattr(table, kind)] == [seen(row) for row in listed]
    return done.changes


def as_listed(records: list[OwnershipRecord]) -> list[tuple[str, str, str | None, float | None, int]]:
    return [(r.partition_id, r.owner_id, r.etag, r.last_modified, r.owner_level) for r in records]


def request(rng: random.Random, seen: dict[str, OwnershipRecord], name: str) -> list[OwnershipRecord]:
    """One writer's random request, from the records it last saw: first claims, releases, renewals and
    steals (a steal or renewal with a stale ETag loses)."""
    out = []
    for pid in rng.sample(partition_ids(PARTITIONS), rng.randint(1, 4)):
        current = seen.get(pid)
        if current is None:
            out.append(OwnershipRecord(REF, pid, name))
        elif rng.random() < 0.2:
            out.append(replace(current, owner_id=""))  # a release (won only if nobody wrote it since)
        else:
            out.append(current.claimed_by(name))  # a renewal, or a steal
    return out


class ChangeFeedContract:
    """Async tests of ``ChangeFeed``; the class it is mixed into provides the store (see above)."""

    async def delete_by_hand(self, store: Store, partition_id: str) -> None:
        raise NotImplementedError

    async def start_over(self, store: Store) -> Store:
        raise NotImplementedError

    # Whether a read lists no member or control when none was written since the cursor
    # (``Changes.members_full``), and whether it then lists only the rows written (SQL; Redis lists
    # the whole hash again).
    members_since = False
    members_by_row = False

    async def test_a_first_read_is_whole_and_the_next_ones_bring_only_what_changed(self, store: Store) -> None:
        assert isinstance(store, ChangeFeed) and isinstance(store, OwnershipStore)
        first = await store.snapshot_since(REF, None)
        assert first.full and first.ownership == []
        won = await store.claim_ownership([OwnershipRecord(REF, p, "a") for p in partition_ids(10)])
        whole = await store.snapshot_since(REF, first.cursor)
        assert whole.cursor is not None and len(whole.ownership) == 10
        renewed = await store.claim_ownership([won[3], won[7]])
        changed = await store.snapshot_since(REF, whole.cursor)
        assert not changed.full
        assert as_listed(changed.ownership) == as_listed(renewed)
        quiet = await store.snapshot_since(REF, changed.cursor)
        assert not quiet.full and quiet.ownership == [] and quiet.now >= changed.now

    @pytest.mark.parametrize("stale_after", [None, 3600.0, 0.05])
    async def test_the_copy_kept_from_changes_is_the_full_listing_after_random_interleavings_of_writers(
        self, store: Store, stale_after: float | None
    ) -> None:
        # Three writers (each its own connection) claim free partitions, steal with the ETag they last
        # saw (often stale: it loses), renew and release what they hold, one at a time and in bursts
        # sent together; three readers keep copies, read at random moments. After every read, each
        # copy is the full listing, record for record and in its order; a reader that leaves renewals
        # out (``stale_after``: an hour, so none is listed for its age, or 50 ms, so some are) has
        # a copy that agrees with it (``assert_agrees``).
        deltas = 0
        for seed in range(3):
            rng = random.Random(seed)
            async with AsyncExitStack() as stack:
                writers = [await stack.enter_async_context(self.connect(store)) for _ in range(3)]  # type: ignore[attr-defined]
                names = [f"w{seed}-{i}" for i in range(3)]
                seen: dict[str, OwnershipRecord] = {}
                tables = [OwnershipTable(math.inf) for _ in range(3)]

                for _ in range(25):
                    roll = rng.random()
                    if roll < 0.4:
                        i = rng.randrange(3)
                        for record in await writers[i].claim_ownership(request(rng, seen, names[i])):
                            seen[record.partition_id] = record
                    elif roll < 0.6:
                        results = await asyncio.gather(
                            *(w.claim_ownership(request(rng, seen, names[i])) for i, w in enumerate(writers))
                        )
                        for won in results:
                            for record in won:
                                seen[record.partition_id] = record
                    elif roll < 0.7:
                        seen = {r.partition_id: r for r in await store.list_ownership(REF)}
                    else:
                        table = rng.choice(tables)
                        copy, delta = await brought_up_to_date(store, table, stale_after)
                        deltas += delta
                        assert_agrees(copy, table, await store.list_ownership(REF))
                for table in tables:
                    copy, delta = await brought_up_to_date(store, table, stale_after)
                    deltas += delta
                    assert_agrees(copy, table, await store.list_ownership(REF))
        assert deltas >= 20, "the readers hardly ever read a delta: the test proves nothing"

    async def test_a_reader_that_leaves_renewals_out_reads_owner_changes_and_what_nobody_wrote_lately(
        self, store: Store
    ) -> None:
        # With ``stale_after`` a store that can leaves renewals out of a delta: it lists the records
        # whose owner or owner level changed, and every record last written more than ``stale_after``
        # ago, with its current ETag; ``fresh_after`` bounds the others. One that cannot reads every
        # write and says nothing was left out.
        first = await store.snapshot_since(REF, None, 3600.0)
        won = await store.claim_ownership([OwnershipRecord(REF, p, "a") for p in partition_ids(6)])
        base = await store.snapshot_since(REF, first.cursor, 3600.0)
        await store.claim_ownership([won[1], won[2]])  # renewals
        await store.claim_ownership([replace(won[3], owner_id="")])  # a release
        await store.claim_ownership([replace(won[4], owner_level=2)])  # the same owner, another level
        await store.claim_ownership([won[5].claimed_by("b")])  # a steal
        quiet = await store.snapshot_since(REF, base.cursor, 3600.0)
        listed = {r.partition_id: r for r in await store.list_ownership(REF)}
        assert not quiet.full
        if quiet.fresh_after is None:
            assert {r.partition_id for r in quiet.ownership} == {"1", "2", "3", "4", "5"}
        else:
            assert as_listed(quiet.ownership) == as_listed([listed[p] for p in ("3", "4", "5")])
            assert all(listed[p].last_modified >= quiet.fresh_after for p in ("0", "1", "2"))
        # A bound past every write: every record is listed, as the store holds it.
        aged = await store.snapshot_since(REF, quiet.cursor, -60.0)
        if aged.fresh_after is not None:
            assert as_listed(aged.ownership) == as_listed(list(listed.values()))

    async def test_expired_records_nobody_writes_stay_in_the_copy_as_they_are_in_the_store(self, store: Store) -> None:
        table = OwnershipTable(math.inf)
        held = await store.claim_ownership([OwnershipRecord(REF, p, "gone") for p in partition_ids(6)])
        await brought_up_to_date(store, table)
        await store.claim_ownership([OwnershipRecord(REF, "6", "alive")])
        copy, delta = await brought_up_to_date(store, table)
        assert delta
        assert as_listed(copy[:6]) == as_listed(held)  # unwritten, not dropped: their age still counts
        assert [r.partition_id for r in copy] == [*partition_ids(7)]

    async def test_a_record_deleted_behind_the_stores_back_makes_the_copy_read_everything(self, store: Store) -> None:
        table = OwnershipTable(math.inf)
        await store.claim_ownership([OwnershipRecord(REF, p, "a") for p in partition_ids(5)])
        await brought_up_to_date(store, table)
        await self.delete_by_hand(store, "2")
        copy, _ = await brought_up_to_date(store, table)
        assert [r.partition_id for r in copy] == ["0", "1", "3", "4"]
        assert as_listed(copy) == as_listed(await store.list_ownership(REF))

    @pytest.mark.parametrize("writes_after", [2, 40])
    async def test_a_cursor_from_before_the_store_started_over_reads_everything(
        self, store: Store, writes_after: int
    ) -> None:
        # 2: the store's counter is now behind the cursor (it went back); 40: past it again, so a
        # cursor judged by its number alone would read only the records written after that number.
        table = OwnershipTable(math.inf)
        await store.claim_ownership([OwnershipRecord(REF, p, "before") for p in partition_ids(8)])
        for _ in range(2):
            await store.claim_ownership(await store.list_ownership(REF))
        await brought_up_to_date(store, table)
        store = await self.start_over(store)
        assert await store.list_ownership(REF) == []
        await store.claim_ownership([OwnershipRecord(REF, "9", "after")])
        for _ in range(writes_after - 1):
            await store.claim_ownership(await store.list_ownership(REF))
        copy, delta = await brought_up_to_date(store, table)
        assert not delta
        assert [(r.partition_id, r.owner_id) for r in copy] == [("9", "after")]
        assert as_listed(copy) == as_listed(await store.list_ownership(REF))

    async def test_the_members_kept_from_changes_are_the_listing_through_joins_heartbeats_and_leaves(
        self, store: Store
    ) -> None:
        # The copy's members (``OwnershipTable.members``) are the store's listing after every read,
        # whether the store lists them whole or only those written since the cursor.
        table = OwnershipTable(math.inf)

        async def agrees() -> Any:
            return await kept_as_listed(store, table, "members", lambda m: (m.owner_id, m.last_seen, m.info))

        await store.claim_ownership([OwnershipRecord(REF, "0", "a")])  # a hub some store knows only once written
        for name in ("a", "b", "c"):
            await store.heartbeat(Member(REF, name, 0.0, {"n": "1"}))
        assert (await agrees()).full
        quiet = await agrees()
        assert not quiet.full
        if self.members_since:  # nothing written since: no member read again
            assert quiet.members == [] and not quiet.members_full
        await store.heartbeat(Member(REF, "b", 0.0, {"n": "2"}))
        changed = await agrees()
        if self.members_by_row:
            assert [m.owner_id for m in changed.members] == ["b"] and not changed.members_full
        await store.remove_member(REF, "a")
        await agrees()
        await store.heartbeat(Member(REF, "d", 0.0))
        await agrees()
        # One leaves and another joins between two reads: the count alone stays the same.
        await store.remove_member(REF, "c")
        await store.heartbeat(Member(REF, "e", 0.0))
        await agrees()
        assert [m.owner_id for m in table.members] == ["b", "d", "e"]
        await agrees()

    async def test_the_controls_kept_from_changes_are_the_listing_through_puts_and_deletes(self, store: Store) -> None:
        table = OwnershipTable(math.inf)

        async def agrees() -> Any:
            return await kept_as_listed(store, table, "controls", lambda c: (c.kind, c.target, c.value))

        await store.claim_ownership([OwnershipRecord(REF, "0", "a")])
        await store.put_control(Control(REF, ControlKind.PIN, "3", "w1"))
        await store.put_control(Control(REF, ControlKind.DRAIN, "w2"))
        assert (await agrees()).full
        quiet = await agrees()
        if self.members_since:  # nothing written since: no control read again
            assert quiet.controls == [] and not quiet.controls_full
        await store.put_control(Control(REF, ControlKind.PIN, "3", "w9"))
        moved = await agrees()
        if self.members_by_row:
            assert [(c.target, c.value) for c in moved.controls] == [("3", "w9")] and not moved.controls_full
        await store.delete_control(REF, ControlKind.DRAIN.value, "w2")
        await agrees()
        await store.delete_control(REF, ControlKind.PIN.value, "3")
        await store.put_control(Control(REF, ControlKind.PIN, "4", "w1"))
        await agrees()
        assert [(c.kind, c.target) for c in table.controls] == [(ControlKind.PIN, "4")]
