"""Release notices through Django Channels' channel layer (``balancer.notices``), for a store with no
channel of its own: the Blob store (Azure Blob Storage has nothing a client can subscribe to) and
the SQL store on SQLite.

Used when ``CHANNEL_LAYERS`` names a layer that crosses processes (``channels_redis``, configured when
``REDIS_URL`` is set), never the in-memory one, which reaches no other process (``channel_layer_channel``
says which). One group per hub and consumer group; publishing is one ``group_send``; listening
holds a channel of this process in the group and ``receive``s on it, re-adding it to the group now
and then (a layer forgets a member after its ``group_expiry``). After any failure (the layer's Redis
down or cut) the listener says so once, tells ``on_health`` (the workers then poll while waiting
for a handoff, as without notices) and joins again with backoff; what was sent meanwhile is lost,
which a notice may be: the receiver claims at its next cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from balancer.aio import detached, stop_if_cancelled
from balancer.errors import StoreUnavailable
from balancer.model import HubRef
from balancer.notices import Released

log = logging.getLogger("leaseboard.notices")

MESSAGE_TYPE = "leaseboard.released"
STOP_TYPE = "leaseboard.released.stop"  # sent by a listener to its own channel to end its receive()
GROUP_PREFIX = "leaseboard.releases."
REFRESH = 300.0  # seconds between two group_adds of a listening channel (at most a quarter of group_expiry)
BACKOFF = (0.1, 5.0)  # first and longest wait before joining again after a failure
ENDING = 1.0  # seconds a stopping listener gives its receive and its group to end, in all


def group_name(ref: HubRef) -> str:
    """The layer group of ``ref``'s notices: a valid group name (ASCII letters, digits, ``-_.``, under
    100 characters) for any hub and consumer group (``$Default`` is not one), readable and unique."""
    digest = hashlib.sha256("\x00".join((ref.namespace, ref.hub, ref.consumer_group)).encode()).hexdigest()[:20]
    readable = re.sub(r"[^A-Za-z0-9_-]+", "_", f"{ref.hub}.{ref.consumer_group}")[:40]
    return f"{GROUP_PREFIX}{readable}.{digest}"


def crosses_processes(layer: object) -> bool:
    """Whether ``layer`` reaches other processes: any layer but Channels' in-memory one."""
    if layer is None:
        return False
    from channels.layers import InMemoryChannelLayer

    return not isinstance(layer, InMemoryChannelLayer)


def channel_layer_channel(ref: HubRef, layer: Any = None) -> ChannelLayerReleaseChannel | None:
    """Notices of ``ref`` through ``layer`` (default: Django's default channel layer), or None where
    that layer reaches no other process (in-memory, or none configured) or cannot be built (said once
    in the log)."""
    if layer is None:
        from channels.layers import get_channel_layer

        try:
            layer = get_channel_layer()
        except Exception as exc:  # a layer that cannot be built: notices stay in this process
            log.warning("release notices: the channel layer cannot be used (%s: %s)", type(exc).__name__, exc)
            return None
    return ChannelLayerReleaseChannel(layer, ref) if crosses_processes(layer) else None


async def receive(layer: Any, channel: str, leaving: Callable[[], Awaitable[Any]] | None = None) -> dict[str, Any]:
    """``layer.receive(channel)``, safe to cancel. A cancelled channels_redis ``receive()`` can swallow
    the cancellation and block for good, so it is never cancelled directly: it runs as a task of its
    own, awaited through a shield, and a cancelled caller ends it with a ``STOP_TYPE`` message to
    ``channel`` itself, while ``leaving()`` (taking ``channel`` out of its group) runs beside it, both
    within ``ENDING`` seconds in all (what has not ended by then is cancelled and left behind) before
    the cancellation goes on. Callers ignore ``STOP_TYPE`` messages."""
    receiving = detached(asyncio.ensure_future(layer.receive(channel)))
    try:
        return await asyncio.shield(receiving)
    except asyncio.CancelledError:
        await _end(layer, channel, receiving, *([leaving()] if leaving is not None else []))
        raise


async def _end(layer: Any, channel: str, receiving: asyncio.Task[Any] | None, *also: Awaitable[Any]) -> None:
    """End ``receiving`` (a message to ``channel``) while ``also`` run, all within ``ENDING`` seconds:
    one budget for all, so a layer that does not answer costs a stop ``ENDING``, not a multiple."""
    tasks = [detached(asyncio.ensure_future(call)) for call in also]
    waited = set(tasks)
    if receiving is not None and not receiving.done():
        tasks.append(detached(asyncio.ensure_future(layer.send(channel, {"type": STOP_TYPE}))))
        waited.add(receiving)
        tasks.append(receiving)
    if waited:
        await asyncio.wait(waited, timeout=ENDING)
    for task in tasks:
        if not task.done():  # the layer does not answer: nothing better than a cancellation
            task.cancel()


