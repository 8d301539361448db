"""The ``replayinplace`` action: a partition's dead letters (all, or the sequence numbers named)
handed to the handler of the worker that owns the partition, not sent to the hub again.

The console writes a request beside the dead-letter files and marks each dead letter pending
(``workers.deadletter.inplace``), then wakes the workers: the owner's next cycle finds the request
and its pump hands each dead letter, with the property ``leaseboard-replayed-from``, to the
handler between two reads while its lease holds (``workers.runtime.inplace``); the page shows each
one's outcome. The same refusals as ``replay``: a dead letter replayed (either way) or pending
already is refused unless forced, and "all" leaves those out.
"""

from __future__ import annotations

import asyncio

from workers.deadletter.inplace import request
from workers.deadletter.replay import REPLAYED_FROM, AlreadyReplayed, describe

from .action import Action, Context, Done
from .deadletters import PARTITION, SELECTION, choose, folder_of, numbers, plural
from .request import Preview, Refused


def _owner(ctx: Context) -> str | None:
    record = ctx.fleet.active.get(ctx.request.target)
    return record.owner_id if record is not None and record.owner_id else None


async def preview(ctx: Context) -> Preview:
    pid = ctx.request.target
    chosen = await choose(ctx)
    owner = _owner(ctx)
    who = f"worker {owner}, which owns partition {pid}" if owner else f"the next owner of partition {pid} (none now)"
    summary = (
        f"replay {plural(len(chosen.sending))} of partition {pid} ({numbers(chosen.sending)}) in place: each is "
        f"handed to the handler of {who}, not sent to the hub, with the property {REPLAYED_FROM} = "
        f'"{pid}:<its sequence number>"'
    )
    shown = Preview(ctx.request, summary, effect=chosen.sending)
    shown.notes += [f"forced: {describe(m)}; it is handed over once more" for m in chosen.forced] + chosen.notes
    shown.notes += [
        "each keeps its own sequence number and the checkpoint does not move: a handler that skips what it has "
        "seen skips it too (replay to the hub then)",
        "each is marked once its handler call returns, or marked failed with the error (it is not retried "
        "nor set aside again); a worker that loses the partition half way leaves the rest to the next owner",
    ]
    return shown


async def write(ctx: Context, shown: Preview) -> Done:
    sequences, ref, pid = shown.effect, ctx.fleet.ref, ctx.request.target
    assert isinstance(sequences, list)
    folder, force = folder_of(ref.hub), ctx.request.force
    try:
        asked = await asyncio.to_thread(request, folder, ref.consumer_group, pid, sequences, user=ctx.user, force=force)
    except AlreadyReplayed as exc:  # since the preview, by someone else
        raise Refused("already_replayed", f"{exc}: force to replay again") from None
    owner = _owner(ctx) or "its next owner"
    return Done(
        f"asked {owner} to hand {plural(len(sequences))} of partition {pid} to its handler in place "
        f"(request {asked.id})"
    )


REPLAYINPLACE = Action(
    "replayinplace",
    "Hands a partition's dead letters (all, or the sequence numbers named) to the handler of the worker that owns "
    "it, without sending them to the hub.",
    "Replay dead letters of partition {target} in place",
    preview,
    write,
    target=PARTITION,
    value=SELECTION,
    force="replay dead letters that were replayed already",
)
