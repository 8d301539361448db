"""A small cluster of hosts for the network-partition suite, each in a network namespace.

Hosts (``tests.support.netns``): ``store`` (PostgreSQL: the SQL store and the event log; Redis or
Azurite too when the fleet's store is one of those), ``hub``
(``manage.py runhub``, Event Hubs' AMQP, on the hub's own address), ``console`` (Daphne), and
``w1``..``w3``, one ``runworkers --count 1 --source eventhubs`` process each, reading the hub over
AMQP and the store over TCP, and landing what they read (``landing.LandingRecorder``: Parquet files that
name their writer). The test process is the observer: it writes the events into the hub's
files (``runhub`` serves what is appended), samples the store and polls the console, on a link no
nemesis cuts. Everything a worker records (``tests.chaos.recording``) and lands is on the shared
file system, stamped with the machine's monotonic clock, which namespaces share.

``NetFleet`` is the chaos suite's ``Fleet`` (phases, settling, sampling, evidence, the same
invariant checker) with its processes placed on hosts.
"""

from __future__ import annotations

import json
import pwd
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from balancer.model import HubRef
from tests.chaos.console import Console
from tests.chaos.cycles import LOG_LEVELS
from tests.chaos.fleet import Fleet, Worker
from tests.chaos.stores import BlobKit, RedisKit, SqlKit
from tests.support.azurite import Azurite
from tests.support.netns import IP, Host, Network
from tests.support.postgres import Postgres, postgres_bin_dir
from tests.support.processes import ROOT, manage, start_logged, worker_env
from tests.support.redis_server import RedisServer, answers
from workers.hub.embedded import EmbeddedHub
from workers.sensors import SensorEvent

HOSTS = ("store", "hub", "console", "w1", "w2", "w3")
WORKER_HOSTS = ("w1", "w2", "w3")
POSTGRES_PORT = 5432
REDIS_PORT = 6379
AZURITE_PORT = 10000
AMQP_PORT = 5672
CONSOLE_PORT = 8000
HUB = "netsplit"
READER_STUCK = 2.5  # seconds: the workers' LEASEBOARD_READER_STUCK (the hub's silence they hand over after)