def _where(layer: Any) -> str:
    return f"{type(layer).__module__}.{type(layer).__qualname__}"


class ChannelLayerReleaseChannel:
    """Release notices of ``ref`` on channel layer ``layer``. ``on_health(up)``, when set, hears
    whether the listener is in its group (True once it joined, False at a failure)."""

    def __init__(self, layer: Any, ref: HubRef) -> None:
        self.layer, self.ref = layer, ref
        self.group = group_name(ref)
        self.on_health: Callable[[bool], None] | None = None
        expiry = getattr(layer, "group_expiry", None)
        self.refresh = min(REFRESH, expiry / 4) if isinstance(expiry, int | float) and expiry > 0 else REFRESH

    def __repr__(self) -> str:
        return f"ChannelLayerReleaseChannel({_where(self.layer)}, group {self.group!r})"

    async def publish(self, notice: Released) -> None:
        try:
            await self.layer.group_send(self.group, {"type": MESSAGE_TYPE, "notice": notice.encode()})
        except Exception as exc:  # whatever the layer's client raises (ConnectionError, OSError, a full channel)
            raise StoreUnavailable(f"channel layer {_where(self.layer)}: {type(exc).__name__}: {exc}") from exc

    def _health(self, up: bool) -> None:
        if self.on_health is not None:
            with contextlib.suppress(Exception):
                self.on_health(up)

    async def listen(self) -> AsyncIterator[Released]:
        wait, failing = BACKOFF[0], False
        loop = asyncio.get_running_loop()
        while True:
            channel: str | None = None
            refresher: asyncio.Task[None] | None = None
            receiving: asyncio.Task[dict[str, Any]] | None = None
            try:
                channel = await self.layer.new_channel()
                await self.layer.group_add(self.group, channel)
                stop_if_cancelled()  # the layer's redis-py may have lost a cancellation (balancer.aio)
                if failing:
                    log.info("release notices: in channel-layer group %s again", self.group)
                wait, failing = BACKOFF[0], False
                self._health(True)
                refresher = loop.create_task(self._refresh(channel), name="notice group")
                while True:
                    # Never cancelled from here: a cancelled channels_redis receive() can swallow the
                    # cancellation and block for good. The finally below ends it with a message of its own.
                    receiving = detached(loop.create_task(self.layer.receive(channel), name="notice receive"))
                    message = await asyncio.shield(receiving)
                    receiving = None
                    stop_if_cancelled()
                    if refresher.done():  # the group_add failed: join afresh
                        refresher.result()
                    if message.get("type") != MESSAGE_TYPE:
                        continue
                    notice = Released.decode(message.get("notice") or "")
                    if notice is not None and notice.ref == self.ref:
                        yield notice
            except Exception as exc:  # the layer's client failed: say so once, poll meanwhile, join again
                stop_if_cancelled()  # a cancellation the layer turned into an error: end now, one leave
                if not failing:
                    log.warning(
                        "release notices: the channel layer (%s) failed (%s: %s); joining group %s again with "
                        "backoff, receivers claim at their next cycle meanwhile",
                        _where(self.layer),
                        type(exc).__name__,
                        exc,
                        self.group,
                    )
                    self._health(False)
                failing = True
            finally:
                await self._leave(channel, refresher, receiving)
            await asyncio.sleep(wait)
            wait = min(wait * 2, BACKOFF[1])

    async def _leave(
        self, channel: str | None, refresher: asyncio.Task[None] | None, receiving: asyncio.Task[Any] | None
    ) -> None:
        """Stop ``refresher``, end a pending ``receiving`` (a message to ``channel`` itself) and take
        ``channel`` out of the group, together within ``ENDING`` seconds; what does not end is left behind."""
        if refresher is not None:
            refresher.cancel()
        if channel is not None:
            await _end(self.layer, channel, receiving, self.layer.group_discard(self.group, channel))

    async def _refresh(self, channel: str) -> None:
        """Keep ``channel`` in the group past the layer's ``group_expiry``."""
        while True:
            await asyncio.sleep(self.refresh)
            await self.layer.group_add(self.group, channel)

    async def aclose(self) -> None:
        """Nothing of its own to close: a listener leaves its group when its iteration ends; the layer
        belongs to Channels."""
