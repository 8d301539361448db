"""A worker's graceful stop: its pumps end after their event in hand with a final checkpoint, the
handoffs under way finish, then every partition it holds is released, each step bounded.

The pumps and the handoffs share one wait of ``timeout`` (a handoff's release follows its pump's end,
so both are done by the same moment), and the release has a wait of its own: the stop takes at most
twice ``timeout`` (and a second for pumps cancelled late), which is what the manual promises. Each
stop logs how long its steps took, so a slow stop says where its time went.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable

import workers.metrics as metrics
from balancer.protocol import Balancer
from workers.runtime.handoffs import Handoffs
from workers.runtime.pumps import Pumps

log = logging.getLogger("workers.runtime.processor")


async def stop_worker(
    owner_id: str,
    pumps: Pumps,
    handoffs: Handoffs,
    release: Awaitable[None],
    *,
    coordinator: Balancer,
    timeout: float,
    cycles: int,
) -> None:
    """Stop ``pumps`` and finish ``handoffs`` within ``timeout``, then ``release`` within ``timeout``."""
    started = time.monotonic()
    pumps.unwatch_deadlines()
    await asyncio.gather(pumps.stop_all(timeout, cycles), handoffs.finish(timeout))
    stopped = time.monotonic()
    try:
        await asyncio.wait_for(release, timeout=timeout)
    except Exception as exc:
        metrics.STORE_ERRORS.labels(operation="release").inc()
        log.warning(
            "worker %s: could not release its partitions (%s: %s); others take them after expiry (%gs)",
            owner_id,
            type(exc).__name__,
            exc,
            coordinator.expiry,
        )
    done = time.monotonic()
    log.info(
        "worker %s stopped in %.1fs (pumps and handoffs %.1fs, release %.1fs)",
        owner_id,
        done - started,
        stopped - started,
        done - stopped,
    )
