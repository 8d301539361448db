"""The embedded hub over AMQP: Event Hubs' protocol on a loopback port, on the same log the embedded source reads.

``HubServer`` serves every hub under one directory (``LEASEBOARD_HUB_DIR``): what a producer sends
is appended to the partition logs that ``workers.hub.embedded.EmbeddedHub`` readers (and the embedded
workers) read, and what other processes append is sent to AMQP receivers within ``poll_interval``
(at once for appends made through this server). Partitions added by any process (``produce
--partitions``) are served from the next request on. One asyncio loop runs everything; file
reads and appends are short and happen on it.

It listens for plain AMQP on ``port`` and, given a TLS context (``tls.server_context``), for AMQPS
on ``tls_port`` (5671 by default, the only port the SDKs use with TLS): either or both, one set
of hubs, links and receivers behind them.

``thread.ServerThread`` runs a server on a loop of its own in a daemon thread, for tests and benchmarks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proton import Link

from workers.hub.amqp.addresses import Address, BadAddress, parse_address, parse_filter
from workers.hub.amqp.auth import Grant, SasKey
from workers.hub.amqp.connection import AmqpConnection
from workers.hub.amqp.consumer import OUT_OF_RANGE, ConsumerLink, Receivers
from workers.hub.amqp.endpoints import LinkHandler
from workers.hub.amqp.limits import Limits
from workers.hub.amqp.links import refuse
from workers.hub.amqp.management import HubDirectory, put_token, read_properties
from workers.hub.amqp.notes import AttachInfo
from workers.hub.amqp.producer import ProducerLink
from workers.hub.amqp.requests import ReplyLink, Request, RequestLink, Response
from workers.hub.amqp.tls import AMQPS_PORT
from workers.hub.embedded import EmbeddedHub

log = logging.getLogger("leaseboard.amqp")
EPOCH = "com.microsoft:epoch"
RUNTIME_METRICS = "com.microsoft:enable-receiver-runtime-metric"


def connection_string(host: str, port: int, key: SasKey, *, tls: bool = False) -> str:
    """What a client of the Event Hubs SDKs is given. Plain AMQP: ``UseDevelopmentEmulator=true``
    (TLS off, the port used). TLS: Azure's form; the SDKs connect to 5671 whatever the endpoint's
    port, so on another port a client needs ``custom_endpoint_address="sb://host:port"`` too."""
    if tls:
        where = host if port == AMQPS_PORT else f"{host}:{port}"
        return f"Endpoint=sb://{where}/;SharedAccessKeyName={key.name};SharedAccessKey={key.key}"
    return (
        f"Endpoint=sb://{host}:{port};SharedAccessKeyName={key.name};SharedAccessKey={key.key};"
        "UseDevelopmentEmulator=true"
    )


@dataclass
class Stats:
    """Counters since the server started (read them through ``ServerThread.call`` from other threads)."""

    connections: int = 0
    open_connections: int = 0
    links: int = 0
    refused: int = 0
    events_in: int = 0
    events_out: int = 0
    requests: int = 0


class HubServer:
    """Serves the hubs under ``root`` to clients holding ``key``: plain AMQP on ``host:port`` (0: a
    free port, see ``port`` once started; None: no plain listener) and, with ``tls``, AMQPS on
    ``host:tls_port`` (0: a free port, see ``tls_port``). Implements ``connection.Router``."""

    def __init__(
        self,
        root: Path | str,
        key: SasKey,
        *,
        host: str = "127.0.0.1",
        port: int | None = 0,
        tls: ssl.SSLContext | None = None,
        tls_port: int = AMQPS_PORT,
        limits: Limits | None = None,
        poll_interval: float = 0.02,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if port is None and tls is None:
            raise ValueError("a HubServer needs a plain port, a TLS context, or both")
        self.hubs = HubDirectory(Path(root))
        self.key = key
        self.host = host
        self.port = port
        self.tls = tls
        self.tls_port: int | None = tls_port if tls is not None else None
        self.limits = limits or Limits()
        self.poll_interval = poll_interval
        self.stats = Stats()
        self._clock = clock
        self._servers: list[asyncio.Server] = []
        self._connections: set[AmqpConnection] = set()
        self._grants: dict[int, list[Grant]] = defaultdict(list)
        self._replies: dict[int, list[ReplyLink]] = defaultdict(list)
        self.receivers = Receivers()
        self._wake: asyncio.Event | None = None
        self._pump_task: asyncio.Task[None] | None = None

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Listens on every port asked for; raises OSError if one cannot be bound (and then listens on none)."""
        self._wake = asyncio.Event()
        try:
            if self.port is not None:
                self.port = await self._listen(self.port, None)
            if self.tls is not None and self.tls_port is not None:
                self.tls_port = await self._listen(self.tls_port, self.tls)
        except OSError:
            for server in self._servers:
                server.close()
            self._servers.clear()
            raise
        self._pump_task = asyncio.create_task(self._pump_forever(), name="amqp event pump")
        listening = [f"AMQP on {self.host}:{self.port}"] if self.port is not None else []
        if self.tls_port is not None:
            listening.append(f"AMQPS (TLS) on {self.host}:{self.tls_port}")
        log.info("embedded hub serving %s (hubs under %s)", " and ".join(listening), self.hubs.root)

    async def _listen(self, port: int, tls: ssl.SSLContext | None) -> int:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: AmqpConnection(self, self.limits, "leaseboard-hub"),
            self.host,
            port,
            reuse_address=True,
            ssl=tls,
            ssl_handshake_timeout=self.limits.handshake_timeout if tls is not None else None,
        )
        self._servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stops listening, closes every connection (with ``amqp:connection:forced``) and the hubs."""
        for server in self._servers:
            server.close()
        for conn in list(self._connections):
            conn.close("amqp:connection:forced", "the hub is shutting down")
        if self._pump_task is not None:
            self._pump_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump_task
        for server in self._servers:
            await server.wait_closed()
        self.hubs.close()

    @property
    def connections(self) -> list[AmqpConnection]:
        return list(self._connections)

    def connection_string(self, host: str | None = None, *, tls: bool | None = None) -> str:
        """The plain listener's connection string, or the TLS one's (``tls=True``, or no plain listener)."""
        use_tls = self.port is None if tls is None else tls
        port = self.tls_port if use_tls else self.port
        if port is None:
            raise ValueError(f"this server has no {'TLS' if use_tls else 'plain'} listener")
        return connection_string(host or self.host, port, self.key, tls=use_tls)

    @property
    def endpoint(self) -> str:
        """``host:port`` of the plain listener, else of the TLS one: how entities are named in errors."""
        return f"{self.host}:{self.port if self.port is not None else self.tls_port}"

    # -- connection.Router -------------------------------------------------------------------------

    def attach(self, conn: AmqpConnection, link: Link, info: AttachInfo) -> LinkHandler | None:
        address_text = info.target if info.client_is_sender else info.source
        try:
            address = parse_address(address_text)
            handler = self._open(conn, link, info, address)
        except BadAddress as exc:
            self.stats.refused += 1
            refuse(conn, link, exc.condition, str(exc))
            return None
        self.stats.links += 1
        log.debug("connection %d: link %r attached to %s", conn.id, link.name, address_text)
        return handler

    def connection_closed(self, conn: AmqpConnection) -> None:
        self._connections.discard(conn)
        self._grants.pop(conn.id, None)
        self._replies.pop(conn.id, None)
        self.receivers.prune()
        self.stats.open_connections = len(self._connections)

    def connection_opened(self, conn: AmqpConnection) -> None:
        self._connections.add(conn)
        self.stats.connections += 1
        self.stats.open_connections = len(self._connections)

    def wake(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # -- links -------------------------------------------------------------------------------------

    def _open(self, conn: AmqpConnection, link: Link, info: AttachInfo, address: Address) -> LinkHandler:
        if address.kind in ("cbs", "management"):
            node = "$cbs" if address.kind == "cbs" else "$management"
            if not info.client_is_sender:
                reply = ReplyLink(conn, link, info, node)
                # The SDK attaches a new pair for every management request: forget the detached ones.
                self._replies[conn.id] = [r for r in self._replies[conn.id] if not r.gone] + [reply]
                return reply
            handle = self._put_token if address.kind == "cbs" else self._read_properties
            return RequestLink(
                conn, link, info, node, lambda request: handle(conn, request), lambda r: self._reply_to(conn, info, r)
            )
        hub = self._hub(address)
        self._authorize(conn, address)
        if info.client_is_sender:
            if address.kind not in ("hub", "partition"):
                raise BadAddress(f"{info.target!r} is not an address to send to: use <hub> or <hub>/Partitions/<id>")
            self._check_partition(hub, address)
            return ProducerLink(conn, link, hub, address.partition_id, self._appended)
        if address.kind != "consumer":
            raise BadAddress(
                f"{info.source!r} is not an address to receive from: use <hub>/ConsumerGroups/<g>/Partitions/<id>"
            )
        self._check_partition(hub, address)
        assert address.partition_id is not None and address.consumer_group is not None
        start = parse_filter(info.filters)
        level = _owner_level(info.properties)
        consumer = ConsumerLink(
            conn,
            link,
            hub,
            address.partition_id,
            address.consumer_group,
            start,
            level,
            RUNTIME_METRICS in info.desired_capabilities,
            self.wake,
        )
        refused = self.receivers.admit(consumer)
        if refused is not None:
            consumer.on_detach()
            raise BadAddress(refused[1], refused[0])
        consumer.open()
        self.wake()
        return consumer

    def _hub(self, address: Address) -> EmbeddedHub:
        hub = self.hubs.get(address.hub)
        if hub is None:
            entity = f"sb://{self.endpoint}/{address.hub}"
            raise BadAddress(f"The messaging entity '{entity}' could not be found.", "amqp:not-found")
        return hub

    def _check_partition(self, hub: EmbeddedHub, address: Address) -> None:
        if address.partition_id is not None and address.partition_id not in hub.partition_ids():
            raise BadAddress(
                f"The specified partition '{address.partition_id}' is invalid for event hub '{hub.name}': its"
                f" partitions are 0..{hub.partition_count - 1}.",
                OUT_OF_RANGE,
            )

    def _authorize(self, conn: AmqpConnection, address: Address) -> None:
        now = self._clock()
        if not any(grant.covers(address.entity, now) for grant in self._grants.get(conn.id, [])):
            raise BadAddress(
                f"Unauthorized access to '{address.entity}': put a token for it on $cbs first.",
                "amqp:unauthorized-access",
            )

    def _appended(self, partition_id: str, count: int) -> None:
        self.stats.events_in += count
        self.wake()

    # -- $cbs and $management ------------------------------------------------------------------------

    def _reply_to(self, conn: AmqpConnection, info: AttachInfo, request: Request) -> ReplyLink | None:
        node = "$cbs" if (info.target or "").lower().endswith("$cbs") else "$management"
        replies = [r for r in self._replies.get(conn.id, []) if not r.gone and r.node == node]
        if request.reply_to is not None:
            for reply in replies:
                if reply.target == request.reply_to:
                    return reply
        for reply in replies:
            if reply.info.channel == info.channel:
                return reply
        return replies[0] if replies else None

    def _put_token(self, conn: AmqpConnection, request: Request) -> Response:
        self.stats.requests += 1
        response, grant = put_token(request, self.key, self._clock())
        if grant is not None and grant.path and not self._hub_exists(grant.path.split("/")[0]):
            # As Event Hubs does: a token for an entity that does not exist is refused, not stored.
            name = grant.path.split("/")[0]
            response, grant = (
                Response(404, f"The messaging entity 'sb://{self.endpoint}/{name}' could not be found."),
                None,
            )
        if grant is None:
            log.warning("connection %d from %s: token refused: %s", conn.id, conn.peer, response.description)
        else:
            self._grants[conn.id] = [*(g for g in self._grants[conn.id] if g.path != grant.path), grant]
        return response

    def _hub_exists(self, lowered: str) -> bool:
        """Whether a hub of this name, in any case, is served (token paths are lowercased)."""
        if self.hubs.get(lowered) is not None:
            return True
        root = self.hubs.root
        return root.is_dir() and any(
            p.name.lower() == lowered and EmbeddedHub.exists(root, p.name) for p in root.iterdir()
        )

    def _read_properties(self, conn: AmqpConnection, request: Request) -> Response:
        self.stats.requests += 1
        now = self._clock()
        grants = self._grants.get(conn.id, [])
        return read_properties(
            request,
            self.hubs,
            self.key,
            now,
            lambda entity: any(g.covers(entity, now) for g in grants),
            lambda hub: f"sb://{self.endpoint}/{hub}",
        )

    # -- the event pump --------------------------------------------------------------------------

    def pump_once(self, budget: int = 100) -> int:
        """Sends what every receiver has credit for, up to ``budget`` events each; returns how many."""
        sent = 0
        touched: set[AmqpConnection] = set()
        for consumer in self.receivers.all():
            try:
                n = consumer.pump(budget)
            except Exception:  # one receiver's failure must not stop the others
                log.exception(
                    "sending to receiver %r of partition %s failed; detaching it",
                    consumer.link.name,
                    consumer.partition_id,
                )
                consumer.detach("amqp:internal-error", "the hub failed to send to this receiver")
                touched.add(consumer.conn)
                continue
            if n:
                sent += n
                touched.add(consumer.conn)
        for conn in touched:
            conn.flush()
        self.stats.events_out += sent
        return sent

    async def _pump_forever(self) -> None:
        assert self._wake is not None
        while True:
            self._wake.clear()
            try:
                sent = self.pump_once()
            except Exception:
                log.exception("the event pump failed; it goes on")
                sent = 0
            if sent:
                await asyncio.sleep(0)  # let sockets drain and credit come in
                continue
            # Not asyncio.wait_for: on Python 3.11 it can swallow the cancellation that stop() sends.
            try:
                async with asyncio.timeout(self.poll_interval):
                    await self._wake.wait()
            except TimeoutError:
                pass


def _owner_level(properties: dict[Any, Any]) -> int | None:
    for key, value in properties.items():
        if str(key) == EPOCH and value is not None:
            return int(value)
    return None
