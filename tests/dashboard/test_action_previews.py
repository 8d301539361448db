"""Previews plan with the strategy the fleet runs (named on the preview), and say what they cannot predict."""

from __future__ import annotations

import random

import pytest
from django.conf import LazySettings

from balancer.lease import Coordinator
from balancer.model import Control, ControlKind, HubRef, Member, OwnershipRecord
from balancer.strategies import get_strategy
from dashboard.control import actions
from dashboard.control.actions import Request
from workers.hub.embedded import EmbeddedHub
from workers.wiring import Stores

from .conftest import PARTITIONS

pytestmark = pytest.mark.django_db(transaction=True)


async def fleet_running(stores: Stores, ref: HubRef, holdings: dict[str, list[str]], strategy: str | None) -> None:
    """Each worker heartbeats naming ``strategy`` (None: naming none, as older workers did) and claims."""
    for worker, partitions in holdings.items():
        info = {"strategy": strategy} if strategy else {}
        await stores.controls.heartbeat(Member(ref, worker, 0.0, info))
        await stores.ownership.claim_ownership([OwnershipRecord(ref, p, worker) for p in partitions])


def moved(shown: actions.Preview) -> list[tuple[str, str | None, str | None]]:
    return [(m.partition_id, m.before, m.after) for m in shown.moves if m.caused]


async def test_a_fleet_heartbeating_balanced_gets_a_balanced_plan_not_cooperatives(
    stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    await fleet_running(stores, ref, {"w1": ["0", "1"], "w2": ["2", "3"]}, "cooperative")
    cooperative = await actions.preview(ref, Request("pin", "0", "w2"))
    await fleet_running(stores, ref, {"w1": [], "w2": []}, "balanced")

    balanced = await actions.preview(ref, Request("pin", "0", "w2"))

    assert (cooperative.strategy, cooperative.strategy_source) == ("cooperative", "workers")
    assert ("0", "w1", "w2") in moved(cooperative) and len(moved(cooperative)) == 2
    assert (balanced.strategy, balanced.strategy_source) == ("balanced", "workers")
    assert balanced.summary == "pin partition 0 to w2: no partition moves"  # balanced never reads a pin
    assert any("balanced does not read drain and pin records" in n for n in balanced.notes)
    assert balanced.as_json()["strategy"] == "balanced"


async def test_a_rebalance_preview_runs_the_fleets_own_planning_function(
    stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    await fleet_running(stores, ref, {"w1": ["0", "1", "2", "3"], "w2": []}, "eph")

    shown = await actions.preview(ref, Request("rebalance", "*"))

    # eph steals one partition a cycle from the biggest owner while it holds two more: 4/0, 3/1, 2/2.
    assert shown.strategy == "eph"
    assert len(moved(shown)) == 2 and {(b, a) for _, b, a in moved(shown)} == {("w1", "w2")}
    assert any("random choices" in n for n in shown.notes)


async def test_the_forecast_of_a_cooperative_drain_is_what_the_real_coordinators_do(
    stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    async def ids() -> tuple[str, ...]:
        return tuple(str(i) for i in range(PARTITIONS))

    workers = [
        Coordinator(
            ref=ref,
            owner_id=w,
            store=stores.ownership,
            partitions=ids,
            strategy=get_strategy("cooperative"),
            expiry=30.0,
            controls=stores.controls,
            rng=random.Random(1),
        )
        for w in ("w1", "w2", "w3")
    ]
    for _ in range(3):
        for coordinator in workers:
            await coordinator.cycle()

    shown = await actions.preview(ref, Request("drain", "w2"))
    await stores.controls.put_control(Control(ref, ControlKind.DRAIN, "w2"))
    for _ in range(4):
        for coordinator in workers:
            await coordinator.cycle()

    owners = {r.partition_id: r.owner_id for r in await stores.ownership.list_ownership(ref) if r.owner_id}
    assert (shown.strategy, shown.strategy_source) == ("cooperative", "workers")  # their heartbeats name it
    assert moved(shown) and all(owners[p] == after for p, _, after in moved(shown))
    assert "w2" not in owners.values()


async def test_workers_that_disagree_are_named_and_the_most_common_strategy_is_used(
    stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    await fleet_running(stores, ref, {"w1": ["0", "1"]}, "greedy")
    await fleet_running(stores, ref, {"w2": ["2"], "w3": ["3"]}, "cooperative")

    shown = await actions.preview(ref, Request("drain", "w1"))

    assert shown.strategy == "cooperative"
    (note,) = [n for n in shown.notes if "disagree" in n]
    assert "cooperative: w2, w3" in note and "greedy: w1" in note


async def test_without_a_worker_naming_it_the_setting_then_the_default_is_used(
    stores: Stores, hub: EmbeddedHub, ref: HubRef, settings: LazySettings
) -> None:
    await fleet_running(stores, ref, {"w1": ["0", "1"], "w2": ["2", "3"]}, None)
    settings.LEASEBOARD_STRATEGY = "greedy"
    configured = await actions.preview(ref, Request("drain", "w1"))
    settings.LEASEBOARD_STRATEGY = ""
    default = await actions.preview(ref, Request("drain", "w1"))

    assert (configured.strategy, configured.strategy_source) == ("greedy", "settings")
    assert configured.summary == "drain w1: no partition moves"  # greedy does not read drains either
    assert (default.strategy, default.strategy_source) == ("cooperative", "default")
    assert default.summary == "drain w1: 2 partitions move (w1 → w2: 2)"
    assert "LEASEBOARD_STRATEGY" in (configured.strategy_basis or "")


async def test_a_race_fleet_preview_says_what_is_certain_and_not_who_wins(
    stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    await fleet_running(stores, ref, {"w1": ["0", "1"], "w2": ["2"], "w3": ["3"]}, "race")

    drain = await actions.preview(ref, Request("drain", "w1"))
    pin = await actions.preview(ref, Request("pin", "3", "w2"))

    assert drain.strategy == "race"
    assert [(m.partition_id, m.before, m.after_known) for m in drain.moves] == [("0", "w1", False), ("1", "w1", False)]
    assert drain.summary == "drain w1: 2 partitions move (w1 → a race winner: 2)"
    assert any("decided by a race" in n for n in drain.notes)
    assert moved(pin) == [("3", "w3", "w2")] and pin.moves[0].after_known
    assert drain.as_json()["moves"][0]["after_known"] is False


async def test_actions_that_plan_no_moves_name_no_strategy(stores: Stores, hub: EmbeddedHub, ref: HubRef) -> None:
    hub.send_batch([b"{}"] * 3, partition_id="2")
    await fleet_running(stores, ref, {"w1": ["0"]}, "balanced")

    shown = await actions.preview(ref, Request("resetcheckpoint", "2", "latest"))

    assert shown.strategy is None and shown.as_json()["strategy"] is None
