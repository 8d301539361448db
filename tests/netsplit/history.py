"""The store's own history of ownership and checkpoints, and what it proves (issue 19, item 3).

What the workers record themselves (``tests.chaos.recording``) could be wrong in the way a buggy
worker is wrong. The store's history cannot: every ownership and checkpoint write as the store
itself saw it, stamped with the store's clock (``store_history`` collects it: a trigger in
PostgreSQL, ``MONITOR`` on Redis, Azurite's request log).

Each ownership write carries two times on the store's clock:

- ``since``: no earlier than the moment its writer sent it. The writer's own lease runs from the
  moment it sent the winning claim or renewal (``Coordinator.holds``: its monotonic clock, from the
  send), so the lease it got cannot outlast ``since + expiry`` (nor, where the store's log tells when
  the writer made the request, that time plus the expiry: ``lease_from``).
- ``at``: no later than the moment its writer can have heard that it succeeded. A new owner handles
  nothing of the partition before its claim returns, so not before ``at``.

A *tenure* is one owner's run of consecutive writes to a partition, each within the expiry of the
one before: it starts at the first write's ``at`` and ends at the last write's ``lease_from`` + expiry,
or at ``since`` of the release that follows it (a worker releases after it has stopped handling
and checkpointed). A tenure that starts while the previous owner's lease still ran was won by a
steal: the previous owner may handle events until its lease ends by its own clock, so the stealer
handles nothing before that (the lease core's fence, ``balancer.lease.writes``: until the replaced
record would have expired by the store's clock); such a tenure begins when the previous one ended. Any other claim
comes after the previous lease's end or its release. ``handled_outside`` joins the workers' own
records to it: every event a worker handled must fall inside one of its tenures of that partition,
from when it began, on the store's clock. What that proves: per partition, no two workers handled
events at once, to within the resolution of the history's stamps and the drift between the
store's clock and the workers' monotonic clocks over one expiry (one machine here: the same
oscillator). The other rules over the history (checkpoints that go back, writes from another host
than the worker they name) are ``rules.py``'s. Each prints the slice of history that shows the
violation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import pairwise

from tests.chaos.evidence import Handling

SHOWN = 4  # writes printed before and after the one that breaks a rule


@dataclass(frozen=True, slots=True)
class Write:
    """One ownership write as the store saw it."""

    partition: str
    owner: str  # "" for a release
    since: float  # store clock: no earlier than the writer sent it
    at: float  # store clock: no later than the writer can have heard it succeed
    etag: str = ""
    client: str = ""  # the writer's network address, as the store saw the connection ("" unknown)
    # The writer's own clock as it made the request, where the store's log carries it (Azurite: the
    # SDK's request id is a version-1 UUID, the time it was made): the write took effect no earlier,
    # however late the store stamped it (-inf: unknown).
    sent: float = -math.inf


@dataclass(frozen=True, slots=True)
class CheckpointWrite:
    partition: str
    sequence: int
    at: float  # store clock
    client: str = ""


@dataclass
class History:
    """Every ownership and checkpoint write of one hub and consumer group, as the store recorded them."""

    store: str
    source: str  # where it came from: "trigger on dashboard_ownership (clock_timestamp())", ...
    resolution: float  # seconds: of the history's stamps, so of what it can prove
    writes: list[Write] = field(default_factory=list)
    checkpoints: list[CheckpointWrite] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)  # why the history may be incomplete (empty: complete)
    # A write's stamps may come late (Azurite: a busy machine delays the server itself, so a request
    # sent at t is stamped, arrival and end alike, when the server gets to it, seconds later): a
    # tenure's own events are then judged from the end of the tenure before it (the store serves
    # writes in order: a claim lands after the write that ended the previous tenure), and an owner's
    # renewal stamped more than an expiry after its previous one continues its tenure (it was sent
    # earlier; its If-Match held, so no other owner wrote in between).
    late_ends: bool = False
    # The store fences a checkpoint with a read of the ownership before its write, two requests (Blob:
    # ``balancer/stores/blob/checkpoints.py``): the previous owner's checkpoint can land after a claim,
    # before the new owner's first one (of events it did process; the ETag condition keeps it from
    # ever going back), or after its own release. Such a checkpoint is not a foreign one.
    two_request_fence: bool = False


@dataclass(frozen=True, slots=True)
class Tenure:
    partition: str
    owner: str
    start: float  # the first write's ``at``
    end: float  # the last write's ``since`` + expiry, or the release's ``since``
    first: int  # index of the first write in the partition's history
    last: int  # index of the last write (the release, if released)
    released: bool
    sent: float = -math.inf  # the first write's ``since``: its claim reached the store no earlier
    # Won by a steal (``took_a_live_lease``): the store-clock time the previous owner's lease ended (its
    # last write's ``since`` + expiry), before which the stealer handles nothing (-inf: no steal).
    fenced_until: float = -math.inf
    # The earliest the partition's tenure before this one can have ended (-inf: the first): its end,
    # or with late stamps (``late_ends``) the moment its release was made, where its writer's clock
    # is known (``Write.sent``): the release's stamps may come as late as the claim's.
    after: float = -math.inf
    made: float = -math.inf  # the first write's ``Write.sent``: its claim took effect no earlier

    def began(self, history: History) -> float:
        """When the owner can have begun acting on this tenure at the earliest: its claim's end, or with
        late stamps (``late_ends``) the end of the tenure before it, and not before its claim was made
        (the claim's own stamps, and the release's before it, may come after the owner heard it
        succeed); after a steal, not before the previous owner's lease ended (the stealer's fence)."""
        if history.late_ends:
            return max(self.after if math.isfinite(self.after) else self.sent, self.made, self.fenced_until)
        return max(self.start, self.fenced_until)


def clock(at: float) -> str:
    """A store-clock time as the wall-clock time of day, to the microsecond (UTC)."""
    if not math.isfinite(at):
        return str(at)
    return datetime.fromtimestamp(at, UTC).strftime("%H:%M:%S.%f")


def by_partition(writes: Iterable[Write]) -> dict[str, list[Write]]:
    """Each partition's writes in the order they took effect (``at``)."""
    out: dict[str, list[Write]] = {}
    for write in writes:
        out.setdefault(write.partition, []).append(write)
    for found in out.values():
        found.sort(key=lambda w: (w.at, w.since))
    return out


