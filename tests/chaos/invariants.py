"""The invariant checker: what must hold after a fault-injection run, however the faults fell.

``check`` judges a run's evidence (``evidence``: what the workers recorded and what the store said,
on one clock) by the rules (``rules``), each broken one reported as one line, and counts the figures
per phase (``figures``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from tests.chaos.evidence import CheckpointSample, Evidence, Fault, Handling, Lease, OwnershipSample, Phase
from tests.chaos.figures import Figures, Timeline, unowned_intervals
from tests.chaos.rules import (
    CheckpointHistory,
    checkpoint_order,
    coverage,
    overlaps,
    owner_runs,
    repeats,
    resumes,
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
    "Report",
    "check",
    "unowned_intervals",
]


@dataclass
class Report:
    violations: list[str] = field(default_factory=list)
    figures: list[Figures] = field(default_factory=list)
    duplicates: int = 0


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
    timeline = Timeline(evidence, again, unowned_intervals(evidence))
    report.figures = [timeline.figures(phase) for phase in evidence.phases]
    return report


def _limited(rule: str, problems: Iterable[str]) -> list[str]:
    found = list(problems)
    shown = [f"{rule}: {p}" for p in found[:MAX_REPORTED]]
    if len(found) > MAX_REPORTED:
        shown.append(f"{rule}: ... and {len(found) - MAX_REPORTED} more")
    return shown
