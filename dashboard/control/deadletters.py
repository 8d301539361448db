"""The dead-letter actions: ``replay`` sends a partition's dead letters (all, or the sequence numbers
named) to the hub again, ``purgedeadletters`` removes them from its dead-letter file.

Both act on the dead letters of the request's consumer group only (one file holds every group's).
A replay sends each event to the partition it came from with ``leaseboard-replayed-from`` =
``"<partition>:<sequence number>"`` (``workers.deadletter.replay``), through the configured source:
the embedded hub, or Event Hubs with the SDK's producer. Replaying twice: a dead letter named
again is refused, saying when it was replayed, unless forced; "all" leaves the replayed ones out
and says which. The marks are checked again under a lock when applying, so two operators
replaying at once send each event once.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from workers.deadletter import files
from workers.deadletter.files import Entry
from workers.deadletter.replay import (
    REPLAYED_FROM,
    AlreadyReplayed,
    EmbeddedSender,
    EventHubsSender,
    Letter,
    describe,
    replay,
)
from workers.hub.embedded import EmbeddedHub
from workers.sources.base import EventSource

from ..live.state import with_source
from .action import Action, Argument, Context, Done, Kind
from .fleet import ALL
from .request import Preview, Refused

REPLAY_MAX = 1000  # dead letters one replay sends at most ("all" of a bigger partition: replay again)
LISTED = 20  # sequence numbers named in a summary; the rest are counted
PARTITION = Argument(Kind.PARTITION, "the partition id")
SELECTION = Argument(Kind.SELECTION, "which dead letters: all, or sequence numbers separated by commas")


def folder_of(hub: str) -> Path:
    return files.folder_of(Path(settings.LEASEBOARD_DEADLETTER_DIR), hub)


def numbers(sequences: list[int]) -> str:
    """``"sequence numbers 3, 7"``, the first LISTED named and the rest counted."""
    named = ", ".join(str(n) for n in sequences[:LISTED])
    rest = f" and {len(sequences) - LISTED} more" if len(sequences) > LISTED else ""
    return f"sequence number{'s' if len(sequences) != 1 else ''} {named}{rest}"


def plural(count: int, word: str = "dead letter") -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


@dataclass(frozen=True)
class Found:
    letters: dict[int, Entry]  # the partition's dead letters of the group, by sequence number
    marks: dict[int, Entry]  # their replays, by sequence number


async def _read(ctx: Context) -> Found:
    folder, pid, group = folder_of(ctx.fleet.ref.hub), ctx.request.target, ctx.fleet.ref.consumer_group

    def read() -> Found:
        return Found(files.read_letters(folder, pid, group), files.read_markers(folder, pid, group))

    return await asyncio.to_thread(read)


def _select(ctx: Context, found: Found) -> list[int]:
    """The sequence numbers the request names, in order; Refused when there are none or one is unknown."""
    pid, selection = ctx.request.target, ctx.request.value
    if not found.letters:
        group = ctx.fleet.ref.consumer_group
        raise Refused("no_change", f"partition {pid} has no dead letter of consumer group {group}")
    if selection == ALL:
        return sorted(found.letters)
    wanted = [int(n) for n in selection.split(",")]
    missing = [n for n in wanted if n not in found.letters]
    if missing:
        raise Refused("bad_request", f"partition {pid} has no dead letter with {numbers(missing)}")
    return wanted


# --- replay --------------------------------------------------------------------------------------


def _destination(hub: str) -> str:
    """Where a replay of ``hub`` goes, in words; Refused when it cannot go anywhere. Blocking."""
    name = settings.LEASEBOARD_SOURCE
    if name == "eventhubs":
        if not settings.EVENTHUB_CONNECTION_STRING:
            raise Refused("no_source", "EVENTHUB_CONNECTION_STRING is not set: there is no hub to send to")
        return f"Event Hubs hub {hub!r}"
    if name != "embedded":
        raise Refused("unsupported", f"replaying to the {name!r} source is not supported")
    if with_source(hub, lambda source: isinstance(source, EmbeddedHub)) is not True:
        raise Refused("no_source", f"the embedded hub {hub!r} does not exist")
    return f"the embedded hub {hub!r}"


@dataclass(frozen=True)
class Chosen:
    sending: list[int]  # at most REPLAY_MAX, in order
    letters: list[Letter]
    forced: list[Entry]  # the markers of those replayed before and named again, forced
    notes: list[str]  # what was left out and why


async def choose(ctx: Context) -> Chosen:
    """The dead letters a replay (either kind) sends; Refused when it would send none, or one again
    unforced."""
    pid, force = ctx.request.target, ctx.request.force
    found = await _read(ctx)
    chosen = _select(ctx, found)
    before = [n for n in chosen if n in found.marks]
    notes: list[str] = []
    if before and not force:
        if ctx.request.value != ALL:
            said = "; ".join(describe(found.marks[n]) for n in before[:LISTED])
            raise Refused("already_replayed", f"{said}: force to replay again")
        notes.append(f"left out, replayed already: {numbers(before)} (force to replay them again)")
        chosen = [n for n in chosen if n not in found.marks]
        if not chosen:
            raise Refused(
                "no_change", f"every dead letter of partition {pid} was replayed already: force to replay again"
            )
    sending, more = chosen[:REPLAY_MAX], len(chosen) - REPLAY_MAX
    if more > 0:
        notes.append(f"{plural(more)} more after these: at most {REPLAY_MAX} a replay, replay again")
    try:
        letters = [Letter.of(found.letters[n]) for n in sending]
    except ValueError as exc:
        raise Refused("bad_request", str(exc)) from None
    forced = [found.marks[n] for n in sending if n in found.marks]
    return Chosen(sending, letters, forced, notes)


async def replay_preview(ctx: Context) -> Preview:
    pid = ctx.request.target
    chosen = await choose(ctx)
    target = await asyncio.to_thread(_destination, ctx.fleet.ref.hub)
    summary = (
        f"replay {plural(len(chosen.sending))} of partition {pid} ({numbers(chosen.sending)}) to {target}: each is "
        f'sent again to partition {pid} with the property {REPLAYED_FROM} = "{pid}:<its sequence number>"'
    )
    preview = Preview(ctx.request, summary, effect=chosen.letters)
    preview.notes += [f"forced: {describe(m)}; it is sent once more" for m in chosen.forced] + chosen.notes
    preview.notes.append(
        "the workers handle them as new events; the dead letters stay listed, marked replayed, until purged"
    )
    return preview


def _send(hub: str, group: str, letters: list[Letter], user: str, force: bool) -> list[Entry]:
    folder = folder_of(hub)
    if settings.LEASEBOARD_SOURCE == "eventhubs":
        sender = EventHubsSender(settings.EVENTHUB_CONNECTION_STRING, hub)
        try:
            return replay(folder, group, letters, sender, user=user, force=force)
        finally:
            sender.close()

    def send(source: EventSource) -> list[Entry] | None:
        if not isinstance(source, EmbeddedHub):
            return None
        return replay(folder, group, letters, EmbeddedSender(source), user=user, force=force)

    marks = with_source(hub, send)
    if marks is None:
        raise Refused("no_source", f"the embedded hub {hub!r} cannot be opened")
    return marks


async def replay_write(ctx: Context, shown: Preview) -> Done:
    letters, ref, pid = shown.effect, ctx.fleet.ref, ctx.request.target
    assert isinstance(letters, list)
    try:
        marks = await asyncio.to_thread(_send, ref.hub, ref.consumer_group, letters, ctx.user, ctx.request.force)
    except AlreadyReplayed as exc:  # since the preview, by someone else
        raise Refused("already_replayed", f"{exc}: force to replay again") from None
    sent = [str(m["to"]) for m in marks if m["to"]]
    as_what = f" as {', '.join(sent[:LISTED])}{' ...' if len(sent) > LISTED else ''}" if sent else ""
    return Done(f"replayed {plural(len(marks))} of partition {pid}{as_what}", wake=False)


# --- purge ---------------------------------------------------------------------------------------


async def purge_preview(ctx: Context) -> Preview:
    pid, group = ctx.request.target, ctx.fleet.ref.consumer_group
    found = await _read(ctx)
    chosen = _select(ctx, found)
    summary = (
        f"purge {plural(len(chosen))} of partition {pid} ({numbers(chosen)}), consumer group {group}: removed from "
        "the dead-letter file"
    )
    preview = Preview(ctx.request, summary, effect=frozenset(chosen))
    never = [n for n in chosen if n not in found.marks]
    if never:
        preview.notes.append(f"never replayed: {numbers(never)}; once purged they cannot be replayed")
    again = len(chosen) - len(never)
    if again:
        preview.notes.append(f"{again} of them {'was' if again == 1 else 'were'} replayed before")
    if ctx.request.value == ALL:
        preview.notes.append("dead letters set aside after this preview are kept")
    return preview


async def purge_write(ctx: Context, shown: Preview) -> Done:
    chosen, pid, group = shown.effect, ctx.request.target, ctx.fleet.ref.consumer_group
    assert isinstance(chosen, frozenset)

    def drop(entry: Entry) -> bool:
        return entry.get("consumer_group") == group and files.sequence_of(entry) in chosen

    removed = await asyncio.to_thread(files.purge, folder_of(ctx.fleet.ref.hub), pid, drop)
    return Done(f"purged {plural(len(chosen))} of partition {pid} ({plural(removed, 'line')} removed)", wake=False)


REPLAY = Action(
    "replay",
    "Sends a partition's dead letters (all, or the sequence numbers named) to the hub again, each with a property "
    "naming where it was.",
    "Replay dead letters of partition {target}",
    replay_preview,
    replay_write,
    target=PARTITION,
    value=SELECTION,
    force="replay dead letters that were replayed already",
)
PURGEDEADLETTERS = Action(
    "purgedeadletters",
    "Removes a partition's dead letters (all, or the sequence numbers named) from its dead-letter file.",
    "Purge dead letters of partition {target}",
    purge_preview,
    purge_write,
    target=PARTITION,
    value=SELECTION,
)
