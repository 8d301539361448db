"""``greedy``: Microsoft's greedy load balancing (azure-eventhub's ``LoadBalancingStrategy.GREEDY``).

The rule of azure-eventhub 5.x's ownership manager (``_balance_ownership``), in this package's
terms. With N the active owners (this worker counted even when it holds nothing) and P the
partitions, a worker may hold at most ``ceil(P / N)``. Below that maximum it claims, in one cycle,
as many unclaimed partitions (never owned, released or expired, picked at random) as it lacks to
reach the maximum. Only when there is nothing to claim does it steal: one partition a cycle, at
random, from the fullest owner (ties broken by owner id, so every worker picks the same victim).

Microsoft's code steals only while the worker is below ``P // N``; that leaves some fleets
unbalanced for good (5 partitions on 3 workers held 3, 1, 1: nobody is below 1, so nobody steals).
Here a worker also steals when it is below its fair target (``target``: ``P // N``, or ``P // N + 1``
when fewer than ``P % N`` others hold that many) and an owner holds more than its allowance
(``surplus``), so every fleet ends with counts at most one apart; where Microsoft's code does
balance, the two make the same moves (``tests/balancer/test_strategies.py`` compares them on the
SDK's own code). It never gives anything up on its own.

The price of grabbing: simultaneous starters each see themselves alone and claim up to everything
(the store lets one win each partition), and the others then steal their shares back one
partition a cycle. Expiry is judged by the worker's own clock, as Microsoft's processor does.
"""

from __future__ import annotations

import math
import random
from collections import Counter

from ..model import EventKind
from .base import Claim, Plan, Strategy, View, claim_for


def target(counts: Counter[str], me: str, partitions: int) -> int:
    """How many partitions ``me`` should hold given the active owners' ``counts`` (``me`` included)."""
    floor, extra = divmod(partitions, len(counts))
    others_with_extra = sum(1 for owner, c in counts.items() if owner != me and c > floor)
    return floor + 1 if counts[me] > floor or others_with_extra < extra else floor


def surplus(counts: Counter[str], me: str, partitions: int) -> dict[str, int]:
    """Partitions each other owner holds beyond its allowance (owners with none left out).

    The ``P % N`` fullest owners (ties broken by owner id, so every worker computes the same)
    are allowed ``P // N + 1``, less one slot when ``me`` aims at ``P // N + 1`` itself.
    """
    floor, extra = divmod(partitions, len(counts))
    if target(counts, me, partitions) > floor:
        extra -= 1
    others = sorted((o for o in counts if o != me), key=lambda o: (-counts[o], o))
    over: dict[str, int] = {}
    for rank, owner in enumerate(others):
        allowance = floor + 1 if rank < extra else floor
        if counts[owner] > allowance:
            over[owner] = counts[owner] - allowance
    return over


def plan(view: View, rng: random.Random) -> Plan:
    active = view.active()
    counts = view.counts(active)
    p = len(view.partition_ids)
    mine = counts[view.owner_id]
    most = math.ceil(p / len(counts))
    if mine >= most:
        return Plan()

    unclaimed = view.unclaimed(active)
    picked = rng.sample(unclaimed, min(most - mine, len(unclaimed)))
    if picked:
        return Plan(claims=tuple(claim_for(view, pid, active) for pid in sorted(picked, key=int)))
    share = target(counts, view.owner_id, p)
    over = surplus(counts, view.owner_id, p)
    if mine >= share or not over:
        return Plan()

    victim = min(over, key=lambda o: (-counts[o], o))
    theirs = sorted((pid for pid, r in active.items() if r.owner_id == victim), key=int)
    pid = rng.choice(theirs)
    reason = f"{victim} owns {counts[victim]}, the most; this worker owns {mine}, below its share of {share}"
    return Plan(claims=(Claim(pid, EventKind.STEAL, active[pid], reason),))


STRATEGY = Strategy(
    name="greedy",
    plan=plan,
    store_clock=False,
    summary="Microsoft's greedy: free and expired partitions up to ceil(P/N) in one cycle, then one steal a cycle",
)
