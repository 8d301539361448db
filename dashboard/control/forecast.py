"""Where the fleet's own strategy takes the partitions: the moves a preview shows.

A lease-table strategy (``balanced``, ``greedy``, ``eph``, ``cooperative``) is run as the workers run
it: every live worker, in turn, plans a cycle with the strategy's real planning function over the
lease table as the cycles before left it, releases and claims what its plan says and renews the
rest; the clock moves one interval per round, so a dead worker's unexpired leases expire and a
handoff that is not completed times out, as they would. It stops when a round changes nothing and
nothing is pending, and returns who ends with each partition. Pure: the fleet, the controls in
force, the strategy and a seed for the strategies' random choices come in; owners come out.

Only strategies that read control records (``Strategy.uses_members``) see drains and pins: for the
others a drain or a pin changes nothing, which is what the preview then shows (with a note).

``race`` is no lease-table plan: who takes a freed partition is decided by a timed race between
the live workers. ``race_moves`` says only what is certain: a drained worker's partitions leave it
(those pinned to it stay), a pinned partition goes to its worker; the winners are not predicted.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace

from balancer.model import OwnershipRecord, pid_key
from balancer.strategies import Strategy, View

from .fleet import Fleet
from .request import Move

MAX_ROUNDS = 2000


@dataclass(frozen=True)
class Outcome:
    owners: dict[str, str]  # partition id -> who ends with it (absent: nobody)
    rounds: int
    settled: bool  # False: still moving after MAX_ROUNDS (or the round limit for this fleet)


def settle(
    strategy: Strategy, fleet: Fleet, drained: frozenset[str], pins: Mapping[str, str], interval: float, seed: int = 0
) -> Outcome:
    """Run every live worker's cycles of ``strategy`` from the fleet's lease table until nothing changes."""
    table: dict[str, OwnershipRecord] = dict(fleet.records)
    cycling = sorted(fleet.alive)
    controls = strategy.uses_members
    rng = random.Random(seed)
    waits: dict[str, dict[str, float]] = {w: {} for w in cycling}
    step = max(min(interval, fleet.expiry / 2), 1e-3)
    limit = min(MAX_ROUNDS, 4 * len(fleet.partition_ids) + 4 * math.ceil(2 * fleet.expiry / step) + 10)
    now = fleet.now
    for rounds in range(1, limit + 1):
        before = _owners(table, now, fleet.expiry)
        for worker in cycling:
            view = View(
                worker,
                fleet.partition_ids,
                dict(table),
                now,
                fleet.expiry,
                members=fleet.alive if controls else frozenset(),
                drained=drained if controls else frozenset(),
                pins=dict(pins) if controls else {},
                waiting=waits[worker],
            )
            plan = strategy.plan(view, rng)
            waits[worker] = {p: waits[worker].get(p, now) for p in plan.waiting}
            for pid, record in list(table.items()):  # renew what it holds, release what it hands off
                if record.owner_id == worker and not record.expired(now, fleet.expiry):
                    gone = pid in plan.releases
                    table[pid] = replace(record, owner_id="" if gone else worker, last_modified=now)
            for claim in plan.claims:
                table[claim.partition_id] = OwnershipRecord(fleet.ref, claim.partition_id, worker, "", now)
        after = _owners(table, now, fleet.expiry)
        # Leases of workers that no longer cycle run out later; waiting for a handoff times out later.
        pending = any(o not in cycling for o in after.values()) or any(waits.values())
        if after == before and not pending:
            return Outcome(after, rounds, True)
        now += step
    return Outcome(_owners(table, now, fleet.expiry), limit, False)


def _owners(table: Mapping[str, OwnershipRecord], now: float, expiry: float) -> dict[str, str]:
    return {p: r.owner_id for p, r in table.items() if not r.expired(now, expiry)}


@dataclass(frozen=True)
class Forecast:
    moves: list[Move]
    outcome: Outcome
    random: bool  # another seed for the strategy's random choices ends elsewhere: the moves are one outcome


def plan_moves(
    strategy: Strategy,
    fleet: Fleet,
    drained: frozenset[str],
    pins: Mapping[str, str],
    interval: float,
    all_caused: bool = False,
) -> Forecast:
    """The moves from today's owners to where ``strategy`` settles with ``drained`` and ``pins`` in force;
    ``caused`` unless it would settle there without them (``all_caused``: every move is the action's)."""
    base = settle(strategy, fleet, fleet.drained, fleet.pins, interval)
    outcome = settle(strategy, fleet, drained, pins, interval)
    other = settle(strategy, fleet, drained, pins, interval, seed=1)
    active = fleet.active
    moves = []
    for pid in fleet.partition_ids:
        now = active[pid].owner_id if pid in active else None
        then = outcome.owners.get(pid)
        if now != then:
            moves.append(Move(pid, now, then, all_caused or base.owners.get(pid) != then))
    moves.sort(key=lambda m: (not m.caused, pid_key(m.partition_id)))
    return Forecast(moves, outcome, other.owners != outcome.owners)


def race_moves(fleet: Fleet, drained: frozenset[str], pins: Mapping[str, str]) -> list[Move]:
    """What is certain under the race: partitions pinned to a new worker go to it; partitions of a newly
    drained worker leave it for whoever wins the race (unless pinned to it)."""
    active = fleet.active
    moves = []
    for pid in fleet.partition_ids:
        holder, pinned = (active[pid].owner_id if pid in active else None), pins.get(pid)
        if pinned is not None and pinned != holder and pinned != fleet.pins.get(pid):
            moves.append(Move(pid, holder, pinned, True))
        elif holder is not None and holder in drained and holder not in fleet.drained and pinned != holder:
            moves.append(Move(pid, holder, None, True, after_known=False))
    return moves


def describe(verb: str, moves: list[Move]) -> str:
    """One line: the action and how many partitions it moves, from whom to whom."""
    caused = [m for m in moves if m.caused]
    if not caused:
        return f"{verb}: no partition moves"
    pairs = Counter((m.before or "nobody", (m.after or "nobody") if m.after_known else "a race winner") for m in caused)
    detail = ", ".join(f"{a} → {b}: {n}" for (a, b), n in sorted(pairs.items()))
    return f"{verb}: {len(caused)} partition{'s' if len(caused) != 1 else ''} move ({detail})"
