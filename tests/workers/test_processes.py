"""End to end: real ``manage.py runworkers`` processes sharing one SQLite store and one embedded hub.

Each process records what it handled (``tests.workers.recording``); the test reads the store
through ``SqlStore`` on the same file, samples checkpoints while the workers run, and kills or
stops a process. Waiting is polling with a deadline.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import threading
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pytest

from balancer.model import HubRef
from tests.support.processes import SqlSite, manage, sql_site_fixtures

pytestmark = pytest.mark.slow

PARTITIONS = 8
REF = HubRef("localhost", "e2e", "$Default")


@dataclass
class Site(SqlSite):
    """A private database file, hub and record directory, and the processes started on them."""

    samples: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))

    def start(self, prefix: str, *, interval: float = 0.5, expiry: float = 3.0) -> subprocess.Popen[bytes]:
        command = manage(
            "runworkers",
            "--count",
            "1",
            "--owner-prefix",
            prefix,
            "--store",
            "sql",
            "--source",
            "embedded",
            "--hub",
            REF.hub,
            "--interval",
            str(interval),
            "--expiry",
            str(expiry),
            "--handler",
            "tests.workers.recording.RecordingHandler",
            "--checkpoint-events",
            "50",
            "--checkpoint-seconds",
            "1",
            "--shutdown-timeout",
            "5",
        )
        return self.spawn(prefix, command, self.env)

    async def sample(self) -> None:
        """Record every partition's checkpoint every 20 ms, until cancelled."""
        while True:
            for pid, sequence in (await self.checkpoints()).items():
                self.samples[pid].append(sequence)
            await asyncio.sleep(0.02)


environment, site = sql_site_fixtures(Site, REF, partitions=PARTITIONS)


def start_producing(site: Site) -> tuple[threading.Event, threading.Thread]:
    """A thread writing one event to every partition every 20 ms until the returned event is set."""
    stop = threading.Event()

    def produce() -> None:
        while not stop.wait(0.02):
            for pid in site.hub.partition_ids():
                site.hub.send(b'{"e2e": true}', partition_id=pid)

    thread = threading.Thread(target=produce, name="e2e-producer", daemon=True)
    thread.start()
    return stop, thread


def by_partition(records: list[tuple[str, int, str]], owner: str) -> dict[str, list[int]]:
    out: dict[str, list[int]] = defaultdict(list)
    for pid, sequence, who in records:
        if who == owner:
            out[pid].append(sequence)
    return out


async def balanced(site: Site, owners: set[str]) -> bool:
    held = await site.owners()
    counts = [list(held.values()).count(o) for o in owners]
    return len(held) == PARTITIONS and set(held.values()) == owners and max(counts) - min(counts) <= 1


def runs(sequences: list[int]) -> list[range]:
    """``sequences`` cut into ascending contiguous runs (a new run wherever one number is not the next)."""
    out: list[range] = []
    for sequence in sequences:
        if out and sequence == out[-1].stop:
            out[-1] = range(out[-1].start, sequence + 1)
        else:
            out.append(range(sequence, sequence + 1))
    return out


async def test_a_killed_worker_s_partitions_are_taken_over_after_expiry_and_no_event_is_skipped(site: Site) -> None:
    for pid in site.hub.partition_ids():
        site.hub.send_batch([b"{}"] * 20, partition_id=pid)
    site.start("A")
    site.start("B")
    await site.until(lambda: balanced(site, {"A-0", "B-0"}), 30, "A and B to share the partitions")
    sampler = asyncio.create_task(site.sample())
    stop, thread = start_producing(site)
    try:
        a_partitions = {p for p, o in (await site.owners()).items() if o == "A-0"}

        async def a_checkpointed() -> bool:  # A has handled and checkpointed on each of its partitions
            points = await site.checkpoints()
            return all(points.get(p, -1) >= 20 for p in a_partitions)

        await site.until(a_checkpointed, 30, "A to checkpoint past the first events")
        site.processes["A"].send_signal(signal.SIGKILL)
        site.processes["A"].wait(10)
        killed = time.monotonic()

        async def b_owns_all() -> bool:
            return set((await site.owners()).values()) == {"B-0"}

        await site.until(b_owns_all, 30, "B to own every partition")
        takeover = time.monotonic() - killed
    finally:
        stop.set()
        thread.join(5)
    last = site.last()
    await site.until(lambda: _caught_up(site, last), 30, "B to handle everything produced")
    sampler.cancel()
    site.processes["B"].send_signal(signal.SIGTERM)
    assert site.processes["B"].wait(20) == 0

    # B could not take A's partitions before their leases expired: 3 s after A's last renewal, which
    # was at most half the expiry and one late interval before the kill (a lease is renewed once half
    # the expiry has passed).
    assert takeover >= 3.0 - (3.0 / 2 + 0.5 * 1.1), takeover
    for pid, seen in site.samples.items():
        assert seen == sorted(seen), f"checkpoint of partition {pid} went backwards: {seen}"

    records = site.records()
    by_a, by_b = by_partition(records, "A-0"), by_partition(records, "B-0")
    for pid, final in last.items():
        a, b = by_a.get(pid, []), by_b.get(pid, [])
        assert sorted(set(a) | set(b)) == list(range(final + 1)), f"partition {pid}: an event was skipped"
        twice = sorted(s for s in set(a) & set(b))
        assert len(a) == len(set(a)) and len(b) == len(set(b)), f"partition {pid}: a worker repeated itself"
        if pid not in a_partitions:
            assert twice == [], f"partition {pid} moved only by planned handoffs, yet {twice} came twice"
            continue
        # B's last run began right after a checkpoint A wrote (c); only A's events after c came twice.
        tail = runs(b)[-1]
        checkpoint = tail.start - 1
        assert tail.stop == final + 1 and checkpoint >= 20
        assert checkpoint in site.samples[pid], f"partition {pid}: B did not resume at a checkpoint A wrote"
        assert twice == list(range(checkpoint + 1, max(a) + 1)), f"partition {pid}: {twice} came twice"


