"""The partition suite's own checks on hand-made evidence: each finds what it must, and only that."""

from __future__ import annotations

from tests.chaos.evidence import Evidence, Handling
from tests.netsplit.checks import overlaps


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
