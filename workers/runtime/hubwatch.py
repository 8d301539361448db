"""Whether this worker still reaches the hub, asked only once its readers have gone quiet (issue 35).

A worker cut off from the hub while it still reaches the store renews its leases as ever, and its
readers fail nothing: they wait in their sockets, where a cut looks just like a hub with nothing
new. So when its pumps have handed nothing over for ``quiet`` seconds, the worker asks the hub one
small thing (``EventSource.probe``: its partition ids, on a connection of its own). An answer says
the hub is merely idle; a probe unanswered after ``answer_within`` seconds, or failed, starts the
silence (from that probe's start). Silent for ``LEASEBOARD_READER_STUCK`` seconds, the worker cannot
read: its pumps hand every partition over (``Balancer.cannot_read``), and the first answer after
that ends it (``Balancer.can_read``), so it takes its share back as soon as the hub is there again.

While the hub answers and nothing comes, the probes space out (the gap doubles up to
``most_apart``), so an idle fleet asks rarely; events handed over end the silence and reset the gap.
While probes hang in a cut (the SDK gives up on them only after its own retries, 15 s and more), a
new one still starts every ``2 * answer_within`` seconds, up to ``MAX_IN_FLIGHT`` at once, so the
first one after the heal is answered at once rather than when the old ones fail.

Time the worker itself did not run is not the hub's silence: a look that comes late (a starved
machine, a paused process) moves every probe in flight, and the silence, that much later
(``HubWatch.discount``). On a CI machine with every core taken, a probe answered in time whose answer
the worker's loop got to seconds later counted as seconds of silence and handed partitions over.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable

import workers.metrics as metrics
from balancer.aio import off_loop
from balancer.avoid import EVERY
from balancer.protocol import Balancer

log = logging.getLogger("leaseboard.worker")

MOST_APART = 60.0  # seconds: the longest gap between two probes of an idle hub that answers
# Probes hanging in a cut, one every 2 answer_within, so a later one sees the heal; few enough to leave
# room in the default thread pool (its threads: cores + 4) for the worker's other waits on it.
MAX_IN_FLIGHT = 4


class HubWatch:
    """``moved(progress)`` and ``look(wanted)`` each tick (see the module); ``silent_for()`` says how long
    the hub has not answered (0: it answers, or nobody asked)."""

    def __init__(
        self,
        probe: Callable[[], object],
        *,
        quiet: float,
        answer_within: float,
        clock: Callable[[], float],
        most_apart: float = MOST_APART,
    ) -> None:
        self._probe = probe
        self.quiet = quiet
        self.answer_within = answer_within
        self.most_apart = max(most_apart, quiet)
        self._clock = clock
        self._seen: int | None = None
        self._moved_at = clock()
        self._gap = quiet
        self._asked_at = -math.inf
        self._answered_at = -math.inf  # when the last probe that was answered started
        self._silent_since: float | None = None
        self._flying: dict[asyncio.Task[None], float] = {}
        self.probes = 0

    def moved(self, progress: int) -> None:
        """``progress``: a count of what the readers handed over, growing while events come (any change
        proves the hub reached)."""
        if progress == self._seen:
            return
        self._seen = progress
        self._moved_at = self._clock()
        self._gap = self.quiet
        self._silent_since = None

    def look(self, wanted: bool) -> None:
        """Note the probes still unanswered; start one when due and ``wanted`` (the worker holds
        partitions, or waits to read again)."""
        now = self._clock()
        self._note_unanswered(now)
        if not wanted or len(self._flying) >= MAX_IN_FLIGHT:
            return
        if self._flying and now - max(self._flying.values()) < 2 * self.answer_within:
            return  # the last one may still be answered
        if now - max(self._moved_at, self._asked_at) < self._gap:
            return
        self._asked_at = now
        self.probes += 1
        task = asyncio.get_running_loop().create_task(self._ask(now), name="hub probe")
        self._flying[task] = now

    def discount(self, seconds: float) -> None:
        """This worker did not run for ``seconds`` (its loop woke that late): every probe in flight, the
        silence and the readers' quiet start that much later, never after now."""
        if seconds <= 0:
            return
        now = self._clock()
        self._flying = {task: min(started + seconds, now) for task, started in self._flying.items()}
        if self._silent_since is not None:
            self._silent_since = min(self._silent_since + seconds, now)
        self._moved_at = min(self._moved_at + seconds, now)

    def answered_after(self, moment: float) -> bool:
        """Whether a probe started after ``moment`` was answered."""
        return self._answered_at > moment

    def silent_for(self) -> float:
        now = self._clock()
        self._note_unanswered(now)
        return 0.0 if self._silent_since is None else now - self._silent_since

    def _note_unanswered(self, now: float) -> None:
        for started in self._flying.values():
            if now - started > self.answer_within:
                self._silent_from(started)

    def _silent_from(self, started: float) -> None:
        if started <= self._answered_at:
            return  # a later probe was answered: this one hung in a cut that has healed
        if self._silent_since is None or started < self._silent_since:
            self._silent_since = started

    async def _ask(self, started: float) -> None:
        task = asyncio.current_task()
        assert task is not None  # run as a task of its own (``look``)
        try:
            await off_loop(self._probe, name="hub probe")
        except Exception as exc:
            log.debug("the hub did not answer a probe: %s: %s", type(exc).__name__, exc)
            self._silent_from(self._flying.get(task, started))  # as discounted
            self._gap = self.quiet
        else:
            started = self._flying.get(task, started)
            self._answered_at = max(self._answered_at, started)
            if self._silent_since is not None and self._silent_since <= started:
                self._silent_since = None
            self._gap = min(self._gap * 2, self.most_apart)
        finally:
            self._flying.pop(task, None)

    def stop(self) -> None:
        """Forget the probes in flight (their threads end with the SDK's own timeouts)."""
        for task in self._flying:
            task.cancel()
        self._flying.clear()


