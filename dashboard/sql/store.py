"""The SQL store: ownership, checkpoints, members and controls on the Django ORM (SQLite, PostgreSQL).

Implements the three protocols of ``balancer.protocol``. ORM work runs on threads the store owns
(``dbthread.DatabaseThread``, ``lanes.py``), one per *lane*: ``lease`` (ownership, clock, members, controls) and
``checkpoint``, so a burst of checkpoint writes never delays a lease renewal. Each lane keeps one
database connection for the store's lifetime (a worker is not a request; ``CONN_MAX_AGE`` does not
apply); a connection that failed is closed and the next call opens a fresh one. ``aclose()``
closes them; a store dropped without it closes them when garbage-collected.

Time: on PostgreSQL every ``last_modified``/``last_seen`` and ``now()`` is the database server's
clock, so workers on machines with skewed clocks judge expiry alike; elsewhere the local clock
(``clock.py``).

A row an operator edited by hand (in psql or the SQLite shell, where a column may even hold text
of another type) costs only itself, as in every store (``balancer.stores.flaws``): a time that is
not a finite number (NaN, infinity, text) is read as None, so an ownership row without one counts
as expired and the claim carrying its listed ETag (garbage or not, compared as stored) takes it; an
owner level that is no integer is read as 0; a row whose partition id, checkpoint sequence number,
control kind, member ``last_seen`` or member info cannot be read is skipped. A checkpoint skipped
so reads as absent: its partition resumes from the processor's starting position, as one never
checkpointed (a reader that raised instead would stall the partition for good), and the owner's
next checkpoint overwrites the row. Each such row is logged once, as a warning, until what is
wrong with it changes (``corrupt`` lists them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.expressions import RawSQL

from balancer.changes import Changes
from balancer.errors import OwnershipLost
from balancer.model import Checkpoint, Control, ControlKind, HubRef, Member, OwnershipRecord
from balancer.protocol import Snapshot

from ..models import CheckpointRow, ControlRow, MemberRow, Ownership
from . import rows as sqlrows
from .claims import Claims
from .clock import PG_TRANSACTION_ID, StoreClock, read_clock
from .lanes import CHECKPOINT, LEASE, by_partition
from .namespace import NamespaceReads
from .reads import Reads
from .rows import CHECKPOINTS

if TYPE_CHECKING:
    from .notices import PostgresReleaseChannel


def _notify(connection: BaseDatabaseWrapper, channel: str, payload: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [channel, payload])


class SqlStore(Reads, Claims, NamespaceReads):
    """Every store protocol on the Django database ``using`` (an alias of ``settings.DATABASES``).

    ``requests`` counts calls and ``statements`` the SQL statements they sent (SQLite's
    ``BEGIN IMMEDIATE`` included, COMMIT not), for benchmarks and the statement-count tests.
    """

    # release notices -----------------------------------------------------------------------

    def release_channel(self, ref: HubRef) -> PostgresReleaseChannel | None:
        """Release notices of ``ref`` on PostgreSQL's LISTEN/NOTIFY; None on SQLite, which has none."""
        if connections[self.using].vendor != "postgresql":
            return None
        from .notices import PostgresReleaseChannel  # psycopg: only where PostgreSQL is used

        return PostgresReleaseChannel(self.using, ref, self._notify)

    async def _notify(self, channel: str, payload: str) -> None:
        await self._run(LEASE, _notify, channel, payload)

    # ownership -----------------------------------------------------------------------------

    async def now(self) -> float:
        return await self._run(LEASE, read_clock)

    async def list_ownership(self, ref: HubRef) -> list[OwnershipRecord]:
        return await self._run(LEASE, self._list_ownership, ref)

    async def snapshot(self, ref: HubRef) -> Snapshot:
        """Ownership, members, controls and the clock in one trip to the lease thread."""
        return await self._run(LEASE, self._snapshot, ref)

    async def snapshot_since(self, ref: HubRef, cursor: str | None, stale_after: float | None = None) -> Changes:
        """``snapshot`` with only the ownership rows written after ``cursor`` (``balancer.changes``);
        with ``stale_after``, renewals left out and every row not written for that long read."""
        return await self._run(LEASE, self._snapshot_since, ref, cursor, stale_after)

    async def claim_ownership(self, records: Sequence[OwnershipRecord]) -> list[OwnershipRecord]:
        if not records:
            return []
        return await self._run(LEASE, self._claim, list(records))

    # checkpoints ---------------------------------------------------------------------------

    async def list_checkpoints(self, ref: HubRef) -> list[Checkpoint]:
        return await self._run(CHECKPOINT, self._list_checkpoints, ref)

    def _list_checkpoints(self, connection: BaseDatabaseWrapper, ref: HubRef) -> list[Checkpoint]:
        checkpoints = self._valid(CHECKPOINTS, CHECKPOINTS.read(connection, ref), ref, sqlrows.checkpoint)
        return sorted(checkpoints, key=by_partition)

    async def update_checkpoint(self, checkpoint: Checkpoint, owner_id: str) -> Checkpoint:
        return await self._run(CHECKPOINT, self._update_checkpoint, checkpoint, owner_id)

    def _update_checkpoint(self, connection: BaseDatabaseWrapper, checkpoint: Checkpoint, owner_id: str) -> Checkpoint:
        ref, pid = checkpoint.ref, checkpoint.partition_id
        with transaction.atomic(using=self.using):
            # FOR UPDATE holds the ownership row until commit, so a steal waits for this write to
            # land and the new owner reads this checkpoint, never an older one. (SQLite: the
            # IMMEDIATE transaction already holds the write lock.)
            row = (
                self._rows(Ownership, ref)
                .select_for_update()
                .filter(partition_id=pid)
                .annotate(clock=StoreClock())
                .values_list("owner_id", "clock")
                .first()
            )
            if row is None or row[0] != owner_id or not owner_id:
                raise OwnershipLost(pid, owner_id, (row[0] or None) if row else None)
            clock = float(row[1])
            CheckpointRow.objects.using(self.using).bulk_create(
                [
                    CheckpointRow(
                        **CheckpointRow.scope(ref),
                        partition_id=pid,
                        sequence_number=checkpoint.sequence_number,
                        offset=checkpoint.offset,
                        last_modified=clock,
                    )
                ],
                update_conflicts=True,
                unique_fields=["namespace", "hub", "consumer_group", "partition_id"],
                update_fields=["sequence_number", "offset", "last_modified"],
            )
        return replace(checkpoint, last_modified=clock)

    # members -------------------------------------------------------------------------------

    async def heartbeat(self, member: Member) -> None:
        await self._run(LEASE, self._heartbeat, member)

    def _heartbeat(self, connection: BaseDatabaseWrapper, member: Member) -> None:
        # Numbered as a claim is (``Claims._number``), so readers of what changed list it. On
        # PostgreSQL the usual heartbeat is one statement, numbered by its own transaction's id.
        info = dict(member.info)
        rows = self._rows(MemberRow, member.ref).filter(owner_id=member.owner_id)
        if connection.vendor == "postgresql" and rows.update(
            last_seen=StoreClock(), info=info, changed=RawSQL(PG_TRANSACTION_ID, ())
        ):
            return
        with transaction.atomic(using=self.using):
            now, number = self._number(connection, member.ref)
            if rows.update(last_seen=StoreClock(), info=info, changed=number):
                return
            # First heartbeat (or the row was removed): insert, or update if a racing call inserted.
            row = MemberRow(
                **MemberRow.scope(member.ref), owner_id=member.owner_id, last_seen=now, info=info, changed=number
            )
            MemberRow.objects.using(self.using).bulk_create(
                [row],
                update_conflicts=True,
                unique_fields=["namespace", "hub", "consumer_group", "owner_id"],
                update_fields=["last_seen", "info", "changed"],
            )

    async def list_members(self, ref: HubRef) -> list[Member]:
        # Copies: ``_list_members`` hands out what it read before while the rows are unchanged.
        return [m.own() for m in await self._run(LEASE, self._list_members, ref)]

    async def remove_member(self, ref: HubRef, owner_id: str) -> None:
        await self._run(LEASE, self._remove_member, ref, owner_id)

    def _remove_member(self, connection: BaseDatabaseWrapper, ref: HubRef, owner_id: str) -> None:
        self._rows(MemberRow, ref).filter(owner_id=owner_id).delete()

    # controls ------------------------------------------------------------------------------

    async def list_controls(self, ref: HubRef) -> list[Control]:
        return await self._run(LEASE, self._list_controls, ref)

    async def put_control(self, control: Control) -> None:
        await self._run(LEASE, self._put_control, control)

    def _put_control(self, connection: BaseDatabaseWrapper, control: Control) -> None:
        with transaction.atomic(using=self.using):
            now, number = self._number(connection, control.ref)  # as a heartbeat is
            ControlRow.objects.using(self.using).bulk_create(
                [
                    ControlRow(
                        **ControlRow.scope(control.ref),
                        kind=ControlKind(control.kind).value,
                        target=control.target,
                        value=control.value,
                        created=now,
                        changed=number,
                    )
                ],
                update_conflicts=True,
                unique_fields=["namespace", "hub", "consumer_group", "kind", "target"],
                update_fields=["value", "created", "changed"],
            )

    async def delete_control(self, ref: HubRef, kind: str, target: str) -> None:
        await self._run(LEASE, self._delete_control, ref, ControlKind(kind).value, target)

    def _delete_control(self, connection: BaseDatabaseWrapper, ref: HubRef, kind: str, target: str) -> None:
        self._rows(ControlRow, ref).filter(kind=kind, target=target).delete()
