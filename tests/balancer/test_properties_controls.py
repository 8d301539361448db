"""Pins and drains are always respected: properties over random cluster states (Hypothesis).

Controls are planned by the strategies that read heartbeats and control records
(``Strategy.uses_members``; ``cooperative``, the default). The seed algorithms (``balanced``,
``greedy``, ``eph``) plan exactly as their documents say and know nothing of operators.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import dataclass, replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from balancer.model import Control, ControlKind, OwnershipRecord, partition_ids
from balancer.strategies import STRATEGIES, View

from .cluster import REF, Cluster
from .test_properties import EXPIRY, State, build, states, view_of

CONTROLLED = [name for name, s in STRATEGIES.items() if s.uses_members]


@dataclass(frozen=True)
class Controlled:
    state: State
    drained: frozenset[int]  # never every worker
    pins: dict[int, int]  # partition index -> a worker that is not drained


@st.composite
def controlled(draw: st.DrawFn) -> Controlled:
    state = draw(states())
    drained = frozenset(draw(st.sets(st.integers(0, state.workers - 1), max_size=state.workers - 1)))
    open_workers = [w for w in range(state.workers) if w not in drained]
    pinned = draw(st.sets(st.integers(0, state.partitions - 1), max_size=max(1, state.partitions // 3)))
    pins = {p: draw(st.sampled_from(open_workers)) for p in sorted(pinned)}
    return Controlled(state, drained, pins)


def controlled_view(case: Controlled, me: int) -> View:
    view = view_of(case.state, me)
    name = case.state.name
    members = view.members | {name(w) for w in range(case.state.workers)}
    return replace(
        view,
        members=frozenset(members),
        drained=frozenset(name(w) for w in case.drained),
        pins={str(p): name(w) for p, w in case.pins.items()},
    )


def test_the_default_plans_with_controls() -> None:
    assert "cooperative" in CONTROLLED


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=controlled(), seed=st.integers(0, 2**32 - 1), data=st.data())
def test_no_plan_takes_a_partition_pinned_elsewhere_and_a_drained_worker_only_releases(
    case: Controlled, seed: int, data: st.DataObject
) -> None:
    me = data.draw(st.integers(0, case.state.workers - 1), label="planner")
    for name in CONTROLLED:
        for first_cycle in (False, True):
            view = replace(controlled_view(case, me), first_cycle=first_cycle)
            plan = STRATEGIES[name].plan(view, random.Random(seed))
            active = view.active()
            mine = {p for p, r in active.items() if r.owner_id == view.owner_id}
            for claim in plan.claims:
                pinned_to = view.pins.get(claim.partition_id)
                assert pinned_to in (None, view.owner_id), f"{name} claims {claim.partition_id} pinned to {pinned_to}"
            if view.owner_id in view.drained:
                assert plan.claims == () and set(plan.releases) == mine, f"{name}: a drained worker must only release"
            else:
                own_pins = {p for p, w in view.pins.items() if w == view.owner_id}
                assert not own_pins & set(plan.releases), f"{name} releases a partition pinned to itself"
                for p in mine:
                    pinned_to = view.pins.get(p)
                    if pinned_to not in (None, view.owner_id):
                        assert p in plan.releases, f"{name} keeps {p}, pinned to {pinned_to}"


async def converge(case: Controlled, name: str) -> None:
    cluster: Cluster = await build(case.state, name)
    state = case.state
    for p, w in case.pins.items():
        await cluster.store.put_control(Control(REF, ControlKind.PIN, str(p), state.name(w)))
    for w in case.drained:
        await cluster.store.put_control(Control(REF, ControlKind.DRAIN, state.name(w)))
    drained = {state.name(w) for w in case.drained}
    pins = {str(p): state.name(w) for p, w in case.pins.items()}
    open_workers = [state.name(w) for w in range(state.workers) if w not in case.drained]
    pinned_load = Counter(pins.values())

    def respected(owners: dict[str, str]) -> bool:
        if len(owners) != state.partitions or drained & set(owners.values()):
            return False
        if any(owners.get(p) != w for p, w in pins.items()):
            return False
        loads = Counter(owners.values())
        # workers pinned beyond a fair share keep exactly their pins; the others share the rest
        light = [w for w in open_workers if pinned_load[w] <= state.partitions // len(open_workers)]
        free_loads = [loads.get(w, 0) for w in light]
        return not free_loads or max(free_loads) - min(free_loads) <= 1

    for _ in range(state.partitions + 12):
        await cluster.cycle()
        if respected(await cluster.owners()):
            break
    else:
        raise AssertionError(f"{name}: pins or drains not respected: {await cluster.owners()}")
    before = await cluster.owners()
    cluster.events.clear()
    await cluster.cycle(6)
    assert await cluster.owners() == before, f"{name} moved partitions after balance"
    assert cluster.events == []


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=controlled())
def test_the_cluster_reaches_balance_with_every_pin_respected_and_drained_workers_empty(case: Controlled) -> None:
    for name in CONTROLLED:
        asyncio.run(converge(case, name))


def test_a_released_record_is_never_pinned_data_of_the_view() -> None:
    # guard for the helpers above: a released record has no owner, so it never counts as held
    view = View("w0", partition_ids(1), {"0": OwnershipRecord(REF, "0", "", "e", 0.0)}, 10.0, EXPIRY)
    assert view.active() == {}
