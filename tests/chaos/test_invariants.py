"""The invariant checker on small hand-made runs: each rule passes what may happen and names what may not."""

from __future__ import annotations

from dataclasses import replace

from tests.chaos.cycles import Cycle
from tests.chaos.evidence import CheckpointSample, Evidence, Fault, Handling, Lease, OwnershipSample, Phase, Probe
from tests.chaos.figures import unowned_intervals
from tests.chaos.invariants import check
from tests.chaos.rules import event_clock


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


def test_duplicates_handled_late_in_a_lasting_fault_are_explained_by_it_but_not_after_its_window() -> None:
    # a's store link flapped from 2.0 to 14.0 (netsplit's flapping, CHAOS_SEED=392077 on Blob): it handled
    # 10..12 at 10.0, in an up moment, its checkpoint then failed and b resumed at 10 after a's lease ran out.
    run = handled("a", range(13), 1.0, step=0.9) + handled("b", range(10, 20), 16.0)  # a's 10 at 10.0
    flapping = Fault("flapping", 2.0, 14.0, frozenset("a"))
    report = check(evidence(run, [(9.5, 9), (17.0, 19)], [flapping]))
    assert report.violations == [] and report.duplicates == 3
    late = handled("a", range(13), 10.0, step=0.9) + handled("b", range(10, 20), 22.0)  # a's 10 at 19.0: past 14 + 3
    report = check(evidence(late, [(18.5, 9), (23.0, 19)], [flapping]))
    (shown, *_) = [v for v in report.violations if "not inside a failure's window" in v]
    # the failure nearest it is named, so a failed run's first line says what to look at
    assert shown.endswith("(nearest: flapping of a from 2.00 to 14.00, checkpoint -1 at its start)"), shown


def test_a_duplicate_from_before_the_checkpoint_taken_before_the_failure_is_reported() -> None:
    # b went back to event 5 although 9 was checkpointed before a failed: not the failure's window.
    run = handled("a", range(13), 1.0) + handled("b", range(5, 20), 5.2)
    report = check(evidence(run, [(1.1, 9), (6.0, 19)], [Fault("sigkill", 2.0, 2.0, frozenset("a"))]))
    assert any(v.startswith("duplicates: partition 0 event 5:") and "window" in v for v in report.violations)
    assert "resume: partition 0: b started at event 5 although checkpoint 9 was already stored" in report.violations


def test_where_the_previous_owner_s_checkpoint_can_land_after_a_claim_only_one_stored_before_it_counts() -> None:
    # As in CI (blob): b claimed by expiry after 4.0 (the last sample naming a), read checkpoint 4 and
    # handled 5.. from 5.2; a's 9, fenced by a read before the claim, was sampled at 5.0.
    owners = [OwnershipSample(at, 1000.0 + at, ("0",), {"0": Lease(o, 1000.0)}) for at, o in [(4.0, "a"), (4.8, "b")]]
    run = handled("a", range(10), 1.0, step=0.1) + handled("b", range(5, 20), 5.2)
    samples = [(2.0, 4), (5.0, 9), (6.0, 19)]
    faults = [Fault("flapping", 2.0, 3.0, frozenset("a"))]
    strict = check(evidence(run, samples, faults, ownership_samples=owners))
    assert "resume: partition 0: b started at event 5 although checkpoint 9 was already stored" in strict.violations
    late = check(evidence(run, samples, faults, ownership_samples=owners, late_checkpoints=True))
    assert not [v for v in late.violations if v.startswith("resume")], late.violations
    # stored before the claim, it counts still: b should have read it
    early = check(
        evidence(run, [(2.0, 4), (3.5, 9), (6.0, 19)], faults, ownership_samples=owners, late_checkpoints=True)
    )
    assert "resume: partition 0: b started at event 5 although checkpoint 9 was already stored" in early.violations


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


def steady(owner: str, pid: str, start: float, end: float) -> list[Handling]:
    """``owner`` handling ``pid`` every 0.1 s from ``start`` to ``end`` (sequence numbers from 0)."""
    return handled(owner, range(round((end - start) * 10)), start, step=0.1, pid=pid)


