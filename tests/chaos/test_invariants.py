"""The invariant checker on small hand-made runs: each rule passes what may happen and names what may not."""

from __future__ import annotations

from tests.chaos.evidence import CheckpointSample, Evidence, Fault, Handling, Lease, OwnershipSample, Phase
from tests.chaos.figures import unowned_intervals
from tests.chaos.invariants import check


def produced(count: int, malformed: frozenset[int] = frozenset()) -> list[tuple[float, bool]]:
    return [(float(s) / 10, s in malformed) for s in range(count)]


def handled(
    owner: str, sequences: range | list[int], start: float, step: float = 0.01, pid: str = "0"
) -> list[Handling]:
    return [Handling(pid, s, owner, start + i * step) for i, s in enumerate(sequences)]


def evidence(
    handlings: list[Handling], samples: list[tuple[float, int]], faults: list[Fault] | None = None, **extra: object
) -> Evidence:
    values: dict[str, object] = {
        "expiry": 3.0,
        "produced": {"0": produced(20)},
        "handlings": handlings,
        "dead_letters": set(),
        "checkpoint_samples": [CheckpointSample(at, {"0": c}) for at, c in samples],
        "ownership_samples": [],
        "faults": list(faults or []),
        "phases": [Phase("run", 0.0, 100.0)],
        "final_checkpoints": {"0": 19},
    }
    values.update(extra)
    return Evidence(**values)  # type: ignore[arg-type]


def test_a_planned_move_that_resumes_at_the_checkpoint_breaks_nothing() -> None:
    run = handled("a", range(10), 1.0) + handled("b", range(10, 20), 5.0)
    report = check(evidence(run, [(1.05, 4), (2.0, 9), (6.0, 19)], [Fault("sigterm", 3.0, 3.0, frozenset("a"), True)]))
    assert report.violations == [] and report.duplicates == 0
    assert [(f.produced, f.handled, f.duplicates) for f in report.figures] == [(20, 20, 0)]


def test_an_event_nobody_handled_is_reported() -> None:
    run = handled("a", [*range(7), *range(8, 20)], 1.0)
    report = check(evidence(run, [(9.0, 19)]))
    assert report.violations == ["coverage: partition 0: 1 of 20 events never handled (first [7])"]


def test_a_checkpoint_that_went_back_is_reported() -> None:
    report = check(evidence(handled("a", range(20), 1.0), [(1.1, 5), (1.2, 9), (1.3, 6), (9.0, 19)]))
    assert report.violations == ["checkpoints: partition 0: checkpoint went back from 9 (t=1.20) to 6 (t=1.30)"]


def test_a_final_checkpoint_short_of_the_last_event_is_reported() -> None:
    report = check(evidence(handled("a", range(20), 1.0), [(9.0, 18)], final_checkpoints={"0": 18}))
    assert report.violations == ["checkpoints: partition 0: final checkpoint 18, but its last event is 19"]


def test_duplicates_after_a_kill_from_past_the_last_checkpoint_are_counted_not_reported() -> None:
    # a handled 0..12 and checkpointed 9, was killed at 2.0; b resumed at 10 after expiry.
    run = handled("a", range(13), 1.0) + handled("b", range(10, 20), 5.2)
    report = check(evidence(run, [(1.1, 9), (6.0, 19)], [Fault("sigkill", 2.0, 2.0, frozenset("a"))]))
    assert report.violations == [] and report.duplicates == 3
    assert report.figures[0].duplicates == 3


def test_the_same_duplicates_after_a_planned_move_or_no_fault_are_reported() -> None:
    run = handled("a", range(13), 1.0) + handled("b", range(10, 20), 5.2)
    for faults in ([], [Fault("sigterm", 2.0, 2.0, frozenset("a"), planned=True)]):
        report = check(evidence(run, [(1.1, 9), (6.0, 19)], faults))
        assert len(report.violations) == 3 and report.duplicates == 3
        assert report.violations[0].startswith("duplicates: partition 0 event 10: handled by a at 1.10 and again by b")


def test_a_duplicate_from_before_the_checkpoint_taken_before_the_failure_is_reported() -> None:
    # b went back to event 5 although 9 was checkpointed before a failed: not the failure's window.
    run = handled("a", range(13), 1.0) + handled("b", range(5, 20), 5.2)
    report = check(evidence(run, [(1.1, 9), (6.0, 19)], [Fault("sigkill", 2.0, 2.0, frozenset("a"))]))
    assert any(v.startswith("duplicates: partition 0 event 5:") and "window" in v for v in report.violations)
    assert "resume: partition 0: b started at event 5 although checkpoint 9 was already stored" in report.violations