class HostedPostgres(Postgres):
    """The chaos suite's PostgreSQL, served from the ``store`` host's address (as the ``postgres``
    user, dropped to inside the namespace: ``ip netns exec`` needs root)."""

    def __init__(self, host: Host, home: Path, settings: dict[str, str], user: tuple[int, int] | None) -> None:
        super().__init__(POSTGRES_PORT, home, settings, user)
        self.where = host
        self.host = host.address
        with (home / "data" / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {host.address.rsplit('.', 1)[0]}.0/24 trust\n")

    def command(self) -> list[str]:
        drop = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups"] if self.user else []
        return [IP, "netns", "exec", self.where.namespace, *drop, *super().command()]

    def popen_options(self) -> dict[str, Any]:
        return {**super().popen_options(), "user": None, "group": None}


def start_store(host: Host, home: Path) -> HostedPostgres:
    from tests.chaos.stores import CHAOS_POSTGRES
    from tests.support.postgres import FAST

    user = HostedPostgres.initdb(home)
    server = HostedPostgres(host, home, {**FAST, **CHAOS_POSTGRES}, user)
    server.start()
    return server


class HostedRedis(RedisServer):
    """A redis-server on the store host's address."""

    def __init__(self, host: Host, directory: Path) -> None:
        super().__init__(REDIS_PORT, directory, host=host.address)
        self.where = host

    def command(self) -> list[str]:  # reached from other hosts: no loopback-only protected mode
        return [IP, "netns", "exec", self.where.namespace, *super().command(), "--protected-mode", "no"]

    def ready(self) -> bool:  # /proc/net of this process shows another namespace's sockets: ask it
        return self.process is not None and answers(self.host, self.port)


class HostedAzurite(Azurite):
    """An Azurite blob service on the store host's address."""

    def __init__(self, host: Host, location: Path) -> None:
        super().__init__(AZURITE_PORT, location, host=host.address)
        self.where = host

    @property
    def debug_log(self) -> Path:
        """Azurite's log of every request (``--debug``): the store's own history (``store_history``)."""
        return self.home / "requests.log"

    def command(self) -> list[str]:
        return [IP, "netns", "exec", self.where.namespace, *super().command(), "--debug", str(self.debug_log)]

    def ready(self) -> bool:
        if self.process is None:
            return False
        try:
            socket.create_connection((self.host, self.port), timeout=0.5).close()
        except OSError:
            return False
        return True


@dataclass
class HostedRedisKit(RedisKit):
    """The chaos suite's Redis kit, its server on the store host (the event log stays in PostgreSQL)."""

    host: Host | None = None

    def __post_init__(self) -> None:
        assert self.host is not None
        self.server = HostedRedis(self.host, Path(tempfile.mkdtemp(prefix="leaseboard-netsplit-redis-")))
        self.server.start()


@dataclass
class HostedBlobKit(BlobKit):
    """The chaos suite's Blob kit, Azurite on the store host."""

    host: Host | None = None

    def __post_init__(self) -> None:
        assert self.host is not None
        self.azurite = HostedAzurite(self.host, Path(tempfile.mkdtemp(prefix="leaseboard-netsplit-azurite-")))
        self.azurite.start()


def make_kit(store: str, host: Host, cluster: Postgres, database_url: str) -> Any:
    """The kit of ``store`` with its server on ``host`` (PostgreSQL already runs there)."""
    if store == "postgresql":
        return SqlKit(cluster, database_url)
    if store == "redis":
        return HostedRedisKit(database_url, host=host)
    return HostedBlobKit(database_url, host=host)


@dataclass
class Hub:
    process: subprocess.Popen[str]
    connection_string: str
    namespace: str  # what the workers name in --namespace: the hub host's address and port


def start_hub(host: Host, root: Path, partitions: int, env: dict[str, str]) -> Hub:
    """``runhub`` on the hub host, serving ``root/hub`` (where the observer appends events)."""
    command = [
        *manage(
            "runhub", "--host", host.address, "--port", str(AMQP_PORT), "--hub", HUB, "--partitions", str(partitions)
        )
    ]
    process = host.popen(
        command,
        cwd=ROOT,
        env={**env, "LEASEBOARD_LOG_LEVEL": "WARNING"},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert process.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = process.stdout.readline().decode(errors="replace")
        found = re.match(r"EVENTHUB_CONNECTION_STRING=(\S+)", line)
        if found:
            return Hub(process, found.group(1), f"{host.address}:{AMQP_PORT}")  # type: ignore[arg-type]
        if process.poll() is not None:
            break
    raise RuntimeError(f"runhub did not print its connection string on {host.name}")


class HostedConsole(Console):
    """The chaos suite's console (Daphne, polled by the observer) on the console host."""

    host: Host | None = None

    def state(self) -> dict[str, Any] | None:
        """``/api/state`` of the fleet's hub, or None when it does not answer 200."""
        try:
            with urllib.request.urlopen(f"{self.url}/api/state?hub={self.ref.hub}", timeout=self.timeout) as answer:
                found: dict[str, Any] = json.loads(answer.read())
                return found
        except (OSError, ValueError):
            return None

    @property
    def url(self) -> str:
        assert self.host is not None
        return f"http://{self.host.address}:{CONSOLE_PORT}"

    def start(self) -> None:
        assert self.host is not None
        env = {
            **self.env,
            "LEASEBOARD_NAMESPACE": self.ref.namespace,
            "LEASEBOARD_HUB": self.ref.hub,
            "LEASEBOARD_CONSUMER_GROUP": self.ref.consumer_group,
            "DJANGO_ALLOWED_HOSTS": self.host.address,
        }
        command = [
            IP,
            "netns",
            "exec",
            self.host.namespace,
            sys.executable,
            "-m",
            "daphne",
            "-b",
            self.host.address,
            "-p",
            str(CONSOLE_PORT),
            "dashboard.asgi:application",
        ]
        self.process = start_logged(self.log, command, env)


@dataclass
class NetFleet(Fleet):
    """``Fleet`` with a worker per worker host, each reading the hub over AMQP (``hub_server``,
    started once the fleet has made the hub's files)."""

    net: Network | None = None
    hub_server: Hub | None = None
    console: HostedConsole | None = None
    placed: dict[str, str] = field(default_factory=dict)  # worker name -> host name

    def __post_init__(self) -> None:
        assert self.net is not None
        self.ref = HubRef(f"{self.net['hub'].address}:{AMQP_PORT}", HUB, "$Default")
        self.hub = EmbeddedHub(self.root / "hub", HUB, partitions=self.partitions)
        self.env = worker_env(
            self.root,
            **self.kit.env(),
            LEASEBOARD_DEADLETTER_DIR=str(self.root / "deadletter"),
            LEASEBOARD_LOG_LEVELS=LOG_LEVELS,  # every cycle: what recovery is judged by
        )
        self.env.pop("LEASEBOARD_CLOCK_SKEW", None)
        # A request sent into a cut is given up within an expiry (production: 10 s for a 30 s expiry).
        self.env["LEASEBOARD_DB_TCP_TIMEOUT"] = str(self.expiry * 2 / 3)
        self.env["LEASEBOARD_BLOB_TIMEOUT"] = str(self.expiry * 2 / 3)  # the same for a Blob request
        # A worker the hub stops answering hands its partitions over after this (production: 30 s for a
        # 30 s expiry; here the hub cut's partitions are read again elsewhere within 5 s of the cut).
        self.env["LEASEBOARD_READER_STUCK"] = str(READER_STUCK)
        self._write = threading.Lock()
        self._counter = 0
        self._producing = threading.Event()
        self._producer = None

    @property
    def landing(self) -> Path:
        """Where the workers land (``LEASEBOARD_LANDING_DIR``'s default under their var folder)."""
        return self.root / "var" / "landing"

    def send(self, pid: str, malformed: bool) -> None:
        """The chaos producer's event, as a sensor reading (what the landing lands) unless ``malformed``."""
        if malformed:
            super().send(pid, malformed)
            return
        with self._write:
            self._counter += 1
            body = SensorEvent(f"n{self._counter}", f"home-{pid}", "door", "door-1", "opened", False, time.time())
            event = self.hub.send(body.to_json(), partition_id=pid)
            events = self.produced.setdefault(pid, [])
            assert event.sequence_number == len(events), f"partition {pid}: another writer on the hub?"
            events.append((time.monotonic(), malformed))

    def host_of(self, owner: str) -> str:
        """The host a worker (owner id ``name-0``) runs on."""
        return self.placed[owner.removesuffix("-0")]

    def start(self, name: str, skew: float = 0.0) -> Worker:
        assert self.net is not None and self.hub_server is not None
        taken = {self.placed[w.name] for w in self.workers.values() if w.running}
        host = next(h for h in WORKER_HOSTS if h not in taken)
        command = [
            IP,
            "netns",
            "exec",
            self.net[host].namespace,
            *manage(
                "runworkers",
                "--count",
                "1",
                "--owner-prefix",
                name,
                "--store",
                self.kit.store,
                "--source",
                "eventhubs",
                "--hub",
                HUB,
                "--namespace",
                self.hub_server.namespace,
                "--interval",
                str(self.interval),
                "--expiry",
                str(self.expiry),
                "--handler",
                "tests.netsplit.landing.LandingRecorder",
                "--checkpoint-events",
                "50",
                "--checkpoint-seconds",
                "1",
                "--shutdown-timeout",
                "5",
            ),
        ]
        env = {**self.env, "EVENTHUB_CONNECTION_STRING": self.hub_server.connection_string}
        if skew:
            env["LEASEBOARD_CLOCK_SKEW"] = str(skew)
        log = self.root / f"{name}.log"
        process = start_logged(log, command, env)
        worker = Worker(name, process, log, time.monotonic(), skew)
        self.workers[name] = worker
        self.placed[name] = host
        return worker


def postgres_user_exists() -> bool:
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return False
    return postgres_bin_dir().exists()
