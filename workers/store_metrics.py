"""The store calls' metric families, and the wrapper that counts every call a worker makes to its
stores (``instrumented``): ``leaseboard_store_requests_total`` by operation and outcome,
``leaseboard_store_request_duration_seconds`` by operation. Importing ``workers.metrics`` registers
them too, so every ``/metrics`` of a worker process or the dashboard has them (at 0 until a call).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from prometheus_client import Counter, Histogram

from balancer.changes import ChangeFeed, Changes
from balancer.errors import OwnershipLost, StoreUnavailable
from balancer.model import Checkpoint, Control, HubRef, Member, OwnershipRecord
from balancer.protocol import CheckpointStore, ControlStore, OwnershipStore, Snapshot, SnapshotStore

P = ParamSpec("P")
S = TypeVar("S", covariant=True)  # the protocol a wrapper class forwards
T = TypeVar("T")

# prometheus_client appends "_total" to counter names itself.
STORE_REQUESTS = Counter(
    "leaseboard_store_requests",
    "Calls to the ownership, checkpoint and control store by operation and outcome (ok, lost: the caller no "
    "longer owns the partition, unavailable: the store could not be reached, error: anything else).",
    ["operation", "outcome"],
)
STORE_REQUEST_DURATION = Histogram(
    "leaseboard_store_request_duration_seconds",
    "Duration of one store call, by operation.",
    ["operation"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)

OPERATIONS = (
    "list_ownership",
    "claim_ownership",
    "now",
    "snapshot",
    "snapshot_since",
    "list_checkpoints",
    "update_checkpoint",
    "heartbeat",
    "list_members",
    "remove_member",
    "list_controls",
    "put_control",
    "delete_control",
)
OUTCOMES = ("ok", "lost", "unavailable", "error")


def outcome_of(error: BaseException | None) -> str:
    if error is None:
        return "ok"
    if isinstance(error, OwnershipLost):
        return "lost"
    if isinstance(error, StoreUnavailable):
        return "unavailable"
    return "error"


# One wrapper class per protocol, combined at run time into a class with the methods of exactly the
# protocols the wrapped store has. The methods must be the class's own: since Python 3.12
# ``isinstance(x, SomeProtocol)`` looks attributes up statically, so a wrapper that only forwarded
# through ``__getattr__`` would pass no protocol check, and the coordinator would quietly read a
# cycle's snapshot in four requests instead of one (``balancer.protocol.snapshot``).


@functools.lru_cache(maxsize=64)
def _request_series(operation: str) -> tuple[Any, Any]:
    """The "ok" counter and the duration histogram of ``operation`` (looked up once: every cycle counts)."""
    return STORE_REQUESTS.labels(operation=operation, outcome="ok"), STORE_REQUEST_DURATION.labels(operation=operation)


async def _count(operation: str, call: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
    """``call(*args, **kwargs)`` awaited, counted by outcome and timed under ``operation``."""
    ok, duration = _request_series(operation)
    started = time.perf_counter()
    try:
        result = await call(*args, **kwargs)
    except BaseException as exc:
        STORE_REQUESTS.labels(operation=operation, outcome=outcome_of(exc)).inc()
        raise
    finally:
        duration.observe(time.perf_counter() - started)
    ok.inc()
    return result


class InstrumentedStore(Generic[S]):
    """Counts and times the protocol calls of the store it wraps (``leaseboard_store_requests_total``,
    ``leaseboard_store_request_duration_seconds``). Anything else (``aclose``, ``requests``, attributes
    tests set) reaches the wrapped store unchanged. Made by ``instrumented()``."""

    __slots__ = ("_store",)
    _store: S

    def __init__(self, store: S) -> None:
        object.__setattr__(self, "_store", store)

    if not TYPE_CHECKING:  # at run time only, so the type checker knows just the protocols' methods

        def __getattr__(self, name: str) -> Any:
            if name == "_store":  # not set yet (a copy being made): no endless recursion
                raise AttributeError(name)
            return getattr(self._store, name)

        def __setattr__(self, name: str, value: Any) -> None:
            setattr(self._store, name, value)

    @property
    def wrapped(self) -> S:
        """The store whose calls this wrapper counts."""
        return self._store

    def __repr__(self) -> str:
        return f"InstrumentedStore({self._store!r})"


class CountedOwnership(InstrumentedStore[OwnershipStore]):
    __slots__ = ()

    async def list_ownership(self, ref: HubRef) -> list[OwnershipRecord]:
        return await _count("list_ownership", self._store.list_ownership, ref)

    async def claim_ownership(self, records: Sequence[OwnershipRecord]) -> list[OwnershipRecord]:
        return await _count("claim_ownership", self._store.claim_ownership, records)

    async def now(self) -> float:
        return await _count("now", self._store.now)


class CountedSnapshots(InstrumentedStore[SnapshotStore]):
    __slots__ = ()

    async def snapshot(self, ref: HubRef) -> Snapshot:
        return await _count("snapshot", self._store.snapshot, ref)


class CountedChanges(InstrumentedStore[ChangeFeed]):
    __slots__ = ()

    async def snapshot_since(self, ref: HubRef, cursor: str | None, stale_after: float | None = None) -> Changes:
        return await _count("snapshot_since", self._store.snapshot_since, ref, cursor, stale_after)


class CountedCheckpoints(InstrumentedStore[CheckpointStore]):
    __slots__ = ()

    async def list_checkpoints(self, ref: HubRef) -> list[Checkpoint]:
        return await _count("list_checkpoints", self._store.list_checkpoints, ref)

    async def update_checkpoint(self, checkpoint: Checkpoint, owner_id: str) -> Checkpoint:
        return await _count("update_checkpoint", self._store.update_checkpoint, checkpoint, owner_id)


class CountedControls(InstrumentedStore[ControlStore]):
    __slots__ = ()

    async def heartbeat(self, member: Member) -> None:
        await _count("heartbeat", self._store.heartbeat, member)

    async def list_members(self, ref: HubRef) -> list[Member]:
        return await _count("list_members", self._store.list_members, ref)

    async def remove_member(self, ref: HubRef, owner_id: str) -> None:
        await _count("remove_member", self._store.remove_member, ref, owner_id)

    async def list_controls(self, ref: HubRef) -> list[Control]:
        return await _count("list_controls", self._store.list_controls, ref)

    async def put_control(self, control: Control) -> None:
        await _count("put_control", self._store.put_control, control)

    async def delete_control(self, ref: HubRef, kind: str, target: str) -> None:
        await _count("delete_control", self._store.delete_control, ref, kind, target)


# Protocol -> the wrapper class with its methods, in the order the combined classes list them.
COUNTED: tuple[tuple[type, type[InstrumentedStore[object]]], ...] = (
    (OwnershipStore, CountedOwnership),
    (SnapshotStore, CountedSnapshots),
    (ChangeFeed, CountedChanges),
    (CheckpointStore, CountedCheckpoints),
    (ControlStore, CountedControls),
)


@functools.cache
def _wrapper_class(parts: tuple[type[InstrumentedStore[object]], ...]) -> type[InstrumentedStore[object]]:
    if len(parts) == 1:
        return parts[0]
    name = "Instrumented" + "".join(part.__name__.removeprefix("Counted") for part in parts)
    return type(name, parts, {"__slots__": (), "__module__": __name__})


def instrumented(store: object) -> InstrumentedStore[object]:
    """``store`` wrapped so that its calls are counted: an instance of a class having the methods of
    every store protocol ``store`` implements (``OwnershipStore``, ``SnapshotStore``,
    ``CheckpointStore``, ``ControlStore``) and of no other. ``store`` itself if already wrapped.
    Raises TypeError for an object that implements none of them."""
    if isinstance(store, InstrumentedStore):
        return store
    parts = tuple(wrapper for protocol, wrapper in COUNTED if isinstance(store, protocol))
    if not parts:
        raise TypeError(f"{store!r} implements no store protocol")
    return _wrapper_class(parts)(store)


def _initialise() -> None:
    """Create the series at 0, so a rate() over them works before the first call (and multi-process
    mode, which only reports series that were written, reports them)."""
    for operation in OPERATIONS:
        for outcome in OUTCOMES:
            STORE_REQUESTS.labels(operation, outcome)


_initialise()
