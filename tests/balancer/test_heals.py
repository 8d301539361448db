"""``Balancer.healed``: a worker's healing step on a partition it holds (its reader or handler restarted,
issue 35) goes to the event sink as a ``heal`` event naming the worker and why; nothing moves."""

from __future__ import annotations

import random

from balancer.lease import Coordinator
from balancer.model import BalancerEvent, EventKind, HubRef
from balancer.race.backend import MemoryRaceBackend, MemoryRaceHub
from balancer.race.coordinator import RaceCoordinator
from balancer.race.times import RaceTimes
from balancer.stores.memory import MemoryStore
from balancer.strategies import get_strategy

REF = HubRef("heals.example", "sensors", "$Default")


async def ids() -> tuple[str, ...]:
    return ("0", "1")


async def test_the_lease_core_reports_a_healing_step_as_a_heal_event_and_keeps_the_lease() -> None:
    seen: list[BalancerEvent] = []
    store = MemoryStore()
    coordinator = Coordinator(
        ref=REF,
        owner_id="w1",
        store=store,
        partitions=ids,
        strategy=get_strategy("cooperative"),
        expiry=10.0,
        on_event=seen.append,
        rng=random.Random(0),
    )
    for _ in range(3):  # a cold start waits a cycle for late joiners
        await coordinator.cycle()
    assert coordinator.owned == {"0", "1"}
    seen.clear()
    coordinator.healed("1", "restarted: reader failing 10 s")
    (heal,) = seen
    assert (heal.kind, heal.partition_id, heal.owner_id, heal.previous_owner, heal.reporter) == (
        EventKind.HEAL,
        "1",
        "w1",
        "w1",
        "w1",
    )
    assert heal.reason == "restarted: reader failing 10 s" and heal.as_json()["kind"] == "heal"
    assert coordinator.owned == {"0", "1"} and coordinator.holds("1")


def test_the_lease_race_reports_it_too() -> None:
    seen: list[BalancerEvent] = []
    backend = MemoryRaceBackend(MemoryRaceHub(), REF)
    race = RaceCoordinator(REF, "w2", MemoryStore(), backend, ids, RaceTimes(), on_event=seen.append, clock=lambda: 5.0)
    race.healed("0", "restarted: handler running 300 s")
    assert [(e.kind, e.partition_id, e.owner_id, e.reason, e.at) for e in seen] == [
        (EventKind.HEAL, "0", "w2", "restarted: handler running 300 s", 5.0)
    ]
