"""What an operator asked for, why it may be refused, and the dry run shown before it is applied."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# A refusal's HTTP status by code: bad input is the caller's to fix (400); the rest conflict with
# the fleet as it is now (409: already draining, owned, last worker, ...).
BAD_INPUT = frozenset({"bad_request", "unknown_worker", "unknown_partition"})

# Where the strategy a preview plans with comes from (``Preview.strategy_source``), said in words.
STRATEGY_SOURCES = {
    "workers": "the strategy the live workers' heartbeats name",
    "settings": "LEASEBOARD_STRATEGY: no live worker names its strategy",
    "default": "the default strategy: no live worker names one and LEASEBOARD_STRATEGY is unset",
}


def storable(text: str) -> bool:
    """Whether ``text`` can be stored and read back by every database here: no NUL (PostgreSQL refuses
    it in any string) and no unpaired surrogate (no UTF-8 encoder takes one; JSON's ``"\\ud800"``
    gives one)."""
    return "\x00" not in text and not any("\ud800" <= c <= "\udfff" for c in text)


class Refused(Exception):
    """The action cannot be done as asked; ``message`` says why in one sentence, ``code`` names the rule."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def http_status(self) -> int:
        return 400 if self.code in BAD_INPUT else 409


@dataclass(frozen=True, slots=True)
class Request:
    """What an operator asked for. ``target``: the worker or partition; ``value``: the worker to pin to,
    or where to reset (earliest, latest, a sequence number, an ISO 8601 time). Parsed and checked
    against its action's arguments by ``registry.parse``."""

    action: str
    target: str = ""
    value: str = ""
    reason: str = ""
    force: bool = False  # reset a partition a worker owns
    confirm_last: bool = False  # drain the last live worker

    def describe(self) -> str:
        args = " ".join(a for a in (self.target, self.value) if a)
        return f"{self.action} {args}".strip()


@dataclass(frozen=True, slots=True)
class Move:
    partition_id: str
    before: str | None  # who holds it now (None: nobody)
    after: str | None  # who will hold it (None: nobody, or not predictable: see ``after_known``)
    caused: bool  # because of this action (False: already on its way)
    after_known: bool = True  # False: decided by a race between the live workers (the ``race`` strategy)


@dataclass
class Preview:
    """The dry run of a request: what it would change, and what the planner assumed."""

    request: Request
    summary: str
    moves: list[Move] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    needs_confirmation: bool = False  # draining the last live worker
    checkpoint: dict[str, Any] | None = None
    strategy: str | None = None  # the strategy the moves were planned with (None: the action plans no moves)
    strategy_source: str | None = None  # "workers" (their heartbeats), "settings" or "default"
    effect: object = field(default=None, compare=False)  # what applying needs of the dry run (a reset's target)

    @property
    def strategy_basis(self) -> str | None:
        return STRATEGY_SOURCES.get(self.strategy_source or "")

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
            "strategy": self.strategy,
            "strategy_source": self.strategy_source,
            "strategy_basis": self.strategy_basis,
        }
