"""The data model shared by every part of Leaseboard.

Records are frozen dataclasses: the store hands them out, planning reads them, nobody mutates
them. Times are float seconds since the Unix epoch as the *store* reported them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

_PARTITION_ID = re.compile(r"0|[1-9][0-9]{0,5}")


@dataclass(frozen=True, slots=True)
class HubRef:
    """One hub and consumer group: the scope of every store call."""

    namespace: str
    hub: str
    consumer_group: str

    def __post_init__(self) -> None:
        for name in ("namespace", "hub", "consumer_group"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value or "/" in value:
                raise ValueError(f"{name} must be a non-empty string without '/', got {value!r}")


def check_partition_id(partition_id: str) -> str:
    """Return ``partition_id`` if it is a decimal id ("0".."999999"); raise ValueError otherwise."""
    if not isinstance(partition_id, str) or not _PARTITION_ID.fullmatch(partition_id):
        raise ValueError(f"partition id must be a decimal string like '0', got {partition_id!r}")
    return partition_id


def partition_ids(count: int) -> tuple[str, ...]:
    """The ids "0".."count-1" of a hub with ``count`` partitions."""
    if count < 1:
        raise ValueError(f"a hub has at least one partition, got {count}")
    return tuple(str(i) for i in range(count))


@dataclass(frozen=True, slots=True)
class OwnershipRecord:
    """Who owns one partition, as the store saw it.

    ``owner_id`` is "" when the partition was released on purpose (the Azure SDK's convention).
    ``etag`` is None only in a claim for a partition that was never owned. ``last_modified`` is
    the store's clock at the last successful write.
    """

    ref: HubRef
    partition_id: str
    owner_id: str
    etag: str | None = None
    last_modified: float | None = None
    owner_level: int = 0

    def __post_init__(self) -> None:
        check_partition_id(self.partition_id)

    def expired(self, now: float, expiry: float) -> bool:
        """True when nobody renewed this record for longer than ``expiry`` seconds (or it was released).

        A last-modified time that is not a finite number was not written by a store (a hand edit,
        a corrupt row): such a record counts as expired, so its partition can be claimed. Judged
        live, it would never expire, and its owner (one that never heartbeats) would be assigned
        partitions forever that nobody ever processes.
        """
        if not self.owner_id or self.last_modified is None or not math.isfinite(self.last_modified):
            return True
        return now - self.last_modified > expiry

    def claimed_by(self, owner_id: str) -> OwnershipRecord:
        """The claim request ``owner_id`` sends to take this record, carrying the ETag seen."""
        return replace(self, owner_id=owner_id)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The position after which processing of a partition resumes.

    ``sequence_number`` is that of the last event processed; ``offset`` is the hub's offset of
    that same event (a string, as Event Hubs has it).
    """

    ref: HubRef
    partition_id: str
    sequence_number: int
    offset: str | None = None
    last_modified: float | None = None

    def __post_init__(self) -> None:
        check_partition_id(self.partition_id)
        if not isinstance(self.sequence_number, int) or self.sequence_number < 0:
            raise ValueError(f"sequence_number must be an int >= 0, got {self.sequence_number!r}")


# The owner id under which an operator's reset claims a partition and writes its checkpoint (the
# dashboard's ``resetcheckpoint``): the one writer that may move a checkpoint back.
RESET_OWNER = "leaseboard-admin"


@dataclass(frozen=True, slots=True)
class Member:
    """A worker's heartbeat: it is alive, whatever it owns (possibly nothing yet)."""

    ref: HubRef
    owner_id: str
    last_seen: float
    info: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def own(self) -> Member:
        """This member with an ``info`` of its own (stores that keep what they listed hand out copies)."""
        return Member(self.ref, self.owner_id, self.last_seen, dict(self.info))

    def alive(self, now: float, expiry: float) -> bool:
        """Heartbeat within the expiry the worker itself runs with (``info["expiry"]``, what its
        heartbeat says), else within ``expiry`` (a reader's setting, which may not be the fleet's)."""
        return now - self.last_seen <= self.expiry(expiry)

    def expiry(self, default: float) -> float:
        """The lease expiry this worker's heartbeat names, or ``default`` when it names none it can use."""
        try:
            named = float(self.info.get("expiry", ""))
        except ValueError:
            return default
        return named if math.isfinite(named) and named > 0 else default


def pid_key(partition_id: str) -> tuple[int, str]:
    """Partition ids in numeric order ("2" before "10"), any other id after them."""
    return (int(partition_id), partition_id) if partition_id.isdigit() else (1 << 62, partition_id)


def signs_of_life(members: Iterable[Member], records: Iterable[OwnershipRecord]) -> dict[str, float]:
    """Each worker's last sign of life on the store's clock: its heartbeat, or a later write of an
    ownership record naming it (a worker that holds partitions renews them instead of heartbeating).
    Only workers that have announced themselves (a member record) count: a record naming anyone else
    (a phantom, a hand edit) is no sign of a live worker."""
    signs = {m.owner_id: m.last_seen for m in members}
    for record in records:
        at = record.last_modified
        if record.owner_id in signs and at is not None and math.isfinite(at) and at > signs[record.owner_id]:
            signs[record.owner_id] = at
    return signs


def alive_workers(members: Iterable[Member], records: Iterable[OwnershipRecord], now: float, expiry: float) -> set[str]:
    """The workers alive at ``now``: a sign of life (``signs_of_life``) within the expiry each names in
    its heartbeat (else ``expiry``)."""
    known = {m.owner_id: m for m in members}
    signs = signs_of_life(known.values(), records)
    return {w for w, at in signs.items() if now - at <= known[w].expiry(expiry)}


class ControlKind(StrEnum):
    DRAIN = "drain"
    PIN = "pin"
    REBALANCE = "rebalance"


@dataclass(frozen=True, slots=True)
class Control:
    """An operator's standing instruction, stored next to the ownership records.

    drain: ``target`` is the owner id that gives up everything and claims nothing.
    pin: ``target`` is the partition id, ``value`` the only owner id allowed to hold it.
    rebalance: ``target`` is "*", ``value`` a token; a new token makes every worker run a cycle now.
    """

    ref: HubRef
    kind: ControlKind
    target: str
    value: str = ""
    created: float | None = None


@dataclass(frozen=True, slots=True)
class Controls:
    """The drains and pins in force for one hub and consumer group: what planning and the console read
    of the control records (a rebalance token is no standing instruction and is left out)."""

    drained: frozenset[str] = frozenset()  # owner ids that give up everything and claim nothing
    pins: Mapping[str, str] = field(default_factory=dict)  # partition id -> the only owner id allowed

    @classmethod
    def of(cls, records: Iterable[Control]) -> Controls:
        """The drains and pins among ``records`` (a later pin of the same partition wins)."""
        drained: set[str] = set()
        pins: dict[str, str] = {}
        for control in records:
            if control.kind is ControlKind.DRAIN:
                drained.add(control.target)
            elif control.kind is ControlKind.PIN:
                pins[control.target] = control.value
        return cls(frozenset(drained), pins)


class EventKind(StrEnum):
    CLAIM = "claim"  # took a partition nobody held (never owned or released)
    EXPIRE = "expire"  # took a partition whose lease was not renewed in time
    STEAL = "steal"  # took a partition from a live, over-loaded owner
    RELEASE = "release"  # gave a partition up on purpose
    LOST = "lost"  # found that another worker holds a partition this one thought it owned
    HEAL = "heal"  # restarted the reader or handler of a partition stuck on it (the reason says which, why); no move
    # Operators' actions, one kind each way (partition "*" for a worker's drain):
    DRAIN = "drain"  # ``previous_owner`` is drained: it gives up everything
    UNDRAIN = "undrain"  # ``owner_id`` claims partitions again
    PIN = "pin"  # the partition is pinned to ``owner_id``
    UNPIN = "unpin"  # the partition's pin (to ``previous_owner``) is removed


@dataclass(frozen=True, slots=True)
class BalancerEvent:
    """One ownership change, as the worker that saw it reports it."""

    kind: EventKind
    ref: HubRef
    partition_id: str
    owner_id: str | None  # who holds the partition after the change (None: nobody, or unknown)
    previous_owner: str | None  # who held it before (None: nobody)
    reporter: str  # the worker that made or noticed the change
    reason: str
    at: float  # the reporter's clock
    # A RELEASE on a planned handoff (the plan moved the partition to another worker: balancing, a
    # drain, a pin, a lost race), not one of a worker shutting down. Always False for other kinds.
    handoff: bool = False

    def as_json(self) -> dict[str, object]:
        return {
            "kind": self.kind.value,
            "namespace": self.ref.namespace,
            "hub": self.ref.hub,
            "consumer_group": self.ref.consumer_group,
            "partition_id": self.partition_id,
            "owner_id": self.owner_id,
            "previous_owner": self.previous_owner,
            "reporter": self.reporter,
            "reason": self.reason,
            "at": self.at,
            "handoff": self.handoff,
        }
