"""Measured load for the load-weighted default strategy: events per second per partition.

Every worker must plan with the same weights, or two workers would each think a partition is the
other's (or both think it is theirs). Rates a worker judges from the checkpoint versions it happened
to read differ from another's, which read at other moments. So each partition has one judge, its
owner, and the weights are what the owners published, which every worker reads in the same store
state:

- every worker reads the checkpoint listing each cycle and keeps, per partition, the versions it
  saw (sequence number, the store's ``last_modified``): ``RateMeter``. Its rate is the slope over
  the last ``window`` seconds of the store's clock. A partition changes owner, its checkpoints do
  not, so a new owner has measured it already;
- the owner publishes the rates of the partitions it holds in its member record's info
  (``info["load"]``, ``format_rates``), which every store already keeps; it writes it again only
  when a rate moved by more than ``CHANGE`` at once, or by more than half that for a whole window
  (a level that shifted, not noise), or it holds a partition it has not published: so weights, and
  with them plans, stay put while load only wobbles;
- a worker plans with ``published``: per partition, its holder's published rate, else the latest
  one any member published for it. A worker keeps publishing the rate of a partition it gave up
  until the new holder publishes one, and a new holder first publishes the rate in force: so a move
  changes no weight (changed weights in the middle of a round of handoffs could send a partition
  freed for one worker to another that is not listening), only a measurement does.

No field is added to any record: a checkpoint stays (sequence number, offset), as Microsoft's
processor reads it on Blob.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .model import Checkpoint, Member, OwnershipRecord

INFO_KEY = "load"  # the member info key holding "pid=rate,pid=rate" (events per second)
CHANGE = 0.2  # a published rate is written again once the measured one differs by more than this share
DRIFT = CHANGE / 2  # ... or by more than this share for a whole window


def format_rates(rates: Mapping[str, float]) -> str:
    """``{"0": 12.5, "7": 0.0}`` as ``"0=12.5,7=0"`` (three significant digits, partitions in order)."""
    return ",".join(f"{p}={rates[p]:.3g}" for p in sorted(rates, key=lambda p: (len(p), p)))


def parse_rates(text: str) -> dict[str, float]:
    """The rates of ``format_rates``; entries that are no ``pid=rate`` with a finite rate >= 0 are skipped
    (a hand edit, or a newer writer's format), so one bad entry costs its partition, not the member."""
    rates: dict[str, float] = {}
    for entry in text.split(","):
        pid, _, value = entry.partition("=")
        try:
            rate = float(value)
        except ValueError:
            continue
        if pid.isdigit() and math.isfinite(rate) and rate >= 0:
            rates[pid] = rate
    return rates


def published(members: Iterable[Member], ownership: Iterable[OwnershipRecord]) -> dict[str, float]:
    """partition id -> the rate the fleet plans with: its holder's published rate, else the one of the
    member that published a rate for it last (latest heartbeat, then owner id). The same for every
    worker that read the same members and records."""
    holder = {r.partition_id: r.owner_id for r in ownership if r.owner_id}
    by_member = {m.owner_id: parse_rates(m.info.get(INFO_KEY, "")) for m in members}
    chosen: dict[str, float] = {}
    for member in sorted(members, key=lambda m: (m.last_seen, m.owner_id)):  # later ones win
        chosen.update(by_member[member.owner_id])
    for pid, owner in holder.items():
        mine = by_member.get(owner, {})
        if pid in mine:
            chosen[pid] = mine[pid]
    return chosen


def held_and_published(members: Iterable[Member], ownership: Iterable[OwnershipRecord]) -> set[str]:
    """The partitions whose holder has published a rate for them."""
    by_member = {m.owner_id: parse_rates(m.info.get(INFO_KEY, "")) for m in members}
    return {r.partition_id for r in ownership if r.partition_id in by_member.get(r.owner_id, {})}


def close(a: float, b: float, share: float = CHANGE) -> bool:
    """Whether rates ``a`` and ``b`` are within ``share`` of the larger (both under 0.01/s count as equal)."""
    return abs(a - b) <= share * max(a, b) or max(a, b) < 0.01


@dataclass
class RateMeter:
    """One worker's measurement of every partition's rate, from the checkpoint versions it read."""

    window: float = 30.0  # seconds of the store's clock a rate is measured over
    _seen: dict[str, list[tuple[float, int]]] = field(default_factory=dict)  # pid -> (last_modified, seq), oldest first
    _drifting: dict[str, float] = field(default_factory=dict)  # pid -> since when it is off its published rate

    def observe(self, checkpoints: Iterable[Checkpoint]) -> None:
        """Add the versions in one checkpoint listing."""
        for cp in checkpoints:
            at = cp.last_modified
            if at is None or not math.isfinite(at):
                continue
            seen = self._seen.setdefault(cp.partition_id, [])
            if seen and at <= seen[-1][0]:
                continue  # the version seen already (or an older one, read late)
            if seen and cp.sequence_number < seen[-1][1]:
                seen.clear()  # moved back (an operator's reset): the history says nothing of now
            seen.append((at, cp.sequence_number))
            # Keep what spans the window: the newest version at least a window old, and those after it.
            while len(seen) > 2 and seen[1][0] <= at - self.window:
                del seen[0]

    def rate(self, partition_id: str, now: float) -> float | None:
        """Events per second of ``partition_id`` at store time ``now``; None while it has not been
        watched for half a window (a partition with no checkpoint for a whole window measures 0)."""
        seen = self._seen.get(partition_id)
        if not seen:
            return None
        (first_at, first_seq), (last_at, last_seq) = seen[0], seen[-1]
        if now - last_at > self.window:  # nothing checkpointed for a window: count the quiet time too
            return (last_seq - first_seq) / (now - first_at)
        if last_at - first_at < self.window / 2:
            return None
        return (last_seq - first_seq) / (last_at - first_at)

    def _drifted_for(self, partition_id: str, now: float) -> float:
        """Seconds the measured rate of ``partition_id`` has been more than ``DRIFT`` off its published one."""
        return now - self._drifting.setdefault(partition_id, now)

    def to_publish(self, held: Iterable[str], current: Mapping[str, float], now: float) -> dict[str, float]:
        """The rates this worker publishes for the partitions it ``held``: the ``current`` (published)
        one while the measured one stays ``close`` to it (within ``DRIFT``, or within ``CHANGE`` for
        less than a window: after a jump the window's slope climbs for a window, and a rate published
        on the way would otherwise stay up to ``CHANGE`` off), else the measured one; a partition not
        measured yet keeps its current rate, or is left out."""
        rates: dict[str, float] = {}
        for pid in held:
            measured, known = self.rate(pid, now), current.get(pid)
            if measured is None or known is None or close(measured, known, DRIFT):
                self._drifting.pop(pid, None)
            if measured is None:
                if known is not None:
                    rates[pid] = known
            elif known is not None and close(measured, known) and self._drifted_for(pid, now) < self.window:
                rates[pid] = known
            else:
                self._drifting.pop(pid, None)
                rates[pid] = float(f"{measured:.3g}")
        return rates
