"""The Azure Blob Storage store: ownership, checkpoints, heartbeats and controls as empty blobs.

Names and metadata are those of Microsoft's blob checkpoint store (``azure-eventhub-checkpointstoreblob``
and ``-aio``), so its processors and Leaseboard's can share one container (names lowercased whole,
as Microsoft does, so the consumer group ``$Default`` is ``$default`` in a name)::

    <namespace>/<hub>/<consumer group>/ownership/<partition>   metadata: ownerid
    <namespace>/<hub>/<consumer group>/checkpoint/<partition>  metadata: offset, sequencenumber

Leaseboard's own records sit beside them, where Microsoft's processor never lists::

    <prefix>/leaseboard/members/<owner id>            metadata: info (JSON)    heartbeats
    <prefix>/leaseboard/controls/<kind>/<target>      metadata: value          drain, pin, rebalance

(owner ids, targets and values percent-encoded). Data lives in metadata (``002``), so every listing
is ONE List Blobs request with metadata, whatever the number of partitions.

Claims are compare-and-set on the blob's ETag: ``If-Match`` with the ETag seen for a record that
exists, create-if-absent (``If-None-Match: *``) for a partition never owned. A lost race (412, 409, or
404 for a blob that is gone) means "not won"; every other failure is raised as StoreUnavailable
(the service cannot be reached or answers 5xx) or StoreError (refused credentials, a deleted
container, a request the service rejects), never swallowed.

Clock: expiry is judged by the *service's* clock. ``last_modified`` is the blob's Last-Modified and
``now()`` is the Date header of the latest response plus the whole seconds elapsed on this machine's
monotonic clock since it arrived. Both have one-second resolution and both are truncated, so
``now()`` never runs ahead of a Last-Modified the service writes later, and no request is spent on
the clock. A worker whose wall clock is minutes off judges leases exactly as the others do.

Requests: a listing 1, a claim 1 per record (sent concurrently), a checkpoint 2 (read the ownership
blob, write the checkpoint if its ETag is still the one this store wrote; 3 the first time, reading
that ETag too), a heartbeat or control 1, ``now()`` none. A steady cycle of the
cooperative strategy is 4 + the partitions held (list, heartbeat, list members, list controls, one
renewal each); Microsoft's processor spends 1 + the partitions held.

A blob that cannot be read (metadata missing or malformed: a hand edit, an older layout) is skipped,
logged by name once, and listed in ``corrupt``; an unreadable ownership blob is overwritten by the
next claim of its partition, so it cannot block that partition forever.

The only extra key Leaseboard ever writes into Microsoft's metadata is ``ownerlevel``, and only when
an owner level other than 0 is claimed; Microsoft's processor ignores it (and drops it when it claims).

The parts: ``blob_layout`` has the names and the reading of each blob's metadata (no SDK),
``blob_service`` the container as the SDK reaches it (clients, errors, the service's clock); this
module is the store's operations on them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import replace
from typing import NamedTuple
from urllib.parse import quote

from azure.core import MatchConditions
from azure.core.exceptions import AzureError, ResourceExistsError, ResourceModifiedError, ResourceNotFoundError
from azure.storage.blob import BlobProperties
from azure.storage.blob.aio import ContainerClient

from balancer.errors import CorruptRecord, OwnershipLost, StoreError
from balancer.model import RESET_OWNER, Checkpoint, Control, ControlKind, HubRef, Member, OwnershipRecord
from balancer.protocol import Snapshot
from balancer.stores.blob_layout import (
    NO_OFFSET,
    Skipped,
    bare_etag,
    checkpoint_blob,
    control_blob,
    header_value,
    member_blob,
    metadata_of,
    ownership_blob,
    parse_checkpoint,
    parse_control,
    parse_member,
    parse_ownership,
    scope_prefix,
    written_at,
)
from balancer.stores.blob_service import (
    CONNECTION_STRING_ENV,
    CONTAINER_ENV,
    DEFAULT_CONTAINER,
    BlobContainer,
    container_gone,
)

__all__ = [
    "CONNECTION_STRING_ENV", "CONTAINER_ENV", "DEFAULT_CONTAINER", "NO_OFFSET", "BlobStore", "checkpoint_blob",
    "ownership_blob", "scope_prefix",
]  # fmt: skip


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
        # Per partition, the checkpoint blob's ETag and sequence as this store last wrote them: the
        # If-Match of its next checkpoint (see ``update_checkpoint``).
        self._checkpoints_written: dict[tuple[HubRef, str], _Written] = {}

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
            "ownership/": [], "leaseboard/members/": [], "leaseboard/controls/": []
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
        would move the checkpoint back, as the Redis store does.

        The write is conditional on the checkpoint blob itself: ``If-Match`` with the ETag read or
        last written by this store (``If-None-Match: *`` for a partition never checkpointed), so a
        checkpoint written by anyone else between the check and the write (a new owner's, an
        operator's reset) is never overwritten by an older one: the write is refused (412), both
        blobs are read again and it is tried once more. What remains is the ownership check and the
        write being two requests (a blob write cannot be conditioned on *another* blob): an old
        owner's checkpoint can land after a steal, before the new owner's first one, which is of
        events the old owner did process, and never takes the checkpoint back. Microsoft's own store
        checks neither.

        Requests: 2 in steady state (read the ownership blob, write), 3 the first time (or after a
        refused write) as the checkpoint blob's ETag is read too, concurrently with the ownership.
        """
        ref, pid = checkpoint.ref, checkpoint.partition_id
        offset = NO_OFFSET if checkpoint.offset is None else header_value(checkpoint.offset, "offset")
        metadata = {"offset": offset, "sequencenumber": str(checkpoint.sequence_number)}
        owner_name, checkpoint_name = ownership_blob(ref, pid), checkpoint_blob(ref, pid)

        # No retry by the SDK (its backoff is a second or two): the pump waits for this call, and it
        # must go on handling events through an outage. It tries again at its next checkpoint.
        async def owned(client: ContainerClient) -> None:
            owner_props = await _properties(client, owner_name)
            if owner_props is None:
                raise OwnershipLost(pid, owner_id, None)
            holder = metadata_of(owner_props).get("ownerid", "")
            if not owner_id or holder != owner_id:
                raise OwnershipLost(pid, owner_id, holder or None)

        async def stored(client: ContainerClient) -> _Written:
            props = await _properties(client, checkpoint_name)
            if props is None:
                return _Written(None, None)
            try:
                sequence: int | None = parse_checkpoint(ref, pid, props).sequence_number
            except ValueError:
                sequence = None  # unreadable: no position to keep, overwritten like an absent one
            return _Written(bare_etag(str(props["etag"])), sequence)

        async def write(client: ContainerClient) -> Checkpoint:
            key = (ref, pid)
            for attempt in (1, 2):
                cached = self._checkpoints_written.get(key)
                if cached is None:
                    _, known = await asyncio.gather(owned(client), stored(client))
                else:
                    await owned(client)
                    known = cached
                if (
                    known.sequence is not None
                    and checkpoint.sequence_number < known.sequence
                    and owner_id != RESET_OWNER
                ):
                    raise StoreError(
                        f"checkpoint of partition {pid} would go back from {known.sequence} to "
                        f"{checkpoint.sequence_number}: refused (a stale write; only an operator's reset moves it back)"
                    )
                blob = client.get_blob_client(checkpoint_name)
                try:
                    if known.etag is None:
                        props = await blob.upload_blob(b"", metadata=metadata, overwrite=False, retry_total=0)
                    else:
                        props = await blob.upload_blob(
                            b"", metadata=metadata, overwrite=True, retry_total=0,
                            etag=known.etag, match_condition=MatchConditions.IfNotModified,
                        )  # fmt: skip
                except (ResourceModifiedError, ResourceExistsError):
                    self._checkpoints_written.pop(key, None)  # written by someone else since: read again
                    if attempt == 2:
                        raise StoreError(
                            f"checkpoint of partition {pid} was written by someone else while this one was: "
                            "not written (the next checkpoint reads it again)"
                        ) from None
                    continue
                except ResourceNotFoundError as exc:
                    self._checkpoints_written.pop(key, None)  # deleted since its ETag was read
                    if container_gone(exc) or attempt == 2:
                        raise
                    continue
                self._checkpoints_written[key] = _Written(bare_etag(str(props["etag"])), checkpoint.sequence_number)
                return replace(checkpoint, last_modified=written_at(props))
            raise AssertionError("unreachable")

        try:
            return await self._service.run(f"checkpointing partition {pid}", write)
        except StoreError:
            self._checkpoints_written.pop((ref, pid), None)  # a write that may have landed: read again
            raise

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
