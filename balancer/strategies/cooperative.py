"""``cooperative``: Leaseboard's default strategy.

Every worker computes the same target assignment from the same view, so workers agree without
talking and simultaneous starters do not collide:

1. Members are the workers whose heartbeat is fresh by the *store's* clock (a worker that owns
   nothing yet counts at once); drained workers are left out, and so is a worker that holds nothing
   and missed two cycles' heartbeats (it crashed right after announcing itself). An active owner
   without a fresh heartbeat is no member: its partitions are handed over or taken like any others.
2. Each member's target count is ``P // N`` or one more; pinned partitions count toward their
   worker's load (a worker pinned more than its share keeps them all and the rest share the
   remainder). The extra partitions go to the members holding the most already, so the number of
   partitions that move is the minimum.
3. Each member keeps the partitions it holds, up to its target; the rest (free, expired, excess,
   held by drained workers, pinned elsewhere) fill the members below target, in a fixed order.

A worker then claims the free partitions assigned to it, hands off (releases) the ones assigned to
someone else, and *waits* for those it was assigned that another live worker still holds: that
worker sees the same assignment and releases them once it has finished the event in hand and
checkpointed, so a planned move processes no event twice. Only if the holder has not released
after the handoff timeout (it may run an older strategy, or be stuck) does the waiter take over, and
then it handles nothing until the holder's last renewal would have expired (the steal's fence,
``balancer.lease.writes``): the holder may go on until its lease runs out by its own clock.

A worker claims nothing in its first cycle: it announces itself, so that when every worker starts
together each sees all the others before anyone claims.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Mapping

from ..avoid import EVERY
from ..model import EventKind, OwnershipRecord
from ..schedule import SOON_MAX, SOON_SHARE
from .base import Claim, Plan, Strategy, View, claim_for


def _key(partition_id: str) -> int:
    return int(partition_id)


def members(view: View, active: Mapping[str, OwnershipRecord]) -> list[str]:
    """The workers that share the partitions, sorted: this worker and every worker with a fresh
    heartbeat, less the drained and the unresponsive.

    An active owner without a fresh heartbeat (a phantom or hand-edited record, a worker that
    stopped heartbeating) is no member: it counts only for the partitions it holds, which go to the
    members like any others (handed over, or taken after the handoff timeout). Counted as a member
    it would get a full share that nobody ever processes.
    """
    live = set(view.members) | {view.owner_id}
    sharing = live - view.drained - unresponsive(view, active)
    return sorted(sharing - unreading(view, sharing))


def unreading(view: View, sharing: set[str]) -> set[str]:
    """The workers among ``sharing`` that say they cannot read the hub (``balancer.avoid.EVERY``): in no
    plan, unless none of the others can read either (the hub is down, not they): then nobody is left out."""
    said = {w for w, pids in view.avoided.items() if EVERY in pids and w in sharing}
    return said if sharing - said else set()


def unresponsive(view: View, active: Mapping[str, OwnershipRecord]) -> set[str]:
    """Members that hold nothing and have not heartbeated for two intervals: a newcomer that crashed
    right after announcing itself. Its heartbeat stays fresh until the expiry, but partitions
    released to it would stay unowned all that time. A worker that holds partitions is judged by
    its leases alone. Needs the fleet's interval; without it nobody is judged unresponsive."""
    if view.interval is None:
        return set()
    holders = {r.owner_id for r in active.values()}
    grace = 2 * view.interval
    return {
        w for w, seen in view.heartbeats.items() if w != view.owner_id and w not in holders and view.age(seen) > grace
    }


def target_counts(
    partitions: int, eligible: list[str], pinned: Mapping[str, int], held: Mapping[str, int]
) -> dict[str, int]:
    """How many partitions each eligible worker should own in the end."""
    targets: dict[str, int] = {}
    rest = list(eligible)
    remaining = partitions
    while rest:  # workers pinned beyond their share keep exactly their pins; the others share the rest
        floor = remaining // len(rest)
        heavy = [w for w in rest if pinned.get(w, 0) > floor]
        if not heavy:
            break
        for w in heavy:
            targets[w] = pinned[w]
            remaining -= pinned[w]
            rest.remove(w)
    if rest:
        floor, extra = divmod(remaining, len(rest))
        # The extras go to workers already above the floor, then by id. That rank does not change
        # while a round of claims and releases lands (a worker above the floor stays above it until
        # its target; one at or below it never passes another's), so every worker computes the same
        # targets in the middle of a round, and the ones already holding more keep them.
        by_load = sorted(rest, key=lambda w: (held.get(w, 0) <= floor, w))
        for rank, w in enumerate(by_load):
            targets[w] = floor + (1 if rank < extra else 0)
    return targets


