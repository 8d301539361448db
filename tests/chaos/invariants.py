"""The invariant checker: what must hold after a fault-injection run, however the faults fell.

``check`` judges a run's evidence (``evidence``: what the workers recorded and what the store said,
on one clock) by the rules (``rules``), each broken one reported as one line, and counts the figures
per phase (``figures``); ``Report.summary`` is the run's figures in one line.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from tests.chaos.evidence import CheckpointSample, Evidence, Fault, Handling, Lease, OwnershipSample, Phase, Probe
from tests.chaos.figures import Figures, Timeline, unowned_intervals
from tests.chaos.rules import (
    CheckpointHistory,
    bad_records,
    checkpoint_order,
    console,
    console_error,
    coverage,
    outages,
    overlaps,
    owner_runs,
    ownership_moves,
    repeats,
    resumes,
    store_down_shown,
    unexplained,
)

__all__ = [  # the checker, and what was imported from here before it was split
    "CheckpointHistory",
    "CheckpointSample",
    "Evidence",
    "Fault",
    "Handling",
    "Lease",
    "OwnershipSample",
    "Phase",
    "Probe",
    "Report",
    "check",
    "unowned_intervals",
]


@dataclass
class Report:
    violations: list[str] = field(default_factory=list)
    figures: list[Figures] = field(default_factory=list)
    duplicates: int = 0
    moves: int = 0
    produced: int = 0
    landed: int = 0  # distinct events handled (a malformed one: handled, then set aside)
    console_requests: int = 0
    console_errors: int = 0

    @property
    def missing(self) -> int:
        return self.produced - self.landed

    def summary(self, store: str) -> str:
        """The run in one line: produced, landed, missing, duplicates and moves per fault, console errors."""
        per: dict[str, list[int]] = {}  # phase name -> [times, duplicates, moves]
        for figures in self.figures:
            seen = per.setdefault(figures.phase, [0, 0, 0])
            seen[0] += 1
            seen[1] += figures.duplicates
            seen[2] += figures.moves

        def by_phase(column: int) -> str:
            return ", ".join(f"{name}{f' x{n[0]}' if n[0] > 1 else ''} {n[column]}" for name, n in per.items())

        console = (
            f"console errors {self.console_errors} of {self.console_requests} requests"
            if self.console_requests
            else "no console"
        )
        return (
            f"chaos summary [{store}]: produced {self.produced}, landed {self.landed}, missing {self.missing}; "
            f"duplicates: {by_phase(1)}; moves: {by_phase(2)}; {console}"
        )


MAX_REPORTED = 5  # violations of one rule listed before "... and N more"


def check(evidence: Evidence) -> Report:
    """Every rule over ``evidence``; the report lists what broke and the figures per phase."""
    report = Report()
    again = repeats(evidence.handlings)
    report.duplicates = len(again)
    report.violations += _limited("coverage", coverage(evidence))
    report.violations += _limited("checkpoints", checkpoint_order(evidence))
    runs = list(owner_runs(evidence.handlings, gap=max(1.0, evidence.expiry / 3)))
    report.violations += _limited("one owner at a time", overlaps(evidence, runs))
    report.violations += _limited("duplicates", unexplained(evidence, again))
    report.violations += _limited("resume", resumes(evidence, runs))
    moves = ownership_moves(evidence)
    report.violations += _limited("store outages", outages(evidence, moves, again))
    report.violations += _limited("bad records", bad_records(evidence, moves))
    report.violations += _limited("console", console(evidence))
    report.violations += _limited("console", store_down_shown(evidence))
    report.moves = len(moves)
    report.produced = sum(len(events) for events in evidence.produced.values())
    report.landed = len({(h.partition, h.sequence) for h in evidence.handlings})
    report.console_requests = len(evidence.console)
    report.console_errors = sum(1 for probe in evidence.console if console_error(probe))
    timeline = Timeline(evidence, again, unowned_intervals(evidence), [m.at for m in moves])
    report.figures = [timeline.figures(phase) for phase in evidence.phases]
    return report


def _limited(rule: str, problems: Iterable[str]) -> list[str]:
    found = list(problems)
    shown = [f"{rule}: {p}" for p in found[:MAX_REPORTED]]
    if len(found) > MAX_REPORTED:
        shown.append(f"{rule}: ... and {len(found) - MAX_REPORTED} more")
    return shown
