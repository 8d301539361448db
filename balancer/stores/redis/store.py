"""The Redis store's operations: ownership, checkpoints, heartbeats and controls, each a script or a
command sent over the connection of the running event loop (``connection``). How the records are
kept, compared and timed, and what a hand-edited record costs: see the package
(``balancer.stores.redis``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from balancer.changes import Changes
from balancer.errors import CorruptRecord, OwnershipLost, StoreError
from balancer.model import RESET_OWNER, Checkpoint, Control, ControlKind, HubRef, Member, OwnershipRecord
from balancer.protocol import Snapshot
from balancer.stores.unchanged import LastReads

from .connection import URL_ENV, Connection, RedisConnections, describe_url
from .layout import CHANGES, Keys, scope
from .notices import RedisReleaseChannel
from .records import Skipped, parse_checkpoint, parse_control, parse_member, parse_ownership, server_time, text, texts

__all__ = ["URL_ENV", "Connection", "Keys", "RedisStore", "describe_url", "scope"]


class RedisStore(RedisConnections):
    """Every store protocol on one Redis database (``url``: ``redis://[:password@]host:port/db``).

    ``requests`` counts round trips to Redis; ``corrupt`` lists the records the latest listings
    skipped, with what is wrong with each.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        connect_timeout: float = 2.0,
        timeout: float = 3.0,
        client_name: str | None = None,
    ) -> None:
        super().__init__(url, connect_timeout=connect_timeout, timeout=timeout, client_name=client_name)
        self._skipped = Skipped()
        self._unchanged = LastReads()  # the members and controls hashes, by key

    def __repr__(self) -> str:
        return f"RedisStore({self.where!r})"

    @property
    def corrupt(self) -> list[CorruptRecord]:
        return self._skipped.records

    async def __aenter__(self) -> RedisStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # notices and hashes --------------------------------------------------------------------

    def release_channel(self, ref: HubRef) -> RedisReleaseChannel:
        """Release notices of ``ref`` on Redis pub/sub (``balancer.notices``)."""
        return RedisReleaseChannel(self.client, self.new_client, self.where, ref)

    async def _hash(self, doing: str, key: str) -> dict[str, str]:
        async def hgetall(c: Connection) -> dict[str, str]:
            return texts(await c.client.hgetall(key))

        return await self.run(doing, hgetall)

    # clock ---------------------------------------------------------------------------------

    async def now(self) -> float:
        """Redis ``TIME``: the clock every ``modified``, ``seen`` and ``created`` is written with."""

        async def time(c: Connection) -> float:
            return server_time(*await c.client.time())

        return await self.run("TIME", time)

    # one cycle's read ----------------------------------------------------------------------

    async def snapshot(self, ref: HubRef) -> Snapshot:
        """Ownership, members, controls and ``TIME`` in one round trip (``MULTI``/``EXEC``: one
        consistent view, as the cycle needs it), rather than four."""
        keys = Keys.of(ref)

        async def read(c: Connection) -> list[Any]:
            async with c.client.pipeline(transaction=True) as pipe:
                for key in (keys.ownership, keys.members, keys.controls):
                    pipe.hgetall(key)
                pipe.time()
                return list(await pipe.execute())

        ownership, members, controls, (seconds, micros) = await self.run("reading a snapshot", read)
        return Snapshot(
            self._ownership(ref, ownership),
            self._members(ref, members),
            self._controls(ref, controls),
            server_time(seconds, micros),
        )

    async def snapshot_since(self, ref: HubRef, cursor: str | None, stale_after: float | None = None) -> Changes:
        """``snapshot`` with only the ownership records written after ``cursor`` (``balancer.changes``),
        in one round trip (a script: atomic, so the records and the counter read agree). Each write
        takes its change number from the hub's counter in the claim script, so the numbers are in the
        order of the writes; the script reads everything when the cursor is of another epoch (a
        FLUSHALL, a restart) or past the counter. ``count`` is ``HLEN``: a record deleted by hand
        shows as a copy larger than the store's. With ``stale_after`` renewals are left out (the claim
        script numbers owner changes apart and keeps each record's time in a sorted set)."""
        keys = Keys.of(ref)
        epoch, serial, members_seen, controls_seen = [*(cursor or "").split(":"), "", "", "", ""][:4]
        stale = "" if stale_after is None else repr(float(stale_after))

        async def read(c: Connection) -> list[Any]:
            keys_ = [
                keys.ownership,
                keys.changes,
                keys.etags,
                keys.epoch,
                keys.members,
                keys.controls,
                keys.owner_changes,
                keys.modified,
            ]
            return list(await c.script(CHANGES)(keys=keys_, args=[epoch, serial, stale, members_seen, controls_seen]))

        found = await self.run("reading changes", read)
        seconds, micros, epoch, counter, full, count, flat, (members, members_print), small_controls, fresh = found
        controls, controls_print = small_controls
        # Members and controls as they were at the cursor's read come back empty (see ``CHANGES``).
        members_full = bool(int(full)) or text(members_print) != members_seen
        controls_full = bool(int(full)) or text(controls_print) != controls_seen
        raw = _pairs(flat)
        ownership = self._ownership(ref, raw, whole=bool(int(full)))
        fresh_after = float(text(fresh)) if text(fresh) else None
        if not int(full) and len(ownership) < len(raw):
            # A record written lately that cannot be read (a hand edit over it): a full listing would
            # leave it out, a copy would keep its older version. Read all, as a listing would.
            ownership, full, fresh_after = await self.list_ownership(ref), 1, None
        epoch = text(epoch)
        # A whole listing is the table; after a delta, the store's count of the records a listing shows
        # (the unreadable ones it skips left out) checks the copy's size.
        shown = None if int(full) else int(count) - self._skipped.unread(keys.ownership)
        return Changes(
            ownership,
            self._members(ref, _pairs(members)) if members_full else [],
            self._controls(ref, _pairs(controls)) if controls_full else [],
            server_time(seconds, micros),
            f"{epoch}:{text(counter)}:{text(members_print)}:{text(controls_print)}" if epoch else None,
            bool(int(full)),
            shown,
            fresh_after=fresh_after,
            members_full=members_full,
            controls_full=controls_full,
            # Leaving renewals out, every record no script wrote for ``stale_after`` is listed as stored,
            # so a hand edit (redis-cli) shows within that, unless a script writes the record first;
            # a record added or deleted by hand shows at once in the count.
            sees_every_write=fresh_after is not None,
        )

    # ownership -----------------------------------------------------------------------------

    async def list_ownership(self, ref: HubRef) -> list[OwnershipRecord]:
        return self._ownership(ref, await self._hash("listing ownership", Keys.of(ref).ownership))

    def _ownership(self, ref: HubRef, raw: Mapping[Any, Any], whole: bool = True) -> list[OwnershipRecord]:
        key = Keys.of(ref).ownership
        return sorted(self._skipped.parsed(key, texts(raw), partial(parse_ownership, ref), whole), key=_by_pid)

    async def claim_ownership(self, records: Sequence[OwnershipRecord]) -> list[OwnershipRecord]:
        """One script call per hub and consumer group among ``records`` (usually one)."""
        won: dict[tuple[HubRef, str], OwnershipRecord] = {}
        for ref, group in _grouped(records).items():
            keys = Keys.of(ref)
            args: list[str] = []
            for r in group:
                # A first claim of a partition whose record the latest listing skipped as unreadable
                # carries that record's made-up ETag: it replaces the record only if it is unchanged.
                etag = r.etag or self._skipped.etag_of(keys.ownership, r.partition_id) or ""
                args += [r.partition_id, r.owner_id, etag, str(int(r.owner_level))]

            async def claim(c: Connection, keys: Keys = keys, args: list[str] = args) -> Any:
                return await c.claim(
                    keys=[keys.ownership, keys.etags, keys.changes, keys.epoch, keys.owner_changes, keys.modified],
                    args=args,
                )

            now_text, wins = await self.run("a claim", claim)
            now = float(now_text)
            for n, etag in wins:
                r = group[int(n) - 1]
                won[(ref, r.partition_id)] = OwnershipRecord(
                    ref, r.partition_id, r.owner_id, text(etag), now, r.owner_level
                )
        return list(won.values()) if len(won) < 2 else [won[k] for k in _order(records) if k in won]

    # checkpoints ---------------------------------------------------------------------------

    async def list_checkpoints(self, ref: HubRef) -> list[Checkpoint]:
        key = Keys.of(ref).checkpoints
        raw = await self._hash("listing checkpoints", key)
        return sorted(self._skipped.parsed(key, raw, partial(parse_checkpoint, ref)), key=_by_pid)

    async def update_checkpoint(self, checkpoint: Checkpoint, owner_id: str) -> Checkpoint:
        """Written only while the ownership record names ``owner_id`` and, unless ``owner_id`` is
        ``RESET_OWNER`` (an operator's reset), not below the stored sequence (checked in the same script).

        Raises OwnershipLost, writing nothing, when it does not own it; StoreError for a write that
        would move the checkpoint back (see ``layout.CHECKPOINT``).
        """
        keys = Keys.of(checkpoint.ref)
        payload = json.dumps({"sequence": str(checkpoint.sequence_number), "offset": checkpoint.offset})

        backward = "1" if owner_id == RESET_OWNER else ""

        async def write(c: Connection) -> Any:
            return await c.checkpoint(
                keys=[keys.ownership, keys.checkpoints], args=[checkpoint.partition_id, owner_id, payload, backward]
            )

        written, value = await self.run("a checkpoint", write)
        if int(written) == 2:
            raise StoreError(
                f"checkpoint of partition {checkpoint.partition_id} would go back from {text(value)} to "
                f"{checkpoint.sequence_number}: refused (a stale write; only an operator's reset moves it back)"
            )
        if int(written) != 1:
            holder = text(value)
            raise OwnershipLost(checkpoint.partition_id, owner_id, holder or None)
        return Checkpoint(
            checkpoint.ref, checkpoint.partition_id, checkpoint.sequence_number, checkpoint.offset, float(value)
        )

    # members and controls ------------------------------------------------------------------

    async def _stamped(self, doing: str, key: str, field: str, value: dict[str, Any], stamp: str) -> None:
        async def write(c: Connection) -> Any:
            return await c.stamped(keys=[key], args=[field, json.dumps(value), stamp])

        await self.run(doing, write)

    async def heartbeat(self, member: Member) -> None:
        if not member.owner_id:
            raise ValueError("a member needs a non-empty owner id")
        key = Keys.of(member.ref).members
        await self._stamped("a heartbeat", key, member.owner_id, {"info": dict(member.info)}, "seen")

    async def list_members(self, ref: HubRef) -> list[Member]:
        # Copies: ``_members`` hands out what it parsed before while the hash is unchanged.
        return [m.own() for m in self._members(ref, await self._hash("listing members", Keys.of(ref).members))]

    def _members(self, ref: HubRef, raw: Mapping[Any, Any]) -> list[Member]:
        key = Keys.of(ref).members
        parse = partial(parse_member, ref)
        return self._unchanged.records(
            key, dict(raw), lambda: sorted(self._skipped.parsed(key, texts(raw), parse), key=_owner)
        )

    async def remove_member(self, ref: HubRef, owner_id: str) -> None:
        key = Keys.of(ref).members

        async def remove(c: Connection) -> Any:
            return await c.client.hdel(key, owner_id)

        await self.run("removing a member", remove)

    async def list_controls(self, ref: HubRef) -> list[Control]:
        return self._controls(ref, await self._hash("listing controls", Keys.of(ref).controls))

    def _controls(self, ref: HubRef, raw: Mapping[Any, Any]) -> list[Control]:
        key = Keys.of(ref).controls
        parse = partial(parse_control, ref)
        return self._unchanged.records(key, dict(raw), lambda: self._skipped.parsed(key, texts(raw), parse))

    async def put_control(self, control: Control) -> None:
        if not control.target:
            raise ValueError("a control needs a non-empty target")
        key = Keys.of(control.ref).controls
        field = f"{ControlKind(control.kind).value}/{control.target}"
        await self._stamped("a control", key, field, {"value": control.value}, "created")

    async def delete_control(self, ref: HubRef, kind: str, target: str) -> None:
        key = Keys.of(ref).controls
        field = f"{ControlKind(kind).value}/{target}"

        async def delete(c: Connection) -> Any:
            return await c.client.hdel(key, field)

        await self.run("deleting a control", delete)


def _pairs(flat: Sequence[Any]) -> dict[str, str]:
    """A hash as a script returns it (field, value, field, value, ...) as a dict of text."""
    return {text(flat[i]): text(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}


def _owner(member: Member) -> str:
    return member.owner_id


def _by_pid(record: OwnershipRecord | Checkpoint) -> int:
    return int(record.partition_id)


def _grouped(records: Sequence[OwnershipRecord]) -> dict[HubRef, list[OwnershipRecord]]:
    groups: dict[HubRef, list[OwnershipRecord]] = {}
    for record in records:
        groups.setdefault(record.ref, []).append(record)
    return groups


def _order(records: Sequence[OwnershipRecord]) -> list[tuple[HubRef, str]]:
    """(ref, partition) of ``records`` in request order, each once."""
    return list(dict.fromkeys((r.ref, r.partition_id) for r in records))
