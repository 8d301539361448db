"""The actions on the control records and heartbeats: drain, undrain, pin, unpin, rebalance, purge.

Each is a dry run (``…_preview``), a write (``…_write``) and its ``Action`` declaration at the end,
which ``registry.py`` lists. The dry runs plan with the fleet's own strategy (``Context.planned``).
"""

from __future__ import annotations

import secrets

from balancer.model import Control, ControlKind, EventKind

from .action import Action, Argument, Context, Done, Kind
from .request import Preview, Refused

WORKER = Argument(Kind.WORKER, "the worker's owner id")
PARTITION = Argument(Kind.PARTITION, "the partition id")


# --- drain / undrain -----------------------------------------------------------------------------


async def drain_preview(ctx: Context) -> Preview:
    fleet, worker = ctx.fleet, ctx.request.target
    if worker in fleet.drained:
        raise Refused("no_change", f"{worker} is already draining")
    preview = await ctx.planned(f"drain {worker}", fleet.drained | {worker}, fleet.pins)
    if fleet.eligible(fleet.drained) == {worker}:
        preview.needs_confirmation = True
        preview.notes.insert(
            0,
            f"{worker} is the last live worker: draining it stops all processing until a worker joins or it is "
            "undrained",
        )
    if worker not in fleet.alive:
        preview.notes.append(f"{worker} is not alive ({fleet.ago(worker)})")
    pinned = sorted(p for p, w in fleet.pins.items() if w == worker)
    if pinned:
        preview.notes.append(f"partitions pinned to {worker} ({', '.join(pinned)}) go to others while it drains")
    return preview


async def drain_write(ctx: Context, shown: Preview) -> Done:
    worker = ctx.request.target
    if shown.needs_confirmation and not ctx.request.confirm_last:
        raise Refused("last_worker", f"{shown.notes[0]}; confirm explicitly to drain it")
    await ctx.stores.controls.put_control(Control(ctx.fleet.ref, ControlKind.DRAIN, worker, ctx.user))
    return Done(f"{worker} is draining", ctx.event(EventKind.DRAIN, "*", None, worker, f"drain {worker}"))


async def undrain_preview(ctx: Context) -> Preview:
    fleet, worker = ctx.fleet, ctx.request.target
    if worker not in fleet.drained:
        raise Refused("no_change", f"{worker} is not draining")
    return await ctx.planned(f"undrain {worker}", fleet.drained - {worker}, fleet.pins)


async def undrain_write(ctx: Context, shown: Preview) -> Done:
    worker = ctx.request.target
    await ctx.stores.controls.delete_control(ctx.fleet.ref, ControlKind.DRAIN.value, worker)
    event = ctx.event(EventKind.UNDRAIN, "*", worker, None, f"undrain {worker}")
    return Done(f"{worker} is no longer draining", event)


# --- pin / unpin ---------------------------------------------------------------------------------


async def pin_preview(ctx: Context) -> Preview:
    fleet, pid, worker = ctx.fleet, ctx.request.target, ctx.request.value
    if worker in fleet.drained:
        raise Refused("drained_worker", f"cannot pin partition {pid} to {worker}: it is draining; undrain it first")
    if worker not in fleet.alive:
        raise Refused("dead_worker", f"cannot pin partition {pid} to {worker}: it is not alive ({fleet.ago(worker)})")
    if fleet.pins.get(pid) == worker:
        raise Refused("no_change", f"partition {pid} is already pinned to {worker}")
    preview = await ctx.planned(f"pin partition {pid} to {worker}", fleet.drained, {**fleet.pins, pid: worker})
    if pid in fleet.pins:
        preview.notes.append(f"replaces its pin to {fleet.pins[pid]}")
    return preview


async def pin_write(ctx: Context, shown: Preview) -> Done:
    pid, worker = ctx.request.target, ctx.request.value
    await ctx.stores.controls.put_control(Control(ctx.fleet.ref, ControlKind.PIN, pid, worker))
    event = ctx.event(EventKind.PIN, pid, worker, ctx.fleet.pins.get(pid), f"pin to {worker}")
    return Done(f"partition {pid} is pinned to {worker}", event)


