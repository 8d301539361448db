"""The rules over a store's history that are not about tenures: checkpoints that go back, and writes
from a host other than the worker they name (the owner fence seen from the store); ``judge`` runs them
all, with the history's gaps and its end against the store's final state (``history.py``: the history
and the tenures it proves)."""

from __future__ import annotations

from collections.abc import Mapping

from tests.netsplit.history import (
    SHOWN,
    CheckpointWrite,
    History,
    Write,
    by_partition,
    clock,
    history_slice,
    partition_key,
    unmatched_ends,
)


def checkpoint_regressions(history: History) -> list[str]:
    """Per partition, every checkpoint written below one written before it, with the writes around it."""
    problems = []
    per: dict[str, list[CheckpointWrite]] = {}
    for write in history.checkpoints:
        per.setdefault(write.partition, []).append(write)
    for pid, writes in sorted(per.items(), key=lambda kv: partition_key(kv[0])):
        writes.sort(key=lambda w: w.at)
        highest = 0
        for i, write in enumerate(writes):
            if write.sequence < writes[highest].sequence:
                low = max(0, highest - SHOWN)
                lines = [
                    f"    {'>>' if j == i else '  '} {clock(w.at)} sequence {w.sequence}"
                    f"{f' from {w.client}' if w.client else ''}"
                    for j, w in enumerate(writes[low : i + SHOWN + 1], start=low)
                ]
                problems.append(
                    f"partition {pid}: checkpoint went back from {writes[highest].sequence} (at "
                    f"{clock(writes[highest].at)}) to {write.sequence} (at {clock(write.at)}). The store's history:\n"
                    + "\n".join(lines)
                )
            else:
                highest = i
    return problems


def foreign_writers(history: History, addresses: Mapping[str, str]) -> list[str]:
    """Ownership writes naming an owner whose host (``addresses``: owner id -> its host's address) is
    not where the store saw the write come from: a worker writing in another's name, or a record
    written by something else than the fleet. Releases and writes of unknown origin are not judged."""
    problems = []
    for write in history.writes:
        if not write.owner or not write.client:
            continue
        expected = addresses.get(write.owner)
        if expected is None:
            problems.append(
                f"partition {write.partition}: a write naming {write.owner}, no worker of the fleet, "
                f"came from {write.client} at {clock(write.at)}"
            )
        elif expected != write.client:
            problems.append(
                f"partition {write.partition}: a write naming {write.owner} (host {expected}) came "
                f"from {write.client} at {clock(write.at)}"
            )
    return problems


def judge(
    history: History,
    expiry: float,
    addresses: Mapping[str, str] | None = None,
    final: Mapping[str, tuple[str, str]] | None = None,
) -> list[str]:
    """Every rule over ``history``, each problem one (multi-line) string; the gaps, if any, are problems
    too (a history with holes proves nothing), and so is an end that is not the store's ``final``
    state (partition -> (owner, ETag), read after the last write)."""
    problems = [f"store history incomplete: {gap}" for gap in history.gaps]
    if final is not None:
        problems += [f"store history incomplete: {p}" for p in unmatched_ends(history, final)[:5]]
    if not history.writes:
        problems.append(f"store history: no ownership write recorded ({history.source})")
    problems += [f"store history: {p}" for p in checkpoint_regressions(history)]
    if addresses is not None:
        problems += [f"store history: {p}" for p in foreign_writers(history, addresses)[:5]]
        problems += [f"store history: {p}" for p in foreign_checkpoints(history, addresses)[:5]]
    return problems


def foreign_checkpoints(history: History, addresses: Mapping[str, str]) -> list[str]:
    """Checkpoints written from another host than that of the partition's owner at the time, by the
    store's history (its last ownership write before the checkpoint): the owner fence
    (``update_checkpoint``) seen from the store. Checkpoints of unknown origin are not judged."""
    per = by_partition(history.writes)
    problems = []
    written: list[CheckpointWrite] = []
    for point in sorted(history.checkpoints, key=lambda c: c.at):
        written.append(point)
        if not point.client:
            continue
        before = [w for w in per.get(point.partition, []) if w.at <= point.at]
        owner = before[-1].owner if before else ""
        if history.two_request_fence and _previous_owners_late(point, before, written, addresses):
            continue
        if addresses.get(owner) != point.client:
            holder = f"{owner} (host {addresses.get(owner, '?')})" if owner else "nobody"
            problems.append(
                f"partition {point.partition}: checkpoint {point.sequence} written from {point.client} at "
                f"{clock(point.at)} while {holder} owned it; the ownership history before it:\n"
                + "\n".join(history_slice(before, len(before) - 1, len(before) - 1, -1, before[0].at) if before else [])
            )
    return problems


def _previous_owners_late(
    point: CheckpointWrite, before: list[Write], written: list[CheckpointWrite], addresses: Mapping[str, str]
) -> bool:
    """Whether ``point`` is the previous owner's checkpoint landing after the current owner's claim and
    before the current owner's first checkpoint, or after the previous owner's own release while nobody
    owns the partition (``History.two_request_fence``: its ownership read came before either)."""
    if not before:
        return False
    if not before[-1].owner:  # released: by the owner before the release
        releaser = next((w.owner for w in reversed(before[:-1]) if w.owner), "")
        return bool(releaser) and addresses.get(releaser) == point.client
    owner = before[-1].owner
    claimed = next(i for i in range(len(before) - 1, -1, -1) if i == 0 or before[i - 1].owner != owner)
    previous = next((w.owner for w in reversed(before[:claimed]) if w.owner), "")  # past a release between
    if not previous or addresses.get(previous) != point.client:
        return False
    since = before[claimed].at
    mine = addresses.get(owner)
    return not any(c.partition == point.partition and c.client == mine and since <= c.at for c in written[:-1])
