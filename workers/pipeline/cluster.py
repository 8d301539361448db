"""Which Spark master the job runs on and its executors, as the driver last saw them, for the console.

The driver (``runpipeline``) writes ``<LEASEBOARD_PIPELINE_DIR>/<hub>/cluster.json`` when its query
starts and after every batch (``describe`` + ``publish``); the console reads it (``read``) without
Spark in its own process. ``updated_at`` says how fresh it is: a stopped driver leaves the last view.
No pyspark import here: the console imports this module.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("leaseboard.pipeline")

FILE = "cluster.json"


def describe(spark: Any) -> dict[str, Any]:
    """The master, the application and its active executors (the driver's own entry marked).

    From Spark's status store (what its own UI shows): executor id, host:port, cores, running tasks."""
    context = spark.sparkContext
    executors = []
    listed = context._jsc.sc().statusStore().executorList(True).iterator()  # active ones only
    while listed.hasNext():
        item = listed.next()
        executors.append(
            {
                "id": str(item.id()),
                "host_port": str(item.hostPort()),
                "driver": str(item.id()) == "driver",
                "cores": int(item.totalCores()),
                "running_tasks": int(item.activeTasks()),
                "max_memory": int(item.maxMemory()),
            }
        )
    executors.sort(key=lambda e: (not e["driver"], e["id"]))
    return {
        "master": str(context.master),
        "app_id": str(context.applicationId),
        "app_name": str(context.appName),
        "default_parallelism": int(context.defaultParallelism),
        "executors": executors,
        "updated_at": time.time(),
    }


def publish(folder: Path, view: dict[str, Any]) -> None:
    """Write ``view`` as ``folder/cluster.json`` (atomically: the console never reads half of it)."""
    folder.mkdir(parents=True, exist_ok=True)
    temporary = folder / f".{FILE}.{os.getpid()}"
    temporary.write_text(json.dumps(view), encoding="utf-8")
    temporary.replace(folder / FILE)


def publish_quietly(folder: Path, spark: Any) -> None:
    """``publish(folder, describe(spark))``, logging instead of raising: the job never fails for the view."""
    try:
        publish(folder, describe(spark))
    except Exception as exc:  # py4j and OS errors alike
        log.warning("could not publish the cluster view to %s: %s", folder, exc)


def read(folder: Path) -> dict[str, Any] | None:
    """The last published view in ``folder``, or None."""
    try:
        view = json.loads((folder / FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return view if isinstance(view, dict) else None
