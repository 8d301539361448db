"""Waking a pump when its partition has new events, instead of polling it.

A reader that can tell when new events may have come offers ``notify(wake)`` (``Notifying``): it
calls ``wake()`` from any thread, cheaply and possibly spuriously, once new events may be there;
the pump then reads, and between two arrivals an idle pump costs nothing (``pump.py``). Readers
without ``notify`` are polled every ``PumpConfig.poll_seconds`` as before. The Event Hubs reader
wakes its pump when the SDK's long-polling receive hands it a batch.

The embedded hub's readers use ``FileWatch``: one per process (``shared()``), whatever the number
of readers. On Linux it is one inotify descriptor read by one daemon thread that sleeps in ``read``
until a watched log is written (IN_MODIFY: every append, every torn-tail cut), then wakes the
readers of that log only. Where inotify is missing (another system) or refused (the per-user limit
of instances, 128 by default, or of watches), it is one daemon thread that stats the watched logs
every ``POLL_SECONDS`` and wakes the readers of a log whose size or modification time changed.
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import logging
import os
import struct
import sys
import threading
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)

Wake = Callable[[], None]
POLL_SECONDS = 0.05  # the fallback poller's period
IN_MODIFY = 0x00000002
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_CLOEXEC = 0o2000000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, name length


class Notifying(Protocol):
    def notify(self, wake: Wake | None) -> None:
        """Call ``wake()`` (from any thread) whenever new events may be there; None stops it."""


class FileWatch:
    """Wakes the callers watching a file when it is written; one thread for all the files.

    ``inotify=False`` (or a system without it) uses the stat poller instead."""

    def __init__(self, *, inotify: bool = True, poll_seconds: float = POLL_SECONDS) -> None:
        self._lock = threading.Lock()
        self._wakes: dict[str, dict[int, Wake]] = {}  # path -> token -> wake
        self._paths: dict[int, str] = {}  # token -> path
        self._tokens = itertools.count(1)
        self.backend: _Inotify | _Poller | None = None
        if inotify and sys.platform.startswith("linux"):
            try:
                self.backend = _Inotify(self._changed)
            except OSError as exc:
                log.warning(
                    "inotify unavailable (%s): pumps of the embedded hub are woken by a poller "
                    "stat-ing their logs every %gs instead",
                    exc,
                    poll_seconds,
                )
        if self.backend is None:
            self.backend = _Poller(self._changed, poll_seconds)

    @property
    def kind(self) -> str:
        return "poll" if isinstance(self.backend, _Poller) else "inotify"

    def watch(self, path: str, wake: Wake) -> int:
        """Call ``wake()`` when ``path`` is written, until ``unwatch`` of the token returned."""
        with self._lock:
            token = next(self._tokens)
            first = path not in self._wakes
            self._wakes.setdefault(path, {})[token] = wake
            self._paths[token] = path
        if first:
            try:
                self._backend().add(path)
            except OSError:
                self.unwatch(token)
                raise
        return token

    def unwatch(self, token: int) -> None:
        with self._lock:
            path = self._paths.pop(token, None)
            if path is None:
                return
            wakes = self._wakes.get(path, {})
            wakes.pop(token, None)
            last = not wakes
            if last:
                self._wakes.pop(path, None)
        if last:
            self._backend().remove(path)

    def watching(self) -> int:
        """How many files are watched."""
        with self._lock:
            return len(self._wakes)

    def _backend(self) -> _Inotify | _Poller:
        assert self.backend is not None
        return self.backend

    def _changed(self, path: str | None) -> None:
        """``path`` was written (None: maybe any of them, after an inotify queue overflow)."""
        with self._lock:
            if path is None:
                wakes = [w for ws in self._wakes.values() for w in ws.values()]
            else:
                wakes = list(self._wakes.get(path, {}).values())
        for wake in wakes:
            try:
                wake()
            except Exception:
                log.exception("waking a reader of %s failed", path)


_shared: tuple[int, FileWatch] | None = None
_shared_lock = threading.Lock()


def shared() -> FileWatch:
    """This process's ``FileWatch`` (a forked child gets one of its own: threads do not fork)."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared[0] != os.getpid():
            _shared = (os.getpid(), FileWatch())
        return _shared[1]


