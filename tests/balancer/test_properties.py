"""Properties every registered strategy keeps, over random cluster states (Hypothesis).

A state is P partitions (1..64) and N live workers (1..12); each partition is never owned,
released, held by a ghost (a dead worker) whose lease expired, or held by a live worker, and some
live workers heartbeat while owning nothing. New strategies are checked as soon as they are
registered in ``STRATEGIES``.

Pins and drains are drawn in ``test_properties_controls.py`` for the strategies that plan with them.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections import Counter
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from balancer.model import EventKind, OwnershipRecord, partition_ids
from balancer.strategies import STRATEGIES, Claim, Plan, Strategy, View

from .cluster import REF, Cluster

NOW = 1_700_000_000.0
EXPIRY = 30.0
NEVER, RELEASED, GHOST = -1, -2, -3  # partition states besides "held by live worker i"


@dataclass(frozen=True)
class State:
    partitions: int
    workers: int
    holders: tuple[int, ...]  # per partition: a live worker's index, or NEVER / RELEASED / GHOST
    members: frozenset[int]  # live workers heartbeating (owners or not)

    def name(self, i: int) -> str:
        return f"w{i}"


@st.composite
def states(draw: st.DrawFn) -> State:
    partitions = draw(st.integers(1, 64))
    workers = draw(st.integers(1, 12))
    cell = st.one_of(st.integers(0, workers - 1), st.sampled_from([NEVER, RELEASED, GHOST]))
    holders = tuple(draw(st.lists(cell, min_size=partitions, max_size=partitions)))
    members = frozenset(draw(st.sets(st.integers(0, workers - 1))))
    return State(partitions, workers, holders, members)


def view_of(state: State, me: int) -> View:
    records = {}
    for i, h in enumerate(state.holders):
        pid = str(i)
        if h == RELEASED:
            records[pid] = OwnershipRecord(REF, pid, "", f"e{i}", NOW - 5.0)
        elif h == GHOST:
            records[pid] = OwnershipRecord(REF, pid, "ghost", f"e{i}", NOW - EXPIRY - 1.0)
        elif h >= 0:
            records[pid] = OwnershipRecord(REF, pid, state.name(h), f"e{i}", NOW - 1.0)
    members = frozenset(state.name(i) for i in state.members | {me})
    return View(state.name(me), partition_ids(state.partitions), records, NOW, EXPIRY, members=members)


def may_be_stolen_from(victim: str, view: View) -> bool:
    """``victim`` is above its ceiling: it holds more than ``P // N + 1``, or it holds exactly that
    while more than ``P % N`` workers do (so one of them must come down). N counts every live
    worker this view knows: active owners, heartbeating members, and the planner itself."""
    counts = view.counts(view.active())
    for member in view.members:
        counts[member] += 0
    floor, extra = divmod(len(view.partition_ids), len(counts))
    at_ceiling = sum(1 for c in counts.values() if c >= floor + 1)
    return counts[victim] > floor + 1 or (counts[victim] == floor + 1 and at_ceiling > extra)


def check_plan(plan: Plan, view: View) -> None:
    active = view.active()
    claimed = [c.partition_id for c in plan.claims]
    assert len(claimed) == len(set(claimed)), "a partition claimed twice in one plan"
    for claim in plan.claims:
        assert claim.partition_id in view.partition_ids
        held = active.get(claim.partition_id)
        if held is None:
            assert claim.kind in (EventKind.CLAIM, EventKind.EXPIRE)
            continue
        assert held.owner_id != view.owner_id, "claims a partition it already holds"
        assert claim.kind is EventKind.STEAL, f"takes {claim.partition_id} from live {held.owner_id} as {claim.kind}"
        assert claim.seen == held, "a steal must carry the ETag it saw"
        assert may_be_stolen_from(held.owner_id, view), f"steals from {held.owner_id}, not above its ceiling"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state=states(), seed=st.integers(0, 2**32 - 1), data=st.data())
def test_no_plan_claims_a_partition_held_by_a_live_worker(state: State, seed: int, data: st.DataObject) -> None:
    me = data.draw(st.integers(0, state.workers - 1), label="planner")
    view = view_of(state, me)
    for strategy in STRATEGIES.values():
        check_plan(strategy.plan(view, random.Random(seed)), view)


# convergence on real coordinators ----------------------------------------------------------------


def scripted(strategy: Strategy, claims: list[Claim]) -> Strategy:
    """``strategy`` with a plan that claims ``claims`` once (to put a worker's holdings in place)."""
    plan = Plan(claims=tuple(claims))
    return Strategy(strategy.name, lambda v, r: plan, strategy.store_clock, "set-up", strategy.uses_members)


async def build(state: State, strategy: str) -> Cluster:
    """A cluster of real coordinators on a memory store holding ``state``'s records."""
    cluster = Cluster(state.partitions, strategy=strategy, expiry=EXPIRY, interval=10.0)
    store = cluster.store
    for i, h in enumerate(state.holders):  # the dead and the released, written long ago
        if h in (RELEASED, GHOST):
            [record] = await store.claim_ownership([OwnershipRecord(REF, str(i), "ghost")])
            if h == RELEASED:
                await store.claim_ownership([record.claimed_by("")])
    cluster.now += EXPIRY + 1.0
    for w in range(state.workers):
        coordinator = cluster.add(state.name(w))
        coordinator.controls = store  # heartbeats, as runworkers wires every worker
        listed = {r.partition_id: r for r in await store.list_ownership(REF)}
        mine = [str(i) for i, h in enumerate(state.holders) if h == w]
        real = coordinator.strategy
        coordinator.strategy = scripted(real, [Claim(p, EventKind.CLAIM, listed.get(p), "set-up") for p in mine])
        await coordinator.cycle()
        coordinator.strategy = real
    return cluster


def balanced(cluster: Cluster, owners: dict[str, str]) -> bool:
    counts = Counter(owners.get(p) for p in partition_ids(cluster.partitions))
    loads = [counts.get(w, 0) for w in cluster.workers]
    return None not in counts and set(counts) <= set(cluster.workers) and max(loads) - min(loads) <= 1


async def settle(cluster: Cluster, limit: int) -> int:
    for used in range(1, limit + 1):
        await cluster.cycle()
        if balanced(cluster, await cluster.owners()):
            return used
    raise AssertionError(f"not balanced after {limit} rounds: {await cluster.counts()}")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state=states())
