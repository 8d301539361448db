"""The Redis store's namespace: the keys of its hubs found with ``SCAN``, then every hash of every hub
and the server's clock in one ``MULTI``/``EXEC`` pipeline (``balancer.stores.redis`` draws the keys).

Round trips: one ``SCAN`` per ``SCAN_COUNT`` keys of the database (one, below that many), then one.
Fields that cannot be read are skipped, as the store's listings skip them (they log them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import unquote

from balancer.model import HubRef
from balancer.stores.redis.records import (
    parse_checkpoint,
    parse_control,
    parse_member,
    parse_ownership,
    server_time,
    texts,
)
from balancer.stores.redis.store import Connection, Keys, RedisStore, scope

from .everything import Everything, Records

T = TypeVar("T")

# Keys a SCAN call looks at: Redis walks that many slots of its table per call, a few milliseconds
# of the server's time, so a database of fewer keys is found in one round trip.
SCAN_COUNT = 10_000
HASHES = ("ownership", "checkpoints", "members", "controls")


def namespace_prefix(namespace: str) -> str:
    """``leaseboard:{<namespace>/``: how every key of the namespace starts (its parts percent-encoded,
    so the prefix holds no glob character)."""
    whole = scope(HubRef(namespace, "h", "g"))
    return whole[: -len("h/g}")]


def ref_of(key: str, prefix: str, namespace: str) -> HubRef | None:
    """The hub and consumer group of one of ``HASHES``' keys, or None for any other key."""
    inner, _, kind = key[len(prefix) :].rpartition("}:")
    hub, _, group = inner.partition("/")
    if kind not in HASHES or not hub or not group or "/" in group:
        return None
    try:
        return HubRef(namespace, unquote(hub), unquote(group))
    except ValueError:
        return None


async def _scan(store: RedisStore, prefix: str, namespace: str) -> tuple[set[HubRef], int]:
    found: set[HubRef] = set()
    cursor, calls = 0, 0
    while True:

        async def scan(c: Connection, at: int = cursor) -> Any:
            return await c.client.scan(at, match=f"{prefix}*", count=SCAN_COUNT)

        cursor, keys = await store.run("listing the hubs of a namespace", scan)
        calls += 1
        found.update(ref for ref in (ref_of(str(key), prefix, namespace) for key in keys) if ref is not None)
        if int(cursor) == 0:
            return found, calls


def _parsed(ref: HubRef, raw: Mapping[Any, Any], parse: Callable[[HubRef, str, str, list[str]], T]) -> list[T]:
    out = []
    for name, value in texts(raw).items():
        try:
            out.append(parse(ref, name, value, []))
        except ValueError:
            continue
    return out


async def read_redis(store: RedisStore, namespace: str) -> Everything:
    """Every record of ``namespace``. Raises StoreError (StoreUnavailable) as the store's calls do."""
    prefix = namespace_prefix(namespace)
    refs, scans = await _scan(store, prefix, namespace)
    ordered = sorted(refs, key=lambda r: (r.hub, r.consumer_group))

    async def read(c: Connection) -> list[Any]:
        async with c.client.pipeline(transaction=True) as pipe:
            for ref in ordered:
                keys = Keys.of(ref)
                for key in (keys.ownership, keys.checkpoints, keys.members, keys.controls):
                    pipe.hgetall(key)
            pipe.time()
            return list(await pipe.execute())

    *hashes, (seconds, micros) = await store.run("reading a namespace", read)
    read_ = Records()
    for n, ref in enumerate(ordered):
        ownership, checkpoints, members, controls = hashes[4 * n : 4 * n + 4]
        read_.ownership += _parsed(ref, ownership, parse_ownership)
        read_.checkpoints += _parsed(ref, checkpoints, parse_checkpoint)
        read_.members += _parsed(ref, members, parse_member)
        read_.controls += _parsed(ref, controls, parse_control)
    now = server_time(seconds, micros)
    return Everything.of(now, scans + 1, read_.ownership, read_.checkpoints, read_.members, read_.controls)
