"""The planning strategies, by name. ``DEFAULT`` is what runs when ``--strategy`` is left out.

``STRATEGIES`` are the lease-table plans a ``Coordinator`` runs. ``race`` (001's Redis lease race)
is no plan: ``get_strategy("race")`` returns ``RACE``, whose name tells ``runworkers`` and the
simulator to build a ``balancer.race.coordinator.RaceCoordinator`` instead; ``NAMES`` lists every strategy.
"""

from __future__ import annotations

import random

from . import balanced, cooperative, eph, greedy, weights
from .base import Claim, Plan, PlanFunction, Strategy, View

STRATEGIES: dict[str, Strategy] = {
    s.name: s for s in (balanced.STRATEGY, greedy.STRATEGY, eph.STRATEGY, cooperative.STRATEGY)
}
DEFAULT = "cooperative"


def _not_a_plan(view: View, rng: random.Random) -> Plan:
    raise TypeError("the race strategy is not a lease-table plan: run it with a RaceCoordinator")


RACE = Strategy(
    "race",
    _not_a_plan,
    store_clock=True,
    summary="001: Redis lease race: challenges by pub/sub, HSETNX after a delay that grows with the load held",
    uses_members=True,
)
NAMES: tuple[str, ...] = (*STRATEGIES, RACE.name)


def get_strategy(name: str | None) -> Strategy:
    """The strategy called ``name`` (the default for None); ValueError naming the choices otherwise."""
    key = DEFAULT if name is None else name
    if key == RACE.name:
        return RACE
    try:
        return STRATEGIES[key]
    except KeyError:
        choices = ", ".join(sorted(NAMES))
        raise ValueError(f"unknown strategy {name!r}; choose one of: {choices}") from None


def load_weighted(strategy: Strategy) -> Strategy:
    """``strategy`` weighting by measured load (``--load-weighted``): the default's weighted variant
    (``strategies.weights``), or ``race`` itself (it weighs load by its own options). ValueError for
    a strategy without one."""
    if strategy.uses_load or strategy.name == RACE.name:
        return strategy
    if strategy.name == cooperative.STRATEGY.name:
        return weights.STRATEGY
    raise ValueError(f"--load-weighted works with {DEFAULT} (the default) and {RACE.name}, not {strategy.name}")


__all__ = [
    "DEFAULT",
    "NAMES",
    "RACE",
    "STRATEGIES",
    "Claim",
    "Plan",
    "PlanFunction",
    "Strategy",
    "View",
    "get_strategy",
    "load_weighted",
]
