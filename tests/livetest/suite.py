"""Microsoft's azure-eventhub live tests, run against ``manage.py runhub``: fetch, assemble, serve, run, count.

The source distribution of the installed azure-eventhub is fetched from the package index by pip
at test time and cached (never committed); its ``tests/livetest`` folders and ``tracing_common.py``
are copied into a run folder beside our fixture layer (``microsoft_conftest.py`` as ``conftest.py``),
and pytest runs them there in a child process, spread over several pytest-xdist workers that share
one ``runhub`` (each test on a fresh hub of its own).
"""

from __future__ import annotations

import json
import os
import re
import shutil
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

from tests.support.waiting import until_sync

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "azure-eventhub"
HERE = Path(__file__).resolve().parent
PYTEST_INI = """\
[pytest]
asyncio_default_fixture_loop_scope = function
timeout = 300
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
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
             f"{PACKAGE}=={pinned}", "-d", str(cache)],
            check=True, timeout=300,
        )  # fmt: skip
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


@dataclass
class RunHub:
    process: subprocess.Popen[str]
    connection_string: str
    hub_dir: Path
    log: Path


@contextmanager
def runhub(root: Path) -> Iterator[RunHub]:
    """``manage.py runhub`` on a free loopback port with its var and hub folders under ``root``."""
    var, hub_dir, log = root / "var", root / "hub", root / "runhub.log"
    var.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "LEASEBOARD_VAR_DIR": str(var), "LEASEBOARD_HUB_DIR": str(hub_dir), "PYTHONUNBUFFERED": "1"}
    env.pop("LEASEBOARD_HUB_KEY", None)
    with log.open("w") as err:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "runhub", "--port", "0", "--hub", "livetest", "--partitions", "2"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, text=True,
        )  # fmt: skip
    try:

        def connection_string() -> str | None:
            assert process.stdout is not None
            line = process.stdout.readline()
            if process.poll() is not None:
                raise AssertionError(f"runhub exited with {process.returncode}: {log.read_text()}")
            found = re.match(r"EVENTHUB_CONNECTION_STRING=(\S+)", line)
            return found.group(1) if found else None

        yield RunHub(process, until_sync(connection_string, "runhub's connection string", 60), hub_dir, log)
    finally:
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

    def summary(self, pinned: str) -> str:
        return (
            f"Microsoft's azure-eventhub {pinned} livetest against runhub: {self.collected} collected,"
            f" {len(self.not_applicable)} not applicable, {len(self.passed)} passed, {len(self.failed)} failed"
            f" ({len(self.skipped)} skipped) in {self.seconds:.0f} s"
        )


def run(run_dir: Path, hub: RunHub, workers: int, extra: list[str] | None = None) -> Outcome:
    """Runs the assembled suite against ``hub``: the long-sleep tests (``LONG_SLEEPS`` of the conftest)
    in one pytest, a worker each, and the rest beside it on ``workers`` pytest-xdist workers (xdist
    hands a worker consecutive tests: in one run the long ones would queue behind each other).
    Returns what happened."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(run_dir)]),
        "LIVETEST_CONNECTION_STRING": hub.connection_string,
        "LIVETEST_HUB_DIR": str(hub.hub_dir),
        "LIVETEST_DESELECTED": str(run_dir / "deselected"),
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    started = time.monotonic()
    base = [sys.executable, "-m", "pytest", str(run_dir), "-c", str(run_dir / "pytest.ini"), "--rootdir", str(run_dir)]
    base += ["-q", "--dist", "load", "-o", "junit_family=xunit1", *(extra or [])]
    running = []
    for part, count in (("long", 2), ("rest", workers)):
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
    return outcome


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
