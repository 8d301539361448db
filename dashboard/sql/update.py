"""The compare-and-set ``UPDATE`` of ownership rows, in raw SQL: every cycle writes renewals, and the
ORM's compiling of the same statement cost more than running it."""

from __future__ import annotations

from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from balancer.model import HubRef, OwnershipRecord

from ..models import Ownership
from .clock import PG_CLOCK, PG_TRANSACTION_ID
from .rows import OWNERSHIP


def update_statement(
    connection: BaseDatabaseWrapper,
    ref: HubRef,
    records: list[OwnershipRecord],
    etag_prefix: str,
    now: float | None,
    serial: int | None,
) -> tuple[str, list[Any]]:
    """The compare-and-set ``UPDATE`` of ``records`` (each with the ETag its writer saw) and its
    parameters: the owner and owner level written, a fresh ETag (``etag_prefix`` and the partition
    id), ``now``, the change number ``serial``, and ``owner_changed`` kept where the row already had
    the owner and owner level written (a renewal), else ``serial``. ``now`` and ``serial`` None (on
    PostgreSQL): the statement's own clock and its transaction's id. Raw SQL, as every cycle writes
    renewals: the ORM's compiling of the same statement cost more than running it. Every expression
    reads the row's old values (SQL's ``UPDATE``), so the order of the assignments does not matter."""
    table, column = _ownership_columns(connection)
    params: list[Any] = []
    number = "%s" if serial is not None else PG_TRANSACTION_ID
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
    where = _where(connection, column, ref, records, params)
    return f"UPDATE {table} SET {', '.join(assignments)} WHERE {where}", params


def _where(
    connection: BaseDatabaseWrapper,
    column: dict[str, str],
    ref: HubRef,
    records: list[OwnershipRecord],
    params: list[Any],
) -> str:
    """The rows of ``ref`` that still carry the ETag each record's writer saw (their parameters added
    to ``params``)."""
    etag = column["etag"]
    if connection.vendor == "sqlite":  # an ETag a hand edit left as a BLOB is listed, and so compared, as text
        etag = f"CAST({etag} AS TEXT)"
    pair = f"({column['partition_id']} = %s AND {etag} = %s)"
    params.extend((ref.namespace, ref.hub, ref.consumer_group))
    params.extend(value for r in records for value in (r.partition_id, r.etag))
    scope = " AND ".join(f"{column[name]} = %s" for name in ("namespace", "hub", "consumer_group"))
    return f"{scope} AND ({' OR '.join([pair] * len(records))})"


_OWNERSHIP_COLUMNS = (
    "namespace",
    "hub",
    "consumer_group",
    "partition_id",
    "owner_id",
    "owner_level",
    "etag",
    "last_modified",
    "changed",
    "owner_changed",
)
_QUOTED: dict[str, tuple[str, dict[str, str]]] = {}


def _ownership_columns(connection: BaseDatabaseWrapper) -> tuple[str, dict[str, str]]:
    """The ownership table and its columns by field name, quoted for the connection's vendor: looked
    up once, not at every write."""
    if connection.vendor not in _QUOTED:
        quote = connection.ops.quote_name
        columns = {name: quote(OWNERSHIP.column(name)) for name in _OWNERSHIP_COLUMNS}
        _QUOTED[connection.vendor] = (quote(Ownership._meta.db_table), columns)
    return _QUOTED[connection.vendor]
