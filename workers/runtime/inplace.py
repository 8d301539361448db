"""Dead letters replayed in place (``workers.deadletter.inplace``): the worker finds the requests for
the partitions it pumps, and each pump hands their dead letters to its handler between two reads,
while its lease holds.

``InPlaceWatch`` is the worker's: after each cycle it looks at the requests folder (one ``stat``;
the folder is listed only when it changed or the pumps did) and gives each request to the pump of
its partition. ``InPlace`` is a pump's: the requests it was given, handled from the pump's loop
one dead letter at a time, each marked as soon as its handler call returns. The checkpoint does
not move (the events are behind it). A handler call that fails is marked failed with its error,
not retried and not set aside again: the dead letter stays as it was, and may be replayed again.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Protocol

import workers.metrics as metrics
from balancer.model import HubRef
from workers.deadletter import files
from workers.deadletter.inplace import Request, event_of, partition_of, requests_folder, settle, to_handle
from workers.handlers import PartitionContext
from workers.runtime.lane import ThreadLane
from workers.sources.base import ReceivedEvent

log = logging.getLogger("leaseboard.pump")
RECENT_NS = 2_000_000_000  # a folder changed this recently is listed again at the next look (mtime's grain)


class Takes(Protocol):
    @property
    def in_place(self) -> InPlace: ...


def folder_for(directory: Path | None, ref: HubRef) -> Path | None:
    """The dead-letter folder of ``ref``'s hub, None when dead letters are kept in memory only."""
    return None if directory is None else files.folder_of(directory, ref.hub)


class InPlaceWatch:
    """A worker's look for in-place requests, after each of its cycles (the folder is its pumps')."""

    def __init__(self, clock_ns: Callable[[], int] = time.time_ns) -> None:
        self._clock_ns = clock_ns
        self._seen: tuple[int, frozenset[tuple[str, int]]] | None = None

    def look(self, pumps: Mapping[str, Takes]) -> None:
        """Give each request to the pump of its partition (a pump ignores one it has already)."""
        folder = next((p.in_place.folder for p in pumps.values()), None)
        if folder is None:
            return  # no pump, or dead letters kept in memory only
        requests = requests_folder(folder)
        try:
            changed = os.stat(requests).st_mtime_ns
        except OSError:
            return  # no request was ever made
        key = (changed, frozenset((pid, id(pump)) for pid, pump in pumps.items()))
        if key == self._seen and self._clock_ns() - changed > RECENT_NS:
            return
        self._seen = key
        try:
            found = sorted(requests.iterdir())
        except OSError:
            return
        for path in found:
            pid = partition_of(path)
            if pid is not None and pid in pumps:
                pumps[pid].in_place.replay(path)


Call = Callable[[ThreadLane, list[ReceivedEvent]], Awaitable[Exception | None]]


class InPlace:
    """One pump's in-place requests. ``call`` is its handler call (``HandlerCalls.call_once``),
    ``lease_gone`` whether an error says the lease went, ``arrive`` ends the pump's idle wait."""

    def __init__(
        self,
        folder: Path | None,
        ctx: PartitionContext,
        call: Call,
        lease_gone: Callable[[Exception | None], bool],
        arrive: Callable[[], None],
    ) -> None:
        self.folder = folder
        self._owner_id = ctx.owner_id
        self._group = ctx.ref.consumer_group
        self._label = f"partition {ctx.partition_id} ({ctx.owner_id})"
        self._call, self._lease_gone, self._arrive = call, lease_gone, arrive
        self._queue: dict[Path, None] = {}  # in the order given
        self._given: set[Path] = set()

    def replay(self, path: Path) -> None:
        """Queue the request in ``path`` unless it was given before, and let the pump see it now."""
        if self.folder is None or path in self._given:
            return
        self._given.add(path)
        self._queue[path] = None
        self._arrive()

    @property
    def waiting(self) -> bool:
        return bool(self._queue)

    async def run(self, lane: ThreadLane, may_go_on: Callable[[], bool]) -> None:
        """Handle the queued requests until none is left or ``may_go_on`` says no (the rest waits for
        the pump's lease to be renewed, or for the next owner)."""
        while self._queue and may_go_on():
            path = next(iter(self._queue))
            try:
                loaded = await lane.call(self._load, path)
                if loaded is not None and not await self._handle(lane, may_go_on, *loaded):
                    return
            except OSError as exc:  # the folder cannot be read or marked: this pump leaves the request
                log.error(
                    "%s: in-place request %s left (a worker taking the partition tries again): %s",
                    *(self._label, path.name, exc),
                )
            del self._queue[path]

    def _load(self, path: Path) -> tuple[Request, list[int], dict[int, files.Entry]] | None:
        """The request, what of it waits and its dead letters; None when there is nothing to do."""
        assert self.folder is not None
        try:
            req = Request.load(path)
        except FileNotFoundError:
            return None  # done (by this pump's previous owner) meanwhile
        except ValueError as exc:
            log.error("%s: in-place request %s cannot be read, left alone: %s", self._label, path, exc)
            return None
        if req.consumer_group != self._group:
            return None
        todo = to_handle(req, files.read_markers(self.folder, req.partition_id, self._group))
        if not todo:
            path.unlink(missing_ok=True)
            return None
        return req, todo, files.read_letters(self.folder, req.partition_id, self._group)

    async def _handle(
        self,
        lane: ThreadLane,
        may_go_on: Callable[[], bool],
        req: Request,
        todo: list[int],
        letters: dict[int, files.Entry],
    ) -> bool:
        """Hand each waiting dead letter of ``req`` to the handler; False when stopped half way."""
        for n in todo:
            if not may_go_on():
                return False
            error = await self._one(lane, letters.get(n), n)
            if error is StopIteration:
                return False
            outcome = None if error is None else str(error)
            metrics.DEAD_LETTERS_IN_PLACE.labels("handled" if outcome is None else "failed").inc()
            await lane.call(settle, self.folder, req, {n: outcome}, self._owner_id, time.time)
        log.info("%s: in-place replay %s of %d dead letter(s) by %s done", self._label, req.id, len(todo), req.user)
        return True

    async def _one(self, lane: ThreadLane, entry: files.Entry | None, n: int) -> object:
        """The outcome of one dead letter: None (handled), the error text, or StopIteration (the lease
        went during the call: not marked, the next owner hands it over again)."""
        if entry is None:
            return "no such dead letter now (purged since it was asked for)"
        try:
            event = event_of(entry)
        except ValueError as exc:
            return exc
        error = await self._call(lane, [event])
        if error is None:
            return None
        if self._lease_gone(error):
            return StopIteration
        kind = type(error).__name__
        log.warning("%s: in-place replay of sequence number %d failed: %s: %s", self._label, n, kind, error)
        return f"{type(error).__name__}: {error}"
