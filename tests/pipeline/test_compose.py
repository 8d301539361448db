"""docker-compose.yml's Spark services run what the cluster tests run (``tests.support.spark_cluster``)."""

from __future__ import annotations

import itertools
from pathlib import Path

import yaml

from tests.support.spark_cluster import SPARK_CLASS_MASTER, SPARK_CLASS_WORKER, SparkMaster, SparkWorker

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


def options(command: list[str]) -> dict[str, str]:
    return {a: b for a, b in itertools.pairwise(command) if a.startswith("--")}


def test_compose_starts_the_spark_master_and_two_workers_with_the_tests_settings(tmp_path: Path) -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    master = SparkMaster(7077, tmp_path, 8080)
    worker = SparkWorker(7078, tmp_path, 8081, master)
    assert services["spark-master"]["command"][1] == SPARK_CLASS_MASTER
    assert services["spark-worker"]["command"][1] == SPARK_CLASS_WORKER
    for service in ("spark-master", "spark-worker"):
        spark_home = services[service]["environment"]["SPARK_HOME"]
        assert services[service]["command"][0] == f"{spark_home}/bin/spark-class"  # the pyspark package's own
        assert "SPARK_WORKER_DIR" in services[service]["environment"]
    ours, theirs = options(worker.command()), options(services["spark-worker"]["command"])
    assert {k: ours[k] for k in ("--cores", "--memory")} == {k: theirs[k] for k in ("--cores", "--memory")}
    assert services["spark-worker"]["deploy"]["replicas"] == 2
    pipeline = services["pipeline"]
    assert pipeline["command"][-2:] == ["--master", "spark://spark-master:7077"]
    # The landing, the checkpoint and the results on the one volume every node mounts at the same path.
    shared = "pipeline-data:/data/pipeline-data"
    env = pipeline["environment"]
    assert env["LEASEBOARD_LANDING_DIR"].startswith("/data/pipeline-data/")
    assert env["LEASEBOARD_PIPELINE_DIR"].startswith("/data/pipeline-data/")
    for service in ("workers", "spark-worker", "pipeline"):
        assert shared in services[service]["volumes"], service
