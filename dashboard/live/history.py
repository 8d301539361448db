"""Rebalances over time, derived from the event log. Pure: event dicts in, episodes out.

A rebalance (an *episode*) is a run of ownership changes with no pause longer than ``quiet``
seconds between two of them; it starts with its first change and is balanced, as far as the log
can tell, at its last. For each: when it started, what set it off (an operator's drain or pin
just before it, else its first change), how many partitions moved from one worker to another,
how many were claimed by a first owner, how long it took, and whether the owners' counts ended
within one of each other with every known partition owned.

Times are the store's clock, which every reporter stamps its events with (``BalancerEvent.at``), so a
worker whose own clock is off cannot move an episode; events are taken in id order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

OWNERSHIP = ("claim", "expire", "steal", "release", "lost")
GAINS = ("claim", "expire", "steal")
OPERATOR = ("drain", "undrain", "pin", "unpin")


@dataclass
class Episode:
    started: float
    ended: float
    first_id: int
    last_id: int
    trigger: str
    moves: int = 0  # partitions that went from one worker to another
    claims: int = 0  # partitions taken by a first owner (never owned before, as far as the log shows)
    kinds: Counter[str] = field(default_factory=Counter)
    partitions: set[str] = field(default_factory=set)
    workers: set[str] = field(default_factory=set)
    balanced: bool | None = None
    counts: dict[str, int] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "started": self.started,
            "ended": self.ended,
            "seconds": round(self.ended - self.started, 3),
            "first_id": self.first_id,
            "last_id": self.last_id,
            "trigger": self.trigger,
            "moves": self.moves,
            "claims": self.claims,
            "events": sum(self.kinds.values()),
            "kinds": dict(sorted(self.kinds.items())),
            "partitions": len(self.partitions),
            "workers": sorted(self.workers),
            "balanced": self.balanced,
            "counts": dict(sorted(self.counts.items())),
        }


def _trigger(event: Mapping[str, Any], operator: Mapping[str, Any] | None) -> str:
    if operator is not None:
        return f"{operator['kind']}: {operator['reason']}"
    kind, reason = event["kind"], event.get("reason") or ""
    who = event.get("previous_owner") or event.get("owner_id") or "?"
    if kind == "expire":
        return f"{event.get('previous_owner') or 'a worker'} stopped renewing: {reason}"
    if kind == "claim" and reason == "never owned":
        return "cold start: partitions never owned"
    if kind == "claim" and reason == "released":
        return f"{event.get('owner_id') or 'a worker'} took partitions others had released"
    if kind == "release" and reason.startswith("shutting down"):
        return f"{who} shut down"
    if kind == "release":
        return f"{who} handed partitions off ({reason})"
    return f"{kind} by {event.get('reporter') or who}: {reason}"


def _balanced(owners: Mapping[str, str | None], partitions: int | None) -> tuple[bool | None, dict[str, int]]:
    counts = Counter(o for o in owners.values() if o)
    if not counts:
        return (None if partitions is None else partitions == 0), {}
    unowned = (partitions - sum(counts.values())) if partitions is not None else 0
    even = max(counts.values()) - min(counts.values()) <= 1
    return unowned <= 0 and even, dict(counts)


def episodes(events: Iterable[Mapping[str, Any]], quiet: float, partitions: int | None = None) -> list[Episode]:
    """The episodes of ``events`` (id order), oldest first; ``partitions`` is the hub's count, if known."""
    owners: dict[str, str | None] = {}
    holders: dict[str, str] = {}  # the last worker known to hold each partition
    found: list[Episode] = []
    current: Episode | None = None
    operator: Mapping[str, Any] | None = None
    for event in events:
        kind, at = event["kind"], float(event["at"])
        if kind in OPERATOR:
            operator = event
            continue
        if kind not in OWNERSHIP:
            continue
        pid = str(event["partition_id"])
        if current is None or at - current.ended > quiet:
            if current is not None:
                current.balanced, current.counts = _balanced(owners, partitions)
            near = operator if operator is not None and at - float(operator["at"]) <= quiet else None
            current = Episode(at, at, int(event["id"]), int(event["id"]), _trigger(event, near))
            found.append(current)
            operator = None
        current.ended = max(current.ended, at)
        current.last_id = int(event["id"])
        current.kinds[event.get("category") or kind] += 1
        current.partitions.add(pid)
        for who in (event.get("owner_id"), event.get("previous_owner")):
            if who:
                current.workers.add(str(who))
        new_owner = event.get("owner_id")
        if kind in GAINS and new_owner:
            before = holders.get(pid)
            if before is None:
                current.claims += 1
            elif before != new_owner:
                current.moves += 1
            holders[pid] = str(new_owner)
            owners[pid] = str(new_owner)
        elif kind == "release" and owners.get(pid) in (event.get("previous_owner"), None):
            owners[pid] = None
        elif kind == "lost":
            owners[pid] = str(new_owner) if new_owner else None
            if new_owner:
                holders[pid] = str(new_owner)
    if current is not None:
        current.balanced, current.counts = _balanced(owners, partitions)
    return found


def ownership_timeline(events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One partition's owners, oldest first: who, from when, how it came to them, until when and why it left.

    ``events`` are that partition's events in id order. A release or loss ends a holding; a gain
    starts one (ending the previous holder's, if no release was seen: a steal or an expiry), and so
    does a loss that names who holds it now (a record written by no worker of the fleet, a phantom,
    shows as held by it until a worker takes it back).
    """
    spans: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for event in events:
        kind, at = event["kind"], float(event["at"])
        if kind in GAINS and event.get("owner_id"):
            if current is not None and current["until"] is None:
                current.update(until=at, ended=kind, ended_reason=event.get("reason") or "")
            current = _span(event, at, event["owner_id"])
            spans.append(current)
        elif (
            kind in ("release", "lost")
            and current is not None
            and current["until"] is None
            and event.get("previous_owner") in (None, current["owner"])
        ):
            current.update(until=at, ended=event.get("category") or kind, ended_reason=event.get("reason") or "")
            holder = event.get("owner_id")
            if kind == "lost" and holder and holder != current["owner"]:
                current = _span(event, at, holder)
                spans.append(current)
    return spans


def _span(event: Mapping[str, Any], at: float, owner: str) -> dict[str, Any]:
    """A holding of ``owner`` that ``event`` (a gain, or a loss naming the new holder) started."""
    return {
        "owner": owner,
        "since": at,
        "came": event.get("category") or event["kind"],
        "came_reason": event.get("reason") or "",
        "from": event.get("previous_owner"),
        "until": None,
        "ended": None,
        "ended_reason": None,
        "event_id": event.get("id"),
    }


def checkpoint_history(samples: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The checkpoint's moves, oldest first, from lag samples: each new sequence number once, when it
    was written, by whom (the owner then), how far it moved (negative: it went back)."""
    out: list[dict[str, Any]] = []
    last: int | None = None
    for sample in samples:
        sequence = sample.get("sequence_number")
        if sequence is None or sequence == last:
            continue
        out.append(
            {
                "sequence_number": sequence,
                "at": sample.get("checkpoint_modified") or sample["at"],
                "owner": sample.get("owner"),
                "moved": None if last is None else sequence - last,
            }
        )
        last = sequence
    return out