async def unpin_preview(ctx: Context) -> Preview:
    fleet, pid = ctx.fleet, ctx.request.target
    if pid not in fleet.pins:
        raise Refused("no_change", f"partition {pid} is not pinned")
    pins = {p: w for p, w in fleet.pins.items() if p != pid}
    return await ctx.planned(f"unpin partition {pid} (pinned to {fleet.pins[pid]})", fleet.drained, pins)


async def unpin_write(ctx: Context, shown: Preview) -> Done:
    pid = ctx.request.target
    await ctx.stores.controls.delete_control(ctx.fleet.ref, ControlKind.PIN.value, pid)
    event = ctx.event(EventKind.UNPIN, pid, None, ctx.fleet.pins.get(pid), "unpin")
    return Done(f"partition {pid} is no longer pinned", event)


# --- rebalance -----------------------------------------------------------------------------------


async def rebalance_preview(ctx: Context) -> Preview:
    preview = await ctx.planned("rebalance now", ctx.fleet.drained, ctx.fleet.pins, all_caused=True)
    if not preview.moves:
        preview.notes.append("the fleet is settled: every worker runs a cycle now, nothing moves")
    return preview


async def rebalance_write(ctx: Context, shown: Preview) -> Done:
    token = secrets.token_hex(8)
    await ctx.stores.controls.put_control(Control(ctx.fleet.ref, ControlKind.REBALANCE, "*", token))
    return Done(f"every worker was asked to run a cycle now (token {token})", token=token)


# --- purge ---------------------------------------------------------------------------------------


async def purge_preview(ctx: Context) -> Preview:
    fleet, worker = ctx.fleet, ctx.request.target
    if worker in fleet.alive:
        raise Refused("alive_worker", f"{worker} is alive: drain it and stop it before purging it")
    held = fleet.held_by(worker)
    if held:
        raise Refused("owned", f"{worker} still holds unexpired leases on partitions {', '.join(held)}")
    preview = Preview(ctx.request, f"purge {worker}: forget its heartbeat; no partition moves")
    if worker in fleet.drained:
        preview.notes.append("its drain record is removed too")
    return preview


async def purge_write(ctx: Context, shown: Preview) -> Done:
    worker = ctx.request.target
    await ctx.stores.controls.remove_member(ctx.fleet.ref, worker)
    await ctx.stores.controls.delete_control(ctx.fleet.ref, ControlKind.DRAIN.value, worker)
    return Done(f"{worker} was forgotten", wake=False)


# --- the declarations ----------------------------------------------------------------------------

DRAIN = Action(
    "drain",
    "Drains a worker: it hands its partitions off and claims no more.",
    "Drain {target}",
    drain_preview,
    drain_write,
    target=WORKER,
)
UNDRAIN = Action(
    "undrain",
    "Ends a drain: the worker claims partitions again.",
    "Undrain {target}",
    undrain_preview,
    undrain_write,
    target=WORKER,
)
PIN = Action(
    "pin",
    "Pins a partition to a worker: only that worker may own it.",
    "Pin partition {target}",
    pin_preview,
    pin_write,
    target=PARTITION,
    value=Argument(Kind.WORKER, "the only worker allowed to own it"),
)
UNPIN = Action(
    "unpin",
    "Removes a partition's pin: any worker may own it again.",
    "Unpin partition {target}",
    unpin_preview,
    unpin_write,
    target=PARTITION,
)
REBALANCE = Action(
    "rebalance",
    "Asks every worker to run a load-balancing cycle now instead of at its next interval.",
    "Rebalance now",
    rebalance_preview,
    rebalance_write,
    fixed_target="*",
)
PURGE = Action(
    "purge",
    "Forgets a dead worker: its heartbeat and drain record are removed.",
    "Purge {target}",
    purge_preview,
    purge_write,
    target=WORKER,
)
