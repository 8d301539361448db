"""``greedy``: take the whole fair share in one cycle.

With N the active owners (this worker included) and P the partitions, the share is ``P // N``
and ``P % N`` workers may hold one more. This worker aims at ``P // N + 1`` when it already holds
more than ``P // N`` or fewer than ``P % N`` other workers do, else at ``P // N``. It claims what
it lacks in one cycle: unclaimed partitions first (never owned, released or expired, in random
order), then steals from the other workers' surplus. A worker's surplus is what it holds beyond
its allowance, where the ``P % N`` fullest other workers are allowed ``P // N + 1`` and the rest
``P // N``; so a steal always comes from a worker above ``P // N + 1`` or from one of too many
workers sitting at ``P // N + 1``. It never gives anything up on its own.

The price of speed: simultaneous starters each see themselves alone and claim everything (the
store lets one win each partition), and the others then steal their shares back, so a cold start
moves far more partitions than the minimum. Expiry is judged by the worker's own clock.
"""

from __future__ import annotations

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
    need = target(counts, view.owner_id, p) - counts[view.owner_id]
    if need <= 0:
        return Plan()

    unclaimed = view.unclaimed(active)
    picked = rng.sample(unclaimed, min(need, len(unclaimed)))
    claims = [claim_for(view, pid, active) for pid in sorted(picked, key=int)]
    need -= len(claims)
    if need <= 0:
        return Plan(claims=tuple(claims))

    floor = p // len(counts)
    for owner, spare in sorted(surplus(counts, view.owner_id, p).items()):
        if need <= 0:
            break
        theirs = sorted((pid for pid, r in active.items() if r.owner_id == owner), key=int)
        for pid in sorted(rng.sample(theirs, min(spare, need)), key=int):
            reason = f"{owner} owns {counts[owner]}, {spare} above its share ({floor}..{floor + 1})"
            claims.append(Claim(pid, EventKind.STEAL, active[pid], reason))
            need -= 1
    return Plan(claims=tuple(claims))


STRATEGY = Strategy(
    name="greedy",
    plan=plan,
    store_clock=False,
    summary="the whole fair share in one cycle: unclaimed first, then the surplus of over-loaded owners",
)
