"""``eph``: the lease manager of the .NET Event Processor Host, after ``004_f1b4300f147588a7.txt``.

Each cycle, after renewing its own leases:

1. Active hosts are the owners of leases that have not expired, plus this host. The target is
   ``ceil(P / hosts)``: the document's "number of lease blobs / number of active hosts", rounded
   up as ``Math.Ceiling`` does in the C# lease manager (``AcquireExpiredLeasesAsync``), so with 5
   partitions on 2 hosts each may grab up to 3. The C# code counts only owners of live leases
   (at least one); counting this host too only differs when it holds nothing, and then makes it
   grab less.
2. Grab expired or new leases (never owned, released, expired) until this host holds the target,
   all in the same cycle. The C# code walks a dictionary whose order is arbitrary; here the order
   is random, so hosts starting together spread over different partitions.
3. Steal: find the biggest other owner; only if it holds at least two more than this host (after
   the grabs of step 2) steal ONE of its leases. With a difference of one the cluster is already
   as even as it can be, so nothing moves. Ties for biggest are broken at random.

Expiry is judged by the worker's own clock. EPH creates its lease blobs at start-up only; this
port sees partitions added to the hub because the view lists them.
"""

from __future__ import annotations

import random

from ..model import EventKind
from .base import Claim, Plan, Strategy, View, claim_for


def target(partitions: int, hosts: int) -> int:
    """``ceil(partitions / hosts)``: the most leases one host grabs from the expired and new ones."""
    return -(-partitions // hosts)


def plan(view: View, rng: random.Random) -> Plan:
    active = view.active()
    counts = view.counts(active)
    mine = counts[view.owner_id]
    room = target(len(view.partition_ids), len(counts)) - mine

    free = view.unclaimed(active)
    grabbed = sorted(rng.sample(free, min(max(room, 0), len(free))), key=int)
    claims = [claim_for(view, pid, active) for pid in grabbed]
    have = mine + len(claims)

    others = {o: c for o, c in counts.items() if o != view.owner_id and c > 0}
    if others:
        most = max(others.values())
        biggest = rng.choice(sorted(o for o, c in others.items() if c == most))
        if most - have >= 2:
            victim = rng.choice(sorted((p for p, r in active.items() if r.owner_id == biggest), key=int))
            reason = f"{biggest} is the biggest owner with {most}, this host has {have}: difference >= 2"
            claims.append(Claim(victim, EventKind.STEAL, active[victim], reason))
    return Plan(claims=tuple(claims))


STRATEGY = Strategy(
    name="eph",
    plan=plan,
    store_clock=False,
    summary="004: grab expired/new up to ceil(P/hosts) in one cycle; steal one from the biggest if 2+ ahead",
)
