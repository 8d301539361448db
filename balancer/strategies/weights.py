"""The default strategy, load-weighted (``--load-weighted``): shares by measured events per second.

Same members, pins, handoff and waiting rules as ``cooperative``; only the assignment differs. A
partition weighs its published rate (``View.loads``, see ``balancer.load``: the owners' measurement,
the same for every worker that read the same store state), and the assignment is:

1. Every member keeps what it holds (stickiness); pinned partitions go to their worker. A partition
   a member released less than an expiry ago (by this worker's last view, ``View.previous``) counts
   as still that member's: the moves planned before the release are planned again after it, so
   the partitions of one round of handoffs go where they were meant to whichever of them is free
   yet (dealt out afresh, two freed together could swap receivers, and each would wait unowned
   until the next cycle of a worker nobody woke). Once part of a round has landed, the plan from
   there may differ; should it plan a freed partition back onto its releaser, the partition goes
   to the least loaded other member instead: the releaser hears no release notice of its own, and
   would take it back only at its next cycle.
2. Free partitions, and those of workers that are no members, go heaviest first to the least loaded
   member (ties by id), so a cold start deals them out evenly.
3. Then, while moving one partition from a more loaded member to the least loaded one evens that
   pair by at least half a typical partition's weight (``STEP`` of the median), the move that evens
   it most is made. Each move lowers the sum of squared loads, so this ends; and a state it ends in
   plans no move, so a fleet that got there stays (a rate that only wobbles moves nothing, and an
   owner republishes a rate only when it moved by 20 %). A hot partition ends on a worker with
   fewer others; with every weight equal it is the count-based share, within one partition.

Rates not published yet weigh the median of those known; with none known every partition weighs
one. A partition weighs at least ``FLOOR`` of the mean rate, so idle partitions still spread.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping, Sequence

from ..model import OwnershipRecord
from .base import Plan, Strategy, View
from .cooperative import _key, eligible_and_pins, plan_with

STEP = 0.5  # a move must even its pair by this share of the median weight
FLOOR = 0.05  # the least a partition weighs, as a share of the mean rate


def weights(partition_ids: Sequence[str], loads: Mapping[str, float]) -> dict[str, float]:
    """partition id -> the weight it is planned with (see the module's docstring)."""
    known = [loads[p] for p in partition_ids if p in loads]
    if not known or max(known) <= 0:
        return dict.fromkeys(partition_ids, 1.0)
    typical = statistics.median(known)
    floor = FLOOR * sum(known) / len(known)
    return {p: max(loads.get(p, typical), floor) for p in partition_ids}


def assign(view: View, active: Mapping[str, OwnershipRecord]) -> dict[str, str]:
    """partition id -> the worker it should end with (absent: nobody eligible)."""
    eligible, pins = eligible_and_pins(view, active)
    if not eligible:
        return {}
    weight = weights(view.partition_ids, view.loads)
    load = dict.fromkeys(eligible, 0.0)
    movable: dict[str, list[str]] = {w: [] for w in eligible}
    freed: set[str] = set()  # released by a member, not claimed yet
    assignment = dict(pins)
    for p, w in pins.items():
        load[w] += weight[p]
    pool: list[str] = []
    for p in sorted(view.partition_ids, key=_key):
        if p in pins:
            continue
        owner = holder(view, active, p)
        if owner and p not in active:
            freed.add(p)
        if owner in load:
            assignment[p] = owner
            load[owner] += weight[p]
            movable[owner].append(p)
        else:
            pool.append(p)
    for p in sorted(pool, key=lambda p: (-weight[p], _key(p))):
        w = min(eligible, key=lambda w: (load[w], w))
        assignment[p] = w
        load[w] += weight[p]
        movable[w].append(p)
    step = STEP * statistics.median(weight.values())
    for _ in range(len(view.partition_ids) * len(eligible)):  # a bound, for safety: each move lowers sum(load²)
        move = best_move(eligible, load, movable, weight, step)
        if move is None:
            break
        p, source, target = move
        movable[source].remove(p)
        movable[target].append(p)
        load[source] -= weight[p]
        load[target] += weight[p]
        assignment[p] = target
    for p in sorted(freed, key=_key):  # never back onto its releaser (see the module's docstring)
        releaser = assignment[p]
        if releaser == holder(view, active, p) and len(eligible) > 1:
            target = min((w for w in eligible if w != releaser), key=lambda w: (load[w], w))
            load[releaser] -= weight[p]
            load[target] += weight[p]
            assignment[p] = target
    return assignment


def holder(view: View, active: Mapping[str, OwnershipRecord], partition_id: str) -> str:
    """Who holds ``partition_id`` as the assignment starts from: its active owner, else the worker that
    released it less than an expiry ago ("" for nobody)."""
    record = active.get(partition_id)
    if record is not None:
        return record.owner_id
    record = view.ownership.get(partition_id)
    if record is None or record.owner_id or view.age(record.last_modified) >= view.expiry:
        return ""
    return view.previous.get(partition_id, "")


def best_move(
    eligible: Sequence[str],
    load: Mapping[str, float],
    movable: Mapping[str, Sequence[str]],
    weight: Mapping[str, float],
    step: float,
) -> tuple[str, str, str] | None:
    """(partition, from, to): the move to the least loaded member, from the most loaded member that has
    one, that evens the pair most, if by at least ``step``; None when no move does."""
    target = min(eligible, key=lambda w: (load[w], w))
    for source in sorted(eligible, key=lambda w: (-load[w], w)):
        gap = load[source] - load[target]
        if gap < step:
            return None  # every member after this one is closer still
        # Moving weight x makes the pair's gap |gap - 2x|: it narrows by 2 * min(x, gap - x).
        gains = [(2 * min(weight[p], gap - weight[p]), p) for p in movable[source]]
        if gains:
            gain, p = max(gains, key=lambda g: (g[0], -_key(g[1])))
            if gain >= step:
                return p, source, target
    return None


def plan(view: View, rng: random.Random) -> Plan:
    return plan_with(assign, view)


STRATEGY = Strategy(
    name="cooperative",
    plan=plan,
    store_clock=True,
    uses_members=True,
    uses_load=True,
    summary="default, load-weighted: shares by the events per second the owners measured and published",
)
