"""Where the monitors run: one daemon thread with an event loop of its own, and one database thread.

Request loops come and go (a test client makes one per request) and a sampler must not depend on
which page is open, so the monitors (``monitor.py``) run on a loop of their own. A monitor starts
the first time anything asks for its hub (a page, a websocket, ``/metrics``); the configured hub's
starts with the server (``watch_configured``: on the first connection of any kind, and at once
under ``manage.py serve``) and never stops for want of viewers, so it is always sampled. A
monitor's round reads the store once for every partition (``state.read``: one listing each of
ownership, checkpoints, members and controls), whatever the number of partitions and viewers.

Visitors cannot make the console work for them: a monitor is started only for a hub and consumer
group the store knows (one with an ownership record or a member: ``Host.admit``, answered from a
bounded cache after the first look) or the configured one; anything else is None, which the views
answer with 404 and the socket with close 4404, and nothing starts. At most
``LEASEBOARD_MONITORS_MAX`` monitors run; a new one evicts the least recently used monitor that no
socket watches and that is not kept, and when every one is watched or kept, ``admit`` raises
``Full`` (503).

``current_state`` is the console state a request serves: a fresh read of the stores with the
figures of the hub's running monitor, or of the newest stored sampling round when none is fresh.

Stopping (``Host.stop``): the monitors are cancelled, then the stores and the database thread
closed. Cancelling does not interrupt a statement already running on the database thread; stop
waits for it. So whoever calls ``stop`` must not hold a database lock such a statement needs: on
SQLite (``transaction_mode`` IMMEDIATE) an open transaction holds the write lock, and a sample
write would wait for it (``timeout``, 20 s) while ``stop`` waits for the write, a deadlock broken
only by the busy timeout. That is what a test in a transaction (pytest-django's ``django_db``
without ``transaction=True``) that opened a page did; such tests may not start a monitor
(``tests/dashboard/conftest.py`` refuses it).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
import traceback
from collections import OrderedDict
from typing import Any

from django.conf import settings

from balancer.model import HubRef
from workers.wiring import Stores, build_stores, close_stores, hub_ref

from ..dbthread import DatabaseThread
from .console import ConsoleState, Figures
from .health import DATABASE_ERRORS, report
from .monitor import Monitor
from .state import lag_rules, read, stored_figures

FIRST_ROUND_SECONDS = 10.0  # how long a first look at a hub waits for its monitor's first round
FIGURES_MAX_AGE = 5.0  # seconds after which a monitor's figures are not used for a fresh read
KNOWN_FOR = 60.0  # seconds a hub found in the store is taken as known without asking again
UNKNOWN_FOR = 5.0  # seconds a hub the store did not know is answered 404 without asking again
KNOWN_CACHE = 1024  # names remembered either way (least recently used forgotten first)
ADMIT_TIMEOUT = 10.0  # seconds a look at the store may take


class Full(Exception):
    """Every monitor slot is taken by a hub that is watched or kept: a new hub must wait (503)."""


class Host:
    """The thread and event loop the monitors run on, and one database thread for all of them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.db = DatabaseThread("leaseboard-monitor-db", retry=True)  # one connection for every monitor
        self._monitors: dict[HubRef, Monitor] = {}
        self._tasks: dict[HubRef, asyncio.Task[None]] = {}
        self._stores: Stores | None = None
        self._known: OrderedDict[HubRef, tuple[bool, float]] = OrderedDict()  # ref: (known, until)
        self.configured: set[HubRef] = set()  # refs admitted without asking the store

    def monitor(self, ref: HubRef) -> Monitor:
        """The monitor of ``ref``, started if it was not running (evicting the least recently used
        one that is neither watched nor kept when ``LEASEBOARD_MONITORS_MAX`` run; ``Full`` when
        none can go)."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._start_thread()
            found = self._monitors.get(ref)
            if found is None:
                self._make_room()
                found = self._monitors[ref] = Monitor(ref, self.db)
                assert self._loop is not None
                self._loop.call_soon_threadsafe(self._launch, found)
        found.touched = time.monotonic()
        return found

    def _make_room(self) -> None:
        cap = max(1, int(getattr(settings, "LEASEBOARD_MONITORS_MAX", 16)))
        while len(self._monitors) >= cap:
            idle = [m for m in self._monitors.values() if not m.keep and not m.watched and m.ref not in self.configured]
            if not idle:
                raise Full(f"the console watches {len(self._monitors)} hubs, its maximum; try again later")
            evicted = min(idle, key=lambda m: m.touched)
            del self._monitors[evicted.ref]
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._evict, evicted)

    def _evict(self, monitor: Monitor) -> None:
        task = self._tasks.get(monitor.ref)
        if task is not None and self._monitors.get(monitor.ref) is not monitor:
            task.cancel()

    async def admit(self, ref: HubRef) -> Monitor | None:
        """The monitor of ``ref`` if the store knows it (or it is configured), started if need be;
        None for a hub and consumer group nobody runs (nothing is started). Raises the store's
        error when it cannot be asked, ``Full`` when no monitor slot is free."""
        if not await self.known(ref):
            return None
        return self.monitor(ref)

    def admit_sync(self, ref: HubRef) -> Monitor | None:
        """``admit`` for sync code (not on an event loop's thread)."""
        if not self.known_sync(ref):
            return None
        return self.monitor(ref)

    async def known(self, ref: HubRef) -> bool:
        """Whether the store knows ``ref`` (or it is configured or watched); nothing is started."""
        cached = self._cached(ref)
        if cached is not None:
            return cached
        return self._remember(ref, await asyncio.wrap_future(self._ask(ref)))

    def known_sync(self, ref: HubRef) -> bool:
        cached = self._cached(ref)
        if cached is not None:
            return cached
        return self._remember(ref, self._ask(ref).result(ADMIT_TIMEOUT))

    def _cached(self, ref: HubRef) -> bool | None:
        if ref in self.configured or ref == hub_ref() or ref in self._monitors:
            return True
        with self._lock:
            found = self._known.get(ref)
            if found is not None and found[1] > time.monotonic():
                self._known.move_to_end(ref)
                return found[0]
        return None

    def _remember(self, ref: HubRef, known: bool) -> bool:
        with self._lock:
            self._known[ref] = (known, time.monotonic() + (KNOWN_FOR if known else UNKNOWN_FOR))
            self._known.move_to_end(ref)
            while len(self._known) > KNOWN_CACHE:
                self._known.popitem(last=False)
        return known

    def _ask(self, ref: HubRef) -> Any:
        """A concurrent future of whether the store has an ownership record or a member of ``ref``
        (asked on the host's loop, whose the stores are)."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._start_thread()
            loop = self._loop
        assert loop is not None
        return asyncio.run_coroutine_threadsafe(asyncio.wait_for(self._lookup(ref), ADMIT_TIMEOUT), loop)

    async def _lookup(self, ref: HubRef) -> bool:
        if self._stores is None:
            self._stores = build_stores()
        if await self._stores.ownership.list_ownership(ref):
            return True
        return bool(await self._stores.controls.list_members(ref))

    def running_count(self) -> int:
        """Monitors running."""
        return len(self._monitors)

    async def tasks_count(self) -> int:
        """asyncio tasks on the caller's loop (a view's: the server's) and on the host's."""
        here = len(asyncio.all_tasks()) - 1  # not the caller
        loop = self._loop
        if loop is None or loop.is_closed():
            return here
        try:
            theirs = await asyncio.wait_for(asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_count(), loop)), 2.0)
        except (TimeoutError, RuntimeError):
            theirs = 0
        return here + theirs

    def watching(self) -> list[HubRef]:
        """The hubs and consumer groups a monitor runs for now."""
        with self._lock:
            return list(self._monitors)

    def running(self, ref: HubRef) -> Monitor | None:
        """The monitor of ``ref`` if one is running (nothing is started)."""
        return self._monitors.get(ref)

    async def latest(self, ref: HubRef, max_age: float) -> ConsoleState | None:
        """The state of ``ref``'s monitor (started if need be; its first round awaited for up to
        FIRST_ROUND_SECONDS) if a round read the store within ``max_age`` seconds, else None."""
        watched = self.monitor(ref)
        if not watched.ready.is_set():
            await watched.first_round(FIRST_ROUND_SECONDS)
        return watched.fresh(max_age)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every monitor, close the stores and the database thread, end the thread.

        Raises TimeoutError, with the stacks of the host's threads, if that takes over ``timeout``
        seconds (see the module docstring for the one way it did)."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
            self._known.clear()
            self.configured.clear()
        if loop is None or thread is None:
            self.db.close()  # monitors driven without the thread (tests) used the database thread only
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout)
        except TimeoutError:
            raise TimeoutError(f"the monitors did not stop in {timeout} s; their threads:\n{_stacks()}") from None
        except RuntimeError:  # the loop stopped on its own
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)

    # the thread ------------------------------------------------------------------------------

    def _start_thread(self) -> None:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name="leaseboard-monitor", daemon=True)
        self._thread.start()
        ready.wait()

    def _launch(self, monitor: Monitor) -> None:
        if self._stores is None:
            self._stores = build_stores()  # on this loop: a store's connections may belong to it
        task = asyncio.get_running_loop().create_task(monitor.run(self._stores), name=f"monitor {monitor.ref}")
        self._tasks[monitor.ref] = task
        task.add_done_callback(lambda _: self._ended(monitor, task))

    def _ended(self, monitor: Monitor, task: asyncio.Task[None]) -> None:
        with self._lock:
            if self._monitors.get(monitor.ref) is monitor:
                del self._monitors[monitor.ref]
            if self._tasks.get(monitor.ref) is task:
                del self._tasks[monitor.ref]

    async def _shutdown(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._monitors.clear()
        stores, self._stores = self._stores, None
        if stores is not None:
            with contextlib.suppress(Exception):  # a store that cannot close cleanly is dropped all the same
                await close_stores(stores)
        await self.db.aclose()  # after any statement a cancelled round left running on it


async def _count() -> int:
    return len(asyncio.all_tasks()) - 1  # not this one


def _stacks() -> str:
    names = {t.ident: t.name for t in threading.enumerate()}
    return "\n".join(
        f"--- {names[ident]}\n{''.join(traceback.format_stack(frame))}"
        for ident, frame in sys._current_frames().items()
        if names.get(ident, "").startswith("leaseboard-monitor")
    )


host = Host()


def unknown(ref: HubRef) -> str:
    """Why ``ref`` gets a 404."""
    return f"no worker has run hub {ref.hub!r} with consumer group {ref.consumer_group!r} on this store"


def monitor(ref: HubRef) -> Monitor:
    """The running monitor of ``ref`` (started on first use)."""
    return host.monitor(ref)


def watch_configured(ref: HubRef | None = None) -> Monitor:
    """The monitor of the configured hub and consumer group, started if it was not running: lag is
    sampled, and statuses, ``/metrics`` and alerts exist, whether or not anyone opens a page. The
    ASGI application calls it on every connection of any kind (``asgi.py``), ``serve`` at start (with
    the hub and consumer group of its options as ``ref``)."""
    wanted = ref or hub_ref()
    host.configured.add(wanted)
    watched = host.monitor(wanted)
    watched.keep = True
    return watched


async def current_state(ref: HubRef, db: DatabaseThread) -> ConsoleState:
    """A fresh read of ``ref`` (event log on ``db``) with the figures of its running monitor, else
    of the newest stored sampling round. Raises the store's error when it cannot be read."""
    plain = await read(ref, db=db)
    watched = host.running(ref)
    figures = watched.fresh_figures(FIGURES_MAX_AGE) if watched is not None else None
    if figures is None:
        try:
            figures = await db.acall(stored_figures, ref)
        except DATABASE_ERRORS as exc:  # the store answered, the database did not: no figures
            report(exc)
            figures = Figures(lag_rules())
    return plain.with_figures(figures)
