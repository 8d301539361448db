"""A database that refuses the batch figures costs the figures a while, never the pipeline.

Seen in a full run on a starved machine: ``runpipeline`` died on ``sqlite3.OperationalError: database
is locked`` while copying Spark's per-batch figures into the batch log (``PipelineJob.record_progress``
in its stop's ``finally``), and the restarted pipeline of the end-to-end test with it. No Spark here:
a query stands in with its ``recentProgress``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import OperationalError

from workers.pipeline import summary
from workers.pipeline.job import Paths, PipelineJob


def progress(batch: int) -> dict[str, Any]:
    return {"batchId": batch, "numInputRows": 10, "durationMs": {"addBatch": 5, "triggerExecution": 7}}


def test_a_locked_database_is_logged_and_the_figures_written_at_the_next_look(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    written: list[list[int]] = []
    refusals = [OperationalError("database is locked")]

    def record(query_id: str, fresh: list[dict[str, Any]], database: str) -> int:
        if refusals:
            raise refusals.pop()
        written.append([entry["batchId"] for entry in fresh])
        return len(fresh)

    monkeypatch.setattr(summary, "record_progress", record)
    job = PipelineJob(None, "hub", Paths(tmp_path / "landing", tmp_path / "checkpoint", tmp_path / "results"))  # type: ignore[arg-type]
    query = SimpleNamespace(id="q", recentProgress=[progress(0), progress(1)])
    with caplog.at_level(logging.WARNING, logger="leaseboard.pipeline"):
        assert job.record_progress(query) == 0  # type: ignore[arg-type]
    assert "batch figures not written yet (OperationalError: database is locked)" in caplog.text
    assert job.record_progress(query) == 2  # type: ignore[arg-type]
    assert written == [[0, 1]]
    assert job.record_progress(query) == 0  # type: ignore[arg-type]
    assert written == [[0, 1]]  # each batch once
