"""Microsoft's own balancing code as a strategy of the simulator, for side-by-side figures.

``STRATEGY`` ("microsoft-greedy") plans by calling azure-eventhub's ``OwnershipManager
._balance_ownership`` itself (the installed package's, unmodified) with
``LoadBalancingStrategy.GREEDY``: the view's records become the SDK's ownership dicts, with each
record's age on the worker's clock mapped onto the wall clock the SDK reads (``time.time()``), and
the SDK's global ``random`` seeded from the simulator's generator for the call (then restored), so
runs stay reproducible. What it returns beyond the partitions it already holds become claims
(free and expired) or steals. ``register()`` adds it to the strategy registry of this process only
(the bench's); it is never offered to ``runworkers``.
"""

from __future__ import annotations

import random
import time
from typing import Any

from azure.eventhub._eventprocessor.common import LoadBalancingStrategy
from azure.eventhub.aio._eventprocessor._ownership_manager import OwnershipManager

from balancer.model import EventKind
from balancer.strategies import STRATEGIES, Claim, Plan, Strategy, View
from balancer.strategies.base import claim_for

NAME = "microsoft-greedy"


def _manager(view: View) -> OwnershipManager:
    manager = object.__new__(OwnershipManager)  # no client: only the balancing method is used
    manager.owner_id = view.owner_id
    manager.ownership_timeout = view.expiry
    manager.load_balancing_strategy = LoadBalancingStrategy.GREEDY
    manager.fully_qualified_namespace, manager.eventhub_name, manager.consumer_group = "sim", "sim", "$Default"
    return manager


def plan(view: View, rng: random.Random) -> Plan:
    wall = time.time()
    known = set(view.partition_ids)
    ownership: list[dict[str, Any]] = [
        {
            "partition_id": pid,
            "owner_id": r.owner_id,
            "last_modified_time": wall - view.age(r.last_modified) if r.last_modified is not None else 0.0,
        }
        for pid, r in view.ownership.items()
        if pid in known
    ]
    saved = random.getstate()
    random.seed(rng.getrandbits(64))
    try:
        wanted = _manager(view)._balance_ownership(ownership, list(view.partition_ids))
    finally:
        random.setstate(saved)
    active = view.active()
    claims = []
    for pid in sorted({str(o["partition_id"]) for o in wanted}, key=int):
        held = active.get(pid)
        if held is not None and held.owner_id == view.owner_id:
            continue  # a renewal
        if held is None:
            claims.append(claim_for(view, pid, active))
        else:
            claims.append(Claim(pid, EventKind.STEAL, held, f"Microsoft's greedy steals from {held.owner_id}"))
    return Plan(claims=tuple(claims))


STRATEGY = Strategy(name=NAME, plan=plan, store_clock=False, summary="azure-eventhub's own greedy balancing")


def register() -> None:
    """Make ``simulate(NAME, ...)`` work in this process."""
    STRATEGIES.setdefault(NAME, STRATEGY)