class HubGuard:
    """One worker's ``HubWatch``, looked at every ``tick`` seconds in a task of its own (``start``/``stop``;
    ``step`` is one look): silent for ``bound``
    seconds while it holds partitions, the worker says it cannot read (``Balancer.cannot_read`` for
    ``seconds``); the first answer after that, that it can again (``Balancer.can_read``)."""

    def __init__(
        self,
        watch: HubWatch,
        coordinator: Balancer,
        *,
        bound: float,
        seconds: float,
        progress: Callable[[], int],
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        self.watch = watch
        self._coordinator = coordinator
        self.bound = bound
        self._seconds = seconds
        self._progress = progress
        self._wake = wake  # the worker's next cycle now: it hands over (or plans itself in) at once
        self.tick = min(watch.quiet, watch.answer_within) / 2
        self._said_at: float | None = None  # when this worker said it cannot read (None: it did not)
        self._unread: frozenset[str] = frozenset()  # the partitions it held then (stuck, cause hub, until it answers)
        self._task: asyncio.Task[None] | None = None
        self._telling: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"hub watch {self._owner_id}")

    def stop(self) -> None:
        for task in (self._task, self._telling):
            if task is not None:
                task.cancel()
        self.watch.stop()

    @property
    def _owner_id(self) -> str:
        return self._coordinator.owner_id

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:  # on the wall clock, whatever clock the worker runs on: a poll of the probes' threads
            due = loop.time() + self.tick
            await asyncio.sleep(self.tick)
            self.watch.discount(loop.time() - due)  # how long this worker did not run: not the hub's silence
            self.step()

    def step(self) -> None:
        coordinator = self._coordinator
        self.watch.moved(self._progress())
        self.watch.look(wanted=bool(coordinator.owned) or self._said_at is not None)
        if self._telling is not None and not self._telling.done():
            return
        silent = self.watch.silent_for()
        if self._said_at is None:
            if silent >= self.bound and coordinator.owned and EVERY not in coordinator.avoiding():
                log.error(
                    "worker %s cannot read the hub: it has not answered for %.1f s (LEASEBOARD_READER_STUCK %gs); "
                    "handing its %d partitions over until it answers again",
                    *(self._owner_id, silent, self.bound, len(coordinator.owned)),
                )
                self._said_at = coordinator.monotonic()
                self._stuck(frozenset(coordinator.owned))
                self._telling = asyncio.get_running_loop().create_task(self._tell(False), name="cannot read")
        elif self.watch.answered_after(self._said_at):
            log.warning("worker %s: the hub answers again; taking partitions again", self._owner_id)
            self._said_at = None
            self._stuck(frozenset())
            self._telling = asyncio.get_running_loop().create_task(self._tell(True), name="can read")

    def _stuck(self, partitions: frozenset[str]) -> None:
        """``leaseboard_partition_stuck{cause="hub"}``: 1 for ``partitions``, 0 for those it was 1 for."""
        for pid in self._unread - partitions:
            metrics.PARTITION_STUCK.labels(pid, "hub").set(0)
        for pid in partitions - self._unread:
            metrics.PARTITION_STUCK.labels(pid, "hub").set(1)
        self._unread = partitions

    async def _tell(self, can: bool) -> None:
        try:
            if can:
                await self._coordinator.can_read()
            else:
                await self._coordinator.cannot_read(self._seconds)
                metrics.STUCK_HEALS.labels("hub", "hand_over").inc()
            self._wake()
        except Exception as exc:  # the store failed: its next cycle's heartbeat says it
            log.warning("worker %s: saying it %s read failed (%s)", self._owner_id, "can" if can else "cannot", exc)
