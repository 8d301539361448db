"""``dashboard/live/history.py``: rebalances, ownership timelines and checkpoint moves derived from the log."""

from __future__ import annotations

import itertools
from typing import Any

from dashboard.live.history import checkpoint_history, episodes, ownership_timeline

ids = itertools.count(1)


def ev(
    kind: str,
    pid: str,
    at: float,
    owner: str | None = None,
    previous: str | None = None,
    reason: str = "",
    handoff: bool = False,
) -> dict[str, Any]:
    category = "handoff" if kind == "release" and handoff else kind
    return {
        "id": next(ids),
        "kind": kind,
        "partition_id": pid,
        "owner_id": owner,
        "previous_owner": previous,
        "reporter": owner or previous,
        "reason": reason,
        "at": at,
        "handoff": handoff,
        "category": category,
    }


def cold_start(at: float) -> list[dict[str, Any]]:
    return [ev("claim", str(i), at + i * 0.1, "w1" if i < 2 else "w2", reason="never owned") for i in range(4)]


def test_a_cold_start_is_one_balanced_episode_of_first_claims() -> None:
    (only,) = episodes(cold_start(100.0), quiet=10.0, partitions=4)

    assert (only.claims, only.moves) == (4, 0)
    assert only.balanced is True and only.counts == {"w1": 2, "w2": 2}
    assert only.trigger == "cold start: partitions never owned"
    assert round(only.ended - only.started, 3) == 0.3


def test_a_drain_is_an_episode_of_handoffs_set_off_by_the_operator() -> None:
    log = cold_start(100.0)
    log.append(ev("drain", "*", 200.0, None, "w1", reason="drain w1: deploy"))
    log += [ev("release", p, 201.0, None, "w1", reason="handed off", handoff=True) for p in "01"]
    log += [ev("claim", p, 202.5, "w2", reason="released") for p in "01"]

    _, second = episodes(log, quiet=10.0, partitions=4)

    assert second.trigger == "drain: drain w1: deploy"
    assert (second.moves, second.claims) == (2, 0)
    assert second.kinds == {"handoff": 2, "claim": 2}
    assert second.ended - second.started == 1.5
    assert second.counts == {"w2": 4} and second.balanced is True  # one worker left: every partition on it


def test_a_crash_shows_as_expiries_and_an_unbalanced_end_if_partitions_stay_unowned() -> None:
    log = cold_start(100.0)
    log += [ev("expire", "0", 300.0, "w2", "w1", reason="lease of w1 not renewed for 31.0s (expiry 30s)")]

    _, crash = episodes(log, quiet=10.0, partitions=4)

    assert crash.trigger.startswith("w1 stopped renewing")
    assert crash.moves == 1 and crash.balanced is False  # w1 still holds partition 1: 3 against 1


def test_changes_further_apart_than_quiet_are_separate_episodes() -> None:
    log = [ev("claim", "0", 100.0, "w1", reason="never owned"), ev("claim", "1", 120.0, "w1", reason="never owned")]

    assert len(episodes(log, quiet=10.0)) == 2
    assert len(episodes(log, quiet=30.0)) == 1


def test_the_timeline_says_who_held_a_partition_from_when_and_why_it_moved() -> None:
    log = [
        ev("claim", "3", 100.0, "w1", reason="never owned"),
        ev("release", "3", 150.0, None, "w1", reason="handed off", handoff=True),
        ev("claim", "3", 151.0, "w2", reason="released"),
        ev("steal", "3", 200.0, "w3", "w2", reason="w2 did not hand over within 30s"),
    ]

    spans = ownership_timeline(log)

    assert [(s["owner"], s["since"], s["until"]) for s in spans] == [
        ("w1", 100.0, 150.0),
        ("w2", 151.0, 200.0),
        ("w3", 200.0, None),
    ]
    assert spans[0]["ended"] == "handoff" and spans[1]["ended"] == "steal"
    assert spans[2]["came"] == "steal" and spans[2]["from"] == "w2"


def test_a_phantom_that_took_a_partition_shows_until_its_worker_took_it_back() -> None:
    # issue 36, item 8: b lost 5 to a hand-written record of "phantom", then claimed it back
    log = [
        ev("claim", "5", 100.0, "b", reason="never owned"),
        ev("lost", "5", 160.0, "phantom", "b", reason="now held by phantom"),
        ev("expire", "5", 160.5, "b", "phantom", reason="corrupt record of phantom"),
    ]

    spans = ownership_timeline(log)

    assert [(s["owner"], s["since"], s["until"]) for s in spans] == [
        ("b", 100.0, 160.0),
        ("phantom", 160.0, 160.5),
        ("b", 160.5, None),
    ]
    assert (spans[1]["came"], spans[1]["from"], spans[1]["ended"]) == ("lost", "b", "expire")
    assert all(s["until"] is None or s["until"] >= s["since"] for s in spans)


def test_checkpoint_history_keeps_each_move_once_and_shows_a_rewind() -> None:
    samples: list[dict[str, Any]] = [
        {"at": 1.0, "sequence_number": None, "owner": None},
        {"at": 2.0, "sequence_number": 10, "checkpoint_modified": 1.5, "owner": "w1"},
        {"at": 3.0, "sequence_number": 10, "checkpoint_modified": 1.5, "owner": "w1"},
        {"at": 4.0, "sequence_number": 25, "checkpoint_modified": 3.9, "owner": "w1"},
        {"at": 5.0, "sequence_number": 4, "checkpoint_modified": 4.8, "owner": None},
    ]

    moves = checkpoint_history(samples)

    found = [(m["sequence_number"], m["at"], m["moved"]) for m in moves]
    assert found == [(10, 1.5, None), (25, 3.9, 15), (4, 4.8, -21)]
