"""A real Spark standalone cluster on loopback: a master and workers as separate JVM processes.

Started with nothing but the ``pyspark`` package (its ``bin/spark-class``, ``SPARK_HOME`` = the
package folder), as ``/work/shared/ENVIRONMENT.md`` and the manual's pipeline page (docs/pipeline.md) say: each
process on free ports, in its own process group (one id stops the JVM and the executors a worker
forked), each worker's application folders in ``SPARK_WORKER_DIR`` under the cluster's temporary
home (not inside the virtual environment), ``PYSPARK_PYTHON`` = this Python.

``spark_cluster(home, workers=2)`` yields a running ``Cluster`` and stops every process on the way
out, also when the test failed. ``Cluster.url`` is the ``spark://`` master URL; ``workers[i].kill()``
is a node dying (SIGKILL to its group), ``start()`` brings it back on the same ports. Readiness is
the master's own JSON status (``/json/``): a worker is ready once the master lists it ALIVE.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import urllib.request
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from tests.support.servers import HOST, ServerProcess, free_port, listens

SPARK_CLASS_MASTER = "org.apache.spark.deploy.master.Master"
SPARK_CLASS_WORKER = "org.apache.spark.deploy.worker.Worker"


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def spark_env(home: Path) -> dict[str, str]:
    """The environment of every process of a loopback cluster (and of a driver that joins it)."""
    # Every JVM of the cluster (its daemons and the executors the worker starts, which inherit its
    # environment): C1 only in the suite, as its drivers (tests/conftest.py: SPARK_TEST_JAVA_OPTIONS).
    java = os.environ.get("SPARK_SUBMIT_OPTS")
    jvms = {"JAVA_TOOL_OPTIONS": java} if java else {}
    return {
        **os.environ,
        **jvms,
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": HOST,
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOG_DIR": str(home / "logs"),
        # Block managers' and shuffles' scratch folders (Spark's default: /tmp), here so that a process
        # the tests kill on purpose leaves nothing behind in /tmp
        "SPARK_LOCAL_DIRS": str(home / "local"),
        "SPARK_NO_DAEMONIZE": "1",
    }


class SparkMaster(ServerProcess):
    name = "spark master"
    in_use: ClassVar[str] = "BindException"

    def __init__(self, port: int, home: Path, webui_port: int) -> None:
        super().__init__(port, home)
        self.webui_port = webui_port

    def command(self) -> list[str]:
        return [
            str(spark_home() / "bin" / "spark-class"),
            SPARK_CLASS_MASTER,
            "--host",
            HOST,
            "--port",
            str(self.port),
            "--webui-port",
            str(self.webui_port),
        ]

    def popen_options(self) -> dict[str, Any]:
        return {"env": spark_env(self.home), "cwd": self.home}

    def ready(self) -> bool:
        return super().ready() and self.status() is not None

    def status(self) -> dict[str, Any] | None:
        """The master's JSON status (workers, applications), None if it does not answer."""
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.webui_port}/json/", timeout=2) as reply:
                return dict(json.load(reply))
        except (OSError, ValueError):
            return None


class SparkWorker(ServerProcess):
    name = "spark worker"
    in_use: ClassVar[str] = "BindException"

    def __init__(self, port: int, home: Path, webui_port: int, master: SparkMaster, cores: int = 1) -> None:
        super().__init__(port, home)
        self.webui_port, self.master, self.cores = webui_port, master, cores

    @property
    def url(self) -> str:
        return f"spark://{HOST}:{self.master.port}"

    def command(self) -> list[str]:
        return [
            str(spark_home() / "bin" / "spark-class"),
            SPARK_CLASS_WORKER,
            "--host",
            HOST,
            "--port",
            str(self.port),
            "--webui-port",
            str(self.webui_port),
            "--cores",
            str(self.cores),
            "--memory",
            "1g",
            self.url,
        ]

    def popen_options(self) -> dict[str, Any]:
        (self.home / "work").mkdir(parents=True, exist_ok=True)
        return {"env": {**spark_env(self.home), "SPARK_WORKER_DIR": str(self.home / "work")}, "cwd": self.home}

    def ready(self) -> bool:
        return self.process is not None and listens(self.process.pid, self.port) and self.alive_on_master()

    def alive_on_master(self) -> bool:
        status = self.master.status() or {}
        return any(w.get("port") == self.port and w.get("state") == "ALIVE" for w in status.get("workers", []))

    def executors(self) -> int:
        """Executor processes this worker runs now (its children, by their application folders' logs)."""
        work = self.home / "work"
        return sum(1 for _ in work.glob("app-*/*/stderr")) if work.is_dir() else 0


@dataclass
class Cluster:
    master: SparkMaster
    workers: list[SparkWorker]
    starting: Future[None] | None = None  # the start in the background (``spark_cluster(wait=False)``)

    def ready(self) -> None:
        """Return once every process is up (raises what starting them raised)."""
        if self.starting is not None:
            self.starting.result()

    @property
    def url(self) -> str:
        return f"spark://{HOST}:{self.master.port}"

    @property
    def env(self) -> dict[str, str]:
        """What a driver process on this machine needs to join the cluster (its scratch folders beside
        the cluster's, not in /tmp: the tests kill drivers)."""
        return {
            "SPARK_LOCAL_IP": HOST,
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOCAL_DIRS": str(self.master.home / "driver-local"),
        }

    def logs(self) -> str:
        parts = []
        for server in (self.master, *self.workers):
            parts.append(f"--- {server}\n{server.log_path.read_text(errors='replace')[-2000:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        if self.starting is not None:
            with contextlib.suppress(Exception):
                self.starting.result()  # no process may start after the stop
        for server in (*self.workers, self.master):
            with contextlib.suppress(Exception):
                server.kill()  # nothing of a test cluster needs a clean stop
        for server in (*self.workers, self.master):
            server.remove()


def _start(server: ServerProcess, timeout: float) -> None:
    server.home.mkdir(parents=True, exist_ok=True)
    server.start(timeout)


def _start_all(cluster: Cluster, timeout: float) -> None:
    _start(cluster.master, timeout)
    with ThreadPoolExecutor(len(cluster.workers)) as pool:  # the workers' JVMs start in parallel
        for started in [pool.submit(_start, worker, timeout) for worker in cluster.workers]:
            started.result()


@contextlib.contextmanager
def spark_cluster(home: Path, workers: int = 2, timeout: float = 90.0, *, wait: bool = True) -> Iterator[Cluster]:
    """A master and ``workers`` one-core workers under ``home``, running; all stopped on the way out.
    With ``wait=False`` they start in the background meanwhile: ``Cluster.ready()`` waits for them."""
    master = SparkMaster(free_port(), home / "master", free_port())
    cluster = Cluster(
        master, [SparkWorker(free_port(), home / f"worker-{n}", free_port(), master) for n in range(workers)]
    )
    with ThreadPoolExecutor(1) as background:
        try:
            cluster.starting = background.submit(_start_all, cluster, timeout)
            if wait:
                cluster.ready()
            yield cluster
        finally:
            cluster.stop()
