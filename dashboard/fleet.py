"""What an operator action is about: the request, the fleet as the store and source show it, the dry run.

Shared by ``actions.py`` (the entry points and the plain control records) and ``resets.py``
(checkpoint resets). ``Fleet.view`` is the planning view any live worker would have, so a dry run
is ``balancer.strategies.cooperative.assign`` over it, as the workers compute it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from balancer.model import Checkpoint, Controls, HubRef, Member, OwnershipRecord
from balancer.strategies.base import View
from workers.wiring import Stores

from .state import with_source

ACTIONS = ("drain", "undrain", "pin", "unpin", "rebalance", "resetcheckpoint", "purge")


class Refused(Exception):
    """The action cannot be done as asked; ``message`` says why in one sentence."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class Request:
    """What an operator asked for. ``target``: the worker or partition; ``value``: the worker to pin to,
    or where to reset (earliest, latest, a sequence number, an ISO 8601 time)."""

    action: str
    target: str = ""
    value: str = ""
    reason: str = ""
    force: bool = False  # reset a partition a worker owns
    confirm_last: bool = False  # drain the last live worker

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> Request:
        """A request from a JSON body or form; Refused("bad_request") when it is malformed."""
        action = str(data.get("action") or "")
        if action not in ACTIONS:
            raise Refused("bad_request", f"unknown action {action!r}; choose one of: {', '.join(ACTIONS)}")
        fields = {k: str(data.get(k) or "").strip() for k in ("target", "value", "reason")}
        if any(len(v) > 1000 for v in fields.values()):
            raise Refused("bad_request", "target, value and reason are at most 1000 characters each")
        def flag(name: str) -> bool:
            return data.get(name) in (True, "true", "on", "1", 1)

        return cls(action, fields["target"], fields["value"], fields["reason"], flag("force"), flag("confirm_last"))

    def describe(self) -> str:
        args = " ".join(a for a in (self.target, self.value) if a)
        return f"{self.action} {args}".strip()


@dataclass(frozen=True, slots=True)
class Move:
    partition_id: str
    before: str | None  # who holds it now (None: nobody)
    after: str | None  # who will hold it (None: nobody)
    caused: bool  # because of this action (False: already on its way)


@dataclass
class Preview:
    request: Request
    summary: str
    moves: list[Move] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    needs_confirmation: bool = False  # draining the last live worker
    checkpoint: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "action": self.request.action,
            "target": self.request.target,
            "value": self.request.value,
            "summary": self.summary,
            "moves": [asdict(m) for m in self.moves],
            "notes": self.notes,
            "needs_confirmation": self.needs_confirmation,
            "checkpoint": self.checkpoint,
        }


@dataclass(frozen=True)
class Fleet:
    """What the store and the source say now."""

    ref: HubRef
    now: float
    expiry: float
    partition_ids: tuple[str, ...]
    records: dict[str, OwnershipRecord]
    members: dict[str, Member]
    drained: frozenset[str]
    pins: dict[str, str]
    checkpoints: dict[str, Checkpoint]

    @property
    def active(self) -> dict[str, OwnershipRecord]:
        return {p: r for p, r in self.records.items() if not r.expired(self.now, self.expiry)}

    @property
    def alive(self) -> frozenset[str]:
        return frozenset(w for w, m in self.members.items() if m.alive(self.now, self.expiry))

    def known_workers(self) -> set[str]:
        return set(self.members) | {r.owner_id for r in self.active.values()} | set(self.drained)

    def view(self, drained: frozenset[str], pins: Mapping[str, str]) -> View | None:
        """The planning view any live worker would have, with ``drained`` and ``pins`` in force."""
        holders = {r.owner_id for r in self.active.values()}
        candidates = sorted((self.alive | holders) - drained)
        if not candidates:
            return None
        return View(
            candidates[0], self.partition_ids, self.records, self.now, self.expiry,
            members=self.alive, drained=drained, pins=dict(pins),
        )  # fmt: skip


async def read_fleet(ref: HubRef, stores: Stores, expiry: float) -> Fleet:
    """The fleet of ``ref`` now. Raises the store's error when it cannot be read."""
    now = await stores.ownership.now()
    records = {r.partition_id: r for r in await stores.ownership.list_ownership(ref)}
    checkpoints = {c.partition_id: c for c in await stores.checkpoints.list_checkpoints(ref)}
    listed = await stores.controls.list_members(ref)
    controls = await stores.controls.list_controls(ref)
    ids = await asyncio.to_thread(with_source, ref.hub, lambda source: tuple(source.partition_ids()))
    if ids is None:  # no source to ask: the partitions the store knows of
        ids = tuple(sorted(set(records) | set(checkpoints), key=pid_key))
    standing = Controls.of(controls)
    return Fleet(
        ref, now, expiry, ids, records, {m.owner_id: m for m in listed},
        standing.drained, dict(standing.pins), checkpoints,
    )  # fmt: skip


def pid_key(pid: str) -> tuple[int, str]:
    return (int(pid), pid) if pid.isdigit() else (1 << 62, pid)


def check_partition(fleet: Fleet, partition: str) -> str:
    """``partition`` if the hub has it; Refused otherwise."""
    if not partition:
        raise Refused("bad_request", "name the partition")
    if partition not in fleet.partition_ids:
        span = f"{fleet.partition_ids[0]}..{fleet.partition_ids[-1]}" if fleet.partition_ids else "none"
        raise Refused("unknown_partition", f"unknown partition {partition!r}; the hub's partitions are {span}")
    return partition

