"""Partitions a worker will not take for a while: those it gave up because they were stuck on it
(issue 35: a reader that keeps failing, a handler that never returns).

A worker that gives a partition up (``Balancer.give_up``) says so in its heartbeat first
(``Member.info[INFO_KEY]``: "3,7"), then releases it; every plan that reads the heartbeat then
assigns the partition to someone else (``balancer.strategies.cooperative``), so the release notice
wakes another worker to take it at once, and the one it was stuck on does not take it straight back.
The avoidance ends by itself after the time given, and the heartbeat that follows says so.

A worker that cannot read the hub at all (every reader failing) avoids ``EVERY`` partition
(``Balancer.cannot_read``): it is then no member of anyone's plan, like a drained worker, so its
partitions are handed over and it claims none until the time is up.
"""

from __future__ import annotations

from collections.abc import Iterable

from balancer.model import Member, pid_key

INFO_KEY = "avoid"  # the member info key holding "pid,pid" (partitions this worker will not take)
EVERY = "*"  # avoided: every partition (the worker cannot read the hub)


def format_avoided(partition_ids: Iterable[str]) -> str:
    return ",".join(sorted(set(partition_ids), key=pid_key))


def parse_avoided(text: str) -> frozenset[str]:
    """The partition ids in ``text`` (what ``format_avoided`` wrote); anything else is ignored."""
    return frozenset(p for p in (part.strip() for part in text.split(",")) if p)


def avoided_by(members: Iterable[Member]) -> dict[str, frozenset[str]]:
    """Owner id -> the partitions its heartbeat says it will not take (those that say any)."""
    found = {m.owner_id: parse_avoided(m.info.get(INFO_KEY, "")) for m in members}
    return {owner: pids for owner, pids in found.items() if pids}
