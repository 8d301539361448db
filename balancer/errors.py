"""Errors every store adapter raises, so callers handle one family whatever the backend."""

from __future__ import annotations


class StoreError(Exception):
    """Base of every error a store raises on purpose."""


class StoreUnavailable(StoreError):
    """The store could not be reached or did not answer; nothing was changed by this call."""


class OwnershipLost(StoreError):
    """A checkpoint was written by a worker that no longer owns the partition; nothing was written."""

    def __init__(self, partition_id: str, caller: str, current_owner: str | None) -> None:
        self.partition_id = partition_id
        self.caller = caller
        self.current_owner = current_owner
        holder = repr(current_owner) if current_owner else "nobody"
        super().__init__(f"worker {caller!r} may not checkpoint partition {partition_id}: it is owned by {holder}")


class CorruptRecord(StoreError):
    """A stored record could not be read (hand-edited, truncated, older layout); it was skipped."""

    def __init__(self, where: str, problem: str) -> None:
        self.where = where
        self.problem = problem
        super().__init__(f"corrupt record {where}: {problem}")
