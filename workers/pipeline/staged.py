"""A batch's Parquet results, written while its summary is collected and committed.

The two writes (aggregates and alerts, from the cached tallies) start as soon as the batch's first
pass has filled the cache, into a folder of their own under ``results/_staging/`` (Spark's readers
skip names that start with ``_``), and are moved into ``results/<kind>/batch_id=N/`` only once the
summary is committed (``publish``). A batch whose summary is not committed (it failed, or the batch
log had it already) drops them (``discard``), so no batch's Parquet replaces another's, and a
replay finds its results either absent or whole. A move is a rename within one file system.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark import InheritableThread

log = logging.getLogger("leaseboard.pipeline")

STAGING = "_staging"


def together(*calls: Callable[[], Any]) -> list[Any]:
    """The results of ``calls``, run at once, each in a thread of its own that inherits this thread's
    Spark job properties (a streaming query's job group: stopping the query cancels them too). Waits
    for every call, then raises the first one's exception, if any: no job outlives the batch."""
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException | None] = [None] * len(calls)

    def run(n: int) -> None:
        try:
            results[n] = calls[n]()
        except BaseException as exc:  # re-raised in the caller's thread below
            errors[n] = exc

    threads = [InheritableThread(run, args=(n,)) for n in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for error in errors:
        if error is not None:
            raise error
    return results


def clear_staging(results: Path) -> None:
    """Remove what a run that ended half way left in the staging folder (at the query's start: one
    query writes there at a time)."""
    shutil.rmtree(results / STAGING, ignore_errors=True)


class StagedWrites:
    """One batch's writes, ``write(kind, folder)`` for each kind, started in the background by ``start``."""

    def __init__(self, results: Path, batch_id: int, kinds: tuple[str, ...], write: Callable[[str, str], None]):
        self._results = results
        self._batch_id = batch_id
        self._kinds = kinds
        self._write = write
        self._folder = results / STAGING / f"batch_id={batch_id}-{uuid.uuid4().hex[:12]}"
        self._threads: list[InheritableThread] = []
        self._errors: list[BaseException] = []

    def start(self) -> None:
        """Begin the writes, each in a thread that inherits the batch's Spark job properties."""
        if self._threads:
            return
        self._threads = [InheritableThread(self._run, args=(kind,)) for kind in self._kinds]
        for thread in self._threads:
            thread.start()

    def _run(self, kind: str) -> None:
        try:
            self._write(kind, str(self._folder / kind))
        except BaseException as exc:  # raised by publish, in the batch's thread
            self._errors.append(exc)

    def _join(self) -> None:
        for thread in self._threads:
            thread.join()

    def publish(self) -> None:
        """Wait for the writes, then move each kind into ``results/<kind>/batch_id=N/`` (replacing what
        an earlier attempt of the batch left). Raises the first write's error, and moves nothing then."""
        self.start()  # a batch that never started them (the replay of one committed) writes them now
        self._join()
        if self._errors:
            self.discard()
            raise self._errors[0]
        for kind in self._kinds:
            target = self._results / kind / f"batch_id={self._batch_id}"
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists():
                shutil.rmtree(target)
            os.replace(self._folder / kind, target)
        shutil.rmtree(self._folder, ignore_errors=True)

    def discard(self) -> None:
        """Wait for the writes (no Spark job outlives its batch) and drop what they wrote."""
        self._join()
        for error in self._errors:
            log.debug("batch %d: a discarded write had failed: %s", self._batch_id, error)
        shutil.rmtree(self._folder, ignore_errors=True)