def lease_from(write: Write) -> float:
    """The store-clock time the writer's lease from ``write`` ran from at the latest: its ``since``, or
    when its writer made it (``Write.sent``) where that is known and earlier. The writer times its lease
    from before it sent the request (``Coordinator.holds``), which is before the SDK made it, so the
    lease ends no later than this plus the expiry, however late the store stamped the write (Azurite
    under load: a renewal made at t stamped up to 25 s later on CI)."""
    return min(write.since, write.sent) if math.isfinite(write.sent) else write.since


def took_a_live_lease(writes: list[Write], i: int, expiry: float) -> bool:
    """Whether ``writes[i]`` gave the partition to a new owner while the previous one's lease still ran:
    a steal. The stealer handles nothing for one expiry after its steal came back (the lease core's
    fence, ``balancer.lease.writes``): the previous owner may go on until its lease ends by its own clock."""
    if i == 0 or not writes[i].owner:
        return False
    before = writes[i - 1]
    return bool(before.owner) and before.owner != writes[i].owner and writes[i].at <= lease_from(before) + expiry


def tenures(writes: list[Write], expiry: float, late_ends: bool = False) -> list[Tenure]:
    """The tenures in one partition's ``writes`` (sorted by ``at``), in order. A tenure won by a steal
    is fenced until the previous owner's lease ended (``took_a_live_lease``). With ``late_ends``
    (``History.late_ends``) an owner's writes in a row are one tenure, however far apart."""
    out: list[Tenure] = []
    current: tuple[str, int] | None = None  # (owner, index of its first write)

    def tenure(first: int, last: int, end: float, released: bool) -> Tenure:
        fence = lease_from(writes[first - 1]) + expiry if took_a_live_lease(writes, first, expiry) else -math.inf
        won, after = writes[first], -math.inf
        if out:
            before, release = out[-1], writes[out[-1].last]
            made = late_ends and before.released and math.isfinite(release.sent)
            after = release.sent if made else before.end
        return Tenure(won.partition, won.owner, won.at, end, first, last, released, won.since, fence, after, won.sent)

    for i, write in enumerate(writes):
        lapsed = (
            current is not None
            and not late_ends
            and write.owner == current[0]
            and write.at > lease_from(writes[i - 1]) + expiry
        )
        if current is not None and (write.owner != current[0] or lapsed):
            # another owner, a release, or the same owner again after its lease ran out (a new tenure)
            released = write.owner == ""
            end = write.since if released else lease_from(writes[i - 1]) + expiry
            out.append(tenure(current[1], i if released else i - 1, end, released))
            current = None
        if current is None and write.owner:
            current = (write.owner, i)
    if current is not None:
        out.append(tenure(current[1], len(writes) - 1, lease_from(writes[-1]) + expiry, False))
    return out


def describe(write: Write, base: float) -> str:
    who = write.owner or "(released)"
    where = f" from {write.client}" if write.client else ""
    made = f" (made {clock(write.sent)})" if math.isfinite(write.sent) else ""
    return (
        f"{clock(write.at)} (+{write.at - base:.3f}s) {who:<16} sent by {clock(write.since)}{made}{where}"
        f"{f' etag {write.etag}' if write.etag else ''}"
    )


