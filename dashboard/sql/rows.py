"""The SQL store's listings, read without the ORM's model instances.

A worker lists its hub's ownership rows, members and controls at every cycle. Through the ORM each
listing compiled its query again and built a model instance per row (``__init__`` and the
``pre_init``/``post_init`` signals), about half of an idle worker's CPU at 1024 partitions. A
``Listing`` writes its ``SELECT`` once per database vendor and reads each row into a plain named
tuple of the columns it names (plus ``pk``), applying the same converters the ORM would (the
backend's and the field's, e.g. a JSON column's ``from_db_value``), so a row reads exactly as it did
through the model, a row edited by hand included. Only a row found corrupt is built as a model
instance, to be described in the warning as the admin would show it.

The converters that turn rows into the balancer's records (see ``store.py`` for what a row edited
by hand reads as) take the hub ``ref`` the listing was scoped to, which every row it returns has.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, Sequence
from typing import Any

from django.db import DatabaseError
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field

from balancer.model import Checkpoint, Control, ControlKind, HubRef, Member, OwnershipRecord
from balancer.stores.flaws import finite_time, time_flaw

from ..models import CheckpointRow, ControlRow, MemberRow, Ownership, Scoped
from .clock import PG_CLOCK

SCOPE = ("namespace", "hub", "consumer_group")


class Listing:
    """How one table's rows of one hub are listed: the columns read and the order given."""

    def __init__(self, model: type[Scoped], columns: tuple[str, ...], order: tuple[str, ...] = ()) -> None:
        self.model, self.columns, self.order = model, columns, order
        self.table: str = model._meta.db_table
        self.row: Any = namedtuple(f"{model.__name__}Read", ("pk", *columns))  # type: ignore[misc]
        self._sql: dict[tuple[str, str], str] = {}

    def _field(self, name: str) -> Field[Any, Any]:
        field = self.model._meta.get_field(name)
        assert isinstance(field, Field), field  # a column of the model, not a relation
        return field

    def column(self, name: str) -> str:
        """The database column of the model's field ``name``."""
        return str(self._field(name).column)

    def __repr__(self) -> str:
        return f"Listing({self.table})"

    def sql(self, connection: BaseDatabaseWrapper, rows: str = "all") -> str:
        """The ``SELECT`` of one hub's rows, its parameters the hub's scope, then for ``rows``
        "changed": a change number (the rows whose number is at least that), "quiet": a change number
        and a time (the rows whose owner changed at that number or later, or last written before
        that time; a time that is no number is never before any), "stale": a change number and
        seconds (as "quiet", the time being the server's clock in the statement, ``PG_CLOCK``, less
        those seconds: PostgreSQL only)."""
        key = (connection.vendor, rows)
        if key not in self._sql:
            quote = connection.ops.quote_name
            columns = [self.column(self.model._meta.pk.name), *map(self.column, self.columns)]
            where = [f"{quote(self.column(c))} = %s" for c in SCOPE]
            if rows == "changed":
                where.append(f"{quote(self.column('changed'))} >= %s")
            elif rows in ("quiet", "stale"):
                owner_changed, written = quote(self.column("owner_changed")), quote(self.column("last_modified"))
                before = "%s" if rows == "quiet" else f"{PG_CLOCK} - CAST(%s AS DOUBLE PRECISION)"
                where.append(f"({owner_changed} >= %s OR {written} < {before})")
            sql = f"SELECT {', '.join(map(quote, columns))} FROM {quote(self.table)} WHERE {' AND '.join(where)}"
            if self.order:
                sql += f" ORDER BY {', '.join(quote(self.column(c)) for c in self.order)}"
            self._sql[key] = sql
        return self._sql[key]

    def read(
        self,
        connection: BaseDatabaseWrapper,
        ref: HubRef,
        since: int | None = None,
        written_before: float | None = None,
    ) -> list[Any]:
        """The rows of ``ref``, in order: with ``since``, those with a change number of at least that;
        with ``written_before`` too, those whose owner changed at ``since`` or later (renewals left
        out) or that were last written before ``written_before``."""
        return self.rows(connection, self.fetch(connection, ref, since, written_before))

    def fetch(
        self,
        connection: BaseDatabaseWrapper,
        ref: HubRef,
        since: int | None = None,
        written_before: float | None = None,
    ) -> list[tuple[Any, ...]]:
        """``read``'s rows as the database driver gives them, before the converters."""
        (found,) = fetch_together(connection, [self.statement(connection, ref, since, written_before)])
        return found

    def statement(
        self,
        connection: BaseDatabaseWrapper,
        ref: HubRef,
        since: int | None = None,
        written_before: float | None = None,
        stale_after: float | None = None,
    ) -> tuple[str, list[Any]]:
        """``fetch``'s ``SELECT`` and its parameters, to be sent with others (``fetch_together``).
        ``stale_after`` instead of ``written_before`` (on PostgreSQL): the rows last written more than
        that many seconds before the statement's clock, the one every statement sent with it reads."""
        params: list[Any] = [ref.namespace, ref.hub, ref.consumer_group]
        which = "all"
        if since is not None:
            params.append(since)
            which = "changed"
            if written_before is not None:
                params.append(written_before)
                which = "quiet"
            elif stale_after is not None:
                params.append(stale_after)
                which = "stale"
        return self.sql(connection, which), params

    def rows(self, connection: BaseDatabaseWrapper, found: list[tuple[Any, ...]]) -> list[Any]:
        """Rows as ``fetch`` gave them, converted as the ORM converts them, as named tuples."""
        convert = self._converters(connection)
        if not convert:
            return list(map(self.row._make, found))
        rows = []
        for values in found:
            listed = list(values)
            for index, converters, expression in convert:
                for converter in converters:
                    listed[index] = converter(listed[index], expression, connection)
            rows.append(self.row._make(listed))
        return rows

    def _converters(self, connection: BaseDatabaseWrapper) -> list[tuple[int, list[Callable[..., Any]], Any]]:
        """Per column that has any, the converters the ORM applies to what the database returns."""
        found = []
        for index, name in enumerate(self.columns, start=1):
            expression = self._field(name).get_col(self.table)
            converters = connection.ops.get_db_converters(expression) + expression.get_db_converters(connection)
            if converters:
                found.append((index, converters, expression))
        return found

    def describe(self, row: Any, ref: HubRef) -> str:
        """``row`` as its model names it (``str()``), for a warning about it."""
        values = {name: getattr(row, name) for name in self.columns}
        return str(self.model(**{"pk": row.pk, **self.model.scope(ref), **values}))


