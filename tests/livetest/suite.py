"""Microsoft's azure-eventhub live tests, run against ``manage.py runhub``: fetch, assemble, serve, run, count.

The source distribution of the installed azure-eventhub is fetched from the package index by pip
at test time and cached (never committed); its ``tests/livetest`` folders and ``tracing_common.py``
are copied into a run folder beside our fixture layer (``microsoft_conftest.py`` as ``conftest.py``),
and pytest runs them there in a child process, spread over several pytest-xdist workers that share
one ``runhub`` (each test on a fresh hub of its own).

``runhub`` serves TLS as Azure does, on port 5671: the SDK connects to no other port with TLS. So
that runs (and other programs) on this machine do not collide on 5671, each runhub takes a loopback
address of its own (``127.x.y.z``: all of 127/8 is the loopback interface) and a certificate made
at test time for that address by a CA made at test time.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

import certifi

from tests.amqp.certs import Certificates, make_certificates
from tests.livetest.schedule import LONG
from tests.support.waiting import until_sync

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "azure-eventhub"
HERE = Path(__file__).resolve().parent
PYTEST_INI = """\
[pytest]
asyncio_default_fixture_loop_scope = function
timeout = 600
addopts = -p no:django -p no:cacheprovider -p no:randomly
"""


def sdist(cache: Path, pinned: str | None = None) -> Path:
    """The source distribution of ``pinned`` (default: the installed version), from the cache or,
    the first time, from the package index through pip. Raises CalledProcessError if pip fails."""
    pinned = pinned or version(PACKAGE)
    cache.mkdir(parents=True, exist_ok=True)
    name = f"{PACKAGE.replace('-', '_')}-{pinned}.tar.gz"
    if not (cache / name).is_file():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"{PACKAGE}=={pinned}",
                "-d",
                str(cache),
            ],
            check=True,
            timeout=300,
        )
    return cache / name


def assemble(archive: Path, run_dir: Path) -> Path:
    """A folder holding Microsoft's ``synctests`` and ``asynctests``, ``tracing_common.py``, our
    conftest and a pytest.ini; returns it."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    prefix = archive.name.removesuffix(".tar.gz") + "/tests/"
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if not member.isfile() or not member.name.startswith(prefix):
                continue
            relative = member.name[len(prefix) :]
            if relative.startswith("livetest/") or relative == "tracing_common.py":
                target = run_dir / relative.removeprefix("livetest/")
                target.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(member)
                assert source is not None
                target.write_bytes(source.read())
    shutil.copy(HERE / "microsoft_conftest.py", run_dir / "conftest.py")
    (run_dir / "pytest.ini").write_text(PYTEST_INI)
    return run_dir


AMQPS_PORT = 5671


@dataclass
class RunHub:
    process: subprocess.Popen[str]
    connection_string: str  # TLS, Azure's form: the SDK connects to the host's port 5671
    hub_dir: Path
    log: Path
    certificates: Certificates
    trust: Path  # certifi's bundle and the run's CA: the SDK's default trust store, for the tests


def free_loopback_address(port: int = AMQPS_PORT, attempts: int = 50) -> str:
    """A loopback address (127.x.y.z, not 127.0.0.1) where ``port`` can be bound now. Raises OSError."""
    for _ in range(attempts):
        address = f"127.{random.randint(2, 254)}.{random.randint(0, 255)}.{random.randint(1, 254)}"
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio binds
            try:
                probe.bind((address, port))
            except OSError:
                continue
            return address
    raise OSError(f"no loopback address with port {port} free in {attempts} tries")


@contextmanager
def runhub(root: Path) -> Iterator[RunHub]:
    """``manage.py runhub`` serving TLS on port 5671 of a loopback address of its own (with a plain
    port beside it, unused by the suite), its var, hub and certificate folders under ``root``."""
    for attempt in range(5):
        hub = _start_runhub(root)
        try:
            hub.connection_string = _tls_connection_string(hub)
        except AssertionError:
            _stop(hub.process)
            if "cannot listen" in hub.log.read_text() and attempt < 4:
                continue  # another program took that address's port 5671 after the probe: another address
            raise
        try:
            yield hub
        finally:
            _stop(hub.process)
        return


def _start_runhub(root: Path) -> RunHub:
    var, hub_dir, log, tls = root / "var", root / "hub", root / "runhub.log", root / "tls"
    var.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "LEASEBOARD_VAR_DIR": str(var), "LEASEBOARD_HUB_DIR": str(hub_dir), "PYTHONUNBUFFERED": "1"}
    for name in ("LEASEBOARD_HUB_KEY", "LEASEBOARD_HUB_TLS_CERT", "LEASEBOARD_HUB_TLS_KEY"):
        env.pop(name, None)
    address = free_loopback_address()
    certificates = make_certificates(tls, (address, "localhost"))
    trust = tls / "trust.pem"
    trust.write_text(Path(certifi.where()).read_text() + "\n" + certificates.ca.read_text())
    command = [
        sys.executable,
        "manage.py",
        "runhub",
        "--host",
        address,
        "--port",
        "0",
        "--hub",
        "livetest",
        "--partitions",
        "2",
        "--tls-port",
        str(AMQPS_PORT),
        "--tls-cert",
        str(certificates.cert),
        "--tls-key",
        str(certificates.key),
    ]
    with log.open("w") as err:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    return RunHub(process, "", hub_dir, log, certificates, trust)


