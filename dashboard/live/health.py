"""What the console depends on, whether it answers now, and one log line per change.

The console reads two backends: the Django **database** (event log, lag samples, audit, sessions)
and the ownership **store** (Redis or Azure Blob Storage; with the SQL store the store *is* the
database, so its outages are the database's). Whoever reads one reports the outcome here
(``failed``/``ok``); the log gets one WARNING line when a backend stops answering and one when it
answers again (with how long it was away), however many requests fail in between. Requests and
monitor rounds that fail meanwhile answer 503 (or a stale state) without a traceback.

``outage(exc)`` says whether an exception is such an outage and of which backend: a store's
``StoreError`` or the database driver's ``OperationalError``/``InterfaceError`` (server gone,
connection refused or broken). Anything else is a bug and is left to raise.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from django.conf import settings
from django.db import InterfaceError, OperationalError

from balancer.errors import StoreError

log = logging.getLogger("leaseboard.health")

DATABASE = "database"
STORE = "store"

DATABASE_ERRORS: tuple[type[Exception], ...] = (OperationalError, InterfaceError)


@dataclass(frozen=True, slots=True)
class Outage:
    backend: str  # DATABASE or STORE
    reason: str  # one line, for the log, a 503's "error" and the stale state's "error"


def store_backend() -> str:
    """The backend a store error belongs to: the database for the SQL store, else the store."""
    return DATABASE if settings.LEASEBOARD_STORE == "sql" else STORE


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def outage(exc: BaseException) -> Outage | None:
    """The outage ``exc`` reports, or None when it is not one (a bug: let it raise)."""
    if isinstance(exc, StoreError):
        return Outage(store_backend(), f"store unavailable: {_one_line(exc)}")
    if isinstance(exc, DATABASE_ERRORS):
        return Outage(DATABASE, f"database unavailable: {_one_line(exc)}")
    return None


def is_outage(exc: BaseException) -> bool:
    return outage(exc) is not None


class Health:
    """Which backends are down, since when and why; thread-safe (views, monitors and sockets report)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._down: dict[str, tuple[float, str]] = {}  # backend -> (monotonic time it broke, reason)
        self._answered: dict[str, float] = {}  # backend -> monotonic time it last answered

    def failed(self, found: Outage, started: float | None = None) -> None:
        """Record ``found``; logs one line if its backend was up. A failure of a call ``started``
        before the backend last answered is old news (a slow call that began in the outage) and
        changes nothing."""
        with self._lock:
            if found.backend in self._down:
                return
            if started is not None and self._answered.get(found.backend, float("-inf")) > started:
                return
            self._down[found.backend] = (time.monotonic(), found.reason)
        log.warning("console degraded: the %s stopped answering (%s)", found.backend, found.reason)

    def ok(self, *backends: str) -> None:
        """Record that ``backends`` answered; logs one line for each that was down."""
        for backend in backends:
            with self._lock:
                self._answered[backend] = time.monotonic()
                was = self._down.pop(backend, None)
            if was is not None:
                log.warning(
                    "console recovered: the %s answers again after %.1f s down", backend, time.monotonic() - was[0]
                )

    def down(self) -> dict[str, str]:
        """Backend -> reason, for every backend down now."""
        with self._lock:
            return {backend: reason for backend, (_, reason) in self._down.items()}

    def is_down(self, backend: str) -> bool:
        with self._lock:
            return backend in self._down

    def reset(self) -> None:
        """Forget every outage without logging (tests)."""
        with self._lock:
            self._down.clear()
            self._answered.clear()


health = Health()


def report(exc: BaseException, started: float | None = None) -> Outage | None:
    """``outage(exc)``, recorded in ``health`` when it is one (``started``: see ``Health.failed``)."""
    found = outage(exc)
    if found is not None:
        health.failed(found, started)
    return found