def eligible_and_pins(view: View, active: Mapping[str, OwnershipRecord]) -> tuple[list[str], dict[str, str]]:
    """The members a plan may assign to (``members``), and the pins among them of known partitions."""
    eligible = members(view, active)
    known = set(view.partition_ids)
    return eligible, {p: w for p, w in view.pins.items() if p in known and w in eligible}


def assign(view: View, active: Mapping[str, OwnershipRecord]) -> dict[str, str]:
    """partition id -> the worker it should end with (absent: nobody eligible)."""
    eligible, pins = eligible_and_pins(view, active)
    if not eligible:
        return {}
    pinned_count: dict[str, int] = {}
    for w in pins.values():
        pinned_count[w] = pinned_count.get(w, 0) + 1
    holdings: dict[str, list[str]] = {w: [] for w in eligible}
    for p, r in active.items():
        if r.owner_id in holdings and p not in pins:
            holdings[r.owner_id].append(p)
    held = {w: len(ps) + pinned_count.get(w, 0) for w, ps in holdings.items()}
    targets = target_counts(len(view.partition_ids), eligible, pinned_count, held)

    avoided = {w: ps for w, ps in view.avoided.items() if w in holdings}
    shunned = frozenset().union(*avoided.values())  # partitions some member will not take

    def kept_first(p: str) -> tuple[bool, int]:  # a partition someone shuns stays where it is
        return p not in shunned, _key(p)

    assignment = dict(pins)
    pool: list[str] = []
    for w in eligible:
        budget = targets[w] - pinned_count.get(w, 0)
        mine = sorted((p for p in holdings[w] if p not in avoided.get(w, ())), key=kept_first)
        assignment.update({p: w for p in mine[:budget]})
        pool.extend(mine[budget:] + [p for p in holdings[w] if p in avoided.get(w, ())])
    free = [p for p in view.partition_ids if p not in active and p not in pins]
    leftovers = [p for p, r in active.items() if p not in pins and r.owner_id not in holdings]
    pool = sorted(free, key=_key) + sorted(pool + leftovers, key=_key)
    assigned = Counter(assignment.values())
    pool.reverse()  # taken from the end: the same order as from the front, without shifting the list
    for w in eligible:
        need = targets[w] - assigned[w]
        skipped: list[str] = []
        while need > 0 and pool:
            p = pool.pop()
            if p in avoided.get(w, ()):
                skipped.append(p)
                continue
            assignment[p] = w
            assigned[w] += 1
            need -= 1
        pool.extend(reversed(skipped))
    if avoided:  # what only those who shun it had room for: to whoever holds the fewest and takes it
        for p in reversed(pool):
            # Shunned by every member (its link down for all): kept by someone all the same, to be read
            # as soon as it can be, rather than left unowned until the avoidances end.
            takers = [w for w in eligible if p not in avoided.get(w, ())] or eligible
            taker = min(takers, key=lambda w: (assigned[w], w))
            assignment[p] = taker
            assigned[taker] += 1
    return assignment


VACATED_HOLD = 0.5  # of an interval: how long a partition released by a worker that left stays free


def vacated_for(view: View, partition_id: str) -> float | None:
    """Seconds a partition released by a worker that has left since stays free (``VACATED_HOLD`` of
    an interval from its release), or None: it may be claimed now.

    A worker that stops releases everything; one that joins at the same moment announces itself
    in its first cycle. Claimed at once, the stopped worker's partitions go to whoever cycles
    first, who has not seen the newcomer yet and hands half of them on a cycle later: twice the
    moves. Left free a while, they go straight to their final owners. The plan says when the hold
    ends (``Plan.recheck_in``) and the worker reads again then (``balancer.schedule``), so a plain
    scale-in costs half an interval, not up to two: a whole interval's hold, seen at the next read
    after it, took 3.4 s on average at 2 s / 10 s, and 20 s at 10 s / 30 s.
    """
    record = view.ownership.get(partition_id)
    before = view.previous.get(partition_id)
    if view.interval is None or record is None or record.owner_id or not before:
        return None
    left = before not in view.members and before not in view.drained  # a drained worker hands over; it has not left
    rest = VACATED_HOLD * view.interval - view.age(record.last_modified)
    return rest if left and rest > 0 else None


