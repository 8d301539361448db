"""The SQL store: ownership, checkpoints, members and controls on the Django ORM (SQLite, PostgreSQL).

Implements the three protocols of ``balancer.protocol``. ORM work runs on threads the store owns
(``dbthread.DatabaseThread``), one per *lane*: ``lease`` (ownership, clock, members, controls) and
``checkpoint``, so a burst of checkpoint writes never delays a lease renewal. Each lane keeps one
database connection for the store's lifetime (a worker is not a request; ``CONN_MAX_AGE`` does not
apply); a connection that failed is closed and the next call opens a fresh one. ``aclose()``
closes them; a store dropped without it closes them when garbage-collected.

Time: on PostgreSQL every ``last_modified``/``last_seen`` and ``now()`` is the database server's
clock, so workers on machines with skewed clocks judge expiry alike; elsewhere the local clock
(``sqlclock.py``).

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

import logging
import secrets
import weakref
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import DatabaseError, InterfaceError, OperationalError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import QuerySet

from balancer.changes import Changes
from balancer.errors import CorruptRecord, OwnershipLost, StoreError, StoreUnavailable
from balancer.model import Checkpoint, Control, ControlKind, HubRef, Member, OwnershipRecord
from balancer.protocol import Snapshot
from balancer.stores.flaws import CorruptLog
from balancer.stores.unchanged import LastReads

from . import sqlclock, sqlrows
from .dbthread import DatabaseThread
from .models import CheckpointRow, ControlRow, MemberRow, Ownership, OwnershipClock
from .sqlclock import PG_CLOCK, StoreClock, read_clock
from .sqlrows import CHECKPOINTS, CONTROLS, MEMBERS, OWNERSHIP, Listing

if TYPE_CHECKING:
    from .sqlnotices import PostgresReleaseChannel

log = logging.getLogger(__name__)
T = TypeVar("T")

LEASE, CHECKPOINT = "lease", "checkpoint"
# Records per UPDATE/INSERT statement: keeps every statement far below SQLite's variable limit.
CHUNK = 200


def _notify(connection: BaseDatabaseWrapper, channel: str, payload: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [channel, payload])


def _shut_lanes(lanes: list[DatabaseThread]) -> None:
    """Close a dropped store's connections and let its threads end (no waiting: may run in GC)."""
    for lane in lanes:
        lane.close_soon()