async def _caught_up(site: Site, last: dict[str, int]) -> bool:
    return await site.checkpoints() == last


async def test_a_terminated_worker_releases_its_partitions_at_once_after_a_final_checkpoint(site: Site) -> None:
    for pid in site.hub.partition_ids():
        site.hub.send_batch([b"{}"] * 30, partition_id=pid)
    expiry = 20.0
    site.start("A", expiry=expiry)
    site.start("B", expiry=expiry)
    await site.until(lambda: balanced(site, {"A-0", "B-0"}), 30, "A and B to share the partitions")
    a_partitions = {p for p, o in (await site.owners()).items() if o == "A-0"}
    await site.until(lambda: _caught_up(site, site.last()), 30, "every event to be handled")

    stop, thread = start_producing(site)  # A is stopped while events keep coming
    try:
        started = time.monotonic()
        site.processes["A"].send_signal(signal.SIGTERM)
        assert site.processes["A"].wait(15) == 0
        stopped = time.monotonic() - started
        held = await site.owners()
        assert all(held[p] in ("", "B-0") for p in a_partitions), held  # released, not left to expire

        async def b_owns_all() -> bool:
            return set((await site.owners()).values()) == {"B-0"}

        await site.until(b_owns_all, expiry, "B to take A's partitions")
        takeover = time.monotonic() - started
    finally:
        stop.set()
        thread.join(5)
    assert takeover < expiry / 4, f"took {takeover:.1f}s: about as slow as waiting for expiry ({expiry}s)"
    assert stopped < 10

    last = site.last()
    await site.until(lambda: _caught_up(site, last), 30, "B to handle every event")
    site.processes["B"].send_signal(signal.SIGTERM)
    assert site.processes["B"].wait(20) == 0
    records = site.records()
    for pid, final in last.items():  # the final checkpoint came before the release: nothing twice
        assert sorted(s for p, s, _ in records if p == pid) == list(range(final + 1)), pid
    assert final > 30, "no events arrived while A stopped: the test proved nothing"
    assert "SIGTERM: stopping 1 worker(s)" in site.log("A")


def _default_sigint() -> None:
    # A child of a backgrounded shell inherits SIGINT ignored; the test sends Ctrl-C as a user would.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def test_serve_runs_dashboard_workers_and_producer_in_one_process_and_ctrl_c_releases(site: Site) -> None:
    command = manage(
        "serve",
        "--port",
        "0",
        "--workers",
        "2",
        "--produce",
        "200",
        "--no-pipeline",
        "--hub",
        REF.hub,
        "--store",
        "sql",
        "--interval",
        "0.5",
        "--expiry",
        "3",
    )
    process = site.spawn("serve", command, site.env, pipe_stdout=True, preexec_fn=_default_sigint)
    assert process.stdout is not None
    banner = (await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), 30)).decode()
    assert banner.startswith("Leaseboard is serving at http://127.0.0.1:"), banner
    url = banner.split()[4]

    async def everything_owned_and_handled() -> bool:
        owners, points = await site.owners(), await site.checkpoints()
        shared = len(owners) == PARTITIONS and "" not in owners.values() and len(set(owners.values())) == 2
        return shared and len(points) == PARTITIONS and min(points.values()) >= 2

    await site.until(everything_owned_and_handled, 30, "the embedded workers to own and handle every partition")
    state = await asyncio.to_thread(_get_json, f"{url}api/state?hub={REF.hub}")
    assert {p["id"] for p in state["partitions"]} == {str(i) for i in range(PARTITIONS)}
    assert {p["owner"] for p in state["partitions"]} == set((await site.owners()).values())

    process.send_signal(signal.SIGINT)
    assert await asyncio.to_thread(process.wait, 30) == 0
    assert set((await site.owners()).values()) == {""}  # every partition released on the way out
    assert b"Leaseboard stopped." in process.stdout.read()


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        return json.load(response)
