"""001's lease race on the right race store, and the start-up check that waits for stores to answer.

The race needs publish/subscribe, which no ownership store offers, so it has a store of its own:
Redis when there is one (``redis_url``, or the ownership store is a ``RedisStore``), else one
in-memory hub per process (every worker of the process races on it; workers of other processes
cannot see it). The ownership store still fences checkpoints and shows owners (see
``balancer.race``). The process's race hub and its Redis stores for races live here, the wiring's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Iterable, Sequence
from functools import partial
from typing import Any

from balancer.errors import StoreError
from balancer.model import HubRef
from balancer.protocol import ControlStore, EventSink, OwnershipStore, PartitionSource
from balancer.race.backend import MemoryRaceBackend, MemoryRaceHub, RaceBackend
from balancer.race.coordinator import RaceCoordinator
from balancer.race.times import LoadWeights, RaceTimes

# The logger of the start-up check's lines, as named when it lived in balancer/race/build.py.
log = logging.getLogger("balancer.race.build")

PROCESS_HUB = MemoryRaceHub()  # the race of every worker of this process without Redis
_redis_stores: dict[str, Any] = {}  # one RedisStore per URL per process, shared by its workers


def race_backend(ref: HubRef, store: object, redis_url: str | None) -> RaceBackend:
    """Redis's race for ``ref`` when there is a Redis, else this process's in-memory one."""
    from balancer.stores.redis.store import (
        RedisStore,  # imported here: the race without Redis needs no Redis client
    )

    redis: RedisStore | None = None
    if isinstance(store, RedisStore):
        redis = store
    else:
        # The ownership store may be wrapped (metrics); a Redis store's URL shows through.
        url = redis_url or getattr(store, "url", None)
        if isinstance(url, str) and url.startswith(("redis://", "rediss://", "unix://")):
            redis = _redis_stores.get(url)
            if redis is None:
                redis = _redis_stores[url] = RedisStore(url)
    if redis is None:
        return MemoryRaceBackend(PROCESS_HUB, ref)
    from balancer.race.redis import RedisRaceBackend

    return RedisRaceBackend(redis, ref)


def build_race_coordinator(
    ref: HubRef,
    owner_id: str,
    store: OwnershipStore,
    partitions: PartitionSource,
    *,
    backend: RaceBackend,
    times: RaceTimes | None = None,
    controls: ControlStore | None = None,
    on_event: EventSink | None = None,
    load: LoadWeights | None = None,
    rng: random.Random | None = None,
) -> RaceCoordinator:
    """A race node for ``owner_id`` racing on ``backend`` (``race_backend``)."""
    return RaceCoordinator(
        ref,
        owner_id,
        store,
        backend,
        partitions,
        times,
        controls=controls,
        on_event=on_event,
        load=load,
        rng=rng,
    )


def races_in_process(backend: RaceBackend) -> bool:
    """True when ``backend`` is the process-local hub (nobody outside this process races on it)."""
    return isinstance(backend, MemoryRaceBackend)


async def close_race_stores() -> None:
    """Close this event loop's connections of the Redis stores made for races (see ``race_backend``)."""
    for store in list(_redis_stores.values()):
        await store.aclose()


# start-up --------------------------------------------------------------------------------------

Probe = tuple[str, Callable[[], Awaitable[object]]]


async def wait_until_reachable(
    probes: Sequence[Probe], stop: asyncio.Event, first: float = 1.0, cap: float = 30.0
) -> bool:
    """Call each probe until it answers, backing off from ``first`` to ``cap`` seconds between
    attempts, one log line per failed attempt (no traceback: the message says what is wrong).
    Returns False if ``stop`` was set first."""
    delay = first
    for name, probe in probes:
        failed = False
        while not stop.is_set():
            try:
                await probe()
            except StoreError as exc:
                failed = True
                log.error("%s is not reachable: %s; retrying in %gs", name, exc, delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                delay = min(delay * 2, cap)
                continue
            if failed:
                log.warning("%s answers now", name)
            break
    return not stop.is_set()


def probes_of(stores: Iterable[object], backends: Iterable[RaceBackend]) -> list[Probe]:
    """One probe per distinct store (its ``now()``) and per race store (a read of one field)."""
    probes: dict[int, Probe] = {}
    for store in stores:
        now = getattr(store, "now", None)
        if now is not None:
            probes.setdefault(id(store), (f"the store {store!r}", now))
    for backend in backends:
        probes.setdefault(id(backend), ("the race's store", partial(backend.hget, "grab", "0")))
    return list(probes.values())