class WatchedReader:
    """``notify`` for a reader of one file (the embedded hub's ``HubReader``): set ``watched_path``,
    call ``unwatch()`` on close."""

    watched_path: str = ""
    _watch_token: int | None = None

    def notify(self, wake: Wake | None) -> None:
        self.unwatch()
        if wake is not None:
            self._watch_token = shared().watch(self.watched_path, wake)

    def unwatch(self) -> None:
        token, self._watch_token = self._watch_token, None
        if token is not None:
            shared().unwatch(token)


class _Inotify:
    """One inotify descriptor and the daemon thread that reads it."""

    def __init__(self, changed: Callable[[str | None], None]) -> None:
        libc = ctypes.CDLL(None, use_errno=True)  # the C library the interpreter runs on
        self._add_watch = libc.inotify_add_watch
        self._add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self._add_watch.restype = ctypes.c_int
        self._rm_watch = libc.inotify_rm_watch
        self._rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        self._rm_watch.restype = ctypes.c_int
        fd = libc.inotify_init1(IN_CLOEXEC)
        if fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, f"inotify_init1: {os.strerror(code)}")
        self._fd = fd
        self._changed = changed
        self._lock = threading.Lock()
        self._paths: dict[int, str] = {}  # watch descriptor -> path
        self._wds: dict[str, int] = {}
        threading.Thread(target=self._run, name="leaseboard-inotify", daemon=True).start()

    def add(self, path: str) -> None:
        wd = self._add_watch(self._fd, os.fsencode(path), IN_MODIFY)
        if wd < 0:
            code = ctypes.get_errno()
            raise OSError(code, f"inotify_add_watch {path}: {os.strerror(code)}")
        with self._lock:
            self._paths[wd], self._wds[path] = path, wd

    def remove(self, path: str) -> None:
        with self._lock:
            wd = self._wds.pop(path, None)
            if wd is not None:
                self._paths.pop(wd, None)
        if wd is not None:
            self._rm_watch(self._fd, wd)

    def _run(self) -> None:
        while True:
            try:
                data = os.read(self._fd, 64 * 1024)
            except InterruptedError:
                continue
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                log.error("reading inotify failed (%s): pumps of the embedded hub wake on their safety timer only", exc)
                return
            changed: set[str | None] = set()
            with self._lock:
                i = 0
                while i + _EVENT.size <= len(data):
                    wd, mask, _, length = _EVENT.unpack_from(data, i)
                    i += _EVENT.size + length
                    if mask & IN_Q_OVERFLOW:
                        changed.add(None)
                    elif mask & IN_MODIFY and wd in self._paths:
                        changed.add(self._paths[wd])
            for path in sorted(changed, key=lambda p: p or ""):
                self._changed(path)


class _Poller:
    """One daemon thread that stats the watched files every ``seconds`` (sleeping while there are none)."""

    def __init__(self, changed: Callable[[str | None], None], seconds: float) -> None:
        self._changed = changed
        self._seconds = seconds
        self._seen: dict[str, tuple[int, int] | None] = {}
        self._cond = threading.Condition()
        threading.Thread(target=self._run, name="leaseboard-filepoll", daemon=True).start()

    @staticmethod
    def _look(path: str) -> tuple[int, int] | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return st.st_size, st.st_mtime_ns

    def add(self, path: str) -> None:
        look = self._look(path)
        with self._cond:
            self._seen[path] = look
            self._cond.notify_all()

    def remove(self, path: str) -> None:
        with self._cond:
            self._seen.pop(path, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._seen:
                    self._cond.wait()
                self._cond.wait(self._seconds)
                paths = list(self._seen)
            for path in paths:
                look = self._look(path)
                with self._cond:
                    if path not in self._seen or self._seen[path] == look:
                        continue
                    self._seen[path] = look
                self._changed(path)