class SqlStore:
    """Every store protocol on the Django database ``using`` (an alias of ``settings.DATABASES``).

    ``requests`` counts calls and ``statements`` the SQL statements they sent (SQLite's
    ``BEGIN IMMEDIATE`` included, COMMIT not), for benchmarks and the statement-count tests.
    """

    def __init__(self, using: str = "default") -> None:
        if using not in connections:
            raise StoreUnavailable(f"no database {using!r} in settings.DATABASES")
        self.using = using
        self.requests = 0
        self._statements: dict[str, int] = {}
        # Threads start on first use. No check of an idle connection: a connection the server
        # dropped fails one call (StoreUnavailable) and the next reconnects, without the round trip
        # a check would add to every call of a worker's cycle.
        self._lanes = {
            lane: DatabaseThread(f"sqlstore-{using}-{lane}", using, checks=False) for lane in (LEASE, CHECKPOINT)
        }
        self._finalizer = weakref.finalize(self, _shut_lanes, list(self._lanes.values()))
        self._corrupt = CorruptLog(log, f" (database {using!r})")
        self._unchanged = LastReads()  # the members and controls listings, by (table, hub)

    @property
    def corrupt(self) -> list[CorruptRecord]:
        """The rows the latest listings could not read in full (listed in part, or skipped)."""
        return self._corrupt.records

    @property
    def statements(self) -> int:
        return sum(self._statements.values())

    async def aclose(self) -> None:
        """Close this store's connections and stop its threads; it must not be used afterwards."""
        for lane in self._lanes.values():
            await lane.aclose()
        self._finalizer.detach()

    def __repr__(self) -> str:
        return f"SqlStore(using={self.using!r})"

    # plumbing ------------------------------------------------------------------------------

    async def _run(self, lane: str, work: Callable[..., T], *args: Any) -> T:
        self.requests += 1
        # If the awaiting task is cancelled the statement still runs to the end on its thread; a
        # claim may then be won without the caller hearing of it (the next listing shows it).
        return await self._lanes[lane].acall(self._guarded, lane, work, *args)

    def _guarded(self, lane: str, work: Callable[..., T], *args: Any) -> T:
        connection = connections[self.using]
        if not any(getattr(w, "lane", None) == (id(self), lane) for w in connection.execute_wrappers):
            connection.execute_wrappers.append(self._counter(lane))
        try:
            return work(connection, *args)
        except (OperationalError, InterfaceError) as exc:
            # A broken connection is never reused: the next call on this lane reconnects.
            connection.close()
            raise StoreUnavailable(self._describe(exc)) from exc
        except DatabaseError as exc:
            if "does not exist" in str(exc):  # PostgreSQL's missing table
                raise StoreUnavailable(self._describe(exc)) from exc
            raise

    def _counter(self, lane: str) -> Callable[..., Any]:
        # The wrapper lives on the lane thread's connection: it must not hold the store itself,
        # or a dropped store would never be collected (and its threads never end).
        statements = self._statements
        statements.setdefault(lane, 0)

        def count(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
            statements[lane] += 1
            return execute(sql, params, many, context)

        count.lane = (id(self), lane)  # type: ignore[attr-defined]
        return count

    def _describe(self, exc: Exception) -> str:
        """Names the database, never its password."""
        conf = connections.settings[self.using]
        where = conf.get("NAME") or "?"
        if conf.get("HOST"):
            where = f"{where} at {conf['HOST']}:{conf.get('PORT') or 'default port'}"
        problem = " ".join(str(exc).split())
        password = conf.get("PASSWORD")
        if password:
            problem = problem.replace(str(password), "***")
        hint = ""
        if "no such table" in problem or "does not exist" in problem:
            hint = " (run `python manage.py migrate`)"
        engine = str(conf.get("ENGINE", "?")).rsplit(".", 1)[-1]
        return f"database {self.using!r} ({engine} {where}) is unavailable: {problem}{hint}"

    def _rows(self, model: type[Any], ref: HubRef) -> QuerySet[Any]:
        rows: QuerySet[Any] = model.objects.using(self.using).filter(**model.scope(ref))
        return rows

    def _valid(
        self,
        listing: Listing,
        rows: list[Any],
        ref: HubRef,
        convert: Callable[[Any, HubRef, list[str]], T],
        whole: bool = True,
    ) -> list[T]:
        """``rows`` of one listing (``whole``: every row of ``ref``) converted to records. ``convert``
        notes in its list what it had to read around, or raises ValueError or TypeError for a row that
        cannot be read at all, which is skipped. Either is logged once (see ``CorruptLog``); only a
        whole listing forgets rows no longer found."""
        out = []
        found: dict[str, CorruptRecord] = {}
        skipped = set()
        for row in rows:
            flaws: list[str] = []
            try:
                out.append(convert(row, ref, flaws))
            except (ValueError, TypeError) as exc:
                flaws = [str(exc)]
                skipped.add(str(row.pk))
            if flaws:
                found[str(row.pk)] = CorruptRecord(
                    f"{listing.table} id={row.pk} ({listing.describe(row, ref)})", "; ".join(flaws)
                )
        if whole:
            self._corrupt.listing(f"{listing.table} {ref}", found, frozenset(skipped))
        return out

    # release notices -----------------------------------------------------------------------

    def release_channel(self, ref: HubRef) -> PostgresReleaseChannel | None:
        """Release notices of ``ref`` on PostgreSQL's LISTEN/NOTIFY; None on SQLite, which has none."""
        if connections[self.using].vendor != "postgresql":
            return None
        from .sqlnotices import PostgresReleaseChannel  # psycopg: only where PostgreSQL is used

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

    def _snapshot(self, connection: BaseDatabaseWrapper, ref: HubRef) -> Snapshot:
        # Three reads, not one transaction: on SQLite a transaction here would take the write lock
        # (BEGIN IMMEDIATE), and each list is consistent on its own, which is all planning needs.
        return Snapshot(
            self._list_ownership(connection, ref),
            self._list_members(connection, ref),
            self._list_controls(connection, ref),
            read_clock(connection),
        )

    async def snapshot_since(self, ref: HubRef, cursor: str | None, stale_after: float | None = None) -> Changes:
        """``snapshot`` with only the ownership rows written after ``cursor`` (``balancer.changes``);
        with ``stale_after``, renewals left out and every row not written for that long read."""
        return await self._run(LEASE, self._snapshot_since, ref, cursor, stale_after)

    def _snapshot_since(
        self, connection: BaseDatabaseWrapper, ref: HubRef, cursor: str | None, stale_after: float | None = None
    ) -> Changes:
        # A cursor is "<epoch>:<n>": every row whose change number is below n was read (n is the
        # first number a writer may still hold uncommitted). The bound is read before the rows, so
        # the rows read next include every row below it; rows at or past it may come again next
        # time (they cost the reading, nothing more). Leaving renewals out, the rows are those whose
        # owner changed (``owner_changed``, numbered as ``changed``) and those last written before
        # ``fresh_after``, the store's clock as the bound was read less ``stale_after``.
        #
        # The bound, the rows changed since the cursor's number, the members and the controls are
        # asked for together (``fetch_together``: on PostgreSQL one round trip, every statement on the
        # clock the bound is read with), or every row when there is no cursor. The cursor's number is
        # checked against the bound afterwards: a cursor of another epoch, or past the bound, throws
        # the rows away and reads every row.
        # Off PostgreSQL the store's clock is this machine's, read now (a module attribute: tests skew it).
        local = None if connection.vendor == "postgresql" else sqlclock.local_clock()
        seen = _seen(cursor)
        statements = [(_clock_sql(connection), [ref.namespace, ref.hub, ref.consumer_group])]
        if seen is None:
            statements.append(OWNERSHIP.statement(connection, ref))  # every row
        else:
            if stale_after is None:
                statements.append(OWNERSHIP.statement(connection, ref, seen))
            elif local is None:
                statements.append(OWNERSHIP.statement(connection, ref, seen, stale_after=stale_after))
            else:
                statements.append(OWNERSHIP.statement(connection, ref, seen, written_before=local - stale_after))
        statements += [MEMBERS.statement(connection, ref), CONTROLS.statement(connection, ref)]
        found, *rest = sqlrows.fetch_together(connection, statements)
        if not found:  # the hub's clock row is missing: made (with a fresh epoch), then read again
            self._make_clock(ref)
            return self._snapshot_since(connection, ref, cursor, stale_after)
        epoch, bound, clock = _epoch_and_bound(found[0], local)
        listed, members, controls = rest
        since = _since(cursor, epoch, bound)
        fresh_after = None
        if since is None:
            if seen is not None:  # the rows since the cursor's number are of no use: every row, read now
                listed = OWNERSHIP.fetch(connection, ref)
            rows = OWNERSHIP.rows(connection, listed)
            ownership = sorted(self._valid(OWNERSHIP, rows, ref, sqlrows.ownership), key=_partition)
        else:
            if stale_after is not None:
                fresh_after = clock - stale_after
            rows = OWNERSHIP.rows(connection, listed)
            ownership = sorted(self._valid(OWNERSHIP, rows, ref, sqlrows.ownership, whole=False), key=_partition)
        return Changes(
            ownership,
            self._small(MEMBERS, connection, ref, sqlrows.member, members),
            self._small(CONTROLS, connection, ref, sqlrows.control, controls),
            clock, f"{epoch}:{bound}", since is None,  # the clock as the bound was read: no statement more
            sees_every_write=True,  # a row written by hand changes the epoch (migration 0005's triggers)
            fresh_after=fresh_after,
        )  # fmt: skip

    def _make_clock(self, ref: HubRef) -> None:
        """The hub's clock row, with a fresh epoch (a no-op if another writer made it meanwhile)."""
        OwnershipClock.objects.using(self.using).bulk_create(
            [OwnershipClock(**OwnershipClock.scope(ref), serial=0, epoch=secrets.token_hex(8))],
            ignore_conflicts=True,
        )

    def _list_ownership(self, connection: BaseDatabaseWrapper, ref: HubRef) -> list[OwnershipRecord]:
        records = self._valid(OWNERSHIP, OWNERSHIP.read(connection, ref), ref, sqlrows.ownership)
        return sorted(records, key=_partition)

    async def claim_ownership(self, records: Sequence[OwnershipRecord]) -> list[OwnershipRecord]:
        if not records:
            return []
        return await self._run(LEASE, self._claim, list(records))

    def _claim(self, connection: BaseDatabaseWrapper, records: list[OwnershipRecord]) -> list[OwnershipRecord]:
        # A partition named twice in one call: only its first record is tried (the second one's
        # ETag would be stale by then anyway).
        groups: dict[HubRef, dict[str, OwnershipRecord]] = {}
        for record in records:
            groups.setdefault(record.ref, {}).setdefault(record.partition_id, record)
        claims = [r for wanted in groups.values() for r in wanted.values()]
        if len(groups) == 1 and len(claims) <= CHUNK and all(r.etag is not None for r in claims) and (
            sqlrows.sends_together(connection)
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
        sql, params = _update(connection, ref, batch, f"{token}-", None, None)
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
            cursor.execute(f"SELECT {PG_CLOCK}, pg_current_xact_id()::text::bigint")
            now, xid = cursor.fetchone()
            return float(now), int(xid)

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
                cursor.execute(*_update(connection, ref, updates, f"{token}-", now, serial))
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

    # checkpoints ---------------------------------------------------------------------------

    async def list_checkpoints(self, ref: HubRef) -> list[Checkpoint]:
        return await self._run(CHECKPOINT, self._list_checkpoints, ref)

    def _list_checkpoints(self, connection: BaseDatabaseWrapper, ref: HubRef) -> list[Checkpoint]:
        checkpoints = self._valid(CHECKPOINTS, CHECKPOINTS.read(connection, ref), ref, sqlrows.checkpoint)
        return sorted(checkpoints, key=_partition)

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
        info = dict(member.info)
        rows = self._rows(MemberRow, member.ref).filter(owner_id=member.owner_id)
        if rows.update(last_seen=StoreClock(), info=info):
            return
        # First heartbeat (or the row was removed): insert, or update if a racing call inserted.
        row = MemberRow(
            **MemberRow.scope(member.ref), owner_id=member.owner_id, last_seen=read_clock(connection), info=info
        )
        MemberRow.objects.using(self.using).bulk_create(
            [row],
            update_conflicts=True,
            unique_fields=["namespace", "hub", "consumer_group", "owner_id"],
            update_fields=["last_seen", "info"],
        )

    async def list_members(self, ref: HubRef) -> list[Member]:
        return await self._run(LEASE, self._list_members, ref)

    def _list_members(self, connection: BaseDatabaseWrapper, ref: HubRef) -> list[Member]:
        return self._small(MEMBERS, connection, ref, sqlrows.member)

    async def remove_member(self, ref: HubRef, owner_id: str) -> None:
        await self._run(LEASE, self._remove_member, ref, owner_id)

    def _remove_member(self, connection: BaseDatabaseWrapper, ref: HubRef, owner_id: str) -> None:
        self._rows(MemberRow, ref).filter(owner_id=owner_id).delete()

    # controls ------------------------------------------------------------------------------

    async def list_controls(self, ref: HubRef) -> list[Control]:
        return await self._run(LEASE, self._list_controls, ref)

    def _list_controls(self, connection: BaseDatabaseWrapper, ref: HubRef) -> list[Control]:
        return self._small(CONTROLS, connection, ref, sqlrows.control)

    def _small(
        self, listing: Listing, connection: BaseDatabaseWrapper, ref: HubRef,
        convert: Callable[[Any, HubRef, list[str]], T], found: list[tuple[Any, ...]] | None = None,
    ) -> list[T]:  # fmt: skip
        """A whole listing of a small table (read now, or ``found``: as ``Listing.fetch`` gave it), not
        converted again when its rows came back as they were (``balancer.stores.unchanged``)."""
        if found is None:
            found = listing.fetch(connection, ref)
        return self._unchanged.records(
            (listing.table, ref), found, lambda: self._valid(listing, listing.rows(connection, found), ref, convert)
        )

    async def put_control(self, control: Control) -> None:
        await self._run(LEASE, self._put_control, control)

    def _put_control(self, connection: BaseDatabaseWrapper, control: Control) -> None:
        ControlRow.objects.using(self.using).bulk_create(
            [
                ControlRow(
                    **ControlRow.scope(control.ref),
                    kind=ControlKind(control.kind).value,
                    target=control.target,
                    value=control.value,
                    created=read_clock(connection),
                )
            ],
            update_conflicts=True,
            unique_fields=["namespace", "hub", "consumer_group", "kind", "target"],
            update_fields=["value", "created"],
        )

    async def delete_control(self, ref: HubRef, kind: str, target: str) -> None:
        await self._run(LEASE, self._delete_control, ref, ControlKind(kind).value, target)

    def _delete_control(self, connection: BaseDatabaseWrapper, ref: HubRef, kind: str, target: str) -> None:
        self._rows(ControlRow, ref).filter(kind=kind, target=target).delete()


def _seen(cursor: str | None) -> int | None:
    """The change number a cursor names, whatever its epoch (``_since`` judges it)."""
    _, _, seen = (cursor or "").partition(":")
    return int(seen) if seen.isdigit() else None


def _epoch_and_bound(found: tuple[Any, ...], clock: float | None) -> tuple[str, int, float]:
    """The epoch of a hub's change numbers, the first number a writer may still hold uncommitted
    (on PostgreSQL the oldest transaction id still running: ``SqlStore._clock_and_transaction_id``; elsewhere
    the hub's counter plus one) and the store's clock, from the hub's row as ``_clock_sql`` reads
    it (on PostgreSQL with the clock; elsewhere ``clock`` is the local clock, read before)."""
    if clock is None:
        epoch, number, now = found
        return str(epoch), int(number), float(now)
    epoch, number = found
    return str(epoch), int(number) + 1, clock


def _since(cursor: str | None, epoch: str, bound: int) -> int | None:
    """The change number a delta read from ``cursor`` starts at, if the cursor is of the hub's current
    ``epoch`` and not past ``bound`` (None, read all: a clock row made again, rows deleted or edited by
    hand since, a database restored with transaction ids that went back)."""
    seen_epoch, _, seen = (cursor or "").partition(":")
    if seen_epoch != epoch or not seen.isdigit() or int(seen) > bound:
        return None
    return int(seen)


def _update(
    connection: BaseDatabaseWrapper, ref: HubRef, records: list[OwnershipRecord], etag_prefix: str,
    now: float | None, serial: int | None,
) -> tuple[str, list[Any]]:  # fmt: skip
    """The compare-and-set ``UPDATE`` of ``records`` (each with the ETag its writer saw) and its
    parameters: the owner and owner level written, a fresh ETag (``etag_prefix`` and the partition
    id), ``now``, the change number ``serial``, and ``owner_changed`` kept where the row already had
    the owner and owner level written (a renewal), else ``serial``. ``now`` and ``serial`` None (on
    PostgreSQL): the statement's own clock and its transaction's id. Raw SQL, as every cycle writes
    renewals: the ORM's compiling of the same statement cost more than running it. Every expression
    reads the row's old values (SQL's ``UPDATE``), so the order of the assignments does not matter."""
    table, column = _ownership_columns(connection)
    params: list[Any] = []
    number = "%s" if serial is not None else "pg_current_xact_id()::text::bigint"
    written = "%s" if now is not None else PG_CLOCK

    def per_partition(name: str, values: dict[str, Any]) -> str:
        """One value for every row (the common renewal), else a CASE by partition."""
        if len(set(values.values())) == 1:
            params.append(next(iter(values.values())))
            return "%s"
        for pid, value in values.items():
            params.extend((pid, value))
        return f"CASE {column['partition_id']} {' '.join(['WHEN %s THEN %s'] * len(values))} ELSE {column[name]} END"

    owner = per_partition("owner_id", {r.partition_id: r.owner_id for r in records})
    level = per_partition("owner_level", {r.partition_id: r.owner_level for r in records})
    groups: dict[tuple[str, int], list[str]] = {}
    for r in records:
        groups.setdefault((r.owner_id, r.owner_level), []).append(r.partition_id)
    same = f"{column['owner_id']} = %s AND {column['owner_level']} = %s"
    renewed = []
    for (owner_id, owner_level), pids in groups.items():
        params.extend((owner_id, owner_level))
        if len(groups) == 1:
            renewed.append(f"WHEN {same} THEN {column['owner_changed']}")
        else:
            params.extend(pids)
            inside = ", ".join(["%s"] * len(pids))
            renewed.append(f"WHEN {same} AND {column['partition_id']} IN ({inside}) THEN {column['owner_changed']}")
    params.extend(value for value in (serial, etag_prefix, now, serial) if value is not None)
    assignments = [
        f"{column['owner_id']} = {owner}",
        f"{column['owner_level']} = {level}",
        f"{column['owner_changed']} = CASE {' '.join(renewed)} ELSE {number} END",
        f"{column['etag']} = %s || {column['partition_id']}",
        f"{column['last_modified']} = {written}",
        f"{column['changed']} = {number}",
    ]
    etag = column["etag"]
    if connection.vendor == "sqlite":  # an ETag a hand edit left as a BLOB is listed, and so compared, as text
        etag = f"CAST({etag} AS TEXT)"
    pair = f"({column['partition_id']} = %s AND {etag} = %s)"
    params.extend((ref.namespace, ref.hub, ref.consumer_group))
    params.extend(value for r in records for value in (r.partition_id, r.etag))
    scope = " AND ".join(f"{column[name]} = %s" for name in ("namespace", "hub", "consumer_group"))
    sql = (
        f"UPDATE {table} SET {', '.join(assignments)} "
        f"WHERE {scope} AND ({' OR '.join([pair] * len(records))})"
    )
    return sql, params


_OWNERSHIP_COLUMNS = (
    "namespace", "hub", "consumer_group", "partition_id", "owner_id", "owner_level", "etag", "last_modified",
    "changed", "owner_changed",
)  # fmt: skip
_QUOTED: dict[str, tuple[str, dict[str, str]]] = {}


def _ownership_columns(connection: BaseDatabaseWrapper) -> tuple[str, dict[str, str]]:
    """The ownership table and its columns by field name, quoted for the connection's vendor: looked
    up once, not at every write."""
    if connection.vendor not in _QUOTED:
        quote = connection.ops.quote_name
        columns = {name: quote(OWNERSHIP.column(name)) for name in _OWNERSHIP_COLUMNS}
        _QUOTED[connection.vendor] = (quote(Ownership._meta.db_table), columns)
    return _QUOTED[connection.vendor]


_CLOCK_SQL: dict[str, str] = {}


def _clock_sql(connection: BaseDatabaseWrapper) -> str:
    """The hub's change-number epoch and bound (``_epoch_and_bound``), written once per vendor."""
    vendor, quote = connection.vendor, connection.ops.quote_name
    if vendor not in _CLOCK_SQL:
        if vendor == "postgresql":  # the bound, and the clock as it is read
            number = f"pg_snapshot_xmin(pg_current_snapshot())::text::bigint, {PG_CLOCK}"
        else:
            number = quote("serial")
        scope = " AND ".join(f"{quote(column)} = %s" for column in ("namespace", "hub", "consumer_group"))
        table = quote(OwnershipClock._meta.db_table)
        _CLOCK_SQL[vendor] = f"SELECT {quote('epoch')}, {number} FROM {table} WHERE {scope}"
    return _CLOCK_SQL[vendor]


def _partition(record: OwnershipRecord | Checkpoint) -> int:
    return int(record.partition_id)
