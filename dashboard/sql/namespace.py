"""The SQL store's read of a whole namespace: every hub and consumer group's ownership rows,
checkpoints, members and controls, and the store's clock, in one call of the store (the console's
groups page, ``dashboard.live.groups``).

One trip to the lease thread: on PostgreSQL the five ``SELECT``s go in one message
(``rows.fetch_together``), elsewhere one after another on that thread. Rows are converted as the
per-hub listings convert them (``rows.py``); a row those would skip as unreadable is skipped here
too, without a warning of its own (the workers' listings of its hub log it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db.backends.base.base import BaseDatabaseWrapper

from balancer.model import Checkpoint, Control, HubRef, Member, OwnershipRecord

from . import rows as sqlrows
from .clock import PG_CLOCK, local_clock
from .lanes import LEASE, Lanes
from .rows import CHECKPOINTS, CONTROLS, MEMBERS, OWNERSHIP, Listing, fetch_together

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class NamespaceRead:
    """Every record of one namespace, as one read of the store saw them at its clock ``now``."""

    now: float
    ownership: list[OwnershipRecord]
    checkpoints: list[Checkpoint]
    members: list[Member]
    controls: list[Control]


def _scoped(listing: Listing) -> Listing:
    """``listing``'s columns, with the hub and consumer group each row belongs to."""
    return Listing(listing.model, ("hub", "consumer_group", *listing.columns))


_OWNERSHIP, _CHECKPOINTS, _MEMBERS, _CONTROLS = map(_scoped, (OWNERSHIP, CHECKPOINTS, MEMBERS, CONTROLS))
_SQL: dict[tuple[str, str], str] = {}


def _select(connection: BaseDatabaseWrapper, listing: Listing) -> str:
    """The ``SELECT`` of every row of one namespace (its one parameter)."""
    key = (connection.vendor, listing.table)
    if key not in _SQL:
        quote = connection.ops.quote_name
        columns = [listing.column(listing.model._meta.pk.name), *map(listing.column, listing.columns)]
        where = f"{quote(listing.column('namespace'))} = %s"
        _SQL[key] = f"SELECT {', '.join(map(quote, columns))} FROM {quote(listing.table)} WHERE {where}"
    return _SQL[key]


def _records(
    connection: BaseDatabaseWrapper,
    listing: Listing,
    found: list[tuple[Any, ...]],
    namespace: str,
    convert: Callable[[Any, HubRef, list[str]], T],
) -> list[T]:
    out = []
    for row in listing.rows(connection, found):
        try:
            out.append(convert(row, HubRef(namespace, str(row.hub), str(row.consumer_group)), []))
        except (ValueError, TypeError):  # unreadable: skipped, as the hub's own listing skips it
            continue
    return out


class NamespaceReads(Lanes):
    """``read_namespace``, run on the lease lane (``SqlStore`` is built on it)."""

    async def read_namespace(self, namespace: str) -> NamespaceRead:
        """Every ownership row, checkpoint, member and control of ``namespace``: one store request.
        Raises StoreUnavailable when the database cannot be read."""
        return await self._run(LEASE, self._read_namespace, namespace)

    def _read_namespace(self, connection: BaseDatabaseWrapper, namespace: str) -> NamespaceRead:
        listings = (_OWNERSHIP, _CHECKPOINTS, _MEMBERS, _CONTROLS)
        statements: list[tuple[str, list[Any]]] = [(_select(connection, each), [namespace]) for each in listings]
        postgres = connection.vendor == "postgresql"
        if postgres:  # the server's clock, in the same message
            statements.append((f"SELECT {PG_CLOCK}", []))
        now = None if postgres else local_clock()
        ownership, checkpoints, members, controls, *clock = fetch_together(connection, statements)
        return NamespaceRead(
            float(clock[0][0][0]) if now is None else now,
            _records(connection, _OWNERSHIP, ownership, namespace, sqlrows.ownership),
            _records(connection, _CHECKPOINTS, checkpoints, namespace, sqlrows.checkpoint),
            _records(connection, _MEMBERS, members, namespace, sqlrows.member),
            _records(connection, _CONTROLS, controls, namespace, sqlrows.control),
        )
