"""The stores the chaos suite runs on, each able to go down, come back and have a record corrupted.

A ``Kit`` knows how to point ``runworkers`` at its store (``--store`` and environment), how to open
the same store in the test process (to sample it), how to take it away and bring it back on the
same port with the same data, and how to corrupt one ownership record the way a hand edit or bit
rot would. PostgreSQL (the SQL store) and Azurite (the Blob store) always run; Redis runs when
``balancer/redisstore.py`` exists (``available_kits`` says which were left out and why).
"""

from __future__ import annotations

import asyncio
import importlib.util
import random
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from balancer.model import HubRef
from tests.support.databases import add_django_database, remove_django_database
from tests.support.postgres import Postgres, start_postgres

DASHBOARD_ALIAS = "chaos"


class Kit(Protocol):
    name: str
    store: str  # the --store value

    def env(self) -> dict[str, str]: ...

    async def open(self) -> Any:
        """The store as the test process reads it (list_ownership, list_checkpoints, now)."""

    async def close(self, store: Any) -> None: ...

    def down(self) -> None: ...

    def up(self) -> None: ...

    async def corrupt(self, store: Any, ref: HubRef, partition_id: str) -> str:
        """Damage ``partition_id``'s ownership record; returns what was done."""

    async def clear(self, store: Any, ref: HubRef, partition_id: str) -> str:
        """Remove ``partition_id``'s ownership record, as an operator would a stuck one; returns what was done."""


# PostgreSQL ----------------------------------------------------------------------------------------


# fsync may be off (the machine does not crash, only the server does), but commits must reach the
# WAL before they return: with synchronous_commit=off a crash loses the last commits, and the suite
# rightly reports checkpoints going backwards.
CHAOS_POSTGRES = {"synchronous_commit": "on", "max_connections": "200"}


def start_cluster() -> Postgres:
    """The module's PostgreSQL; an outage (``kill()``, a crash) keeps its data for ``start()``."""
    return start_postgres(CHAOS_POSTGRES)


@contextmanager
def migrated_cluster() -> Iterator[tuple[Postgres, str]]:
    """A PostgreSQL cluster of its own with the dashboard's database migrated (Django alias
    ``DASHBOARD_ALIAS``), and that database's URL; stopped and the alias forgotten afterwards. Call
    it where the database may be used (``django_db_blocker.unblock()`` in a test)."""
    server = start_cluster()
    try:
        yield server, migrated_database(server)
    finally:
        remove_django_database(DASHBOARD_ALIAS)
        server.stop()


def migrated_database(cluster: Postgres, name: str = DASHBOARD_ALIAS) -> str:
    """Create database ``name`` on ``cluster``, migrate it, and make it Django alias ``name``."""
    from django.core.management import call_command

    cluster.create_database(name)
    add_django_database(name, cluster.database_url(name), connect_timeout=3)
    call_command("migrate", database=name, verbosity=0)
    return cluster.database_url(name)


@dataclass
class SqlKit:
    """The SQL store on PostgreSQL; the dashboard's tables live in the same database."""

    cluster: Postgres
    database_url: str
    name: str = "postgresql"
    store: str = "sql"

    def env(self) -> dict[str, str]:
        return {"DATABASE_URL": self.database_url}

    async def open(self) -> Any:
        from dashboard.sql.store import SqlStore

        return SqlStore(DASHBOARD_ALIAS)

    async def close(self, store: Any) -> None:
        await store.aclose()

    def down(self) -> None:
        self.cluster.kill()

    def up(self) -> None:
        self.cluster.start()

    async def corrupt(self, store: Any, ref: HubRef, partition_id: str) -> str:
        from dashboard.models import Ownership

        ahead = await store.now() + 86_400.0

        def edit() -> int:
            rows = Ownership.objects.using(DASHBOARD_ALIAS).filter(**Ownership.scope(ref), partition_id=partition_id)
            return rows.update(owner_id="ghost-of-a-hand-edit", etag="corrupt!", last_modified=ahead)

        changed = await asyncio.to_thread(edit)
        assert changed == 1, f"no ownership row of partition {partition_id} to corrupt"
        return "owner, etag and last_modified overwritten (an unknown owner, a garbage etag, last modified a day ahead)"

    async def clear(self, store: Any, ref: HubRef, partition_id: str) -> str:
        from dashboard.models import Ownership

        def delete() -> int:
            rows = Ownership.objects.using(DASHBOARD_ALIAS).filter(**Ownership.scope(ref), partition_id=partition_id)
            return rows.delete()[0]

        return f"deleted its ownership row ({await asyncio.to_thread(delete)} row)"


# Azurite ---------------------------------------------------------------------------------------