def test_two_owners_at_the_same_moment_are_reported_unless_inside_an_expiry_after_a_failure() -> None:
    run = handled("a", range(10), 1.0, step=0.1) + handled("b", range(10, 20), 1.5, step=0.1)
    planned = check(evidence(run, [(0.5, -1)], [Fault("sigterm", 1.2, 1.2, frozenset("a"), planned=True)]))
    assert [v for v in planned.violations if v.startswith("one owner")] == [
        "one owner at a time: partition 0: a (events 0..9) and b (events 10..19) handled it at the same time for "
        "0.40s with no unplanned failure of a to excuse it"
    ]
    stopped = check(evidence(run, [(0.5, -1)], [Fault("sigstop", 1.2, 6.2, frozenset("a"))]))
    assert [v for v in stopped.violations if v.startswith("one owner")] == []


def test_an_owner_taking_back_a_partition_where_it_left_off_is_not_two_owners_at_once() -> None:
    # a handed 0..9 to b (planned); b handled 10..14 and was killed before checkpointing; a took the
    # partition back after expiry and resumed at 10, where it had itself stopped.
    run = handled("a", range(10), 1.0) + handled("b", range(10, 15), 2.0) + handled("a", range(10, 20), 6.0)
    faults = [Fault("sigterm", 1.5, 1.5, frozenset("a"), planned=True), Fault("sigkill", 2.5, 2.5, frozenset("b"))]
    report = check(evidence(run, [(1.6, 9), (7.0, 19)], faults))
    assert report.violations == [] and report.duplicates == 5


def test_malformed_events_must_be_set_aside_and_good_ones_never() -> None:
    run = handled("a", range(20), 1.0)
    bad = frozenset({3})
    aside = check(evidence(run, [(9.0, 19)], produced={"0": produced(20, bad)}, dead_letters={("0", 3)}))
    assert aside.violations == []
    kept = check(evidence(run, [(9.0, 19)], produced={"0": produced(20, bad)}, dead_letters={("0", 4)}))
    assert kept.violations == [
        "coverage: partition 0: malformed event 3 was handled but never set aside",
        "coverage: partition 0: good event 4 was set aside as a dead letter",
    ]


def test_an_unowned_partition_is_timed_from_when_its_lease_ran_out_across_a_gap_in_samples() -> None:
    def sample(at: float, now: float, owner: str | None, modified: float | None = None) -> OwnershipSample:
        leases = {} if owner is None else {"0": Lease(owner, modified)}
        return OwnershipSample(at, now, ("0",), leases)

    samples = [
        sample(10.0, 1000.0, "a", 999.5),  # renewed half a second ago: runs out at local 12.5
        sample(30.0, 1020.0, "a", 999.5),  # after a 20 s gap (store down): long expired
        sample(31.0, 1021.0, "b", 1020.8),  # claimed
    ]
    assert unowned_intervals(evidence([], [], ownership_samples=samples)) == [("0", 12.5, 31.0)]
    added = [OwnershipSample(5.0, 995.0, (), {}), sample(6.0, 996.0, None), sample(7.5, 997.5, "b", 997.4)]
    assert unowned_intervals(evidence([], [], ownership_samples=added)) == [("0", 6.0, 7.5)]
    # No sample saw it unowned (the store was down, and renewed at once when back): still counted.
    renewed = [sample(10.0, 1000.0, "a", 999.5), sample(31.0, 1021.0, "a", 1020.5)]
    assert unowned_intervals(evidence([], [], ownership_samples=renewed)) == [("0", 12.5, 30.5)]
    steady = [sample(10.0, 1000.0, "a", 999.5), sample(11.0, 1001.0, "a", 1000.5)]
    assert unowned_intervals(evidence([], [], ownership_samples=steady)) == []


def owned(at: float, owners: dict[str, str], now: float | None = None) -> OwnershipSample:
    """A sample in which each partition's record names its owner, renewed just now."""
    stamp = 1000.0 + at if now is None else now
    leases = {pid: Lease(owner, stamp) for pid, owner in owners.items()}
    return OwnershipSample(at, stamp, tuple(sorted(owners)), leases)


def test_the_summary_line_has_every_figure_in_one_line() -> None:
    run = handled("a", range(13), 1.0) + handled("b", range(10, 20), 5.2)
    faults = [Fault("sigkill", 2.0, 2.0, frozenset("a"))]
    phases = [Phase("start", 0.0, 1.5), Phase("sigkill", 1.5, 50.0)]
    samples = [owned(1.2, {"0": "a"}), owned(5.1, {"0": "b"})]
    report = check(evidence(run, [(1.1, 9), (6.0, 19)], faults, phases=phases, ownership_samples=samples))
    assert report.summary("postgresql") == (
        "chaos summary [postgresql]: produced 20, landed 20, missing 0; duplicates: start 0, sigkill 3; "
        "moves: start 0, sigkill 1; no console"
    )
