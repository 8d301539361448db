"""A handler whose every call blocks for good (the stuck-handler process test): ``--handler
tests.workers.hanging_handler.hang``."""

from __future__ import annotations

import threading

from workers.handlers import PartitionContext
from workers.sources.base import ReceivedEvent

_never = threading.Event()


def hang(event: ReceivedEvent, ctx: PartitionContext) -> None:
    _never.wait()