def history_slice(writes: list[Write], low: int, high: int, mark: int, base: float) -> list[str]:
    """Lines for ``writes[low..high]`` (clipped, widened by ``SHOWN``), ``mark`` flagged."""
    start, stop = max(0, low - SHOWN), min(len(writes), high + SHOWN + 1)
    return [f"    {'>>' if i == mark else '  '} {describe(writes[i], base)}" for i in range(start, stop)]


def margins(history: History, expiry: float) -> dict[bool, list[float]]:
    """For every change of owner, seconds between the end of the previous tenure and the start of
    the next (negative: an overlap), by whether the previous owner released (True: a handoff) or
    its lease ran out (False: a takeover after expiry, where the margin is the safety margin)."""
    out: dict[bool, list[float]] = {True: [], False: []}
    for writes in by_partition(history.writes).values():
        for before, after in pairwise(tenures(writes, expiry, history.late_ends)):
            if before.owner != after.owner:
                out[before.released].append(after.start - before.end)
    return out


def summary(history: History, expiry: float) -> str:
    """One line: what the history holds and the bound it proves."""
    found = margins(history, expiry)

    def changes(released: bool, what: str) -> str:
        closest = f" (closest {min(found[released]):+.3f}s)" if found[released] else ""
        return f"{len(found[released])} {what}{closest}"

    return (
        f"store history [{history.store}] from {history.source}: {len(history.writes)} ownership writes, "
        f"{len(history.checkpoints)} checkpoints; changes of owner, next tenure's start minus the previous one's "
        f"end: {changes(True, 'after a release')}, {changes(False, 'after a lease ran out')}; proves no two "
        f"leases at once to within {history.resolution:g}s"
    )


def partition_key(pid: str) -> tuple[int, str]:
    return (int(pid), pid) if pid.isdigit() else (1 << 30, pid)


def handled_outside(
    history: History, handlings: Iterable[Handling], offset: float, expiry: float, slack: float = 0.0
) -> list[str]:
    """Every event a worker handled outside the tenures the store's history gives it on that
    partition: before its claim had landed, or after its lease had ended by the store's clock.

    ``handlings`` are on the machine's monotonic clock (the workers' recordings); ``offset`` turns
    one into the store's (store = monotonic + offset: the store's clock is this machine's wall
    clock). Allowed beyond each end: the store's resolution and ``slack`` (the error of ``offset``).
    Consecutive events of one worker outside its tenures are reported as one run."""
    tenured: dict[tuple[str, str], list[Tenure]] = {}
    per = by_partition(history.writes)
    for writes in per.values():
        for tenure in tenures(writes, expiry, history.late_ends):
            tenured.setdefault((tenure.partition, tenure.owner), []).append(tenure)
    allowed = history.resolution + slack
    outside: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for h in handlings:
        at = h.at + offset
        own = tenured.get((h.partition, h.owner), [])
        if not any(t.began(history) - allowed <= at <= t.end + allowed for t in own):
            outside.setdefault((h.partition, h.owner), []).append((h.sequence, at))
    problems = []
    for (pid, owner), found in sorted(outside.items(), key=lambda kv: (partition_key(kv[0][0]), kv[0][1])):
        found.sort()
        runs: list[list[tuple[int, float]]] = []
        for item in found:
            if runs and item[0] == runs[-1][-1][0] + 1:
                runs[-1].append(item)
            else:
                runs.append([item])
        writes = per.get(pid, [])
        for run in runs:
            (low, first), (high, last) = run[0], run[-1]
            near = min(range(len(writes)), key=lambda i: abs(writes[i].at - first), default=None)
            lines = [] if near is None else history_slice(writes, near, near, -1, writes[0].at)
            problems.append(
                f"partition {pid}: {owner} handled {low}..{high} from {clock(first)} to {clock(last)} (store clock), "
                f"outside every lease the store gave it there ({len(tenured.get((pid, owner), []))} tenures). "
                "The store's history around it:\n" + "\n".join(lines)
            )
    return problems


def unmatched_ends(history: History, final: Mapping[str, tuple[str, str]]) -> list[str]:
    """The history's last write of each partition against the store's records read after every
    worker stopped (``final``: partition -> (owner, ETag)): a history that missed a write, or holds
    one the store never kept, ends elsewhere than the store. Partitions without a record must have
    no write either."""
    per = by_partition(history.writes)
    problems = []
    for pid in sorted(set(per) | set(final), key=partition_key):
        last = per[pid][-1] if pid in per else None
        kept = final.get(pid)
        ended = (last.owner, last.etag) if last is not None else None
        if ended != kept:
            problems.append(
                f"partition {pid}: the history ends with {ended or 'no write'}, the store holds {kept or 'no record'}"
            )
    return problems
