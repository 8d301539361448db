"""Builds a ``RaceCoordinator`` on the right race store, with its command-line options, for
``runworkers``; and waits for stores to answer before workers start.

The race needs publish/subscribe, which no ownership store offers, so it has a store of its own:
Redis when there is one (``redis_url``, or the ownership store is a ``RedisStore``), else one
in-memory hub per process (every worker of the process races on it; workers of other processes
cannot see it). The ownership store still fences checkpoints and shows owners (see ``race``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any

from balancer.errors import StoreError
from balancer.model import HubRef
from balancer.protocol import Balancer, ControlStore, EventSink, OwnershipStore, PartitionSource
from balancer.race.backend import MemoryRaceBackend, MemoryRaceHub, RaceBackend
from balancer.race.coordinator import RaceCoordinator
from balancer.race.times import LoadWeights, RaceTimes

log = logging.getLogger(__name__)

PROCESS_HUB = MemoryRaceHub()  # the race of every worker of this process without Redis
_redis_stores: dict[str, Any] = {}  # one RedisStore per URL per process, shared by its workers


def race_backend(ref: HubRef, store: object, redis_url: str | None) -> RaceBackend:
    """Redis's race for ``ref`` when there is a Redis, else this process's in-memory one."""
    from balancer.stores.redis import (
        RedisStore,  # imported here: balancer.race.coordinator itself needs no Redis client
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
    times: RaceTimes | None = None,
    controls: ControlStore | None = None,
    redis_url: str | None = None,
    on_event: EventSink | None = None,
    load: LoadWeights | None = None,
    rng: random.Random | None = None,
) -> RaceCoordinator:
    """A race node for ``owner_id``; see the module docstring for where it races."""
    backend = race_backend(ref, store, redis_url)
    return RaceCoordinator(
        ref, owner_id, store, backend, partitions, times,
        controls=controls, on_event=on_event, load=load, rng=rng,
    )  # fmt: skip


def races_in_process(backend: RaceBackend) -> bool:
    """True when ``backend`` is the process-local hub (nobody outside this process races on it)."""
    return isinstance(backend, MemoryRaceBackend)


# command-line options ------------------------------------------------------------------------

_SPANS = ("normal_lease", "maximum_lease", "maximum_shutdown", "minimum_lease_grab", "leases_held_delay")


def add_race_options(parser: argparse.ArgumentParser) -> None:
    """``--normal-lease`` ... ``--leases-held-delay``, ``--load-weighted``, ``--load-unit``."""
    group = parser.add_argument_group("--strategy race (001's lease race; spans in seconds)")
    defaults = RaceTimes()
    for name in _SPANS:
        value = getattr(defaults, name)
        group.add_argument(f"--{name.replace('_', '-')}", type=float, default=value, help=f"(default {value:g})")
    group.add_argument("--load-weighted", action="store_true",
                       help="weigh by measured events per second instead of partitions held: the default "
                            "strategy's load-weighted shares, or the race's wait (LEASEBOARD_LOAD_WEIGHTED)")
    group.add_argument("--load-unit", type=float, default=100.0,
                       help="events per second that weigh as much as one partition (default 100)")


def race_times(options: Mapping[str, Any], interval: float) -> RaceTimes:
    """The spans ``add_race_options`` parsed; ValueError naming what does not fit."""
    times = RaceTimes(**{name: float(options.get(name, getattr(RaceTimes(), name))) for name in _SPANS})
    if times.maximum_shutdown <= interval:
        raise ValueError(
            f"--maximum-shutdown ({times.maximum_shutdown:g}s) must be longer than --interval ({interval:g}s): "
            "it is also how long a worker processes without hearing from the race's store"
        )
    return times


# start-up --------------------------------------------------------------------------------------

Probe = tuple[str, Callable[[], Awaitable[object]]]


async def wait_until_reachable(probes: Sequence[Probe], stop: asyncio.Event, first: float = 1.0,
                               cap: float = 30.0) -> bool:
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


def probes_of(stores: Iterable[object], coordinators: Iterable[Balancer]) -> list[Probe]:
    """One probe per distinct store (its ``now()``) and per race store (a read of one field)."""
    probes: dict[int, Probe] = {}
    for store in stores:
        now = getattr(store, "now", None)
        if now is not None:
            probes.setdefault(id(store), (f"the store {store!r}", now))
    for coordinator in coordinators:
        if isinstance(coordinator, RaceCoordinator):
            backend = coordinator.backend
            probes.setdefault(id(backend), ("the race's store", partial(backend.hget, "grab", "0")))
    return list(probes.values())


async def close_race_stores() -> None:
    """Close this event loop's connections of the Redis stores made for races (see ``race_backend``)."""
    for store in list(_redis_stores.values()):
        await store.aclose()
