"""``manage.py serve``: the whole demo in one process (what ``make demo`` runs).

Daphne serves ``dashboard.asgi.application`` while embedded workers (``--workers``, default 3)
balance the embedded hub and an embedded producer writes sensor events to it (``--produce``). The
workers land events as Parquet (``workers.landing.LandingHandler``) and the Spark pipeline runs
over the landing as a child process (``--no-pipeline`` leaves it out; its log is var/pipeline.log).
Daphne's Twisted reactor runs on an asyncio loop, and the workers run on that same loop, so their
balancer events reach the websocket consumers through the in-memory channel layer. Ctrl-C (or
SIGTERM) stops the producer, then the workers (final checkpoints, partitions released), then
the server. The workers are built by ``workers.wiring.build_fleet`` from ``runworkers``' options.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import random
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser, OutputWrapper

from workers.hub.embedded import EmbeddedHub
from workers.management.commands.produce import Command as Produce
from workers.management.commands.runworkers import add_worker_options, fleet_of
from workers.pipeline.launcher import start_pipeline, stop_pipeline
from workers.runtime.runner import run_workers
from workers.sensors import run_producer
from workers.wiring import Fleet, close_stores, hub_ref

if TYPE_CHECKING:
    from daphne.server import Server
    from twisted.internet import defer

log = logging.getLogger("leaseboard.serve")


class Command(BaseCommand):
    help = "Serves the dashboard with embedded workers and an embedded producer (the demo), in one process."
    requires_system_checks = "__all__"  # it serves the console (a worker alone skips them)

    def add_arguments(self, parser: CommandParser) -> None:
        add_worker_options(parser, count_option="--workers", default_count=3)
        parser.add_argument("--port", type=int, default=8000, help="port to serve on (default 8000; 0: any free one)")
        parser.add_argument("--host", default="127.0.0.1", help="interface to serve on (default 127.0.0.1)")
        parser.add_argument(
            "--produce",
            type=float,
            default=50.0,
            metavar="RATE",
            help="events per second the embedded producer writes (default 50; 0: no producer)",
        )
        parser.add_argument(
            "--partitions",
            type=int,
            default=None,
            help="create the embedded hub with, or grow it to, this many partitions (default: LEASEBOARD_PARTITIONS)",
        )
        parser.add_argument("--homes", type=int, default=1000, help="homes (partition keys) of the producer")
        parser.add_argument(
            "--pipeline",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="also run the Spark pipeline (runpipeline, local[1]) as a child process; "
            "its log goes to var/pipeline.log (default: on)",
        )
        parser.set_defaults(handler="workers.landing.LandingHandler")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["produce"] < 0:
            raise CommandError(f"--produce must be 0 (no producer) or more events per second, got {options['produce']}")
        if (options["source"] or settings.LEASEBOARD_SOURCE) != "embedded":
            raise CommandError("serve runs on the embedded hub (--source embedded); use runworkers for Event Hubs")
        if options["partitions"] is not None and options["partitions"] < 1:
            raise CommandError(f"--partitions must be at least 1, got {options['partitions']}")
        hub_name = options["hub"] or settings.LEASEBOARD_HUB
        hub = Produce()._open_hub(hub_name, options["partitions"])
        fleet = fleet_of(options, "--workers", source=hub)
        self.check_migrations()

        # Imported here: daphne.server installs Twisted's asyncio reactor when imported.
        from daphne.server import Server
        from twisted.internet import reactor

        from dashboard.asgi import application
        from dashboard.live.host import watch_configured

        server = Server(application, endpoints=[f"tcp:port={options['port']}:interface={options['host']}"])
        ref = hub_ref(options["hub"], options["consumer_group"], options["namespace"])
        demo = _Demo(server, hub, hub_name, fleet, options, self.stdout, lambda: watch_configured(ref))
        reactor.callWhenRunning(demo.started)
        reactor.addSystemEventTrigger("before", "shutdown", demo.stopping)  # type: ignore[arg-type]  # zope interface
        try:
            server.run()
        finally:
            demo.stop_producing.set()
            for process in demo.pipeline:  # a backstop: normally stopped in order by _finish
                stop_pipeline(process)
            hub.close()
        if not server.listening_addresses:
            raise CommandError(f"could not listen on {options['host']}:{options['port']} (is the port in use?)")


class _Demo:
    """What runs beside Daphne: the workers, their release notices, the producer and the pipeline."""

    def __init__(
        self,
        server: Server,
        hub: EmbeddedHub,
        hub_name: str,
        fleet: Fleet,
        options: dict[str, Any],
        stdout: OutputWrapper,
        watch: Callable[[], object],
    ) -> None:
        self.server, self.hub, self.hub_name, self.fleet, self.options = server, hub, hub_name, fleet, options
        self.stdout, self.watch = stdout, watch
        self.stop_producing = threading.Event()
        self.running: dict[str, asyncio.Task[None]] = {}
        self.pipeline: list[subprocess.Popen[bytes]] = []

    def started(self) -> None:
        options, fleet, server = self.options, self.fleet, self.server
        self.watch()  # lag is sampled from the start, whether or not anyone opens a page
        host, port = server.listening_addresses[0] if server.listening_addresses else (options["host"], "?")
        loop = asyncio.get_event_loop()
        self.running["workers"] = loop.create_task(run_workers(fleet.processors, sink=fleet.sink, signals=False))
        # A planned move wakes its receiver at once (release notices), as under runworkers.
        self.running["notices"] = loop.create_task(fleet.notices.listen(fleet.processors), name="notices")
        if options["produce"] > 0:
            threading.Thread(
                target=run_producer,
                name="producer",
                daemon=True,
                args=(self.hub, options["produce"], self.stop_producing, random.Random()),
                kwargs={"homes": options["homes"]},
            ).start()
        if options["pipeline"]:
            self.pipeline.append(start_pipeline(self.hub_name, Path(settings.VAR_DIR) / "pipeline.log"))
        self.stdout.write(
            f"Leaseboard is serving at http://{host}:{port}/ with {len(fleet.processors)} workers on "
            f"{len(self.hub.partition_ids())} partitions of hub {self.hub_name!r}"
            + (f", producing {options['produce']:g} events/s" if options["produce"] > 0 else "")
            + (", with the Spark pipeline (log in var/pipeline.log)" if self.pipeline else "")
            + ". Ctrl-C stops it.",
        )
        self.stdout.flush()

    def stopping(self) -> defer.Deferred[None] | None:
        from twisted.internet import defer

        self.stop_producing.set()
        for processor in self.fleet.processors:
            processor.stop()
        return defer.Deferred.fromFuture(asyncio.ensure_future(self._finish()))

    async def _finish(self) -> None:
        """Wait for the workers' graceful stop (bounded), then the pipeline's, then close the stores."""
        workers, notices, fleet = self.running.get("workers"), self.running.get("notices"), self.fleet
        if workers is not None:
            bound = 2 * max(p.shutdown_timeout for p in fleet.processors) + 5
            _, late = await asyncio.wait([workers], timeout=bound)
            for task in late:
                log.warning("workers did not stop within %gs; leaving their leases to expire", bound)
                task.cancel()
        if notices is not None:
            notices.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await notices
        await fleet.notices.aclose()
        for process in self.pipeline:
            await asyncio.to_thread(stop_pipeline, process)
        await close_stores(fleet.stores)
        self.stdout.write("Leaseboard stopped.")