def test_every_strategy_reaches_balance_and_then_moves_nothing(state: State) -> None:
    async def run(name: str) -> None:
        cluster = await build(state, name)
        # Slowest honest path: one claim per cycle for a full share, after ghosts' leases expire.
        await settle(cluster, limit=state.partitions + 10)
        before = await cluster.owners()
        await cluster.cycle()  # the last losers notice their losses (LOST events, no moves)
        assert await cluster.owners() == before, f"{name} moved partitions after balance"
        cluster.events.clear()
        await cluster.cycle(8)
        assert await cluster.owners() == before, f"{name} moved partitions after balance"
        assert cluster.events == []

    for name in STRATEGIES:
        asyncio.run(run(name))


_TIMES = st.one_of(
    st.none(),
    st.just(float("nan")),
    st.just(float("inf")),
    st.just(float("-inf")),
    st.floats(min_value=-40.0, max_value=40.0).map(lambda d: 1_000.0 + d),  # around now, either side of the expiry
)


@given(
    times=st.lists(st.tuples(st.booleans(), _TIMES, st.booleans()), max_size=12),
    clock_is_store=st.booleans(),
    dark=st.lists(st.tuples(st.floats(960.0, 1_000.0), st.floats(0.0, 20.0)), max_size=2),
    fresh_after=st.one_of(st.none(), st.floats(985.0, 1_000.0)),
)
def test_active_is_every_held_record_no_older_than_the_expiry(
    times: list[tuple[bool, float | None, bool]],
    clock_is_store: bool,
    dark: list[tuple[float, float]],
    fresh_after: float | None,
) -> None:
    """``View.active`` (inlined for speed when nothing is dark) agrees with ``View.age`` of
    ``View.modified`` record by record, with records a quiet delta left out (``fresh_after``) or not."""
    records = {
        str(i): OwnershipRecord(REF, str(i), "w" if held else "", last_modified=at, etag=str(i))
        for i, (held, at, _) in enumerate(times)
    }
    exact = frozenset(str(i) for i, (_, _, listed) in enumerate(times) if listed)
    view = View(
        "w",
        tuple(records),
        records,
        1_000.0,
        10.0,
        clock_is_store=clock_is_store,
        dark=tuple((start, start + length) for start, length in dark),
        fresh_after=fresh_after,
        exact=exact,
    )
    expected = {p for p, r in records.items() if r.owner_id and view.age(view.modified(r)) <= view.expiry}
    assert set(view.active()) == expected
    for p, r in records.items():  # a record left out is never older than the bound, and never younger than shown
        at, seen = r.last_modified, view.modified(r)
        if fresh_after is not None and p not in exact and at is not None and math.isfinite(at):
            assert seen == max(at, fresh_after)
        else:
            assert seen is at
