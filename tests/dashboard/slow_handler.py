"""A handler for the desired-workers test: each event costs ``LEASEBOARD_SLOW_HANDLER_SECONDS``
(default 5 ms) of work, one event at a time per process, so a worker handles at most 1 / that many
events a second whatever it owns (the sleep stands for the work; nothing waits on a condition)."""

from __future__ import annotations

import os
import threading
import time

from workers.handlers import PartitionContext
from workers.sources.base import ReceivedEvent


class SlowHandler:
    def __init__(self) -> None:
        self.seconds = float(os.environ.get("LEASEBOARD_SLOW_HANDLER_SECONDS", "0.005"))
        self._lock = threading.Lock()  # partitions are handled on threads of their own: one at a time here

    def __call__(self, event: ReceivedEvent, ctx: PartitionContext) -> None:
        with self._lock:
            time.sleep(self.seconds)
