"""The blob store's operations: ownership, checkpoints, heartbeats and controls as empty blobs in
one container (``service``), named and read as ``layout`` says. The layout, the claims, the clock
and the requests each call costs: see the package (``balancer.stores.blob``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import replace
from urllib.parse import quote

from azure.core import MatchConditions
from azure.core.exceptions import AzureError, ResourceExistsError, ResourceModifiedError, ResourceNotFoundError
from azure.storage.blob import BlobProperties
from azure.storage.blob.aio import ContainerClient

from balancer.errors import CorruptRecord
from balancer.model import Checkpoint, Control, ControlKind, HubRef, Member, OwnershipRecord
from balancer.protocol import Snapshot

from .checkpoints import CheckpointWrites
from .layout import (
    NO_OFFSET,
    Skipped,
    bare_etag,
    checkpoint_blob,
    control_blob,
    header_value,
    member_blob,
    ownership_blob,
    parse_checkpoint,
    parse_control,
    parse_member,
    parse_ownership,
    scope_prefix,
    written_at,
)
from .service import CONNECTION_STRING_ENV, CONTAINER_ENV, DEFAULT_CONTAINER, BlobContainer, container_gone

__all__ = [
    "CONNECTION_STRING_ENV",
    "CONTAINER_ENV",
    "DEFAULT_CONTAINER",
    "NO_OFFSET",
    "BlobStore",
    "checkpoint_blob",
    "ownership_blob",
    "scope_prefix",
]


class BlobStore:
    """Ownership, checkpoints, members and controls in one Blob Storage container.

    Use it from one event loop at a time (``clone()`` gives another thread its own store).

    ``requests`` counts HTTP requests sent (retries included), for the bench and the simulator's
    comparison. ``corrupt`` lists the blobs the latest listings skipped, with what is wrong.
    """

    # Last-Modified and the Date header count whole seconds: an age judged on them is off by up to a
    # second either way, which only a whole-second expiry absorbs (``runworkers`` refuses another).
    clock_resolution = 1.0

    def __init__(
        self,
        connection_string: str | None = None,
        container: str | None = None,
        *,
        timeout: float = 10.0,
        retries: int = 1,
    ) -> None:
        """Raises StoreError at once when the connection string is missing or malformed or the
        container name is invalid; the service itself is first contacted by the first call."""
        self._service = BlobContainer(connection_string, container, timeout=timeout, retries=retries)
        self._skipped = Skipped(self._service.where)
        self._checkpoints = CheckpointWrites(self._service)  # remembers the ETags it wrote: its next If-Match

    def __repr__(self) -> str:
        return f"BlobStore({self.where})"

    @property
    def container(self) -> str:
        return self._service.name

    @property
    def where(self) -> str:
        return self._service.where

    @property
    def requests(self) -> int:
        return self._service.requests

    def clone(self) -> BlobStore:
        """Another store on the same container with its own connection (another thread or loop)."""
        service = self._service
        return BlobStore(service.connection_string, service.name, timeout=service.timeout, retries=service.retries)

    @property
    def corrupt(self) -> list[CorruptRecord]:
        """Blobs the latest listing of each kind skipped because they could not be read."""
        return self._skipped.records

    async def __aenter__(self) -> BlobStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP session (only from the event loop that used it)."""
        await self._service.aclose()

    # the clock -----------------------------------------------------------------------------

    async def now(self) -> float:
        """The service's clock (see the module docstring); costs a request only before the first one."""
        return await self._service.now()

    # ownership -----------------------------------------------------------------------------

    async def snapshot(self, ref: HubRef) -> Snapshot:
        """Ownership, members and controls from ONE listing of the scope (checkpoint blobs come
        along and are ignored), with the service's clock from that response."""
        scope = scope_prefix(ref)
        blobs = await self._service.list(scope)
        parts: dict[str, list[BlobProperties]] = {
            "ownership/": [],
            "leaseboard/members/": [],
            "leaseboard/controls/": [],
        }
        for blob in blobs:
            for sub, found in parts.items():
                if blob.name.startswith(scope + sub):
                    found.append(blob)
        skipped = self._skipped
        return Snapshot(
            skipped.parsed(scope + "ownership/", parts["ownership/"], lambda pid, b: parse_ownership(ref, pid, b)),
            skipped.parsed(
                scope + "leaseboard/members/", parts["leaseboard/members/"], lambda e, b: parse_member(ref, e, b)
            ),
            skipped.parsed(
                scope + "leaseboard/controls/", parts["leaseboard/controls/"], lambda x, b: parse_control(ref, x, b)
            ),
            await self.now(),
        )

    async def list_ownership(self, ref: HubRef) -> list[OwnershipRecord]:
        """Every readable ownership record of ``ref`` (one request); unreadable blobs are skipped."""
        prefix = scope_prefix(ref) + "ownership/"
        blobs = await self._service.list(prefix)
        return self._skipped.parsed(prefix, blobs, lambda pid, blob: parse_ownership(ref, pid, blob))

    async def claim_ownership(self, records: Sequence[OwnershipRecord]) -> list[OwnershipRecord]:
        """Write each record at once (one request each); return those won.

        Raises StoreUnavailable or StoreError if any write failed for another reason than a lost
        race; writes that went through before it stay written, and the next listing shows them.
        """
        for record in records:
            header_value(record.owner_id, "owner id")
        if not records:
            return []
        client = await self._service.ready()
        results = await asyncio.gather(*(self._claim_one(client, r) for r in records), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            first = failures[0]
            if not isinstance(first, AzureError):
                raise first
            written = sum(isinstance(r, OwnershipRecord) for r in results)
            doing = f"claiming {len(records)} partition(s), {written} written before the error"
            raise self._service.error(doing, first)
        return [r for r in results if isinstance(r, OwnershipRecord)]

    async def _claim_one(self, client: ContainerClient, record: OwnershipRecord) -> OwnershipRecord | None:
        name = ownership_blob(record.ref, record.partition_id)
        blob = client.get_blob_client(name)
        metadata = {"ownerid": record.owner_id}
        if record.owner_level:
            metadata["ownerlevel"] = str(record.owner_level)
        # A blob the listing skipped as unreadable is invisible to the caller, who claims it as never
        # owned: overwrite it if it is still the blob we saw, so a hand-edited record cannot block a
        # partition forever.
        etag = record.etag if record.etag is not None else self._skipped.etag_of(name)
        try:
            if etag is None:
                props = await blob.upload_blob(b"", metadata=metadata, overwrite=False)
            else:
                props = await blob.set_blob_metadata(metadata, etag=etag, match_condition=MatchConditions.IfNotModified)
        except (ResourceModifiedError, ResourceExistsError):
            return None  # someone wrote the record since the caller looked (or created it first)
        except ResourceNotFoundError as exc:
            if container_gone(exc):
                raise
            return None  # the ETag names a record that was deleted since
        self._skipped.overwritten(name)
        return replace(record, etag=bare_etag(str(props["etag"])), last_modified=written_at(props))

    # checkpoints ---------------------------------------------------------------------------

    async def list_checkpoints(self, ref: HubRef) -> list[Checkpoint]:
        """Every readable checkpoint of ``ref`` (one request); unreadable blobs are skipped."""
        prefix = scope_prefix(ref) + "checkpoint/"
        blobs = await self._service.list(prefix)
        return self._skipped.parsed(prefix, blobs, lambda pid, blob: parse_checkpoint(ref, pid, blob))

    async def update_checkpoint(self, checkpoint: Checkpoint, owner_id: str) -> Checkpoint:
        """Write ``checkpoint`` if the ownership blob names ``owner_id`` and, unless ``owner_id`` is
        ``RESET_OWNER`` (an operator's reset), the stored checkpoint is not further on.

        Raises OwnershipLost, writing nothing, when it does not own it; StoreError for a write that
        would move the checkpoint back, as the Redis store does. The write is conditional on the
        checkpoint blob's ETag too; the race that closes, the one that remains, and the requests it
        costs (2 in steady state): see ``checkpoints``.
        """
        return await self._checkpoints.update(checkpoint, owner_id)

    # members and controls ------------------------------------------------------------------

    async def heartbeat(self, member: Member) -> None:
        """One write; ``last_seen`` becomes the blob's Last-Modified (the service's clock)."""
        info = json.dumps(dict(member.info), ensure_ascii=True, sort_keys=True)
        name = member_blob(member.ref, member.owner_id)

        async def write(client: ContainerClient) -> None:
            await client.get_blob_client(name).upload_blob(b"", metadata={"info": info}, overwrite=True)

        await self._service.run(f"heartbeat of {member.owner_id!r}", write)

    async def list_members(self, ref: HubRef) -> list[Member]:
        prefix = scope_prefix(ref) + "leaseboard/members/"
        blobs = await self._service.list(prefix)
        return self._skipped.parsed(prefix, blobs, lambda encoded, blob: parse_member(ref, encoded, blob))

    async def remove_member(self, ref: HubRef, owner_id: str) -> None:
        await self._delete(member_blob(ref, owner_id), f"removing member {owner_id!r}")

    async def list_controls(self, ref: HubRef) -> list[Control]:
        prefix = scope_prefix(ref) + "leaseboard/controls/"
        blobs = await self._service.list(prefix)
        return self._skipped.parsed(prefix, blobs, lambda suffix, blob: parse_control(ref, suffix, blob))

    async def put_control(self, control: Control) -> None:
        """Create or replace (one write); ``created`` becomes the blob's Last-Modified."""
        name = control_blob(control.ref, control.kind, control.target)
        metadata = {"value": quote(control.value, safe="")}

        async def write(client: ContainerClient) -> None:
            await client.get_blob_client(name).upload_blob(b"", metadata=metadata, overwrite=True)

        await self._service.run(f"writing control {control.kind.value} {control.target!r}", write)

    async def delete_control(self, ref: HubRef, kind: str, target: str) -> None:
        await self._delete(control_blob(ref, ControlKind(kind), target), f"deleting control {kind} {target!r}")

    async def _delete(self, name: str, doing: str) -> None:
        async def delete(client: ContainerClient) -> None:
            try:
                await client.get_blob_client(name).delete_blob()
            except ResourceNotFoundError as exc:
                if container_gone(exc):
                    raise

        await self._service.run(doing, delete)