def outage_run(
    lasted: float, after: dict[str, str], handlings: list[Handling] | None = None, **extra: object
) -> Evidence:
    """Two partitions held by a and b, the store down from 10 s for ``lasted`` seconds, then ``after``."""
    ended = 10.0 + lasted
    samples = [owned(t, {"0": "a", "1": "b"}) for t in (9.0, 9.5)] + [owned(ended + 0.5, after)]
    faults = [Fault("outage", 10.0, ended, frozenset({"a", "b"}))]
    phases = [Phase("outage", 9.8, ended + 5.0)]
    values: dict[str, object] = {
        "ownership_samples": samples,
        "phases": phases,
        "workers": frozenset({"a", "b"}),
        "produced": {},
        "final_checkpoints": {},
        **extra,
    }
    return evidence(handlings or [], [], faults, **values)


def test_a_short_store_outage_may_move_nothing_and_a_long_one_each_partition_at_most_once() -> None:
    assert check(outage_run(6.0, {"0": "a", "1": "b"})).violations == []
    moved = check(outage_run(6.0, {"0": "b", "1": "b"}))
    assert moved.moves == 1 and moved.figures[0].moves == 1
    assert moved.violations == [
        "store outages: store outage of 6.0s at outage +0.2s (at most 3x the expiry of 3s, every worker alive): "
        "1 move(s) of 1 partition(s), want none (0: a->b at outage +6.7s)"
    ]
    assert check(outage_run(20.0, {"0": "b", "1": "b"})).violations == []  # longer: one move each is allowed
    back = outage_run(20.0, {"0": "b", "1": "b"})
    back.ownership_samples.append(owned(31.0, {"0": "a", "1": "b"}))
    assert check(back).violations == [
        "store outages: store outage of 20.0s at outage +0.2s (longer than 3x the expiry): moved more than once: "
        "partition 0 (2 moves)"
    ]


def test_events_handled_twice_after_a_short_outage_are_reported() -> None:
    # a handled 0..9 before the outage, but its checkpoints failed: b, then a again, re-read 5..9.
    run = handled("a", range(10), 9.0, step=0.1) + handled("a", range(5, 20), 16.5, step=0.1)
    report = check(
        outage_run(6.0, {"0": "a", "1": "b"}, run, produced={"0": produced(20)}, final_checkpoints={"0": 19})
    )
    assert report.duplicates == 5
    assert report.violations == [
        "store outages: store outage of 6.0s at outage +0.2s (every worker alive): 5 event(s) handled twice, want "
        "none (first: partition 0 event 5 again by a at outage +6.7s)"
    ]


