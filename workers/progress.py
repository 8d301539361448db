"""Progress of long work on a terminal: one rich line per task on stderr, and nothing anywhere else.

    with progress("seeds", total=20, unit="seeds") as task:
        for seed in range(20):
            ...
            task.advance()

The line (elapsed time, done of total, rate, time left, and any ``info`` text) shows only when
stderr is a terminal and the caller did not ask for machine-readable output (``enabled=False``,
e.g. for ``--json``). Otherwise every method of the task is a no-op that costs a method call, so
piped or redirected output is byte for byte what it was without progress. stdout is never written
to; when stdout is a terminal too, lines printed while a line is live go above it.

Tasks opened while another is live join its display (one live display at a time), so a benchmark
that tracks its own steps shows them under ``tests.benchmarks.run``'s line.

``advance`` is cheap enough for a per-event call: it adds to a counter, which the display reads
when it refreshes (ten times a second).

The core (``balancer``) never imports this module or rich; it takes plain callbacks instead
(``balancer.sim.run.simulate``'s ``on_seed``).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console, RenderableType
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

__all__ = ["Tracker", "on_terminal", "progress"]

_lock = threading.Lock()
_live: _Display | None = None  # the display tasks join while one is live
_users = 0  # tasks on it


def on_terminal() -> bool:
    """Whether stderr is a terminal (the only place progress goes)."""
    return _isatty(sys.stderr)


def terminal_console() -> Console | None:
    """A rich console on stderr when stderr is a terminal, else None. Tests replace it with a
    ``Console(force_terminal=True)`` of their own to see the line without a terminal."""
    if not on_terminal():
        return None
    console = Console(stderr=True)
    return console if console.is_terminal else None


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return False


class RateColumn(ProgressColumn):
    """The task's recent rate, in its ``unit`` per second."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        unit = task.fields.get("unit", "")
        if speed is None:
            return Text(f"- {unit}/s", style="progress.data.speed")
        figure = f"{speed:,.0f}" if speed >= 10 else f"{speed:.2f}"
        return Text(f"{figure} {unit}/s", style="progress.data.speed")


def _columns() -> list[str | ProgressColumn]:
    # Without a total the bar pulses, the count reads "n/?" and the time left "-:--:--".
    return [
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(bar_width=20),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        RateColumn(),
        TextColumn("[progress.remaining]eta"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
    ]


class Tracker:
    """One task of a live progress display; every method does nothing when the display is off."""

    def __init__(self, display: _Display | None = None, task: Any = None) -> None:
        self._display = display
        self._task = task
        self._pending = 0.0
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        """Whether anything is shown (callers can skip work that only feeds the display)."""
        return self._display is not None

    def advance(self, amount: float = 1) -> None:
        """Count ``amount`` more done; thread-safe. Rich gets the sum at its next refresh."""
        if self._display is None:
            return
        with self._lock:
            self._pending += amount

    def update(
        self,
        *,
        completed: float | None = None,
        total: float | None = None,
        description: str | None = None,
        info: str | None = None,
    ) -> None:
        """Set what is done, the total, the description or the text after the figures."""
        if self._display is None:
            return
        self.flush()
        fields: dict[str, Any] = {} if info is None else {"info": info}
        self._display.update(self._task, completed=completed, total=total, description=description, **fields)

    def flush(self) -> None:
        """Hand rich what ``advance`` counted since it last did."""
        if self._display is None:
            return
        with self._lock:
            amount, self._pending = self._pending, 0.0
        if amount:
            self._display.advance(self._task, amount)


class _Display(Progress):
    """A live progress display that collects its trackers' counts just before each refresh."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.trackers: list[Tracker] = []  # before rich's __init__, which renders once
        super().__init__(*args, **kwargs)

    def get_renderables(self) -> Iterable[RenderableType]:
        for tracker in list(self.trackers):
            tracker.flush()
        yield from super().get_renderables()


@contextmanager
def progress(
    description: str,
    total: float | None = None,
    *,
    unit: str = "",
    info: str = "",
    enabled: bool = True,
    console: Console | None = None,
    transient: bool = True,
) -> Iterator[Tracker]:
    """A progress line for the work inside, on stderr when it is a terminal (or on ``console``, for
    tests); a no-op ``Tracker`` when not, or when ``enabled`` is false (``--json``).

    ``total`` None shows no bar nor time left, only elapsed time and rate. ``transient``: the line
    disappears at the end, leaving the terminal to the command's own output."""
    global _live, _users
    if not enabled:
        yield Tracker()
        return
    with _lock:
        display = _live
        if display is None:
            # Lines printed meanwhile go above the live line, but only when stdout is a terminal
            # as well: a redirected stdout is left exactly as it is.
            redirect = console is None and _isatty(sys.stdout)
            if console is None:
                console = terminal_console()
            if console is not None and console.is_terminal:
                display = _Display(
                    *_columns(),
                    console=console,
                    transient=transient,
                    redirect_stdout=redirect,
                    redirect_stderr=redirect,
                )
                display.start()
                _live = display
        if display is None:
            tracker = Tracker()
        else:
            _users += 1
            task = display.add_task(description, total=total, unit=unit, info=info)
            tracker = Tracker(display, task)
            display.trackers.append(tracker)
    try:
        yield tracker
    finally:
        if tracker.enabled:
            assert display is not None
            display.refresh()  # its last figures (a joined task's only, if it ends within a refresh)
            with _lock:
                display.trackers.remove(tracker)
                _users -= 1
                if _users == 0:
                    display.stop()
                    _live = None
                else:
                    display.remove_task(tracker._task)
