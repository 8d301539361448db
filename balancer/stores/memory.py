"""The in-memory store: every protocol, for tests, the simulator and single-process demos.

Thread-safe (one lock), so the contract suite's race of two real threads holds here too. The
clock is injected so the simulator can run it on simulated time.

Nothing but this module writes its records, yet a test or the simulator may plant a damaged one
(as a hand edit would leave it in a real store): it is listed as the real stores list theirs (see
``balancer.stores.flaws``): a time that is not a finite number as None, an ETag that is no
non-empty string as a made-up one the claim that carries it wins with, a member without a
readable ``last_seen`` skipped; each logged once.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from itertools import count

from balancer.changes import Changes
from balancer.errors import CorruptRecord, OwnershipLost, StoreUnavailable
from balancer.model import Checkpoint, Control, ControlKind, HubRef, Member, OwnershipRecord
from balancer.notices import LocalChannel
from balancer.protocol import Snapshot
from balancer.stores.flaws import CorruptLog, finite_time, made_up_etag, time_flaw

log = logging.getLogger(__name__)


def _etag(value: object) -> str:
    """The ETag a listing shows for a stored one (a made-up one, naming it, when it is no non-empty string)."""
    return value if isinstance(value, str) and value else made_up_etag(repr(value).encode())


def _as_listed(record: OwnershipRecord) -> tuple[OwnershipRecord, list[str]]:
    """``record`` as a listing shows it, and what had to be read around to show it."""
    flaws = []
    modified = finite_time(record.last_modified)
    if modified is None:
        flaws.append(time_flaw("last_modified", record.last_modified))
    etag = _etag(record.etag)
    if etag != record.etag:
        flaws.append(f"ETag {record.etag!r} is not a non-empty string: listed as {etag!r}")
    level = record.owner_level
    if not isinstance(level, int) or isinstance(level, bool):
        flaws.append(f"owner level {level!r} is not an integer: read as 0")
        level = 0
    if not flaws:
        return record, flaws
    return replace(record, etag=etag, last_modified=modified, owner_level=level), flaws


class MemoryStore:
    """Ownership, checkpoints, members and controls in dictionaries."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._etags = count(1)
        self._ownership: dict[tuple[HubRef, str], OwnershipRecord] = {}
        # Change numbers (``balancer.changes``): one counter per hub, taken under the lock by every
        # write, so their order is the order the writes were made. The epoch names this store's life.
        self._epoch = secrets.token_hex(4)
        self._serial: dict[HubRef, int] = {}
        self._changed: dict[tuple[HubRef, str], int] = {}
        # The change number of each record's latest write that was no renewal (it changed the owner or
        # the owner level): what a reader that leaves renewals out reads by (``stale_after``).
        self._owner_changed: dict[tuple[HubRef, str], int] = {}
        self._checkpoints: dict[tuple[HubRef, str], Checkpoint] = {}
        self._members: dict[tuple[HubRef, str], Member] = {}
        self._controls: dict[tuple[HubRef, ControlKind, str], Control] = {}
        self.requests = 0  # store round trips, for the simulator's and the bench's counts
        self.down = False  # set by tests and the simulator to model an outage
        self._corrupt = CorruptLog(log)
        self._notices = LocalChannel()  # release notices between the workers on this store (one process)

    def release_channel(self, ref: HubRef) -> LocalChannel:
        """Release notices (``balancer.notices``) between the workers on this store: all in this process."""
        return self._notices

    @property
    def corrupt(self) -> list[CorruptRecord]:
        """The records the latest listings could not read in full (listed in part, or skipped)."""
        return self._corrupt.records

    def _enter(self) -> None:
        self.requests += 1
        if self.down:
            raise StoreUnavailable("in-memory store is marked down")

    async def now(self) -> float:
        return self._clock()

    async def snapshot(self, ref: HubRef) -> Snapshot:
        """Ownership, members, controls and the clock in one request."""
        with self._lock:
            self._enter()
            return Snapshot(self._listed(ref), self._listed_members(ref), self._listed_controls(ref), self._clock())

    async def snapshot_since(self, ref: HubRef, cursor: str | None, stale_after: float | None = None) -> Changes:
        """``snapshot`` with only the ownership records written after ``cursor`` (every one when
        ``cursor`` is None or is not one of this store's, or names a change it never made). With
        ``stale_after``, renewals are left out, and every record last written more than ``stale_after``
        seconds ago is listed whatever its change (``balancer.changes``)."""
        with self._lock:
            self._enter()
            serial, now = self._serial.get(ref, 0), self._clock()
            since = _since(cursor, self._epoch, serial)
            fresh_after = None
            if since is None:
                ownership = self._listed(ref)
            elif stale_after is None:
                changed = [
                    stored
                    for key, stored in self._ownership.items()
                    if key[0] == ref and self._changed.get(key, 0) > since
                ]
                ownership = [_as_listed(stored)[0] for stored in changed]
            else:
                fresh_after = now - stale_after
                changed = [
                    stored
                    for key, stored in self._ownership.items()
                    if key[0] == ref
                    and (self._owner_changed.get(key, 0) > since or _written_before(stored, fresh_after))
                ]
                ownership = [_as_listed(stored)[0] for stored in changed]
            count = None if since is None else sum(1 for k in self._ownership if k[0] == ref)
            return Changes(
                ownership,
                self._listed_members(ref),
                self._listed_controls(ref),
                now,
                f"{self._epoch}:{serial}",
                since is None,
                count,
                in_partition_order=False,
                fresh_after=fresh_after,
            )

    # ownership -----------------------------------------------------------------------------

    async def list_ownership(self, ref: HubRef) -> list[OwnershipRecord]:
        with self._lock:
            self._enter()
            return self._listed(ref)

    def _listed(self, ref: HubRef) -> list[OwnershipRecord]:
        out, found = [], {}
        for (k, pid), stored in self._ownership.items():
            if k == ref:
                record, flaws = _as_listed(stored)
                out.append(record)
                if flaws:
                    found[pid] = CorruptRecord(f"ownership of partition {pid} of {ref}", "; ".join(flaws))
        self._corrupt.listing(f"ownership {ref}", found)
        return out

    async def claim_ownership(self, records: Sequence[OwnershipRecord]) -> list[OwnershipRecord]:
        won: list[OwnershipRecord] = []
        with self._lock:
            self._enter()
            now = self._clock()
            for record in records:
                key = (record.ref, record.partition_id)
                current = self._ownership.get(key)
                if current is None and record.etag is not None:
                    continue  # claims an ETag the store never issued for this partition
                if current is not None and _etag(current.etag) != record.etag:
                    continue  # someone wrote it since the caller looked
                stored = replace(record, etag=f"m{next(self._etags)}", last_modified=now)
                self._ownership[key] = stored
                self._serial[record.ref] = self._changed[key] = self._serial.get(record.ref, 0) + 1
                renewal = current is not None and (current.owner_id, current.owner_level) == (
                    record.owner_id,
                    record.owner_level,
                )
                if not renewal:
                    self._owner_changed[key] = self._changed[key]
                won.append(stored)
        return won

    # checkpoints ---------------------------------------------------------------------------

    async def list_checkpoints(self, ref: HubRef) -> list[Checkpoint]:
        with self._lock:
            self._enter()
            out, found = [], {}
            for (k, pid), stored in self._checkpoints.items():
                if k == ref:
                    modified = finite_time(stored.last_modified)
                    if modified is None:
                        problem = time_flaw("last_modified", stored.last_modified)
                        found[pid] = CorruptRecord(f"checkpoint of partition {pid} of {ref}", problem)
                        stored = replace(stored, last_modified=None)
                    out.append(stored)
            self._corrupt.listing(f"checkpoints {ref}", found)
            return out

    async def update_checkpoint(self, checkpoint: Checkpoint, owner_id: str) -> Checkpoint:
        with self._lock:
            self._enter()
            key = (checkpoint.ref, checkpoint.partition_id)
            owner = self._ownership.get(key)
            if owner is None or not owner_id or owner.owner_id != owner_id:  # "" owns nothing
                raise OwnershipLost(checkpoint.partition_id, owner_id, (owner.owner_id or None) if owner else None)
            stored = replace(checkpoint, last_modified=self._clock())
            self._checkpoints[key] = stored
            return stored

    # members and controls ------------------------------------------------------------------

    async def heartbeat(self, member: Member) -> None:
        with self._lock:
            self._enter()
            # A copy of its info: a caller that changes its own dict later changes no stored member.
            self._members[(member.ref, member.owner_id)] = replace(
                member, last_seen=self._clock(), info=dict(member.info)
            )

    async def list_members(self, ref: HubRef) -> list[Member]:
        with self._lock:
            self._enter()
            return self._listed_members(ref)

    def _listed_members(self, ref: HubRef) -> list[Member]:
        """A member whose ``last_seen`` is not a finite number is skipped: not alive (its next
        heartbeat rewrites it)."""
        out, found = [], {}
        for (k, owner), member in self._members.items():
            if k == ref:
                seen = finite_time(member.last_seen)
                if seen is None:
                    found[owner] = CorruptRecord(f"member {owner!r} of {ref}", time_flaw("last_seen", member.last_seen))
                else:
                    out.append(replace(member, last_seen=seen, info=dict(member.info)))  # the reader's own
        self._corrupt.listing(f"members {ref}", found, frozenset(found))
        return out

    async def remove_member(self, ref: HubRef, owner_id: str) -> None:
        with self._lock:
            self._enter()
            self._members.pop((ref, owner_id), None)

    async def list_controls(self, ref: HubRef) -> list[Control]:
        with self._lock:
            self._enter()
            return self._listed_controls(ref)

    def _listed_controls(self, ref: HubRef) -> list[Control]:
        out, found = [], {}
        for (k, kind, target), control in self._controls.items():
            if k == ref:
                created = finite_time(control.created)
                if created is None:
                    where = f"control {kind.value}/{target} of {ref}"
                    found[f"{kind.value}/{target}"] = CorruptRecord(where, time_flaw("created", control.created))
                    control = replace(control, created=None)
                out.append(control)
        self._corrupt.listing(f"controls {ref}", found)
        return out

    async def put_control(self, control: Control) -> None:
        with self._lock:
            self._enter()
            stored = replace(control, created=self._clock())
            self._controls[(control.ref, control.kind, control.target)] = stored

    async def delete_control(self, ref: HubRef, kind: str, target: str) -> None:
        with self._lock:
            self._enter()
            self._controls.pop((ref, ControlKind(kind), target), None)


def _written_before(record: OwnershipRecord, at: float) -> bool:
    """Whether ``record`` was last written before ``at``: a time that is no number never was (a reader
    reads it as expired, as the listing showed it)."""
    modified = finite_time(record.last_modified)
    return modified is not None and modified < at


def _since(cursor: str | None, epoch: str, serial: int) -> int | None:
    """The change number ``cursor`` read up to, if it is one of this store's life up to ``serial``."""
    seen_epoch, _, seen = (cursor or "").partition(":")
    if seen_epoch != epoch or not seen.isdigit() or int(seen) > serial:
        return None
    return int(seen)
