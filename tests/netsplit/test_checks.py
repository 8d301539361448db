"""The partition suite's own checks on hand-made evidence: each finds what it must, and only that."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.chaos.evidence import Evidence, Handling
from tests.netsplit.checks import overlaps
from tests.netsplit.history import (
    CheckpointWrite,
    History,
    Write,
    by_partition,
    checkpoint_regressions,
    foreign_checkpoints,
    foreign_writers,
    handled_outside,
    judge,
    margins,
    owner_overlaps,
    summary,
    tenures,
    unmatched_ends,
)
from tests.netsplit.store_history import azurite_history, monitor_arguments, monitor_history


def evidence(*handled: tuple[str, int, str, float]) -> Evidence:
    return Evidence(
        expiry=3.0, produced={}, handlings=[Handling(p, s, o, at) for p, s, o, at in handled], dead_letters=set(),
        checkpoint_samples=[], ownership_samples=[], faults=[], phases=[], final_checkpoints={},
    )  # fmt: skip


def test_a_handoff_is_no_overlap_even_with_duplicates() -> None:
    # w1 handles 0..2 until t=2, w2 takes over at t=5 and handles 2 again (a duplicate, no overlap)
    found = evidence(("0", 0, "w1", 1.0), ("0", 1, "w1", 1.5), ("0", 2, "w1", 2.0), ("0", 2, "w2", 5.0),
                     ("0", 3, "w2", 5.1))  # fmt: skip
    assert overlaps(found) == []


def test_two_owners_reading_one_partition_at_once_are_found() -> None:
    # w1 reads 10..12 from 1.0 to 1.2 while w2 reads 11..13 from 1.05 to 1.25; partition 1 is alone
    found = evidence(("0", 10, "w1", 1.0), ("0", 11, "w1", 1.1), ("0", 12, "w1", 1.2), ("0", 11, "w2", 1.05),
                     ("0", 12, "w2", 1.15), ("0", 13, "w2", 1.25), ("1", 0, "w3", 1.1))  # fmt: skip
    (problem,) = overlaps(found)
    assert problem == "partition 0: w1 read 10..12 from 1.000 to 1.200 while w2 read 11..13 from 1.050 to 1.250"


def test_rapid_handoffs_back_and_forth_are_no_overlap() -> None:
    found = evidence(("0", 0, "w1", 1.0), ("0", 1, "w2", 1.2), ("0", 2, "w1", 1.4))
    assert overlaps(found) == []


def test_readings_within_the_slack_are_one_handoff() -> None:
    assert overlaps(evidence(("0", 0, "w1", 1.00), ("0", 1, "w2", 0.99))) == []


# the store's own history ---------------------------------------------------------------------------

EXPIRY = 3.0


def history(*writes: tuple[str, str, float, float], checkpoints: tuple[tuple[str, int, float], ...] = ()) -> History:
    """Writes (partition, owner, since, at), store-clock seconds; checkpoints (partition, sequence, at)."""
    return History(
        "hand-made", "a test", 1e-6, [Write(p, o, since, at) for p, o, since, at in writes],
        [CheckpointWrite(p, s, at) for p, s, at in checkpoints],
    )  # fmt: skip


def test_a_claim_after_the_previous_lease_expired_is_no_overlap() -> None:
    # w1 claims at 100, renews at 101 and 102 (its lease ends at 105); w2 claims at 105.2
    found = history(("0", "w1", 100.0, 100.001), ("0", "w1", 101.0, 101.001), ("0", "w1", 102.0, 102.001),
                    ("0", "w2", 105.2, 105.201))  # fmt: skip
    assert owner_overlaps(found, EXPIRY) == []
    assert margins(found, EXPIRY) == {True: [], False: [pytest.approx(0.201)]}
    assert summary(found, EXPIRY).endswith(
        "0 after a release, 1 after a lease ran out (closest +0.201s); proves no two leases at once to within 1e-06s"
    )


def test_a_claim_after_a_release_is_no_overlap_however_soon() -> None:
    found = history(("0", "w1", 100.0, 100.001), ("0", "", 101.0, 101.001), ("0", "w2", 101.01, 101.02))
    assert owner_overlaps(found, EXPIRY) == []


def test_a_claim_while_the_previous_lease_ran_fails_and_shows_the_history() -> None:
    # w1 renewed at 102 (its lease runs to 105); w2 took the partition at 104.5: half a second early
    found = history(("0", "w1", 100.0, 100.001), ("0", "w1", 102.0, 102.001), ("0", "w2", 104.499, 104.5),
                    ("0", "w2", 105.0, 105.001), ("1", "w3", 100.0, 100.001))  # fmt: skip
    (problem,) = owner_overlaps(found, EXPIRY)
    assert problem.startswith("partition 0: w2 took it at 00:01:44.500000, 0.500s before the lease of w1 could have "
                              "ended (00:01:45.000000: its last write sent by 00:01:42.000000 + expiry 3s")  # fmt: skip
    shown = problem.splitlines()[1:]
    assert len(shown) == 4 and shown[2].startswith("    >> 00:01:44.500000 (+4.499s) w2")
    assert "w1" in shown[1] and "sent by 00:01:42.000000" in shown[1]
    assert judge(found, EXPIRY) == [f"store history: {problem}"]


def test_an_overlap_within_the_stores_resolution_is_not_reported() -> None:
    found = history(("0", "w1", 100.0, 100.1), ("0", "w2", 102.6, 102.7))
    assert owner_overlaps(found, EXPIRY) != []
    found.resolution = 1.0  # a history stamped to the second proves no more
    assert owner_overlaps(found, EXPIRY) == []


def test_a_checkpoint_going_back_fails_and_shows_where() -> None:
    points = (("0", 10, 100.0), ("0", 60, 101.0), ("0", 60, 101.5), ("0", 45, 102.0), ("0", 70, 103.0), ("1", 5, 100.0))
    found = history(("0", "w1", 100.0, 100.0), checkpoints=points)
    (problem,) = checkpoint_regressions(found)
    assert problem.startswith("partition 0: checkpoint went back from 60 (at 00:01:41.500000) to 45 (at 00:01:42")
    assert "    >> 00:01:42.000000 sequence 45" in problem.splitlines()


def test_a_write_in_another_workers_name_is_found() -> None:
    found = History("hand-made", "a test", 1e-6, [Write("0", "w1", 1.0, 1.0, client="10.0.0.4"),
                                                  Write("0", "w2", 5.0, 5.0, client="10.0.0.4"),
                                                  Write("0", "", 6.0, 6.0, client="10.0.0.9")])  # fmt: skip
    assert foreign_writers(found, {"w1": "10.0.0.4", "w2": "10.0.0.5"}) == [
        "partition 0: a write naming w2 (host 10.0.0.5) came from 10.0.0.4 at 00:00:05.000000"
    ]


def test_an_empty_or_incomplete_history_proves_nothing() -> None:
    assert judge(history(), EXPIRY) == ["store history: no ownership write recorded (a test)"]
    gapped = history(("0", "w1", 1.0, 1.0))
    gapped.gaps.append("Redis closed the MONITOR connection")
    assert judge(gapped, EXPIRY) == ["store history incomplete: Redis closed the MONITOR connection"]


def test_redis_monitor_lines_become_writes_with_their_callers_address() -> None:
    own, points = "leaseboard:{ns/hub/$Default}:ownership", "leaseboard:{ns/hub/$Default}:checkpoints"
    lines = (SAMPLES / "redis-monitor.txt").read_text(encoding="latin-1").splitlines(keepends=True)
    found = monitor_history(lines, own, points)
    assert found.writes == [Write("3", "w1-0", 1795671603.727559, 1795671603.727594, "1795671603.727559-7", "10.9.0.4")]
    assert found.checkpoints == [CheckpointWrite("3", 42, 1795671604.0001, "10.9.0.5")]
    assert monitor_arguments('"a\\x41\\"b" "c d"') == ['aA"b', "c d"]


SAMPLES = Path(__file__).parent / "samples"


def test_azurite_request_log_gives_successful_writes_only() -> None:
    found = azurite_history((SAMPLES / "azurite-debug.log").read_text().splitlines(), "chaos", "ns/hub/$default/")
    at = datetime(2026, 11, 26, 5, 40, 13, tzinfo=UTC).timestamp()
    assert found.writes == [Write("3", "w1-0", at + 0.644, at + 0.658, "0x1", "10.9.0.4")]
    assert found.checkpoints == [CheckpointWrite("3", 57, at + 1.102, "10.9.0.4")]
    assert found.resolution == 1e-3


def test_events_handled_inside_the_owners_tenure_pass_and_one_after_it_fails() -> None:
    # w1 holds partition 0 from 100.001 to 105.0 (last renewal sent by 102), w2 from 105.201 on; the
    # store's clock is the monotonic one + 1000. w1 handles 0..2 inside its lease, then 3..4 at
    # 105.3 and 105.4, after it ended; w2 handles 3 at 105.5, inside its own.
    found = history(("0", "w1", 100.0, 100.001), ("0", "w1", 102.0, 102.001), ("0", "w2", 105.2, 105.201))
    inside = [Handling("0", 0, "w1", -899.5), Handling("0", 1, "w1", -898.9), Handling("0", 2, "w1", -898.1),
              Handling("0", 3, "w2", -894.5)]  # fmt: skip
    assert handled_outside(found, inside, offset=1000.0, expiry=EXPIRY) == []
    late = [Handling("0", 3, "w1", -894.7), Handling("0", 4, "w1", -894.6)]
    (problem,) = handled_outside(found, [*inside, *late], offset=1000.0, expiry=EXPIRY)
    assert problem.startswith("partition 0: w1 handled 3..4 from 00:01:45.300000 to 00:01:45.400000 (store clock), "
                              "outside every lease the store gave it there (1 tenures)")  # fmt: skip
    assert handled_outside(found, late, offset=1000.0, expiry=EXPIRY, slack=0.5) == []


def test_an_owner_handling_while_its_lease_had_lapsed_is_found_even_if_it_claimed_again() -> None:
    # w1's lease ran out at 103.0 (renewal sent by 100), nobody took it, w1 claimed it again at 106.001;
    # w1 handled an event at 104.5 in between: it held no lease then
    found = history(("0", "w1", 100.0, 100.001), ("0", "w1", 106.0, 106.001))
    assert [(t.start, t.end) for t in tenures(by_partition(found.writes)["0"], EXPIRY)] == [(100.001, 103.0),
                                                                                          (106.001, 109.0)]  # fmt: skip
    (problem,) = handled_outside(found, [Handling("0", 7, "w1", 104.5)], offset=0.0, expiry=EXPIRY)
    assert problem.startswith("partition 0: w1 handled 7..7 from 00:01:44.500000")


def test_a_history_that_does_not_end_where_the_store_is_incomplete() -> None:
    found = History("hand-made", "a test", 1e-6, [Write("0", "w1", 1.0, 1.0, "e1"), Write("0", "", 2.0, 2.0, "e2"),
                                                  Write("1", "w2", 1.0, 1.0, "e3")])  # fmt: skip
    assert unmatched_ends(found, {"0": ("", "e2"), "1": ("w2", "e3")}) == []
    assert unmatched_ends(found, {"0": ("w3", "e9"), "1": ("w2", "e3"), "2": ("w1", "e4")}) == [
        "partition 0: the history ends with ('', 'e2'), the store holds ('w3', 'e9')",
        "partition 2: the history ends with no write, the store holds ('w1', 'e4')",
    ]
    assert judge(found, EXPIRY, final={"0": ("", "e2")}) == [
        "store history incomplete: partition 1: the history ends with ('w2', 'e3'), the store holds no record"
    ]


def test_a_checkpoint_written_by_a_former_owner_is_found() -> None:
    writes = [Write("0", "w1", 1.0, 1.0, client="10.0.0.4"), Write("0", "w2", 5.0, 5.0, client="10.0.0.5")]
    points = [CheckpointWrite("0", 10, 2.0, "10.0.0.4"), CheckpointWrite("0", 20, 6.0, "10.0.0.5"),
              CheckpointWrite("0", 15, 6.5, "10.0.0.4"), CheckpointWrite("1", 3, 6.5, "10.0.0.4")]  # fmt: skip
    found = History("hand-made", "a test", 1e-6, writes, points)
    problems = foreign_checkpoints(found, {"w1-0": "10.0.0.9", "w1": "10.0.0.4", "w2": "10.0.0.5"})
    assert [p.splitlines()[0] for p in problems] == [
        "partition 0: checkpoint 15 written from 10.0.0.4 at 00:00:06.500000 while w2 (host 10.0.0.5) owned it; "
        "the ownership history before it:",
        "partition 1: checkpoint 3 written from 10.0.0.4 at 00:00:06.500000 while nobody owned it; "
        "the ownership history before it:",
    ]
