"""How one pump calls its handler: a sync handler in the pump's lane (``SyncWork``, ``syncwork.py``),
an async one on the loop, event by event; a batch handler with one batch a call; and what a failure
gets (the worker never dies of one):

1. the failure is logged and counted (``leaseboard_handler_errors_total``, the pump's ``errors``);
2. the same event (or batch) is retried up to ``retries`` times, waiting ``backoff_seconds``,
   doubling, at most ``backoff_max`` between tries; ``MalformedEvent`` skips the retries;
3. then the event (every event of a failed batch) is set aside to the dead-letter file
   (``deadletters.py``), and processing goes on with the next event, which moves the checkpoint
   past the dead-lettered one.

If the pump is stopped during retries, the failing event is neither handled nor set aside: the
checkpoint stays before it and the next owner tries it again. A pump paused during retries goes on
retrying once it resumes.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import workers.metrics as metrics
from workers.handlers import Handler, MalformedEvent, PartitionContext, batch_size, is_async
from workers.runtime.checkpoints import Checkpointer
from workers.runtime.config import PumpConfig, PumpStats
from workers.runtime.deadletters import DeadLetters
from workers.runtime.lane import ThreadLane
from workers.runtime.sequence import SequenceGuard
from workers.runtime.syncwork import SyncWork
from workers.runtime.tracing import traced
from workers.sources.base import ReceivedEvent

log = logging.getLogger("leaseboard.pump")


class HandlerCalls:
    """Calls one pump's ``handler``; ``batch`` is its batch size (None: one event a call), ``sync`` its
    work in the pump's lane (None for an async handler, called on the event loop).

    From the pump: ``hold`` (True when it may go on, after a pause if need be; False when it must
    end), ``may_go_on`` (not stopping and the lease held, now), ``lease_gone`` (the error is the
    handler's ``NotHeld`` and the lease is indeed gone), ``pause`` (a stoppable sleep); ``deadline``,
    ``monotonic`` and ``sequence`` are for the lane's work."""

    def __init__(
        self,
        *,
        handler: Handler,
        ctx: PartitionContext,
        config: PumpConfig,
        dead_letters: DeadLetters,
        checkpoints: Checkpointer,
        stats: PumpStats,
        label: str,
        sequence: SequenceGuard,
        deadline: Callable[[str], float],
        monotonic: Callable[[], float],
        hold: Callable[[], Awaitable[bool]],
        may_go_on: Callable[[], bool],
        lease_gone: Callable[[Exception | None], bool],
        pause: Callable[[float], Awaitable[None]],
    ) -> None:
        handler = traced(handler, ctx)  # itself while tracing is off
        self._handler = handler
        self.ctx = ctx
        self._ref, self._owner_id, self._partition_id = ctx.ref, ctx.owner_id, ctx.partition_id  # dead letters' names
        self.batch = batch_size(handler)
        self._async = is_async(handler)
        self._config = config
        self._dead = dead_letters
        self._checkpoints = checkpoints
        self.stats = stats
        self._label = label
        self._hold = hold
        self._may_go_on = may_go_on
        self._lease_gone = lease_gone
        self._pause = pause
        self.calling: tuple[object, float] | None = None  # a call made from the loop now (``SyncWork.calling``)
        self._monotonic = monotonic
        self.sync: SyncWork | None = None
        if not self._async:
            self.sync = SyncWork(
                handler=handler,
                ctx=ctx,
                batch=self.batch,
                max_events=config.max_events,
                deadline=deadline,
                monotonic=monotonic,
                may_go_on=may_go_on,
                advance=self.advance,
                sequence=sequence,
                checkpoints=checkpoints,
            )

    async def run_async(self, events: Sequence[ReceivedEvent]) -> tuple[int, Exception | None]:
        """Hand ``events`` one by one to the async handler, on the loop; (how many were handled, the
        error of the next one or None)."""
        try:
            for n, event in enumerate(events):
                if not self._may_go_on():
                    return n, None
                self.calling = (event, self._monotonic())
                try:
                    await self._handler(event, self.ctx)
                except Exception as exc:
                    # NotHeld: the handler found the lease gone before its work became visible.
                    return (n, None) if self._lease_gone(exc) else (n, exc)
            return len(events), None
        finally:
            self.calling = None

    async def call_once(self, lane: ThreadLane, events: list[ReceivedEvent]) -> Exception | None:
        """One handler call with ``events`` (one event, or a batch); the error or None."""
        arg: Any = events if self.batch is not None else events[0]
        self.calling = (arg, self._monotonic())
        try:
            if self._async:
                await self._handler(arg, self.ctx)
            else:
                await lane.call(self._handler, arg, self.ctx)
        except Exception as exc:
            return exc
        finally:
            self.calling = None
        return None

    async def handle_batch(self, lane: ThreadLane, events: list[ReceivedEvent]) -> None:
        while True:
            if not await self._hold():
                return
            error = await self.call_once(lane, events)
            if not self._lease_gone(error):
                break  # else the handler found the lease gone: pause, then the same batch again
        if error is None:
            self.advance(events)
        elif not await self.recover(lane, events, error):
            return
        await self._checkpoints.write()

    async def recover(self, lane: ThreadLane, events: list[ReceivedEvent], error: Exception) -> bool:
        """Retry ``events`` per the policy, else set them aside. False when the pump must stop (paused
        meanwhile, it goes on retrying once the lease is renewed)."""
        attempts = 1
        first = events[0].sequence_number
        while True:
            metrics.HANDLER_ERRORS.inc()
            self.stats.errors += 1
            log.warning(
                "%s: handler failed on sequence number %d (attempt %d of %d): %s: %s",
                self._label,
                first,
                attempts,
                self._config.retries + 1,
                type(error).__name__,
                error,
            )
            if isinstance(error, MalformedEvent) or attempts > self._config.retries:
                break
            delay = min(self._config.backoff_seconds * 2 ** (attempts - 1), self._config.backoff_max)
            await self._pause(delay)
            if not await self._hold():
                return False  # the next owner (or the next run) tries the event again
            retry_error = await self.call_once(lane, events)
            while self._lease_gone(retry_error):  # not an attempt: the lease ran out during it
                if not await self._hold():
                    return False
                retry_error = await self.call_once(lane, events)
            if retry_error is None:
                self.advance(events)
                return True
            error = retry_error
            attempts += 1
        for event in events:
            await lane.call(self._dead.add, self._ref, self._owner_id, event, error, attempts)
        metrics.DEAD_LETTERS.inc(len(events))
        self.stats.dead_lettered += len(events)
        log.error(
            "%s: set aside %d event(s) from sequence number %d to %s after %d attempt(s): %s: %s",
            self._label,
            len(events),
            first,
            self._dead.path(self._ref, self._partition_id) or "memory",
            attempts,
            type(error).__name__,
            error,
        )
        self.advance(events)
        return True

    def advance(self, events: Sequence[ReceivedEvent]) -> None:
        if not events:
            return
        self._checkpoints.done(events)
        self.stats.processed += len(events)
        self.stats.last_sequence = events[-1].sequence_number
        metrics.EVENTS_PROCESSED.inc(len(events))
