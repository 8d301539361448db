"""``manage.py runhub``: the embedded hub over AMQP, for Microsoft's Event Hubs SDKs and ``--source eventhubs``.

Serves every hub under ``LEASEBOARD_HUB_DIR`` (creating ``--hub``, by default ``LEASEBOARD_HUB``,
with ``--partitions`` if it does not exist yet, or growing it) on a loopback port, and prints the
connection string to give the SDKs (``EVENTHUB_CONNECTION_STRING``). Producers, the embedded
workers and AMQP clients all use the same partition logs. Ctrl-C or SIGTERM stops it.

TLS (AMQPS, as Azure serves it) is on once a certificate and its key are named: ``--tls-cert`` and
``--tls-key``, else the settings or environment variables ``LEASEBOARD_HUB_TLS_CERT`` and
``LEASEBOARD_HUB_TLS_KEY`` (an encrypted key's password in ``LEASEBOARD_HUB_TLS_KEY_PASSWORD``). It
listens on ``--tls-port`` (default 5671, the port the SDKs use with TLS) beside the plain port,
which ``--no-plain`` turns off; ``EVENTHUB_TLS_CONNECTION_STRING`` is printed too.
"""

from __future__ import annotations

import asyncio
import signal
import ssl
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from workers.hub.amqp.connection import Limits
from workers.hub.amqp.keys import KeyFileError, load_key
from workers.hub.amqp.server import HubServer
from workers.hub.amqp.tls import AMQPS_PORT, ENV_CERT, ENV_KEY, ENV_PORT, TlsConfigError, server_context, tls_files
from workers.hub.amqp.tls import tls_port as resolve_tls_port

from .produce import Command as Produce


class Command(BaseCommand):
    help = "Serves the embedded hub over AMQP (the Event Hubs protocol) and prints its connection string."

    def add_arguments(self, parser: CommandParser) -> None:
        add = parser.add_argument
        add("--port", type=int, default=5672, help="port to listen on (default 5672; 0: any free one)")
        add(
            "--host",
            default="127.0.0.1",
            help="interface to listen on (default 127.0.0.1; plain AMQP is not encrypted: keep it local or"
            " use --no-plain)",
        )
        add(
            "--tls-cert",
            default=None,
            metavar="PEM",
            help=f"certificate chain for AMQPS (default: ${ENV_CERT}); with --tls-key, turns TLS on",
        )
        add("--tls-key", default=None, metavar="PEM", help=f"its private key (default: ${ENV_KEY})")
        add(
            "--tls-port",
            type=int,
            default=None,
            help=f"port for AMQPS (default ${ENV_PORT}, else {AMQPS_PORT}, the only port the SDKs use with TLS"
            " unless given custom_endpoint_address; 0: any free one)",
        )
        add("--no-plain", action="store_true", help="serve AMQPS only: no plain AMQP port (needs TLS)")
        add("--hub", default=None, help="hub to create or grow (default: LEASEBOARD_HUB); every hub found is served")
        add(
            "--partitions",
            type=int,
            default=None,
            help="create the hub with, or grow it to, this many partitions (default: LEASEBOARD_PARTITIONS)",
        )
        add(
            "--idle-timeout",
            type=float,
            default=120.0,
            help="the idle timeout clients are told, in seconds (default 120, as Azure); a connection silent"
            " for twice this is closed",
        )
        add(
            "--poll-interval",
            type=float,
            default=0.02,
            help="seconds between looks for events other processes appended (default 0.02)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["idle_timeout"] <= 0 or options["poll_interval"] <= 0:
            raise CommandError("--idle-timeout and --poll-interval must be more than 0 seconds")
        if options["partitions"] is not None and options["partitions"] < 1:
            raise CommandError(f"--partitions must be at least 1, got {options['partitions']}")
        name = options["hub"] or settings.LEASEBOARD_HUB
        hub = Produce()._open_hub(name, options["partitions"])
        partitions = hub.partition_count
        hub.close()
        try:
            key, where = load_key(settings.VAR_DIR)
        except (KeyFileError, OSError) as exc:
            raise CommandError(str(exc)) from exc
        tls, tls_from, tls_port = self._tls(options)
        if options["no_plain"] and tls is None:
            raise CommandError("--no-plain needs TLS: give --tls-cert and --tls-key (or set their variables)")
        server = HubServer(
            settings.LEASEBOARD_HUB_DIR,
            key,
            host=options["host"],
            port=None if options["no_plain"] else options["port"],
            tls=tls,
            tls_port=tls_port,
            limits=Limits(idle_timeout=options["idle_timeout"]),
            poll_interval=options["poll_interval"],
        )
        asyncio.run(self._serve(server, name, partitions, f"{where}{tls_from}"))

    def _tls(self, options: dict[str, Any]) -> tuple[ssl.SSLContext | None, str, int]:
        """The TLS context (None: TLS off), where it came from (paths only), and the AMQPS port, from
        the options, else the settings, else the environment. Raises CommandError."""
        try:
            files = tls_files(
                options["tls_cert"] or getattr(settings, "LEASEBOARD_HUB_TLS_CERT", None),
                options["tls_key"] or getattr(settings, "LEASEBOARD_HUB_TLS_KEY", None),
            )
            port = options["tls_port"]
            port = resolve_tls_port(port if port is not None else getattr(settings, "LEASEBOARD_HUB_TLS_PORT", None))
            if files is None:
                return None, "", port
            return server_context(files), f"; TLS {files.describe()}", port
        except TlsConfigError as exc:
            raise CommandError(str(exc)) from exc

    async def _serve(self, server: HubServer, name: str, partitions: int, where: str) -> None:
        try:
            await server.start()
        except OSError as exc:
            reason = exc.strerror or exc
            ports = [str(p) for p in (server.port, server.tls_port) if p is not None]
            raise CommandError(
                f"cannot listen on {server.host} port {' or '.join(ports)}: {reason}"
                " (another AMQP broker? try --port 0 or --tls-port 0)"
            ) from exc
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        listening = [f"AMQP on {server.host}:{server.port}"] if server.port is not None else []
        if server.tls_port is not None:
            listening.append(f"AMQPS (TLS) on {server.host}:{server.tls_port}")
        self.stdout.write(
            f"The embedded hub speaks {' and '.join(listening)} (Event Hubs): hub {name!r} with"
            f" {partitions} partitions in {settings.LEASEBOARD_HUB_DIR}; key from {where}."
        )
        self.stdout.write(f"EVENTHUB_CONNECTION_STRING={server.connection_string()}")
        # Microsoft's processor names blobs after the endpoint's host *and port*; workers sharing a
        # container with it must use the same namespace.
        self.stdout.write(f"LEASEBOARD_NAMESPACE={server.endpoint}")
        if server.tls_port is not None:
            self.stdout.write(f"EVENTHUB_TLS_CONNECTION_STRING={server.connection_string(tls=True)}")
            if server.tls_port != AMQPS_PORT:
                self.stdout.write(
                    f"The SDKs use TLS on port {AMQPS_PORT} only: give them"
                    f" custom_endpoint_address='sb://{server.host}:{server.tls_port}' and"
                    " transport_type=TransportType.Amqp (without it a custom endpoint means WebSockets)."
                )
        self.stdout.write("Ctrl-C stops it.")
        self.stdout.flush()
        try:
            await stop.wait()
        finally:
            await server.stop()
            self.stdout.write("The AMQP hub stopped.")
