"""The console's event log against the store's history (issue 19, items 3 and 4).

The console (Daphne on the console host) serves the balancer events the workers reported, in
``/api/events`` (``Console.events`` reads every page over HTTP, as any outside client would):
``{"id", "kind", "partition_id", "owner_id", "previous_owner", "reporter", "reason", "at", ...}``.
``at`` is the store's clock (the won write's own last-modified, or the reporter's last reading of
the store's clock carried forward), so each change the store recorded is matched with an event of
its partition stamped within an expiry of it (the nearest, when a worker claims the same partition
twice in that time), one event each, saying what it says and with a reason that fits it:

- a tenure that starts the partition's history, or follows a release: a ``claim`` by its owner,
  reason ``never owned`` or ``released``;
- a tenure that follows another owner's lease running out: an ``expire`` by its owner naming that
  owner as ``previous_owner``, its reason saying whose lease was not renewed (or a ``steal`` from
  it, with a reason: a live owner's lease taken, its new owner fenced for one expiry);
- a release: a ``release`` by the owner that released, with a reason (``handed off``, ``shutting
  down``).

A worker reports a change once the store has taken it. A report it cannot deliver (the event log's
host, the store host, is cut off, or the worker is stopped) is kept and tried again until it goes
through (``workers.runtime.sink.EventSink``), so a cut or a stop delays a report and never loses it:
every change must be there by the end of the run. Only a change whose reporter was SIGKILLed within
an expiry after it is counted apart, not failed: the reports it still held died with it.

A tenure that follows the same owner's lapsed lease (nobody took it meanwhile; its renewal carried
the ETag it held) is no change of owner and has no event.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tests.chaos.evidence import Fault
from tests.netsplit.history import History, by_partition, clock, history_slice, tenures

GAINS = ("claim", "expire", "steal")


@dataclass(frozen=True, slots=True)
class Expected:
    partition: str
    kinds: tuple[str, ...]
    owner: str | None  # the event's owner_id (None: a release names none)
    previous: str | None  # the event's previous_owner (None: not judged)
    at: float  # store clock, for the message
    write: int  # index of the write in the partition's history
    why: str  # what the store shows


def expected_events(history: History, expiry: float) -> list[Expected]:
    """The events the store's history says the log must hold, in the order of the history."""
    out = []
    for pid, writes in by_partition(history.writes).items():
        previous = None
        for tenure in tenures(writes, expiry, history.late_ends):
            if previous is None or previous.released:
                why = "the first owner" if previous is None else f"a claim after {previous.owner} released it"
                out.append(Expected(pid, ("claim",), tenure.owner, None, tenure.start, tenure.first, why))
            elif previous.owner != tenure.owner:
                why = f"a claim after the lease of {previous.owner} ran out ({clock(previous.end)})"
                out.append(
                    Expected(pid, ("expire", "steal"), tenure.owner, previous.owner, tenure.start, tenure.first, why)
                )
            if tenure.released:
                out.append(
                    Expected(
                        pid, ("release",), None, tenure.owner, tenure.end, tenure.last, f"{tenure.owner} released it"
                    )
                )
            previous = tenure
    return out


def plausible(expected: Expected, event: Mapping[str, object]) -> bool:
    """Whether ``event``'s reason fits the change of owner ``expected`` describes."""
    reason = str(event.get("reason") or "")
    kind = event.get("kind")
    if kind == "claim":
        return reason in ("never owned", "released")
    if kind == "expire":
        return (
            expected.previous is not None
            and expected.previous in reason
            and ("not renewed" in reason or reason.startswith("corrupt record"))
        )
    return bool(reason.strip())


def _matches(expected: Expected, event: Mapping[str, object]) -> bool:
    if event.get("partition_id") != expected.partition or event.get("kind") not in expected.kinds:
        return False
    if expected.kinds == ("release",):
        return event.get("previous_owner") == expected.previous and event.get("reporter") == expected.previous
    if event.get("owner_id") != expected.owner:
        return False
    return expected.previous is None or event.get("previous_owner") == expected.previous


