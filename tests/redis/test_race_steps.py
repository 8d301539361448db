"""001's algorithm step by step, on real ``RaceCoordinator``s with 001's own spans (60 s normal
lease time), on the in-memory race hub and simulated time (``race_rig``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from balancer.model import Control, ControlKind, EventKind
from balancer.race.times import LoadWeights
from balancer.sim import loop as sim_loop

from .race_rig import REF, TIMES, RaceCluster, now

LEASE = TIMES.normal_lease
# One normal lease time with its jitter, a race, a handoff, and a cycle to notice.
WITHIN_A_LEASE = LEASE * (1 + TIMES.jitter) + TIMES.wait_cap + 5.0


def run(test: Callable[[RaceCluster], Awaitable[None]], cluster: RaceCluster) -> None:
    async def main() -> None:
        try:
            await test(cluster)
        finally:
            await cluster.close()

    sim_loop.run(main())


async def settle(cluster: RaceCluster, names: list[str]) -> None:
    for name in names:
        cluster.add(name)
    await cluster.until(lambda: cluster.balanced(names), within=3 * LEASE)


def test_a_node_that_joins_gets_an_even_share_within_one_normal_lease_time() -> None:
    async def test(c: RaceCluster) -> None:
        await settle(c, ["a", "b"])
        joined = now()
        c.add("c")
        took = await c.until(lambda: c.balanced(["a", "b", "c"]), within=WITHIN_A_LEASE)
        assert took <= WITHIN_A_LEASE
        # 6/6 -> 4/4/4 takes 4 moves at the fewest; each race only compares one owner with one
        # challenger, so which owner's partitions are challenged first may cost a move or two more
        moved = [e.partition_id for e in c.moves(joined)]
        assert 4 <= len(moved) <= 6 and len(set(moved)) == len(moved), moved
        await asyncio.sleep(5 * LEASE)
        assert len(c.moves(joined)) == len(moved) and c.balanced()

    run(test, RaceCluster(12))


def test_with_one_partition_and_three_nodes_the_partition_never_changes_node() -> None:
    async def test(c: RaceCluster) -> None:
        await settle(c, ["a", "b", "c"])
        [owner] = c.owners().values()
        published = c.hub.published
        await asyncio.sleep(100 * LEASE)
        assert c.owners() == {"0": owner} and c.moves() == []
        assert c.hub.published - published >= 90  # it was challenged about once per normal lease time

    run(test, RaceCluster(1))


def test_one_grab_notification_per_partition_per_normal_lease_time() -> None:
    async def test(c: RaceCluster) -> None:
        await settle(c, ["a", "b", "c"])
        published = c.hub.published
        await asyncio.sleep(20 * LEASE)
        sent = c.hub.published - published
        # each node has a timer per partition, but hearing a notification resets them all
        assert 6 * 20 / (1 + TIMES.jitter) - 6 <= sent <= 6 * 20 + 6, sent
        assert c.moves() == []

    run(test, RaceCluster(6))


def test_a_killed_nodes_partitions_are_processed_elsewhere_after_about_the_maximum_lease_time() -> None:
    async def test(c: RaceCluster) -> None:
        await settle(c, ["a", "b", "c"])
        orphans = {p for p, o in c.owners().items() if o == "c"}
        c.kill("c")
        killed = now()
        first: list[float] = []

        def taken() -> bool:
            owners = c.owners()
            if not first and any(owners.get(p) in ("a", "b") for p in orphans):
                first.append(now() - killed)
            return all(owners.get(p) in ("a", "b") for p in orphans)

        took = await c.until(taken, within=TIMES.maximum_lease + 2 * LEASE)
        # nobody starts before the dead node's maximum shutdown time has passed (no allocated notice)
        assert first[0] >= TIMES.maximum_shutdown
        assert took <= TIMES.maximum_lease + c.interval * 2 + TIMES.wait_cap
        expired = [e for _, e in c.events if e.kind is EventKind.EXPIRE]
        assert {e.partition_id for e in expired} <= orphans and all(e.previous_owner == "c" for e in expired)
        assert c.balanced(["a", "b"])

    run(test, RaceCluster(9))


def test_the_loser_hands_over_and_the_winner_starts_on_the_allocated_notice() -> None:
    async def test(c: RaceCluster) -> None:
        await settle(c, ["a"])
        c.add("b")
        await c.until(lambda: c.balanced(), within=WITHIN_A_LEASE)
        for at, event in c.events:
            if event.kind is EventKind.STEAL:
                pid = event.partition_id
                released = [t for t, e in c.events if e.kind is EventKind.RELEASE and e.partition_id == pid]
                assert released and 0 <= at - max(released) < 0.1  # at once, not after the maximum shutdown
        assert c.hub.table(REF, "allocation") == c.owners()

    run(test, RaceCluster(4))


def test_the_grab_mark_is_cleared_after_the_minimum_lease_grab_time() -> None:
    async def test(c: RaceCluster) -> None:
        c.add("a")
        c.add("b")
        grab = c.hub.table(REF, "grab")
        appeared: dict[str, float] = {}
        lived: list[float] = []
        while now() < 3 * LEASE:  # watch every mark of the first three lease times
            for pid in grab:
                appeared.setdefault(pid, now())
            for pid in [p for p in appeared if p not in grab]:
                lived.append(now() - appeared.pop(pid))
            await asyncio.sleep(0.05)
        assert len(lived) >= 8  # every partition was raced for at least twice
        assert all(TIMES.minimum_lease_grab - 0.1 <= t <= TIMES.minimum_lease_grab + 1 for t in lived), lived

    run(test, RaceCluster(4))


def test_a_stale_grab_mark_is_cleared_after_the_maximum_lease_time_and_the_partition_raced_for() -> None:
    async def test(c: RaceCluster) -> None:
        # a winner that died between steps 3 and 6: its grab mark and its allocation stay behind
        c.hub.table(REF, "grab")["0"] = "ghost"
        c.hub.table(REF, "allocation")["0"] = "ghost"
        started = now()
        c.add("a")
        c.add("b")
        took = await c.until(lambda: "0" in c.owners(), within=TIMES.maximum_lease + LEASE)
        assert TIMES.maximum_lease <= took <= TIMES.maximum_lease + c.interval + TIMES.wait_cap
        assert c.hub.table(REF, "grab").get("0") in (None, "a", "b") and now() - started == took

    run(test, RaceCluster(2))


def test_an_owner_that_missed_the_notification_yields_at_its_next_cycle() -> None:
    async def test(c: RaceCluster) -> None:
        await settle(c, ["a"])
        c.hub.table(REF, "grab")["0"] = "b"  # b won a race a never heard of
        await c.until(lambda: "0" not in c.nodes["a"].coordinator.owned, within=c.interval * 2 + c.handoff)
        assert [e.kind for _, e in c.events if e.partition_id == "0"][-1] is EventKind.RELEASE
        assert "0" not in c.hub.table(REF, "allocation")  # cleared for the winner

    run(test, RaceCluster(2))


def test_after_the_race_store_restarts_empty_the_owners_put_the_allocation_back_and_nothing_moves() -> None:
    async def test(c: RaceCluster) -> None:
        await settle(c, ["a", "b", "c"])
        before = c.owners()
        c.hub.flush()  # Redis restarted without persistence: hashes empty, subscriptions broken
        await asyncio.sleep(c.interval * 2)
        assert c.hub.table(REF, "allocation") == before
        await asyncio.sleep(5 * LEASE)
        assert c.owners() == before and c.moves() == []

    run(test, RaceCluster(9))


def test_a_race_decided_before_a_restart_the_racers_have_not_noticed_is_not_won_again_after_it() -> None:
    # CI (tests/redis/test_processes.py, a quiet run): the owner won its partition's race, Redis
    # restarted empty (the grab mark gone), and a racer whose wait ended before its subscription
    # noticed the break won the same race again on the new server: the partition moved. A race's
    # HSETNX carries the store's generation of its subscription, which the restart changed.
    async def test(c: RaceCluster) -> None:
        await settle(c, ["a", "b", "c"])
        before = c.owners()
        pid = min(p for p, owner in before.items() if owner == "a")
        await c.nodes["b"].coordinator.backend.publish("grab", pid)
        d = TIMES.leases_held_delay  # each holds 3: the owner tries after 2 d, the others after 3.5 d
        await asyncio.sleep(2.8 * d)
        assert c.hub.table(REF, "grab").get(pid) == "a"  # the owner won
        c.hub.flush(subscriptions=False)  # restarted empty; nobody has noticed yet
        await asyncio.sleep(d)  # the others' HSETNX, with the generation they subscribed in
        assert pid not in c.hub.table(REF, "grab")
        c.hub.break_subscriptions()  # the restart noticed
        await asyncio.sleep(5 * LEASE)
        assert c.owners() == before and c.moves() == []

    run(test, RaceCluster(9))


def test_a_node_that_cannot_reach_the_race_store_stops_processing_within_the_maximum_shutdown_time() -> None:
    async def test(c: RaceCluster) -> None:
        await settle(c, ["a"])
        node = c.nodes["a"].coordinator
        c.hub.down = True
        await c.until(lambda: not node.holds("0"), within=TIMES.maximum_shutdown + 0.01, step=0.01)
        assert node.owned == {"0", "1"}  # still its own: nobody could take it
        c.hub.down = False
        await c.until(lambda: node.holds("0") and node.holds("1"), within=c.interval * 2)

    run(test, RaceCluster(2))


def test_load_weighted_a_node_with_a_hot_partition_gives_its_idle_partitions_away() -> None:
    async def test(c: RaceCluster) -> None:
        def processed(name: str) -> Callable[[str], int]:
            return lambda pid: int(1000 * now()) if pid == "0" and pid in c.nodes[name].coordinator.owned else 0

        for name in ("a", "b"):
            c.add(name, load=LoadWeights(processed(name), unit=100.0, floor=0.1, smoothing=10.0))
        await c.until(lambda: sum(c.counts()) == 6, within=2 * LEASE)

        def hot_alone() -> bool:
            hot = c.owners().get("0")
            return hot is not None and [p for p, o in c.owners().items() if o == hot] == ["0"]

        await c.until(hot_alone, within=10 * LEASE)
        await asyncio.sleep(5 * LEASE)
        assert hot_alone() and sum(c.counts()) == 6

    run(test, RaceCluster(6))


def test_a_drained_node_gives_everything_away_and_a_pinned_partition_goes_to_its_node() -> None:
    async def test(c: RaceCluster) -> None:
        await settle(c, ["a", "b", "c"])
        await c.store.put_control(Control(REF, ControlKind.DRAIN, "c"))
        took = await c.until(lambda: c.balanced(["a", "b"]), within=WITHIN_A_LEASE)
        assert took < c.interval * 2 + TIMES.wait_cap + c.handoff  # challenged at once, not at its timers
        pid = next(p for p, o in c.owners().items() if o == "a")
        await c.store.put_control(Control(REF, ControlKind.PIN, pid, "b"))
        await c.until(lambda: c.owners().get(pid) == "b", within=WITHIN_A_LEASE)
        await asyncio.sleep(3 * LEASE)
        assert c.owners().get(pid) == "b" and "c" not in c.owners().values()

    run(test, RaceCluster(6))


def test_a_node_that_stops_cleanly_has_its_partitions_raced_for_at_once() -> None:
    async def test(c: RaceCluster) -> None:
        await settle(c, ["a", "b", "c"])
        node = c.nodes["c"]
        assert node.loop is not None
        node.loop.cancel()
        events = await node.coordinator.release_all()
        node.dead = True
        assert {e.kind for e in events} == {EventKind.RELEASE} and len(events) == 2
        took = await c.until(lambda: c.balanced(["a", "b"]), within=LEASE)
        assert took < 2 * TIMES.wait_cap  # a race right away, not at the next timers
        expired = [e for _, e in c.events if e.kind is EventKind.EXPIRE]
        assert expired == []  # nobody waited out the maximum shutdown time: the allocation was cleared

    run(test, RaceCluster(6))