def test_a_corrupt_record_may_move_only_its_own_partition_and_only_briefly() -> None:
    ghost = {"0": "ghost", "1": "b", "2": "c"}
    samples = [owned(9.0, {"0": "a", "1": "b", "2": "c"}), owned(10.1, ghost), owned(11.0, {**ghost, "0": "c"})]
    fault = Fault("corrupt", 10.0, 10.0, frozenset({"a"}), partitions=frozenset({"0"}))
    handlings = steady("a", "0", 5.0, 10.2) + steady("c", "0", 11.0, 15.0)

    def run(samples: list[OwnershipSample], handlings: list[Handling]) -> Evidence:
        return evidence(
            handlings,
            [],
            [fault],
            ownership_samples=samples,
            workers=frozenset("abc"),
            produced={},
            final_checkpoints={},
            phases=[Phase("corrupt-record", 9.9, 15.0)],
        )

    assert [v for v in check(run(samples, handlings)).violations if v.startswith("bad records")] == []
    rebalanced = [*samples, owned(12.0, {**ghost, "0": "c", "2": "a"})]
    assert [v for v in check(run(rebalanced, handlings)).violations if v.startswith("bad records")] == [
        "bad records: corrupt record of partition 0 at corrupt-record +0.1s: 1 other partition(s) moved, want none "
        "(2: c->a at corrupt-record +2.1s)"
    ]
    stalled = steady("a", "0", 5.0, 10.2) + steady("c", "0", 14.0, 15.0)
    assert [v for v in check(run(samples, stalled)).violations if v.startswith("bad records")] == [
        "bad records: corrupt record of partition 0 at corrupt-record +0.1s: partition 0 went unprocessed for 3.9s "
        "from corrupt-record +0.2s (want at most one expiry, 3s)"
    ]
    coarse = replace(run(samples, stalled), store_tick=1.0)  # Blob: the steal waits one more tick
    assert [v for v in check(coarse).violations if v.startswith("bad records")] == []
    cycling = replace(run(samples, stalled), interval=0.5)  # and the claimer's next cycle
    assert [v for v in check(cycling).violations if v.startswith("bad records")] == []
    later = steady("a", "0", 5.0, 10.2) + steady("c", "0", 14.6, 15.0)
    assert [v for v in check(replace(run(samples, later), interval=0.5)).violations if v.startswith("bad records")] == [
        "bad records: corrupt record of partition 0 at corrupt-record +0.1s: partition 0 went unprocessed for 4.5s "
        "from corrupt-record +0.2s (want at most one expiry, 3s and one interval, 0.5s)"
    ]
    # a starved machine: the claimer's cycles ran late meanwhile, the slowest by 0.6 s (a cycle that
    # began before the partition went unprocessed does not count)
    ran = [Cycle("c", 13.5, 0.6), Cycle("c", 10.15, 2.0)]
    starved = replace(run(samples, later), interval=0.5, cycles=ran)
    assert [v for v in check(starved).violations if v.startswith("bad records")] == []
    slower = steady("a", "0", 5.0, 10.2) + steady("c", "0", 15.0, 15.0)
    assert [v for v in check(replace(starved, handlings=slower)).violations if v.startswith("bad records")] == [
        "bad records: corrupt record of partition 0 at corrupt-record +0.1s: partition 0 went unprocessed for 4.9s "
        "from corrupt-record +0.2s (want at most one expiry, 3s and one interval, 0.5s and the slowest cycle "
        "meanwhile, 0.60s)"
    ]


def test_the_console_must_answer_and_show_the_store_down_during_an_outage() -> None:
    def probe(path: str, at: float, status: int | None, up: float | None = None) -> Probe:
        return Probe(path, at, at + 0.01, status, up, "" if status in (200, 503) else "OperationalError at /metrics")

    fine = [probe("/metrics", 9.0, 200, 1), probe("/api/state", 12.0, 503), probe("/metrics", 12.0, 200, 0)]
    report = check(outage_run(6.0, {"0": "a", "1": "b"}, console=fine))
    assert report.violations == [] and (report.console_requests, report.console_errors) == (3, 0)
    broken = [probe("/metrics", 9.0, 200, 1), probe("/metrics", 12.0, 500), probe("/metrics", 13.0, None)]
    report = check(outage_run(6.0, {"0": "a", "1": "b"}, console=broken))
    assert report.console_errors == 2
    assert report.violations == [
        "console: /metrics answered 500 1 time(s), from outage +2.2s to outage +2.2s (first: OperationalError at "
        "/metrics)",
        "console: /metrics no answer 1 time(s), from outage +3.2s to outage +3.2s (first: OperationalError at "
        "/metrics)",
        "console: store outage of 6.0s at outage +0.2s: /metrics never showed leaseboard_store_up 0 (2 scrapes: "
        "500 x1, no answer x1)",
    ]


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


def test_an_event_stamped_with_a_skewed_workers_own_clock_is_reported() -> None:
    def event(at: float, reporter: str = "w1") -> dict[str, object]:
        return {"kind": "release", "partition_id": "3", "reporter": reporter, "at": at}

    assert list(event_clock([event(1000.0), event(1100.0)], 990.0, 1200.0)) == []
    problems = list(event_clock([event(1000.0), event(1380.0, "skewed")], 990.0, 1200.0))
    assert problems == [
        "event log: 1 of 2 event(s) stamped outside the run's time (first: release of partition 3 by skewed, "
        "+180s after its end)"
    ]
    assert list(event_clock([], 990.0, 1200.0)) != []
