"""A batch's staged Parquet writes (``workers/pipeline/staged.py``): in place only once published,
nothing left behind when discarded or failed, a replay's results replacing the first attempt's whole."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from workers.pipeline.staged import STAGING, StagedWrites, clear_staging

KINDS = ("aggregates", "alerts")


def writer(
    content: str, started: threading.Event | None = None, release: threading.Event | None = None
) -> Callable[[str, str], None]:
    """A write that puts one file naming its kind and ``content``, after ``release`` if given."""

    def write(kind: str, folder: str) -> None:
        if started is not None:
            started.set()
        if release is not None:
            assert release.wait(10), "never released"
        Path(folder).mkdir(parents=True)
        (Path(folder) / "part-0.parquet").write_text(f"{kind} {content}")

    return write


def test_the_writes_run_in_the_background_and_appear_only_when_published(tmp_path: Path) -> None:
    started, release = threading.Event(), threading.Event()
    writes = StagedWrites(tmp_path, 3, KINDS, writer("first", started, release))
    writes.start()
    assert started.wait(10), "the writes did not start in the background"
    assert not (tmp_path / "aggregates").exists()  # the caller goes on (the summary's commit) meanwhile
    release.set()
    writes.publish()
    for kind in KINDS:
        assert (tmp_path / kind / "batch_id=3" / "part-0.parquet").read_text() == f"{kind} first"
    assert list((tmp_path / STAGING).iterdir()) == []


def test_a_replay_replaces_the_first_attempts_results_whole(tmp_path: Path) -> None:
    StagedWrites(tmp_path, 5, KINDS, writer("first")).publish()  # publish starts them if nobody did
    (tmp_path / "alerts" / "batch_id=5" / "part-1.parquet").write_text("left by a half-done try")
    StagedWrites(tmp_path, 5, KINDS, writer("again")).publish()
    for kind in KINDS:
        folder = tmp_path / kind / "batch_id=5"
        assert sorted(p.name for p in folder.iterdir()) == ["part-0.parquet"]
        assert (folder / "part-0.parquet").read_text() == f"{kind} again"


def test_a_discarded_batch_leaves_nothing_and_waits_for_its_writes(tmp_path: Path) -> None:
    release = threading.Event()
    writes = StagedWrites(tmp_path, 7, KINDS, writer("not committed", release=release))
    writes.start()
    threading.Timer(0.2, release.set).start()
    writes.discard()  # returns only once both writes are done: no Spark job outlives its batch
    assert release.is_set()
    assert not (tmp_path / "aggregates").exists() and not (tmp_path / "alerts").exists()
    assert list((tmp_path / STAGING).iterdir()) == []


def test_a_failed_write_is_raised_by_publish_and_nothing_moves(tmp_path: Path) -> None:
    def write(kind: str, folder: str) -> None:
        if kind == "alerts":
            raise OSError("disk full")
        writer("half")(kind, folder)

    with pytest.raises(OSError, match="disk full"):
        StagedWrites(tmp_path, 9, KINDS, write).publish()
    assert not (tmp_path / "aggregates" / "batch_id=9").exists()
    assert list((tmp_path / STAGING).iterdir()) == []


def test_what_a_stopped_run_left_in_staging_is_cleared(tmp_path: Path) -> None:
    left = tmp_path / STAGING / "batch_id=2-abc" / "aggregates"
    left.mkdir(parents=True)
    (tmp_path / "aggregates" / "batch_id=1").mkdir(parents=True)
    clear_staging(tmp_path)
    assert not (tmp_path / STAGING).exists()
    assert (tmp_path / "aggregates" / "batch_id=1").is_dir()
