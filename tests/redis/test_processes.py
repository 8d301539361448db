"""001's own tests, with real ``runworkers --strategy race`` processes on a real Redis: a joining
node gets an even share within one normal lease time; one partition on three nodes never changes
node; a node killed with SIGKILL has its partitions processed elsewhere after about the maximum
lease time; and Redis restarted without persistence moves nothing.

Spans are 001's scaled down (``processes.SPANS``: 4 s normal lease time). Every test also reads
what the recording handler wrote: no event is skipped, and events are handled twice only where a
node died before its checkpoint.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from balancer.stores.redis.layout import scope
from tests.support.redis_server import RedisServer

from .processes import INTERVAL, REF, SPANS, Site, handled_by, start_producing

pytestmark = pytest.mark.slow

LEASE = SPANS["normal-lease"]
WAIT_CAP = 0.8 * SPANS["minimum-lease-grab"]


@pytest.fixture
def partitions() -> int:
    return 6


@pytest.fixture
async def site(tmp_path: Path, redis_server: RedisServer, sqlite_copy: Path, partitions: int) -> AsyncIterator[Site]:
    site = Site(tmp_path, redis_server, sqlite_copy, partitions)
    try:
        yield site
    finally:
        site.stop_all()


def race_lines(site: Site, prefixes: tuple[str, ...]) -> str:
    """What each node logged about the race, its leases and its slow cycles: why a partition moved."""
    words = ("race", "lease", "partition 0", "cycle", "claim", "lost", "release", "expire")
    out = []
    for prefix in prefixes:
        lines = [line for line in site.log(prefix).splitlines() if any(w in line for w in words)]
        out.append(f"--- {prefix}.log ({len(lines)} lines about the race)\n" + "\n".join(lines[-40:]))
    return "\n".join(out)


def woke_late(site: Site, owner: str, pid: str) -> bool:
    """Whether ``owner`` lost the race for ``pid`` because it woke later than it meant to by more than
    half a delay (``balancer.race.steps``: the margin a balanced fleet's owner has is larger, but a
    starved machine, CI's with every core taken, can wake a process that late; the loser says so)."""
    node = owner.removesuffix("-0")
    return bool(re.search(rf"{owner}: partition {pid}: lost the lease race: .*, [\d.]+s late\)", site.log(node)))


def every(site: Site, owner: str) -> dict[str, str]:
    return {p: owner for p in site.hub.partition_ids()}


async def stop_and_check_nothing_was_skipped(site: Site) -> dict[str, dict[int, list[str]]]:
    """Let the workers catch up, stop them, and check every event was handled (none skipped)."""
    last = site.last()

    def caught_up() -> bool:
        done = handled_by(site.records())
        return all(set(range(final + 1)) <= set(done.get(pid, {})) for pid, final in last.items())

    await site.until(caught_up, 30, "every event to be handled")
    for process in site.processes.values():
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for prefix, process in site.processes.items():
        assert process.wait(20) in (0, -signal.SIGKILL), site.log(prefix)[-3000:]
    done = handled_by(site.records())
    for pid, final in last.items():
        assert sorted(done[pid])[: final + 1] == list(range(final + 1)), f"partition {pid}: an event was skipped"
    return done


async def test_a_node_that_joins_gets_an_even_share_within_one_normal_lease_time(site: Site) -> None:
    site.start("A")
    await site.until(lambda: site.allocation() == every(site, "A-0"), 20, "A to take every partition")
    stop, thread = start_producing(site)
    try:
        site.start("B")
        await site.until(lambda: "B-0" in site.members(), 30, "B to start")  # its first cycle
        took = await site.until(
            lambda: (
                site.balanced(site.allocation(), {"A-0", "B-0"}) and site.balanced(site.redis_owners(), {"A-0", "B-0"})
            ),
            2 * LEASE,
            "an even share",
        )
        # one normal lease time (and its jitter) for every partition to be challenged once, then
        # the last race and its handoff
        assert took <= LEASE * 1.05 + WAIT_CAP + 2 * INTERVAL, took
        shared = site.allocation()
        watched = time.monotonic()
        while time.monotonic() - watched < 2 * LEASE:  # and it stays: nothing moves back and forth
            now = site.allocation()
            if now != shared and set(now) == set(shared):  # unless a starved owner woke too late to defend it
                moved = {pid: shared[pid] for pid in now if now[pid] != shared[pid]}
                assert all(woke_late(site, owner, pid) for pid, owner in moved.items()), (
                    f"moved {moved} -> {now}\n{race_lines(site, ('A', 'B'))}"
                )
                shared = now
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        thread.join(5)
    done = await stop_and_check_nothing_was_skipped(site)
    for pid in shared:  # a planned handoff: the final checkpoint came before the release
        assert all(len(owners) == 1 for owners in done[pid].values()), f"partition {pid} handled twice"


@pytest.mark.parametrize("partitions", [1])
async def test_with_one_partition_and_three_nodes_the_partition_never_changes_node(site: Site) -> None:
    async with Redis.from_url(site.redis.url, decode_responses=True) as listener:
        pubsub = listener.pubsub(ignore_subscribe_messages=True)
        await pubsub.subscribe(f"{scope(REF)}:race:grab-lease")
        for prefix in ("A", "B", "C"):
            site.start(prefix)
        # taken: the race's allocation marked, then the ownership record written (balancer/race/steps.py);
        # between the two the record is not there yet (ci-under-load caught the watch below starting there)
        await site.until(lambda: "0" in site.allocation() and site.redis_owners() == site.allocation(), 30, "taken")
        await site.until(lambda: len(site.members()) == 3, 30, "all three nodes to run")
        [owner] = site.allocation().values()
        challenges, settling = 0, False
        watched = time.monotonic()
        while time.monotonic() - watched < 6 * LEASE:
            now = site.allocation()
            if now != {"0": owner} and woke_late(site, owner, "0"):  # a starved owner lost, and says so
                owner, settling = now.get("0", owner), True  # (between the loser and the winner: none)
            records = site.redis_owners()
            settling = settling and (records != {"0": owner} or now != {"0": owner})
            assert settling or now == {"0": owner}, race_lines(site, ("A", "B", "C"))
            assert settling or records == {"0": owner}, race_lines(site, ("A", "B", "C"))
            message = await pubsub.get_message(timeout=0.05)
            challenges += message is not None
        await pubsub.aclose()
        if settling:  # an excused move completes: one owner, in the race's allocation and the records alike
            await site.until(
                lambda: len(site.allocation()) == 1 and site.redis_owners() == site.allocation(), 10, "the move to end"
            )
    assert challenges >= 4  # it was challenged about once per normal lease time, and stayed
    lost = [line for p in ("A", "B", "C") for line in site.log(p).splitlines() if "lost the lease race" in line]
    assert all(line.endswith("s late); shutting it down") for line in lost), lost


async def test_a_node_killed_with_sigkill_has_its_partitions_processed_elsewhere_after_about_the_maximum_lease_time(
    site: Site,
) -> None:
    site.start("A")
    site.start("B")
    await site.until(lambda: site.balanced(site.allocation(), {"A-0", "B-0"}), 30, "A and B to share")
    stop, thread = start_producing(site)
    try:
        await site.until(lambda: len(site.records()) > 200, 30, "some events to be handled")
        orphans = {p for p, o in site.allocation().items() if o == "A-0"}
        site.processes["A"].send_signal(signal.SIGKILL)
        site.processes["A"].wait(10)
        killed = time.monotonic()
        first: list[float] = []

        def b_has_all() -> bool:
            allocation = site.allocation()
            if not first and any(allocation.get(p) == "B-0" for p in orphans):
                first.append(time.monotonic() - killed)
            return allocation == every(site, "B-0") and site.redis_owners() == every(site, "B-0")

        took = await site.until(b_has_all, 3 * SPANS["maximum-lease"], "B to process every partition")
    finally:
        stop.set()
        thread.join(5)
    # B waits the maximum shutdown time for an allocated notice that never comes, and the next
    # challenge (or a dead winner's grab mark) comes within the maximum lease time
    assert first[0] >= SPANS["maximum-shutdown"], first
    assert took <= SPANS["maximum-lease"] + WAIT_CAP + 3 * INTERVAL, took
    done = await stop_and_check_nothing_was_skipped(site)
    for pid, sequences in done.items():
        twice = [s for s, owners in sequences.items() if len(owners) > 1]
        assert pid in orphans or not twice, f"partition {pid} of the survivor handled {twice} twice"


async def test_redis_restarted_without_persistence_moves_nothing_and_processing_goes_on(site: Site) -> None:
    # The ownership records and checkpoints in SQLite (durable); the race in Redis, which restarts
    # empty: the allocation and grab hashes, the subscriptions and the scripts are gone.
    # A race's owner goes first by 1.5 x the leases-held delay; a node starved longer loses the race and
    # hands the partition off. ci-under-load starved one past the suite's 0.375 s once (8a7eb7c): twice
    # the delay here (the most the 2 s wait cap leaves room for) gives the owner 0.75 s.
    for prefix in ("A", "B", "C"):
        site.start(prefix, store="sql", extra=("--leases-held-delay=0.5",))
    nodes = {"A-0", "B-0", "C-0"}
    await site.until(lambda: site.balanced(site.sql_owners(), nodes) and len(site.allocation()) == 6, 30, "a share")
    owners = site.sql_owners()
    stop, thread = start_producing(site)
    try:
        await site.until(lambda: len(site.records()) > 300, 30, "some events to be handled")
        site.redis.restart()
        restarted = time.monotonic()
        handled_before = len(site.records())
        await site.until(lambda: site.allocation() == owners, 4 * INTERVAL + 2, "the allocation to be put back")
        while time.monotonic() - restarted < 3 * LEASE:  # three rounds of challenges after the restart
            assert site.sql_owners() == owners
            await asyncio.sleep(0.05)
        assert site.allocation() == owners
        assert len(site.records()) > handled_before + 200  # processing went on
    finally:
        stop.set()
        thread.join(5)
    done = await stop_and_check_nothing_was_skipped(site)
    for pid, sequences in done.items():  # nothing moved, so nothing was handled by two nodes
        assert {o for owners in sequences.values() for o in owners} == {owners[pid]}, pid
    for prefix in ("A", "B", "C"):
        assert "race subscription is back" in site.log(prefix)
