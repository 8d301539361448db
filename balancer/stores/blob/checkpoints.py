"""The blob store's checkpoint write: only while the ownership blob names the writer and, unless the
writer is ``RESET_OWNER`` (an operator's reset), the stored checkpoint is not further on.

The write is conditional on the checkpoint blob itself: ``If-Match`` with the ETag read or last
written by this store (``If-None-Match: *`` for a partition never checkpointed), so a checkpoint
written by anyone else between the check and the write (a new owner's, an operator's reset) is
never overwritten by an older one: the write is refused (412), both blobs are read again and it is
tried once more. What remains is the ownership check and the write being two requests (a blob write
cannot be conditioned on *another* blob): an old owner's checkpoint can land after a steal, before
the new owner's first one, which is of events the old owner did process, and never takes the
checkpoint back. Microsoft's own store checks neither.

Requests: 2 in steady state (read the ownership blob, write), 3 the first time (or after a refused
write) as the checkpoint blob's ETag is read too, concurrently with the ownership.

No retry by the SDK (its backoff is a second or two): the pump waits for this call, and it must go
on handling events through an outage. It tries again at its next checkpoint.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from functools import partial
from typing import Any, NamedTuple

from azure.core import MatchConditions
from azure.core.exceptions import ResourceExistsError, ResourceModifiedError, ResourceNotFoundError
from azure.storage.blob import BlobProperties
from azure.storage.blob.aio import ContainerClient

from balancer.errors import OwnershipLost, StoreError
from balancer.model import RESET_OWNER, Checkpoint, HubRef

from .layout import (
    NO_OFFSET,
    bare_etag,
    checkpoint_blob,
    header_value,
    metadata_of,
    ownership_blob,
    parse_checkpoint,
    written_at,
)
from .service import BlobContainer, container_gone


class _Written(NamedTuple):
    """A checkpoint blob's ETag (None: no blob) and sequence number (None: none readable)."""

    etag: str | None
    sequence: int | None


async def _properties(client: ContainerClient, name: str) -> BlobProperties | None:
    """The blob's properties (no SDK retry), None when it does not exist; a deleted container raises."""
    try:
        return await client.get_blob_client(name).get_blob_properties(retry_total=0)
    except ResourceNotFoundError as exc:
        if container_gone(exc):
            raise
        return None


class CheckpointWrites:
    """The checkpoint writes of one ``BlobStore``, on its container (see the module docstring).

    Per partition it keeps the checkpoint blob's ETag and sequence as it last wrote them: the
    If-Match of its next checkpoint.
    """

    def __init__(self, service: BlobContainer) -> None:
        self._service = service
        self._written: dict[tuple[HubRef, str], _Written] = {}

    async def update(self, checkpoint: Checkpoint, owner_id: str) -> Checkpoint:
        """``BlobStore.update_checkpoint``: raises OwnershipLost, writing nothing, when ``owner_id``
        does not own the partition; StoreError for a write that would move the checkpoint back."""
        pid = checkpoint.partition_id
        offset = NO_OFFSET if checkpoint.offset is None else header_value(checkpoint.offset, "offset")
        metadata = {"offset": offset, "sequencenumber": str(checkpoint.sequence_number)}
        try:
            return await self._service.run(
                f"checkpointing partition {pid}", partial(self._write, checkpoint, owner_id, metadata)
            )
        except StoreError:
            self._written.pop((checkpoint.ref, pid), None)  # a write that may have landed: read again
            raise

    async def _write(
        self, checkpoint: Checkpoint, owner_id: str, metadata: dict[str, str], client: ContainerClient
    ) -> Checkpoint:
        key = (checkpoint.ref, checkpoint.partition_id)
        for attempt in (1, 2):
            known = await self._known(client, checkpoint, owner_id)
            if known.sequence is not None and checkpoint.sequence_number < known.sequence and owner_id != RESET_OWNER:
                raise StoreError(
                    f"checkpoint of partition {checkpoint.partition_id} would go back from {known.sequence} to "
                    f"{checkpoint.sequence_number}: refused (a stale write; only an operator's reset moves it back)"
                )
            props = await self._upload(client, checkpoint, metadata, known, attempt)
            if props is None:
                continue
            self._written[key] = _Written(bare_etag(str(props["etag"])), checkpoint.sequence_number)
            return replace(checkpoint, last_modified=written_at(props))
        raise AssertionError("unreachable")

    async def _known(self, client: ContainerClient, checkpoint: Checkpoint, owner_id: str) -> _Written:
        """The checkpoint blob as last written or read, once the ownership blob is found to name
        ``owner_id`` (OwnershipLost otherwise)."""
        ref, pid = checkpoint.ref, checkpoint.partition_id
        cached = self._written.get((ref, pid))
        if cached is None:
            _, known = await asyncio.gather(_owned(client, ref, pid, owner_id), _stored(client, ref, pid))
            return known
        await _owned(client, ref, pid, owner_id)
        return cached

    async def _upload(
        self,
        client: ContainerClient,
        checkpoint: Checkpoint,
        metadata: dict[str, str],
        known: _Written,
        attempt: int,
    ) -> dict[str, Any] | None:
        """The write's response, or None when it was refused the first time (read again and retry)."""
        key = (checkpoint.ref, checkpoint.partition_id)
        blob = client.get_blob_client(checkpoint_blob(*key))
        try:
            if known.etag is None:
                return await blob.upload_blob(b"", metadata=metadata, overwrite=False, retry_total=0)
            return await blob.upload_blob(
                b"",
                metadata=metadata,
                overwrite=True,
                retry_total=0,
                etag=known.etag,
                match_condition=MatchConditions.IfNotModified,
            )
        except (ResourceModifiedError, ResourceExistsError):
            self._written.pop(key, None)  # written by someone else since: read again
            if attempt == 2:
                raise StoreError(
                    f"checkpoint of partition {checkpoint.partition_id} was written by someone else while this "
                    "one was: not written (the next checkpoint reads it again)"
                ) from None
            return None
        except ResourceNotFoundError as exc:
            self._written.pop(key, None)  # deleted since its ETag was read
            if container_gone(exc) or attempt == 2:
                raise
            return None


async def _owned(client: ContainerClient, ref: HubRef, pid: str, owner_id: str) -> None:
    """Raises OwnershipLost unless the ownership blob of ``pid`` names ``owner_id``."""
    owner_props = await _properties(client, ownership_blob(ref, pid))
    if owner_props is None:
        raise OwnershipLost(pid, owner_id, None)
    holder = metadata_of(owner_props).get("ownerid", "")
    if not owner_id or holder != owner_id:
        raise OwnershipLost(pid, owner_id, holder or None)


async def _stored(client: ContainerClient, ref: HubRef, pid: str) -> _Written:
    """The checkpoint blob of ``pid`` as stored now (no blob: ETag and sequence None)."""
    props = await _properties(client, checkpoint_blob(ref, pid))
    if props is None:
        return _Written(None, None)
    try:
        sequence: int | None = parse_checkpoint(ref, pid, props).sequence_number
    except ValueError:
        sequence = None  # unreadable: no position to keep, overwritten like an absent one
    return _Written(bare_etag(str(props["etag"])), sequence)
