"""The planning strategies, by name. ``DEFAULT`` is what runs when ``--strategy`` is left out."""

from __future__ import annotations

from . import balanced, cooperative, eph, greedy
from .base import Claim, Plan, PlanFunction, Strategy, View

STRATEGIES: dict[str, Strategy] = {
    s.name: s for s in (balanced.STRATEGY, greedy.STRATEGY, eph.STRATEGY, cooperative.STRATEGY)
}
DEFAULT = "cooperative"


def get_strategy(name: str | None) -> Strategy:
    """The strategy called ``name`` (the default for None); ValueError naming the choices otherwise."""
    key = DEFAULT if name is None else name
    try:
        return STRATEGIES[key]
    except KeyError:
        choices = ", ".join(sorted(STRATEGIES))
        raise ValueError(f"unknown strategy {name!r}; choose one of: {choices}") from None


__all__ = ["DEFAULT", "STRATEGIES", "Claim", "Plan", "PlanFunction", "Strategy", "View", "get_strategy"]
