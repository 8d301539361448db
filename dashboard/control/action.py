"""What an admin action is: its arguments and how each is checked, its dry run, what it writes.

An ``Action`` is declared once (``records.py``, ``resets.py``) and listed in ``registry.py``; the
views, the management commands, the page's dialog, the audit and the metrics iterate over the
registry. ``preview(ctx)`` checks what the arguments cannot (already draining, owned, ...) and
returns the dry run; ``write(ctx, preview)`` does it and says what was done.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from balancer.model import BalancerEvent, EventKind
from balancer.strategies import RACE, get_strategy
from workers.wiring import Stores

from .fleet import Fleet, FleetStrategy, check_partition, check_selection, check_worker
from .forecast import describe, plan_moves, race_moves
from .request import Preview, Refused, Request


class Kind(StrEnum):
    """What an argument names, which says how it is checked and how the page asks for it."""

    WORKER = "worker"  # a worker the fleet knows (heartbeat, lease or drain record)
    PARTITION = "partition"  # a partition of the hub
    POSITION = "position"  # where to reset a checkpoint: earliest, latest, a sequence number, a time
    SELECTION = "selection"  # which dead letters: "all", or sequence numbers separated by commas


@dataclass(frozen=True)
class Argument:
    kind: Kind
    help: str  # the command's help for it, and the page's label
    option: str = ""  # a command-line option ("--to") rather than a positional argument

    @property
    def metavar(self) -> str:
        return self.kind.value.upper()

    def check(self, fleet: Fleet, raw: str) -> str:
        """``raw`` if it names what it should; Refused ("bad_request", "unknown_…") saying what is wrong."""
        if self.kind is Kind.WORKER:
            return check_worker(fleet, raw)
        if self.kind is Kind.PARTITION:
            return check_partition(fleet, raw)
        if self.kind is Kind.SELECTION:
            return check_selection(raw)
        if not raw:
            raise Refused("bad_request", f"say {self.help}")
        return raw


@dataclass(frozen=True)
class Done:
    """What applying did: the audit's message, the event for the feed, and whether to wake the workers."""

    message: str
    event: BalancerEvent | None = None
    wake: bool = True
    token: str = ""  # a rebalance's token, sent with the wake-up


@dataclass
class Context:
    """One request against the fleet as read now, with what planning needs."""

    fleet: Fleet
    request: Request
    stores: Stores
    strategy: FleetStrategy
    interval: float  # the workers' cycle interval, the forecast's time step
    user: str = ""

    def event(self, kind: EventKind, pid: str, after: str | None, before: str | None, why: str) -> BalancerEvent:
        """The feed's record of this action (reported by ``dashboard:<user>``, with the reason), stamped
        with the store's clock as the fleet was read, as the workers stamp theirs."""
        return BalancerEvent(
            kind,
            self.fleet.ref,
            pid,
            after,
            before,
            f"dashboard:{self.user}",
            f"{why}: {self.request.reason}",
            self.fleet.now,
        )

    async def planned(
        self, verb: str, drained: frozenset[str], pins: Mapping[str, str], all_caused: bool = False
    ) -> Preview:
        """The dry run of putting ``drained`` and ``pins`` in force, planned with the fleet's strategy
        (on a thread: a big fleet's forecast is CPU work the event loop should not wait for)."""
        fleet, name = self.fleet, self.strategy.name
        strategy = get_strategy(name)
        notes = list(self.strategy.notes)
        changes_controls = drained != fleet.drained or dict(pins) != fleet.pins
        if strategy is RACE:
            moves = race_moves(fleet, drained, pins) if not all_caused else []
            notes.append(
                "race: who takes a freed partition is decided by a race between the live workers; the preview "
                "shows what is certain, not the winners"
            )
        else:
            forecast = await asyncio.to_thread(plan_moves, strategy, fleet, drained, pins, self.interval, all_caused)
            moves = forecast.moves
            if not forecast.outcome.settled:
                rounds = forecast.outcome.rounds
                notes.append(f"{name} had not settled after {rounds} cycles: this is where it was then")
            if changes_controls and not strategy.uses_members:
                notes.append(
                    f"{name} does not read drain and pin records: the record is written, but workers running {name} "
                    "do not act on it (cooperative and race do)"
                )
            elif forecast.random:
                notes.append(f"{name} makes random choices: which partitions move is one likely outcome")
        return Preview(
            self.request, describe(verb, moves), moves, notes, strategy=name, strategy_source=self.strategy.source
        )


Previewer = Callable[[Context], Awaitable[Preview]]
Writer = Callable[[Context, Preview], Awaitable[Done]]


@dataclass(frozen=True)
class Action:
    """One admin action, declared once: the registry gives it to the views, the commands, the page and the audit."""

    name: str
    help: str  # one sentence: the command's help and the dialog's introduction
    title: str  # the dialog's title; "{target}" is replaced by the target
    preview: Previewer
    write: Writer
    target: Argument | None = None  # None: the action has no target (``fixed_target`` is used)
    value: Argument | None = None
    force: str = ""  # the help of its --force flag ("": none)
    fixed_target: str = ""

    def check(self, fleet: Fleet, request: Request) -> Request:
        """``request`` with its arguments checked against the fleet; Refused naming what is wrong."""
        target = self.target.check(fleet, request.target) if self.target is not None else self.fixed_target
        value = self.value.check(fleet, request.value) if self.value is not None else ""
        return replace(request, target=target, value=value, force=request.force and bool(self.force))

    def catalogue(self) -> dict[str, Any]:
        """What the page's dialog needs to ask for this action (JSON)."""

        def arg(a: Argument | None) -> dict[str, str] | None:
            return None if a is None else {"kind": a.kind.value, "help": a.help}

        return {
            "name": self.name,
            "title": self.title,
            "help": self.help,
            "target": arg(self.target),
            "value": arg(self.value),
            "force": self.force,
            "fixed_target": self.fixed_target,
        }
