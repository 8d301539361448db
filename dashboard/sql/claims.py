"""The SQL store's ownership claims: compare-and-set writes of ownership rows, each with a fresh
ETag and the hub's next change number, returning only the records won."""

from __future__ import annotations

import secrets
from dataclasses import replace

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from balancer.errors import StoreError
from balancer.model import HubRef, OwnershipRecord

from ..models import Ownership, OwnershipClock
from . import rows as sqlrows
from .clock import PG_CLOCK, PG_TRANSACTION_ID, read_clock
from .lanes import Lanes
from .update import update_statement

# Records per UPDATE/INSERT statement: keeps every statement far below SQLite's variable limit.
CHUNK = 200


class Claims(Lanes):
    """The ownership writes of the lease lane, run on its thread (``SqlStore`` awaits them)."""

    def _claim(self, connection: BaseDatabaseWrapper, records: list[OwnershipRecord]) -> list[OwnershipRecord]:
        # A partition named twice in one call: only its first record is tried (the second one's
        # ETag would be stale by then anyway).
        groups: dict[HubRef, dict[str, OwnershipRecord]] = {}
        for record in records:
            groups.setdefault(record.ref, {}).setdefault(record.partition_id, record)
        claims = [r for wanted in groups.values() for r in wanted.values()]
        if (
            len(groups) == 1
            and len(claims) <= CHUNK
            and all(r.etag is not None for r in claims)
            and (sqlrows.sends_together(connection))
        ):
            won = self._update_at_once(connection, claims)  # one hub, rows that exist: no transaction
        else:
            won = []
            with transaction.atomic(using=self.using):
                now, xid = self._clock_and_transaction_id(connection)
                # Every transaction locks rows in the same order (hub by hub, partition by partition),
                # so two claimers of overlapping sets wait for each other instead of deadlocking.
                for ref in sorted(groups, key=lambda r: (r.namespace, r.hub, r.consumer_group)):
                    serial = xid if xid is not None else self._tick(connection, ref)
                    batch = sorted(groups[ref].values(), key=lambda r: int(r.partition_id))
                    for start in range(0, len(batch), CHUNK):
                        won += self._claim_chunk(connection, ref, batch[start : start + CHUNK], now, serial)
        order = {(r.ref, r.partition_id): i for i, r in enumerate(records)}
        return sorted(won, key=lambda r: order[(r.ref, r.partition_id)])

    def _update_at_once(self, connection: BaseDatabaseWrapper, batch: list[OwnershipRecord]) -> list[OwnershipRecord]:
        """On PostgreSQL, compare-and-set writes of rows that exist (every renewal, most steals) in one
        round trip: the ``UPDATE`` takes its time and change number from its own statement (the
        server's clock, its transaction's id) and a ``SELECT`` sent with it reads that time back (the
        same ``STATEMENT_TIMESTAMP()``). One statement is atomic without ``BEGIN`` and ``COMMIT``."""
        ref, token = batch[0].ref, secrets.token_hex(12)
        sql, params = update_statement(connection, ref, batch, f"{token}-", None, None)
        with connection.cursor() as cursor:
            cursor.execute(f"{sql}; SELECT {PG_CLOCK}", params)
            changed = cursor.rowcount
            if not cursor.nextset():
                raise StoreError(f"database {self.using!r}: the clock read with an ownership write did not answer")
            (now,) = cursor.fetchone()
        wanted = [replace(r, etag=f"{token}-{r.partition_id}", last_modified=float(now)) for r in batch]
        if changed == len(batch):
            return wanted
        # Some rows did not change (another worker wrote them first, so the ETag moved).
        mine = self._carrying(ref, [r.etag for r in wanted])
        return [r for r in wanted if r.partition_id in mine]

    def _carrying(self, ref: HubRef, etags: list[str | None]) -> set[str]:
        """The partitions whose rows carry one of ``etags``: the fresh ETags a claim wrote mark
        exactly the rows it won (nobody else writes them)."""
        return set(self._rows(Ownership, ref).filter(etag__in=etags).values_list("partition_id", flat=True))

    def _clock_and_transaction_id(self, connection: BaseDatabaseWrapper) -> tuple[float, int | None]:
        """The store's clock (``read_clock``) and, on PostgreSQL, the writing transaction's id (in one
        statement): the change number of every row it writes.

        Why not a number from a sequence or a counter: a number taken inside a transaction becomes
        visible only at commit, so a writer that took 7 can commit after one that took 8 was read,
        and a reader asking for "changed after 8" would miss 7 for good. Serializing the hub's
        writers (a lock on a counter row, or ``pg_advisory_xact_lock``, until commit) would fix
        that, but at 1024 partitions and 64 worker processes on two cores the lock holder was often
        descheduled between statements while the others queued: the fleet did not balance in 300 s.
        Snapshot bounds instead: a reader's cursor is ``pg_snapshot_xmin`` (the oldest transaction
        still running) taken before it reads, and the next read asks for rows written by that
        transaction id or later. Every transaction below it had ended before the rows were read, so
        its rows were read; later ones are read next time. No writer waits for another. A
        transaction held open long (an idle psql session) keeps the bound low, and so re-reads the
        rows written since it began, never misses one. ``xid8`` never wraps around.
        """
        if connection.vendor != "postgresql":
            return read_clock(connection), None
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {PG_CLOCK}, {PG_TRANSACTION_ID}")
            now, xid = cursor.fetchone()
            return float(now), int(xid)

    def _number(self, connection: BaseDatabaseWrapper, ref: HubRef) -> tuple[float, int]:
        """The store's clock and the change number of what the current transaction writes: its id on
        PostgreSQL (``_clock_and_transaction_id``), else the hub's next number (``_tick``)."""
        now, xid = self._clock_and_transaction_id(connection)
        return now, xid if xid is not None else self._tick(connection, ref)

    def _tick(self, connection: BaseDatabaseWrapper, ref: HubRef) -> int:
        """Elsewhere (SQLite, which runs one writer at a time anyway): the hub's next change number,
        from its counter row, in the writing transaction."""
        quote = connection.ops.quote_name
        table = quote(OwnershipClock._meta.db_table)
        scope = " AND ".join(f"{quote(column)} = %s" for column in ("namespace", "hub", "consumer_group"))
        params = [ref.namespace, ref.hub, ref.consumer_group]
        with connection.cursor() as cursor:
            serial = quote("serial")
            cursor.execute(f"UPDATE {table} SET {serial} = {serial} + 1 WHERE {scope} RETURNING {serial}", params)
            row = cursor.fetchone()
            if row is not None:
                return int(row[0])
        self._make_clock(ref)  # the hub's first write: its counter row, made in this transaction
        return self._tick(connection, ref)

    def _claim_chunk(
        self, connection: BaseDatabaseWrapper, ref: HubRef, batch: list[OwnershipRecord], now: float, serial: int
    ) -> list[OwnershipRecord]:
        # Every write gets a fresh ETag: one random token per call, made unique per row by the
        # partition id, so one UPDATE can set them all without a CASE per partition.
        token = secrets.token_hex(12)
        etags = {r.partition_id: f"{token}-{r.partition_id}" for r in batch}
        wanted = {r.partition_id: replace(r, etag=etags[r.partition_id], last_modified=now) for r in batch}
        updates = [r for r in batch if r.etag is not None]
        inserts = [r for r in batch if r.etag is None]
        changed = 0
        if updates:
            # Compare-and-set: a row changes only if it still carries the ETag the claimer saw.
            with connection.cursor() as cursor:
                cursor.execute(*update_statement(connection, ref, updates, f"{token}-", now, serial))
                changed = cursor.rowcount
        if inserts:
            # First claims: the unique (scope, partition) key lets one insert through; the others
            # hit the conflict and are skipped, which is how they lose.
            Ownership.objects.using(self.using).bulk_create(
                [
                    Ownership(
                        **Ownership.scope(ref),
                        partition_id=r.partition_id,
                        owner_id=r.owner_id,
                        owner_level=r.owner_level,
                        etag=etags[r.partition_id],
                        last_modified=now,
                        changed=serial,
                        owner_changed=serial,
                    )
                    for r in inserts
                ],
                ignore_conflicts=True,
            )
        if changed == len(updates) and not inserts:
            return [wanted[r.partition_id] for r in updates]
        # Some rows did not change (nothing updated: another worker got there first, so the ETag
        # moved), or inserts were made whose outcome ON CONFLICT DO NOTHING does not report. The
        # rows carrying the fresh ETags written above are exactly the ones won.
        mine = self._carrying(ref, list(etags.values()))
        won_updates = sum(1 for r in updates if r.partition_id in mine)
        if won_updates != changed:  # cannot happen unless something rewrites ETags behind our back
            raise StoreError(f"database {self.using!r}: {changed} ownership rows updated, {won_updates} found")
        return [wanted[p] for p in wanted if p in mine]
