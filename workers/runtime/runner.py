"""Running the workers of one process: ``run_workers`` runs its event processors until all have
stopped (SIGTERM or SIGINT stops them gracefully; a second signal gives up waiting), and
``listen_for_wakeups`` wakes them all on an operator's "rebalance now" from the channel layer."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Sequence

from workers.runtime.processor import EventProcessor
from workers.runtime.sink import EventSink

log = logging.getLogger("leaseboard.worker")


async def run_workers(
    processors: Sequence[EventProcessor],
    *,
    sink: EventSink | None = None,
    signals: bool = True,
) -> None:
    """Run ``processors`` until all have stopped; SIGTERM or SIGINT stops them gracefully.

    A second signal gives up on the graceful stop (pending work is cancelled).
    """
    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(p.run(), name=f"worker {p.owner_id}") for p in processors]
    installed: list[signal.Signals] = []

    def wake_all() -> None:
        for p in processors:
            p.wake()

    for p in processors:
        p.on_rebalance = wake_all
    listener = loop.create_task(listen_for_wakeups(wake_all), name="wake-up listener")

    def on_signal(signum: signal.Signals) -> None:
        if any(p.stopping for p in processors):
            log.warning("second %s: not waiting for the graceful stop", signum.name)
            for task in tasks:
                task.cancel()
            return
        log.info(
            "%s: stopping %d worker(s): finishing events in hand, checkpointing, releasing",
            signum.name,
            len(processors),
        )
        for p in processors:
            p.stop()

    if signals:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, on_signal, signum)
            installed.append(signum)
    try:
        await asyncio.gather(*tasks, return_exceptions=True)
        if sink is not None:
            await sink.flush(timeout=5.0)
    finally:
        listener.cancel()
        for signum in installed:
            loop.remove_signal_handler(signum)
        for task in tasks:
            if not task.done():
                task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)


WAKE_GROUP = "leaseboard.workers"


async def listen_for_wakeups(wake: Callable[[], None]) -> None:
    """Wake the workers of this process on a ``worker.wake`` message to the channel-layer group
    "leaseboard.workers" (an operator's "rebalance now"). With the in-process layer only workers in
    the dashboard's own process hear it; the others see the rebalance token in their next cycle."""
    from channels.layers import get_channel_layer

    from balancer.aio import stop_if_cancelled, within
    from workers.layer_notices import ENDING, receive

    layer = get_channel_layer()
    if layer is None:
        return
    try:
        channel = await layer.new_channel()
        await layer.group_add(WAKE_GROUP, channel)
        stop_if_cancelled()
    except Exception as exc:  # no layer to listen on: the token in the store still does the job
        log.warning("not listening for rebalance wake-ups: %s: %s", type(exc).__name__, exc)
        return

    async def leave() -> None:
        await layer.group_discard(WAKE_GROUP, channel)

    try:
        while True:
            # Cancelled at the stop: ends the receive and leaves the group within ENDING, never hangs.
            message = await receive(layer, channel, leave)
            stop_if_cancelled()  # the layer's redis-py may have lost a cancellation (balancer.aio)
            if message.get("type") == "worker.wake":
                log.info("woken by the channel layer: %s", message.get("reason", "no reason given"))
                wake()
    except Exception:  # the layer failed: leave its group if it still answers
        await within(leave(), ENDING)
        raise
