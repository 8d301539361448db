"""A heartbeat is judged by the expiry its worker runs with, which it names, not by the reader's setting."""

from __future__ import annotations

import random

import pytest

from balancer.lease import Coordinator
from balancer.model import HubRef, Member
from balancer.stores.memory import MemoryStore
from balancer.strategies import get_strategy

REF = HubRef("ns", "hub", "$Default")


def test_a_heartbeat_that_names_its_expiry_is_judged_by_it() -> None:
    fleet = Member(REF, "w1", 100.0, {"expiry": "3"})
    assert fleet.alive(102.9, expiry=30.0) and not fleet.alive(103.5, expiry=30.0)
    assert Member(REF, "w2", 100.0).alive(120.0, expiry=30.0)  # names none: the reader's setting


@pytest.mark.parametrize("named", ["", "soon", "0", "-3", "nan", "inf"])
def test_an_unusable_expiry_falls_back_to_the_readers(named: str) -> None:
    assert Member(REF, "w1", 100.0, {"expiry": named}).expiry(30.0) == 30.0


async def test_a_coordinators_heartbeat_names_its_strategy_and_expiry() -> None:
    store = MemoryStore()

    async def ids() -> tuple[str, ...]:
        return ("0", "1")

    coordinator = Coordinator(
        ref=REF,
        owner_id="w1",
        store=store,
        partitions=ids,
        strategy=get_strategy("cooperative"),
        expiry=7.5,
        controls=store,
        rng=random.Random(0),
    )
    await coordinator.cycle()
    (member,) = await store.list_members(REF)
    # and when it announced itself, by the store's clock (the others' cold start waits on late joiners):
    # the worker's reckoning of that clock as it wrote, which the store then stamps a little later
    # (ci-under-load: 1 ms later, when the test asked for the same millisecond)
    joined = float(member.info["joined"])
    assert {k: v for k, v in member.info.items() if k != "joined"} == {"strategy": "cooperative", "expiry": "7.5"}
    assert -0.0005 <= member.last_seen - joined < 1.0
    await coordinator.cycle()
    (again,) = await store.list_members(REF)
    assert again.info["joined"] == member.info["joined"]  # the first heartbeat's, for the worker's life
