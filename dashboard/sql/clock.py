"""The SQL store's clock: the database server's on PostgreSQL, this machine's elsewhere.

On PostgreSQL every ownership, checkpoint and heartbeat time is the server's, read in the same
statement that writes it, so workers on machines with skewed clocks judge expiry alike.
"""

from __future__ import annotations

import time
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import FloatField
from django.db.models.expressions import Expression

_PG_CLOCK = "CAST(EXTRACT(EPOCH FROM STATEMENT_TIMESTAMP()) AS DOUBLE PRECISION)"
PG_CLOCK = _PG_CLOCK  # the server's clock in a statement of one's own (the store's change bound, ``reads.py``)
# The writing transaction's id on PostgreSQL: the change number of the rows it writes (``claims.py``).
PG_TRANSACTION_ID = "pg_current_xact_id()::text::bigint"


class StoreClock(Expression):
    """The store's clock inside a statement: the server's on PostgreSQL, this machine's elsewhere."""

    output_field = FloatField()

    def as_sql(self, compiler: Any, connection: BaseDatabaseWrapper) -> tuple[str, Any]:
        return "%s", (local_clock(),)

    def as_postgresql(self, compiler: Any, connection: BaseDatabaseWrapper) -> tuple[str, Any]:
        return _PG_CLOCK, ()


def local_clock() -> float:
    """This machine's clock (a module attribute so tests can skew it)."""
    return time.time()


def read_clock(connection: BaseDatabaseWrapper) -> float:
    """The store's clock: one ``SELECT`` on PostgreSQL, no statement elsewhere."""
    if connection.vendor != "postgresql":
        return local_clock()
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {_PG_CLOCK}")
        (now,) = cursor.fetchone()
    return float(now)
