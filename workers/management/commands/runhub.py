"""``manage.py runhub``: the embedded hub over AMQP, for Microsoft's Event Hubs SDKs and ``--source eventhubs``.

Serves every hub under ``LEASEBOARD_HUB_DIR`` (creating ``--hub``, by default ``LEASEBOARD_HUB``,
with ``--partitions`` if it does not exist yet, or growing it) on a loopback port, and prints the
connection string to give the SDKs (``EVENTHUB_CONNECTION_STRING``). Producers, the embedded
workers and AMQP clients all use the same partition logs. Ctrl-C or SIGTERM stops it.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from workers.hub.amqp.connection import Limits
from workers.hub.amqp.keys import KeyFileError, load_key
from workers.hub.amqp.server import HubServer

from .produce import Command as Produce


class Command(BaseCommand):
    help = "Serves the embedded hub over AMQP (the Event Hubs protocol) and prints its connection string."

    def add_arguments(self, parser: CommandParser) -> None:
        add = parser.add_argument
        add("--port", type=int, default=5672, help="port to listen on (default 5672; 0: any free one)")
        add("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1; no TLS: keep it local)")
        add("--hub", default=None, help="hub to create or grow (default: LEASEBOARD_HUB); every hub found is served")
        add("--partitions", type=int, default=None,
            help="create the hub with, or grow it to, this many partitions (default: LEASEBOARD_PARTITIONS)")
        add("--idle-timeout", type=float, default=120.0,
            help="the idle timeout clients are told, in seconds (default 120, as Azure); a connection silent"
                 " for twice this is closed")
        add("--poll-interval", type=float, default=0.02,
            help="seconds between looks for events other processes appended (default 0.02)")

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
        server = HubServer(
            settings.LEASEBOARD_HUB_DIR, key, host=options["host"], port=options["port"],
            limits=Limits(idle_timeout=options["idle_timeout"]), poll_interval=options["poll_interval"],
        )  # fmt: skip
        asyncio.run(self._serve(server, name, partitions, where))

    async def _serve(self, server: HubServer, name: str, partitions: int, where: str) -> None:
        try:
            await server.start()
        except OSError as exc:
            reason = exc.strerror or exc
            where = f"{server.host}:{server.port}"
            raise CommandError(f"cannot listen on {where}: {reason} (another AMQP broker? try --port 0)") from exc
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        self.stdout.write(
            f"The embedded hub speaks AMQP (Event Hubs) on {server.host}:{server.port}: hub {name!r} with"
            f" {partitions} partitions in {settings.LEASEBOARD_HUB_DIR}; key from {where}."
        )
        self.stdout.write(f"EVENTHUB_CONNECTION_STRING={server.connection_string()}")
        # Microsoft's processor names blobs after the endpoint's host *and port*; workers sharing a
        # container with it must use the same namespace.
        self.stdout.write(f"LEASEBOARD_NAMESPACE={server.host}:{server.port}")
        self.stdout.write("Ctrl-C stops it.")
        self.stdout.flush()
        try:
            await stop.wait()
        finally:
            await server.stop()
            self.stdout.write("The AMQP hub stopped.")
