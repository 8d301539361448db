"""Cycles that take too long: warned once, with what the cycle did and how late the loop ran.

A cycle over half the interval leaves little room before a lease lapses. ``CycleWatch.judge``
warns once when that starts (and once when cycles are quick again), naming the store requests the
cycle made, the partitions owned and how late the event loop woke the worker for it
(``CycleWatch.waited``): a slow store shows as long cycles with a punctual loop, a process
starved of CPU as a late loop. With the logger ``workers.runtime.cycles`` at DEBUG
(``LEASEBOARD_LOG_LEVELS=workers.runtime.cycles=DEBUG``) every cycle is logged (``CYCLE``): what the
network-partition suite reads to judge a recovery by the cycles the workers really ran.
"""

from __future__ import annotations

import logging

from balancer.protocol import CycleReport

log = logging.getLogger("workers.runtime.processor")
cycles = logging.getLogger("workers.runtime.cycles")
# One line per cycle (at DEBUG): its seconds, how late the event loop woke the worker for it.
CYCLE = "worker %s: cycle %.3fs, woke %.3fs late, %d store requests, %d partitions owned"


class CycleWatch:
    def __init__(self, owner_id: str, interval: float) -> None:
        self.owner_id = owner_id
        self.interval = interval
        self.slow = False  # the last cycle took more than half the interval
        self.late = 0.0  # seconds the event loop was late to end the worker's last wait

    def waited(self, late: float) -> None:
        self.late = max(0.0, late)

    def judge(self, report: CycleReport) -> None:
        cycles.debug(CYCLE, self.owner_id, report.seconds, self.late, report.requests, len(report.owned))
        slow = report.seconds > self.interval / 2
        if slow and not self.slow:
            starved = self.late > self.interval / 4
            log.warning(
                "worker %s: a cycle took %.2fs, more than half the %gs interval (%d store requests, %d "
                "partitions owned; the event loop woke this worker %.2fs late: %s)",
                self.owner_id,
                report.seconds,
                self.interval,
                report.requests,
                len(report.owned),
                self.late,
                "the process is starved of CPU" if starved else "the store answers slowly",
            )
        elif not slow and self.slow:
            log.warning("worker %s: cycles are quick again (%.3fs)", self.owner_id, report.seconds)
        self.slow = slow
