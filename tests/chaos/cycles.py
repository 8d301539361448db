"""The workers' own cycles, as they log them: how late a starved machine ran each one.

A worker logs one line per cycle (``workers.runtime.slowcycles.CYCLE``) when ``LEASEBOARD_LOG_LEVELS``
sets ``workers.runtime.cycles`` to DEBUG: the cycle's own seconds and how late its event loop woke it.
A bound that waits for a worker's next cycle (a claim after an expiry, a recovery after a heal) is
judged with the slowest cycle run meanwhile: on a saturated machine one cycle can take a second or
wake seconds late (CI: a corrupt record's partition claimed 0.9 s past its bound, every process
starved), which is the machine's doing, not the balancer's, and the report prints what it allowed.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

CYCLE_LINE = re.compile(
    r"^(?P<wall>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(?P<ms>\d{3}) DEBUG workers\.runtime\.cycles: "
    r"worker (?P<owner>\S+): cycle (?P<seconds>[\d.]+)s, woke (?P<late>[\d.]+)s late"
)
# What a fleet's workers need in their environment to log every cycle.
LOG_LEVELS = "workers.runtime.cycles=DEBUG"


@dataclass(frozen=True, slots=True)
class Cycle:
    owner: str
    ended: float  # on the monotonic clock
    seconds: float  # the cycle's own seconds and how late the event loop woke its worker for it


def cycles(root: Path, offset: float) -> list[Cycle]:
    """Every cycle the workers logged under ``root`` (``w1.log``..), on the monotonic clock (``offset``:
    the wall clock minus the monotonic one; a line's time is its wall time, to the millisecond)."""
    found = []
    for path in sorted(root.glob("w*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if (m := CYCLE_LINE.match(line)) is None:
                continue
            wall = time.mktime(time.strptime(m["wall"], "%Y-%m-%d %H:%M:%S")) + int(m["ms"]) / 1000
            found.append(Cycle(m["owner"], wall - offset, float(m["seconds"]) + float(m["late"])))
    return found


def slowest(ran: Iterable[Cycle], start: float, end: float) -> float:
    """The seconds of the slowest cycle begun at ``start`` or later and ended by ``end`` (0: none)."""
    return max((c.seconds for c in ran if start <= c.ended - c.seconds and c.ended <= end), default=0.0)