def sends_together(connection: BaseDatabaseWrapper) -> bool:
    """Whether several statements can go to the database in one message: on PostgreSQL with Django's
    default client-side binding (``server_side_binding`` prepares each statement on its own)."""
    options = connection.settings_dict.get("OPTIONS") or {}
    return connection.vendor == "postgresql" and options.get("server_side_binding") is not True


def fetch_together(
    connection: BaseDatabaseWrapper, statements: Sequence[tuple[str, Sequence[Any]]]
) -> list[list[tuple[Any, ...]]]:
    """The rows of each ``SELECT`` (with its parameters), in order. On PostgreSQL they go in one
    message (``sends_together``): one round trip, run one after another in one implicit transaction
    (each statement still sees what was committed before it began), and ``STATEMENT_TIMESTAMP()`` is
    the same in all of them. Elsewhere one after another (a later statement's clock is then later)."""
    if not sends_together(connection) or len(statements) == 1:
        found = []
        for sql, params in statements:
            with connection.cursor() as cursor:
                cursor.execute(sql, params)
                found.append(list(cursor.fetchall()))
        return found
    # psycopg's client-side binding cursor (Django's default) sends a query of several statements
    # as PostgreSQL's simple query; ``nextset()`` steps from one statement's rows to the next's.
    with connection.cursor() as cursor:
        cursor.execute("; ".join(sql for sql, _ in statements), [p for _, params in statements for p in params])
        found = [list(cursor.fetchall())]
        while cursor.nextset():
            found.append(list(cursor.fetchall()))
    if len(found) != len(statements):  # a driver that ran only some of them: never read a short answer
        raise DatabaseError(f"{len(statements)} statements sent together, {len(found)} answered")
    return found


