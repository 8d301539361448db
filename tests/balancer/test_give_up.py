"""A partition stuck on a worker is given up (``Balancer.give_up``): released, and kept from that
worker for a while through its heartbeat (``balancer.avoid``), so another takes it at once and
nothing moves back (issue 35, item 2)."""

from __future__ import annotations

import random

from balancer import avoid
from balancer.model import EventKind, Member, OwnershipRecord, partition_ids
from balancer.strategies import View
from balancer.strategies.cooperative import assign, plan

from .cluster import REF, Cluster

NOW = 1_700_000_000.0


def test_the_avoided_partitions_go_in_a_heartbeat_and_come_back_out() -> None:
    assert avoid.format_avoided(["10", "3", "3"]) == "3,10"
    assert avoid.parse_avoided("3,10") == {"3", "10"} and avoid.parse_avoided("") == frozenset()
    members = [Member(REF, "a", NOW, {avoid.INFO_KEY: "3"}), Member(REF, "b", NOW, {"strategy": "x"})]
    assert avoid.avoided_by(members) == {"a": frozenset({"3"})}


def view(held: dict[str, list[str]], avoided: dict[str, frozenset[str]], partitions: int = 8) -> View:
    ownership = {p: OwnershipRecord(REF, p, w, last_modified=NOW, etag="e") for w, ps in held.items() for p in ps}
    return View(
        "a",
        partition_ids(partitions),
        ownership,
        NOW,
        30.0,
        members=frozenset(held),
        clock_is_store=True,
        avoided=avoided,
    )


def test_a_partition_its_worker_avoids_goes_to_another_even_past_its_share() -> None:
    # a gave 1 up: with every other worker at its share, one of them takes a third.
    held = {"a": ["0"], "b": ["2", "3"], "c": ["4", "5"], "d": ["6", "7"]}
    active_view = view(held, {"a": frozenset({"1"})})
    assignment = assign(active_view, active_view.active())
    assert assignment["1"] in {"b", "c", "d"}
    assert all(assignment[p] == w for w, ps in held.items() for p in ps)  # nothing else moves


def test_the_worker_that_took_it_past_its_share_hands_on_another_and_keeps_it() -> None:
    held = {"a": ["0"], "b": ["1", "2", "3"], "c": ["4", "5"], "d": ["6", "7"]}  # b took 1 from a
    v = view(held, {"a": frozenset({"1"})})
    assignment = assign(v, v.active())
    assert assignment["1"] == "b"  # the partition a shuns stays where it is
    assert sorted(p for p, w in assignment.items() if w == "a") == ["0", "3"]  # b's highest other goes to a
    assert sorted(assignment.values()).count("b") == 2


def test_without_avoidance_the_assignment_is_unchanged() -> None:
    held = {"a": ["0"], "b": ["1", "2", "3"], "c": ["4", "5"], "d": ["6", "7"]}
    v = view(held, {})
    assignment = assign(v, v.active())
    assert sorted(p for p, w in assignment.items() if w == "a") == ["0", "3"]  # b keeps its lowest two


async def test_a_given_up_partition_is_taken_by_another_and_not_taken_back_until_the_time_is_up() -> None:
    cluster = Cluster(8, strategy="cooperative", expiry=30.0, interval=10.0)
    for w in "abcd":
        cluster.add(w)
    await cluster.settle()
    stuck = sorted((await cluster.owners()).items())[0]
    pid, owner = stuck
    cluster.events.clear()
    event = await cluster.workers[owner].give_up(pid, "stuck: reader failing 10 s", 60.0)
    assert event is not None and event.kind is EventKind.RELEASE and event.reason == "stuck: reader failing 10 s"
    for _ in range(4):  # 40 s: balanced again, the partition elsewhere
        await cluster.cycle()
    owners = await cluster.owners()
    assert owners[pid] != owner
    assert await cluster.counts() == [2, 2, 2, 2]
    assert cluster.workers[owner].avoiding() == {pid}
    took = [e for e in cluster.events if e.partition_id == pid and e.kind is EventKind.CLAIM]
    assert len(took) == 1, "the given-up partition moved more than once"
    for _ in range(4):  # past the 60 s: the avoidance ends and nothing moves for it
        await cluster.cycle()
    assert cluster.workers[owner].avoiding() == frozenset()
    assert (await cluster.owners())[pid] == owners[pid]
    assert await cluster.counts() == [2, 2, 2, 2]


def test_a_worker_that_cannot_read_is_in_no_plan_and_releases_everything() -> None:
    held = {"a": ["0", "1"], "b": ["2", "3"], "c": ["4", "5"], "d": ["6", "7"]}
    v = view(held, {"a": frozenset({avoid.EVERY})})
    assignment = assign(v, v.active())
    assert "a" not in assignment.values() and set(assignment) == set(partition_ids(8))
    assert set(plan(v, random.Random(0)).releases) == {"0", "1"}  # a's own plan hands them over


def test_when_nobody_can_read_the_hub_is_down_and_nothing_moves() -> None:
    held = {"a": ["0", "1"], "b": ["2", "3"], "c": ["4", "5"], "d": ["6", "7"]}
    everyone = {w: frozenset({avoid.EVERY}) for w in held}
    v = view(held, everyone)
    assignment = assign(v, v.active())
    assert all(assignment[p] == w for w, ps in held.items() for p in ps)
    assert plan(v, random.Random(0)).releases == ()


def test_a_partition_every_worker_shuns_is_still_kept_by_one() -> None:
    held = {"a": ["0"], "b": ["2", "3"], "c": ["4", "5"], "d": ["6", "7"]}  # 1 was given up by everyone
    shunned = {w: frozenset({"1"}) for w in held}
    v = view(held, shunned)
    assignment = assign(v, v.active())
    assert assignment["1"] == "a"  # the one holding the fewest: read again as soon as it can be