@dataclass
class BlobKit:
    database_url: str
    azurite: Any = None
    container: str = "chaos"
    name: str = "blob"
    store: str = "blob"

    def __post_init__(self) -> None:
        from tests.support.azurite import start_azurite

        self.azurite = start_azurite()

    def env(self) -> dict[str, str]:
        return {
            "DATABASE_URL": self.database_url,
            "AZURE_STORAGE_CONNECTION_STRING": self.azurite.connection_string,
            "LEASEBOARD_BLOB_CONTAINER": self.container,
        }

    async def open(self) -> Any:
        from balancer.stores.blob.store import BlobStore

        return BlobStore(self.azurite.connection_string, self.container)

    async def close(self, store: Any) -> None:
        await store.aclose()

    def down(self) -> None:
        self.azurite.kill()

    def up(self) -> None:
        self.azurite.start()

    async def corrupt(self, store: Any, ref: HubRef, partition_id: str) -> str:
        from azure.storage.blob.aio import ContainerClient

        from balancer.stores.blob.layout import ownership_blob

        async with ContainerClient.from_connection_string(self.azurite.connection_string, self.container) as client:
            await client.get_blob_client(ownership_blob(ref, partition_id)).set_blob_metadata(
                {"ownerid": "ghost-of-a-hand-edit"}
            )
        return "ownership blob's ownerid replaced by an unknown owner that never heartbeats"

    async def clear(self, store: Any, ref: HubRef, partition_id: str) -> str:
        from azure.storage.blob.aio import ContainerClient

        from balancer.stores.blob.layout import ownership_blob

        async with ContainerClient.from_connection_string(self.azurite.connection_string, self.container) as client:
            await client.get_blob_client(ownership_blob(ref, partition_id)).delete_blob()
        return "deleted its ownership blob"

    def finish(self) -> None:
        self.azurite.stop()


# Redis -----------------------------------------------------------------------------------------


@dataclass
class RedisKit:
    database_url: str
    server: Any = None
    name: str = "redis"
    store: str = "redis"

    def __post_init__(self) -> None:
        from tests.support.redis_server import start_redis

        self.server = start_redis()

    def env(self) -> dict[str, str]:
        return {"DATABASE_URL": self.database_url, "REDIS_URL": self.server.url}

    async def open(self) -> Any:
        from balancer.stores.redis.store import RedisStore

        return RedisStore(self.server.url)

    async def close(self, store: Any) -> None:
        await store.aclose()

    def down(self) -> None:
        """``SHUTDOWN SAVE``: the data goes to ``dump.rdb`` in the server's directory, which the
        restarted server loads (the test server runs without automatic persistence)."""
        from tests.support.redis_server import redis_binary

        command = [redis_binary("redis-cli"), "-h", self.server.host, "-p", str(self.server.port), "shutdown", "save"]
        subprocess.run(command, capture_output=True, timeout=20, check=False)
        if self.server.process is not None:
            self.server.process.wait(20)

    def up(self) -> None:
        self.server.start()

    async def corrupt(self, store: Any, ref: HubRef, partition_id: str) -> str:
        """Either damage the parser refuses (not JSON), or a well-formed record naming an unknown
        owner with a last-modified time that is not a number (never expires unless caught)."""
        from balancer.stores.redis.layout import Keys

        unreadable = random.random() < 0.5
        value = "not json" if unreadable else '{"owner": "ghost", "etag": "corrupt", "modified": "nan", "level": 0}'
        client = store.new_client()
        try:
            await client.hset(Keys.of(ref).ownership, partition_id, value)
        finally:
            await client.aclose()
        return "ownership field overwritten: " + ("not JSON" if unreadable else "unknown owner, modified NaN")

    async def clear(self, store: Any, ref: HubRef, partition_id: str) -> str:
        from balancer.stores.redis.layout import Keys

        client = store.new_client()
        try:
            removed = await client.hdel(Keys.of(ref).ownership, partition_id)
        finally:
            await client.aclose()
        return f"deleted its ownership field ({removed} field)"

    def finish(self) -> None:
        self.server.stop()


@dataclass
class Kits:
    """What the suite runs on, and what it leaves out (said in its output)."""

    names: list[str] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)


def available_kits() -> Kits:
    kits = Kits(["postgresql", "blob"])
    if importlib.util.find_spec("balancer.stores.redis.store") is not None:
        kits.names.append("redis")
    else:
        kits.missing["redis"] = "balancer/redisstore.py does not exist"
    return kits


def make_kit(name: str, cluster: Postgres, database_url: str) -> Kit:
    builders: dict[str, Callable[[], Kit]] = {
        "postgresql": lambda: SqlKit(cluster, database_url),
        "blob": lambda: BlobKit(database_url),
        "redis": lambda: RedisKit(database_url),
    }
    return builders[name]()