def _tls_connection_string(hub: RunHub) -> str:
    """What runhub prints as its TLS connection string; AssertionError if it exits first."""

    def printed() -> str | None:
        assert hub.process.stdout is not None
        line = hub.process.stdout.readline()
        if hub.process.poll() is not None:
            raise AssertionError(f"runhub exited with {hub.process.returncode}: {hub.log.read_text()}")
        found = re.match(r"EVENTHUB_TLS_CONNECTION_STRING=(\S+)", line)
        return found.group(1) if found else None

    return str(until_sync(printed, "runhub's TLS connection string", 60))


def _stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(15)


@dataclass
class Outcome:
    """What one run of the suite gave."""

    collected: int
    not_applicable: list[str]
    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    times: dict[str, tuple[float, float]] = field(default_factory=dict)  # nodeid: (start, end) from the run's start

    def timing(self, slowest: int = 5) -> str:
        """Where the time went: when the first test started and the last ended, the slowest tests."""
        if not self.times:
            return "no test timings"
        first = min(start for start, _ in self.times.values())
        last = max(end for _, end in self.times.values())
        ranked = sorted(self.times.items(), key=lambda kv: kv[1][0] - kv[1][1])[:slowest]
        tests = ", ".join(f"{nodeid.rsplit('::', 1)[-1]} {end - start:.0f} s" for nodeid, (start, end) in ranked)
        return f"first test started at {first:.0f} s, last ended at {last:.0f} s; slowest: {tests}"

    def summary(self, pinned: str) -> str:
        return (
            f"Microsoft's azure-eventhub {pinned} livetest against runhub: {self.collected} collected,"
            f" {len(self.not_applicable)} not applicable, {len(self.passed)} passed, {len(self.failed)} failed"
            f" ({len(self.skipped)} skipped) in {self.seconds:.0f} s"
        )


def run(
    run_dir: Path,
    hub: RunHub,
    workers: int,
    extra: list[str] | None = None,
    processes: list[subprocess.Popen[bytes]] | None = None,
) -> Outcome:
    """Runs the assembled suite against ``hub``: the tests that take minutes (``schedule.LONG``) in
    one pytest, a worker each, and the rest beside it on ``workers`` pytest-xdist workers (xdist
    queues a worker's next test behind its current one: in one run a long test would hold another
    back for minutes). Its pytest processes are added to ``processes`` (so another thread can stop
    them). Returns what happened."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(run_dir)]),
        "LIVETEST_CONNECTION_STRING": hub.connection_string,
        "LIVETEST_CA_FILE": str(hub.certificates.ca),
        "LIVETEST_TRUST_FILE": str(hub.trust),
        "LIVETEST_HUB_DIR": str(hub.hub_dir),
        "LIVETEST_DESELECTED": str(run_dir / "deselected"),
        "LIVETEST_TIMES": str(run_dir / "times"),
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    # Only the plugins the suite uses: the others installed here (hypothesis, schemathesis, the
    # database fixtures) would triple what each of the twenty-odd processes spends starting up.
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    started, started_at = time.monotonic(), time.time()
    base = [sys.executable, "-m", "pytest", str(run_dir), "-c", str(run_dir / "pytest.ini"), "--rootdir", str(run_dir)]
    base += ["-p", "xdist.plugin", "-p", "pytest_asyncio.plugin", "-p", "pytest_timeout"]
    base += ["-q", "--dist", "load", "-o", "junit_family=xunit1", *(extra or [])]
    running = processes if processes is not None else []
    for part, count in (("long", len(LONG)), ("rest", workers)):
        with (run_dir / f"pytest-{part}.log").open("w") as out:
            args = [*base, "-n", str(count), f"--junitxml={run_dir / f'junit-{part}.xml'}"]
            running.append(
                subprocess.Popen(args, cwd=run_dir, env={**env, "LIVETEST_PART": part}, stdout=out, stderr=out)
            )
    for process in running:
        try:
            process.wait(1500)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    not_applicable = sorted({n for p in run_dir.glob("deselected.*") for n in json.loads(p.read_text())})
    outcome = Outcome(0, not_applicable, seconds=time.monotonic() - started)
    for junit in sorted(run_dir.glob("junit-*.xml")):
        _count(outcome, junit)
    outcome.collected = len(outcome.passed) + len(outcome.failed) + len(outcome.skipped) + len(not_applicable)
    outcome.times = _times(run_dir, started_at)
    return outcome


def run_all(
    cache: Path, root: Path, workers: int, processes: list[subprocess.Popen[bytes]] | None = None
) -> tuple[str, Outcome]:
    """Fetches, assembles and runs the suite under ``root`` against a runhub of its own; returns the
    pinned version and what happened."""
    pinned = version(PACKAGE)
    run_dir = assemble(sdist(cache, pinned), root / "livetest")
    with runhub(root / "runhub") as hub:
        return pinned, run(run_dir, hub, workers, processes=processes)


def _times(run_dir: Path, started_at: float) -> dict[str, tuple[float, float]]:
    """Each test's start and end, in seconds from the start of the run."""
    times = {}
    for path in run_dir.glob("times.*"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            times[row["nodeid"]] = (row["start"] - started_at, row["end"] - started_at)
    return times


def _count(outcome: Outcome, junit: Path) -> None:
    for case in ET.parse(junit).getroot().iter("testcase"):
        nodeid = f"{case.get('file') or case.get('classname')}::{case.get('name')}"
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        skipped = case.find("skipped")
        if problem is not None:
            outcome.failed[nodeid] = (problem.get("message") or "")[:300]
        elif skipped is not None:
            outcome.skipped[nodeid] = skipped.get("message") or ""
        else:
            outcome.passed.append(nodeid)