def unproven(view: View, active: Mapping[str, OwnershipRecord]) -> frozenset[str]:
    """Members that hold nothing and have heartbeated only in their announcing cycle (``View.unready``:
    a heartbeat of a later cycle says "ready"; one that holds a live lease has shown itself alive, and
    sends no heartbeat): no partition is handed to one yet. A newcomer that crashed right after announcing
    itself then costs nothing: its share stays with the holders, nothing is left unowned and nothing
    moves when it is judged unresponsive (``unresponsive``). Handed over at once, its share went
    unowned for about three intervals and then mostly to other workers (5-8 moves on 32/4). A live
    newcomer heartbeats again in its next cycle, a quarter interval (at most a second) later, and tells
    the quiet holders so (``Coordinator.announce_joining``)."""
    holders = {r.owner_id for r in active.values()}
    return frozenset(w for w in view.unready if w not in holders)


def unclaimed_recheck(interval: float) -> float:
    """Seconds until a worker reads again when its view has a free partition another worker is to
    claim: the "soon" of ``balancer.schedule`` (a quarter interval, at most a second). Where two views'
    weights differ for a moment (``--load-weighted``: a rate published between their reads) the one
    meant to claim it may not know it yet, and a worker it would not wake took it at its next read, an
    interval later (the simulator's hot partition on 16/4: 9.7 s unowned at 10 s / 30 s)."""
    return min(SOON_SHARE * interval, SOON_MAX)


Assigner = Callable[[View, Mapping[str, OwnershipRecord]], dict[str, str]]


def plan(view: View, rng: random.Random) -> Plan:
    return plan_with(assign, view)


def plan_with(assigner: Assigner, view: View) -> Plan:
    """The plan that moves toward ``assigner``'s assignment: this worker's claims, releases and waits."""
    active = view.active()
    mine = sorted((p for p, r in active.items() if r.owner_id == view.owner_id), key=_key)
    if view.owner_id in view.drained:
        return Plan(releases=tuple(mine))
    if view.first_cycle:  # announce only; what is pinned elsewhere goes whatever the members are
        others = view.members - {view.owner_id} - view.drained
        return Plan(releases=tuple(p for p in mine if view.pins.get(p) in others))
    assignment = assigner(view, active)
    waiting_for = unproven(view, active)
    releases = tuple(p for p in mine if assignment.get(p) not in (view.owner_id, *waiting_for))
    timeout = view.expiry if view.handoff_timeout is None else view.handoff_timeout
    claims: list[Claim] = []
    waiting: list[str] = []
    holds: list[float] = []
    for p in view.partition_ids:
        if assignment.get(p) != view.owner_id or p in mine:
            if p not in active and view.interval is not None and assignment.get(p) not in (None, view.owner_id):
                holds.append(unclaimed_recheck(view.interval))
            continue
        holder = active.get(p)
        if holder is None:
            hold = vacated_for(view, p)
            if hold is None:
                claims.append(claim_for(view, p, active))
            else:
                holds.append(hold)
            continue
        since = view.waiting.get(p)
        if since is not None and view.now - since >= timeout:
            reason = f"{holder.owner_id} did not hand over within {timeout:g}s"
            claims.append(Claim(p, EventKind.STEAL, holder, reason))
        else:
            waiting.append(p)
    recheck = min(holds, default=None)
    return Plan(claims=tuple(claims), releases=releases, waiting=tuple(waiting), recheck_in=recheck)


STRATEGY = Strategy(
    name="cooperative",
    plan=plan,
    store_clock=True,
    uses_members=True,
    settles=True,
    summary="default: shared deterministic assignment, heartbeats, store clock, cooperative handoff",
)
