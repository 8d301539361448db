"""Replay in place with real processes: a ``runworkers`` on the SQL store and the embedded hub sets a
broken event aside; the handler is fixed; ``manage.py replayinplace`` (the console's action, as a
command) asks the owner, whose pump hands the dead letter to its handler again, with the property
naming where it was, without moving the checkpoint; the page's API shows it replayed in place."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from balancer.model import HubRef
from tests.support.processes import ROOT, SqlSite, manage, sql_site_fixtures
from workers.deadletter import files

pytestmark = pytest.mark.slow

PARTITIONS = 2
REF = HubRef("localhost", "inplace", "$Default")

environment, site = sql_site_fixtures(SqlSite, REF, partitions=PARTITIONS)


def folder(site: SqlSite) -> Path:
    return files.folder_of(site.root / "var" / "deadletter", REF.hub)


def replays(site: SqlSite) -> list[str]:
    return [line for p in sorted((site.root / "records").glob("*.replays")) for line in p.read_text().splitlines()]


async def checkpoint(site: SqlSite) -> bool:
    return (await site.checkpoints()).get("0") == 2


def marked(site: SqlSite) -> dict[int, files.Entry] | None:
    marks = files.read_markers(folder(site), "0", REF.consumer_group)
    return marks if marks.get(1, {}).get("to") not in (None, "in place (pending)") else None


async def test_a_dead_letter_replayed_in_place_reaches_the_fixed_handler_of_the_real_owner(site: SqlSite) -> None:
    site.hub.send_batch([b"ok", b"broken", b"ok"], partition_id="0")
    command = manage(
        *("runworkers", "--owner-prefix", "R", "--store", "sql", "--source", "embedded", "--hub", REF.hub),
        *("--interval", "0.5", "--expiry", "3", "--handler", "tests.workers.recording.FixableHandler"),
    )
    site.spawn("R", command, {**site.env, "LEASEBOARD_CHECKPOINT_EVENTS": "1"})
    await site.until(lambda: sorted(files.read_letters(folder(site), "0", "$Default")) == [1], 60, "it set aside")
    await site.until(lambda: checkpoint(site), 30, "the checkpoint past it")
    (site.root / "records" / "fixed").touch()

    asked = subprocess.run(
        manage("replayinplace", "0", "all", "--hub", REF.hub, "--reason", "handler fixed", "--yes"),
        cwd=ROOT,
        env=site.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert asked.returncode == 0, asked.stderr
    assert "asked R" in asked.stdout and "to hand 1 dead letter of partition 0 to its handler in place" in asked.stdout
    await site.until(lambda: replays(site), 30, "the handler to get the dead letter again")

    (replay,) = replays(site)
    assert replay.startswith("0:1,1,R")  # where it was, its own sequence number, the owner
    marks = await site.until(lambda: marked(site), 10, "its mark")
    assert marks[1]["to"].startswith("in place by R") and marks[1]["user"]
    assert list((folder(site) / "inplace").iterdir()) == []  # the request is done
    assert (await site.checkpoints())["0"] == 2  # unmoved
