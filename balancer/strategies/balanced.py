"""``balanced``: the load-balancing algorithm of ``000_4f2f35b66d29b415.txt`` as written.

Each cycle claims at most one partition. With N the active owners (this worker included) and P
the partitions, every worker should own at least ``P // N`` and at most ``P // N + 1``, and only
``P % N`` workers may own the extra one. A worker with room takes a random unclaimed partition
(never owned, released or expired) if there is one; otherwise it steals one random partition from
the set held by workers owning more than ``P // N + 1``.

One reading the document leaves open is filled the only way that terminates: when this worker is
below ``P // N``, nobody holds more than ``P // N + 1`` and more than ``P % N`` workers hold exactly
``P // N + 1`` (7 partitions on 3 workers as 3, 3, 1), it steals from those. Expiry is judged by
the worker's own clock, as in the document (see its "Clock skews" section).
"""

from __future__ import annotations

import random

from ..model import EventKind
from .base import Claim, Plan, Strategy, View, claim_for


def plan(view: View, rng: random.Random) -> Plan:
    active = view.active()
    counts = view.counts(active)
    n = len(counts)
    p = len(view.partition_ids)
    floor, extra = divmod(p, n)
    mine = counts[view.owner_id]
    with_extra = sum(1 for owner, c in counts.items() if owner != view.owner_id and c > floor)
    has_room = mine < floor or (mine == floor and with_extra < extra)
    if not has_room:
        return Plan()

    unclaimed = view.unclaimed(active)
    if unclaimed:
        return Plan(claims=(claim_for(view, rng.choice(unclaimed), active),))

    over = {o for o, c in counts.items() if o != view.owner_id and c > floor + 1}
    if not over and mine < floor:
        over = {o for o, c in counts.items() if o != view.owner_id and c == floor + 1}
    candidates = sorted(pid for pid, r in active.items() if r.owner_id in over)
    if not candidates:
        return Plan()
    victim = rng.choice(candidates)
    seen = active[victim]
    reason = f"{seen.owner_id} owns {counts[seen.owner_id]}, above the {floor}..{floor + 1} share"
    return Plan(claims=(Claim(victim, EventKind.STEAL, seen, reason),))


STRATEGY = Strategy(
    name="balanced",
    plan=plan,
    store_clock=False,
    summary="000: one claim per cycle; unclaimed first, else steal one from an owner above P//N+1",
)