def _at(event: Mapping[str, object]) -> float:
    try:
        return float(event.get("at") or 0.0)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0


# The faults that lose the reports a worker has not delivered yet: those that end its process.
LOST_WITH = frozenset({"sigkill"})


def cut_off(faults: Iterable[Fault], worker: str, at: float, expiry: float, offset: float) -> Fault | None:
    """The fault that ended ``worker``'s process (``LOST_WITH``) within ``expiry`` after the
    store-clock time ``at`` (faults: monotonic + ``offset``), with the reports it had not delivered."""
    return next(
        (
            f
            for f in faults
            if f.kind in LOST_WITH
            and worker in f.victims
            and f.started + offset <= at + expiry
            and f.ended + offset >= at
        ),
        None,
    )


def unlogged(
    history: History,
    events: Iterable[Mapping[str, object]],
    expiry: float,
    faults: Iterable[Fault] = (),
    offset: float = 0.0,
) -> tuple[list[str], list[str]]:
    """Every change of owner in the store's history without its event in the console's log (or with
    an event whose reason does not fit it), each with the slice of history that shows the change;
    and, apart, the changes whose event is missing because their reporter was killed within an
    expiry after the change (``cut_off``: the reports it had not delivered died with it; these are
    counted, not failed)."""
    pending = list(events)
    used = [False] * len(pending)
    per = by_partition(history.writes)
    faults = list(faults)
    problems, excused = [], []
    for expected in expected_events(history, expiry):
        candidates = [
            i
            for i, e in enumerate(pending)
            if not used[i] and _matches(expected, e) and abs(_at(e) - expected.at) <= expiry
        ]
        fitting = sorted(
            (i for i in candidates if plausible(expected, pending[i])), key=lambda i: abs(_at(pending[i]) - expected.at)
        )
        if fitting:
            used[fitting[0]] = True
            continue
        reporter = expected.owner if expected.owner is not None else expected.previous
        cause = cut_off(faults, reporter or "", expected.at, expiry, offset) if not candidates else None
        if cause is not None:
            excused.append(
                f"partition {expected.partition}: {expected.why} at {clock(expected.at)}, reported by "
                f"{reporter}, {cause.kind} from {clock(cause.started + offset)}"
            )
            continue
        writes = per[expected.partition]
        lines = history_slice(writes, expected.write, expected.write, expected.write, writes[0].at)
        seen = "; ".join(f"{pending[i].get('kind')} {pending[i].get('reason')!r}" for i in candidates[:3])
        problems.append(
            f"event log: partition {expected.partition}: {expected.why} at {clock(expected.at)} (store clock), "
            f"and the console's log has no {'/'.join(expected.kinds)} event for it with a reason that fits"
            f"{f' (found: {seen})' if seen else ''}. The store's history:\n" + "\n".join(lines)
        )
    return problems, excused


def taken_after_expiry(events: Iterable[Mapping[str, object]], owner: str, held: Iterable[str]) -> list[str]:
    """The partitions of ``held`` (what a cut-off ``owner`` held) that ``events`` (the log since the
    cut) do not show as expired from ``owner`` and claimed by another worker, with a reason naming it."""
    found = list(events)
    problems = []
    for pid in sorted(held):
        mine = [e for e in found if e.get("partition_id") == pid]
        if not any(
            e.get("kind") == "expire"
            and e.get("previous_owner") == owner
            and e.get("owner_id") not in (None, owner)
            and owner in str(e.get("reason") or "")
            for e in mine
        ):
            said = "; ".join(f"{e.get('kind')} by {e.get('reporter')}: {e.get('reason')!r}" for e in mine[:4])
            problems.append(
                f"console: partition {pid} of {owner}, cut off, not shown expired and claimed elsewhere "
                f"({said or 'no event'})"
            )
    return problems