OWNERSHIP = Listing(Ownership, ("partition_id", "owner_id", "etag", "last_modified", "owner_level"))
CHECKPOINTS = Listing(CheckpointRow, ("partition_id", "sequence_number", "offset", "last_modified"))
MEMBERS = Listing(MemberRow, ("owner_id", "last_seen", "info"), order=("owner_id",))
CONTROLS = Listing(ControlRow, ("kind", "target", "value", "created"), order=("kind", "target"))


class Print:
    """A table's rows of one hub in brief, as text: their count and the sum of their ids. A row added
    (a new id: ids are never reused) or removed changes it; a row updated does not."""

    def __init__(self, listing: Listing) -> None:
        self.listing = listing
        self._sql: dict[str, str] = {}

    def sql(self, connection: BaseDatabaseWrapper) -> str:
        """The print as a scalar subquery (to go in another ``SELECT``), its parameters the hub's scope."""
        if connection.vendor not in self._sql:
            quote, listing = connection.ops.quote_name, self.listing
            pk = quote(listing.column(listing.model._meta.pk.name))
            where = " AND ".join(f"{quote(listing.column(c))} = %s" for c in SCOPE)
            brief = f"CAST(COUNT(*) AS TEXT) || '-' || CAST(COALESCE(SUM({pk}), 0) AS TEXT)"
            self._sql[connection.vendor] = f"(SELECT {brief} FROM {quote(listing.table)} WHERE {where})"
        return self._sql[connection.vendor]


MEMBER_PRINT = Print(MEMBERS)
CONTROL_PRINT = Print(CONTROLS)


# rows to records -----------------------------------------------------------------------------


def _text(value: object) -> str:
    """A text column as stored (SQLite keeps whatever type a hand edit gave it)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value if isinstance(value, str) else str(value)


def _time(name: str, value: object, flaws: list[str]) -> float | None:
    found = finite_time(value)
    if found is None:
        flaws.append(time_flaw(name, value))
    return found


def ownership(row: Any, ref: HubRef, flaws: list[str]) -> OwnershipRecord:
    level: object = row.owner_level
    if not isinstance(level, int) or isinstance(level, bool):
        flaws.append(f"owner_level {level!r} is not an integer: read as 0")
        level = 0
    etag = _text(row.etag)
    if etag != row.etag:
        flaws.append(f"etag {row.etag!r} is not text: listed as {etag!r}")
    return OwnershipRecord(
        ref, _text(row.partition_id), _text(row.owner_id), etag, _time("last_modified", row.last_modified, flaws), level
    )


def checkpoint(row: Any, ref: HubRef, flaws: list[str]) -> Checkpoint:
    offset = None if row.offset is None else _text(row.offset)
    modified = _time("last_modified", row.last_modified, flaws)
    return Checkpoint(ref, _text(row.partition_id), row.sequence_number, offset, modified)


def member(row: Any, ref: HubRef, flaws: list[str]) -> Member:
    if not isinstance(row.info, dict):
        raise ValueError(f"info must be an object, got {type(row.info).__name__}")
    seen = finite_time(row.last_seen)
    if seen is None:  # not alive, whatever it says: its worker's next heartbeat rewrites it
        raise ValueError(f"last_seen {row.last_seen!r} is not a finite number: not alive")
    return Member(ref, _text(row.owner_id), seen, {str(k): str(v) for k, v in row.info.items()})


def control(row: Any, ref: HubRef, flaws: list[str]) -> Control:
    created = _time("created", row.created, flaws)
    return Control(ref, ControlKind(row.kind), _text(row.target), _text(row.value), created)
