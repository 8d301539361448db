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
blob, write the checkpoint), a heartbeat or control 1, ``now()`` none. A steady cycle of the
cooperative strategy is 4 + the partitions held (list, heartbeat, list members, list controls, one
renewal each); Microsoft's processor spends 1 + the partitions held.

A blob that cannot be read (metadata missing or malformed: a hand edit, an older layout) is skipped,
logged by name once, and listed in ``corrupt``; an unreadable ownership blob is overwritten by the
next claim of its partition, so it cannot block that partition forever.

The only extra key Leaseboard ever writes into Microsoft's metadata is ``ownerlevel``, and only when
an owner level other than 0 is claimed; Microsoft's processor ignores it (and drops it when it claims).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import math
import os
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar
from urllib.parse import quote, unquote, urlsplit

from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.storage.blob import BlobProperties
from azure.storage.blob.aio import ContainerClient, LinearRetry

from balancer.errors import CorruptRecord, OwnershipLost, StoreError, StoreUnavailable
from balancer.model import Checkpoint, Control, ControlKind, HubRef, Member, OwnershipRecord, check_partition_id
from balancer.protocol import Snapshot

log = logging.getLogger(__name__)
T = TypeVar("T")

CONNECTION_STRING_ENV = "AZURE_STORAGE_CONNECTION_STRING"
CONTAINER_ENV = "LEASEBOARD_BLOB_CONTAINER"
DEFAULT_CONTAINER = "leaseboard"
NO_OFFSET = "-1"  # Event Hubs' "start of stream": what a checkpoint without an offset is written with
_CONTAINER_NAME = re.compile(r"^(?=.{3,63}$)[a-z0-9]+(-[a-z0-9]+)*$")
_SIG = re.compile(r"(?i)(sig=)[^&;\s]+")


# names ---------------------------------------------------------------------------------------


def scope_prefix(ref: HubRef) -> str:
    """``<namespace>/<hub>/<consumer group>/``, lowercased as Microsoft's store does."""
    return f"{ref.namespace}/{ref.hub}/{ref.consumer_group}/".lower()


def ownership_blob(ref: HubRef, partition_id: str) -> str:
    return f"{scope_prefix(ref)}ownership/{partition_id}"


def checkpoint_blob(ref: HubRef, partition_id: str) -> str:
    return f"{scope_prefix(ref)}checkpoint/{partition_id}"


def member_blob(ref: HubRef, owner_id: str) -> str:
    if not owner_id:
        raise ValueError("a member needs a non-empty owner id")
    return f"{scope_prefix(ref)}leaseboard/members/{quote(owner_id, safe='')}"


def control_blob(ref: HubRef, kind: ControlKind, target: str) -> str:
    if not target:
        raise ValueError("a control needs a non-empty target")
    return f"{scope_prefix(ref)}leaseboard/controls/{kind.value}/{quote(target, safe='')}"


# metadata ------------------------------------------------------------------------------------


def _header_value(value: str, what: str) -> str:
    """``value`` if it can travel as a metadata header (printable ASCII); ValueError otherwise."""
    if not (value.isascii() and value.isprintable()) or value != value.strip():
        raise ValueError(f"{what} {value!r} cannot be stored in blob metadata: use printable ASCII without edge spaces")
    return value


def _etag(value: str) -> str:
    """ETags without quotes: List Blobs returns them bare, writes return them quoted; If-Match takes both."""
    return value.strip('"')


def _container_gone(exc: AzureError) -> bool:
    """A 404 for the whole container, not for one blob."""
    return getattr(exc, "error_code", None) == "ContainerNotFound"


def _metadata(blob: BlobProperties) -> dict[str, str]:
    # Keys are case-insensitive in the service; an empty value is listed as None by the SDK.
    return {str(k).lower(): (v or "") for k, v in (blob.metadata or {}).items()}


def _modified(blob: BlobProperties) -> float:
    if blob.last_modified is None:
        raise ValueError("the listing gave no Last-Modified")
    return float(blob.last_modified.timestamp())


def _written(props: Mapping[str, Any]) -> float:
    """The Last-Modified of a write's response, as seconds since the epoch."""
    return float(props["last_modified"].timestamp())


def _required(meta: Mapping[str, str], key: str) -> str:
    if key not in meta:
        found = ", ".join(sorted(meta)) or "none"
        raise ValueError(f"no {key!r} metadata (keys found: {found})")
    return meta[key]


def parse_ownership(ref: HubRef, partition_id: str, blob: BlobProperties) -> OwnershipRecord:
    """The record an ownership blob holds; ValueError saying what is wrong with it."""
    meta = _metadata(blob)
    owner = _required(meta, "ownerid")
    level_text = meta.get("ownerlevel") or "0"
    try:
        level = int(level_text)
    except ValueError:
        raise ValueError(f"ownerlevel {level_text!r} is not an integer") from None
    if blob.etag is None:
        raise ValueError("the listing gave no ETag")
    return OwnershipRecord(ref, check_partition_id(partition_id), owner, _etag(blob.etag), _modified(blob), level)


def parse_checkpoint(ref: HubRef, partition_id: str, blob: BlobProperties) -> Checkpoint:
    """The checkpoint a checkpoint blob holds (offset optional, sequencenumber required)."""
    meta = _metadata(blob)
    text = _required(meta, "sequencenumber")
    try:
        sequence_number = int(text)
    except ValueError:
        raise ValueError(f"sequencenumber {text!r} is not an integer") from None
    offset = meta.get("offset") or None
    if offset in (NO_OFFSET, "None"):  # "None": what Microsoft's store writes for a missing offset
        offset = None
    return Checkpoint(ref, check_partition_id(partition_id), sequence_number, offset, _modified(blob))


def parse_member(ref: HubRef, encoded_id: str, blob: BlobProperties) -> Member:
    owner_id = unquote(encoded_id)
    if not owner_id or "/" in encoded_id:
        raise ValueError(f"{encoded_id!r} is not an encoded owner id")
    info_text = _metadata(blob).get("info") or "{}"
    try:
        info = json.loads(info_text)
    except ValueError:
        raise ValueError(f"info {info_text[:80]!r} is not JSON") from None
    if not isinstance(info, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in info.items()):
        raise ValueError(f"info {info_text[:80]!r} is not an object of strings")
    return Member(ref, owner_id, _modified(blob), info)


def parse_control(ref: HubRef, suffix: str, blob: BlobProperties) -> Control:
    kind_text, _, encoded = suffix.partition("/")
    try:
        kind = ControlKind(kind_text)
    except ValueError:
        raise ValueError(f"unknown control kind {kind_text!r}") from None
    if not encoded or "/" in encoded:
        raise ValueError(f"{suffix!r} is not <kind>/<encoded target>")
    value = unquote(_required(_metadata(blob), "value"))
    return Control(ref, kind, unquote(encoded), value, _modified(blob))


# connection strings --------------------------------------------------------------------------


def _secrets(connection_string: str) -> list[str]:
    """The parts of a connection string that must never be printed."""
    found = []
    for part in connection_string.split(";"):
        key, _, value = part.partition("=")
        if key.strip().lower() in ("accountkey", "sharedaccesssignature") and value.strip():
            found.append(value.strip())
    return found


def _check_connection_string(connection_string: str) -> None:
    """Raise StoreError naming what is wrong with a connection string the SDK would accept
    silently and fail on later (no credential, an AccountKey that is not base64)."""
    pairs = {}
    for part in connection_string.split(";"):
        key, sep, value = part.partition("=")
        if sep:
            pairs[key.strip().lower()] = value.strip()
    if "accountkey" in pairs:
        try:
            base64.b64decode(pairs["accountkey"], validate=True)
        except (binascii.Error, ValueError):
            raise StoreError(f"the AccountKey of {CONNECTION_STRING_ENV} is not valid base64") from None
    elif "sharedaccesssignature" not in pairs and pairs.get("usedevelopmentstorage", "").lower() != "true":
        raise StoreError(f"{CONNECTION_STRING_ENV} has neither AccountKey nor SharedAccessSignature")


# the store -----------------------------------------------------------------------------------


class BlobStore:
    """Ownership, checkpoints, members and controls in one Blob Storage container.

    Use it from one event loop at a time (``clone()`` gives another thread its own store).

    ``requests`` counts HTTP requests sent (retries included), for the bench and the simulator's
    comparison. ``corrupt`` lists the blobs the latest listings skipped, with what is wrong.
    """

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
        conn = os.environ.get(CONNECTION_STRING_ENV, "") if connection_string is None else connection_string
        if not conn.strip():
            raise StoreError(f"no Blob Storage connection string: set {CONNECTION_STRING_ENV}")
        name = container or os.environ.get(CONTAINER_ENV) or DEFAULT_CONTAINER
        if not _CONTAINER_NAME.match(name):
            raise StoreError(
                f"blob container name {name!r} is invalid: 3-63 lowercase letters, digits and single hyphens"
            )
        self._secrets = _secrets(conn)
        self._connection_string = conn
        self.container = name
        self._timeout = timeout
        self._retries = retries
        self._client = self._new_client()
        _check_connection_string(conn)
        url = urlsplit(self._client.url)
        self.where = f"container {name!r} at {url.scheme}://{url.netloc}{url.path.rsplit('/', 1)[0]}"
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop self._client's session belongs to
        self._used = False
        self._ready_done = False
        self._anchor: tuple[float, float] | None = None  # (service Date, local monotonic when received)
        self._last_now = 0.0
        self._corrupt: dict[str, CorruptRecord] = {}
        self._corrupt_etags: dict[str, str] = {}  # ownership blobs skipped as corrupt -> their ETag
        self.requests = 0

    def __repr__(self) -> str:
        return f"BlobStore({self.where})"

    def clone(self) -> BlobStore:
        """Another store on the same container with its own connection (another thread or loop)."""
        return BlobStore(self._connection_string, self.container, timeout=self._timeout, retries=self._retries)

    @property
    def corrupt(self) -> list[CorruptRecord]:
        """Blobs the latest listing of each kind skipped because they could not be read."""
        return list(self._corrupt.values())

    async def __aenter__(self) -> BlobStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP session (only from the event loop that used it)."""
        if self._loop is not None and self._loop is asyncio.get_running_loop():
            await self._client.close()
            self._loop = None

    # plumbing ------------------------------------------------------------------------------

    def _new_client(self) -> ContainerClient:
        try:
            return ContainerClient.from_connection_string(
                self._connection_string,
                self.container,
                # Fail within seconds: a lease renewal stuck behind the SDK's default backoff
                # (15 s and more) would outlast the lease it renews.
                retry_policy=LinearRetry(backoff=1, retry_total=self._retries, random_jitter_range=1),
                connection_timeout=min(5.0, self._timeout),
                read_timeout=self._timeout,
                raw_request_hook=self._on_request,
                raw_response_hook=self._on_response,
            )
        except ValueError as exc:
            problem = self._redact(exc)
            raise StoreError(f"{CONNECTION_STRING_ENV} is not a storage connection string: {problem}") from None

    def _on_request(self, request: Any) -> None:
        self.requests += 1

    def _on_response(self, response: Any) -> None:
        date = response.http_response.headers.get("Date")
        if not date:
            return
        try:
            served = parsedate_to_datetime(date).timestamp()
        except (TypeError, ValueError):
            return
        # Any response is a lower bound of the service's clock when it arrived; keep the newest.
        if self._anchor is None or served > self._anchor[0]:
            self._anchor = (served, time.monotonic())

    def _redact(self, exc: BaseException | str) -> str:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return _SIG.sub(r"\1***", text)

    def _error(self, doing: str, exc: AzureError) -> StoreError:
        """The StoreError (StoreUnavailable when the service could not be reached) for ``exc``."""
        status = getattr(exc, "status_code", None)
        code = getattr(exc, "error_code", None)
        cls: type[StoreError] = StoreError
        if isinstance(exc, ServiceRequestError | ServiceResponseError):
            cls, why = StoreUnavailable, "cannot reach the service"
        elif status is not None and (status >= 500 or status in (408, 429)):
            cls, why = StoreUnavailable, f"the service answered {status}"
        elif isinstance(exc, ClientAuthenticationError) or status in (401, 403):
            why = f"the service refused the credentials of {CONNECTION_STRING_ENV} ({status or 'signing'})"
        elif code == "ContainerNotFound":
            why = "the container does not exist (deleted while running?)"
        else:
            why = f"the service answered {status} {code or ''}".rstrip()
        return cls(f"blob store {self.where}: {doing}: {why}: {self._redact(exc)}")

    def _container(self) -> ContainerClient:
        # An aiohttp session belongs to the loop that opened it: a store used from another loop
        # (a thread with asyncio.run) gets a client of its own there.
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._used:  # by another loop, or closed by aclose()
                self._client = self._new_client()
            self._loop, self._used = loop, True
        return self._client

    async def _ready(self) -> ContainerClient:
        """The client, the container created on first use (a wrong key or endpoint fails here)."""
        client = self._container()
        if not self._ready_done:
            try:
                if not await client.exists():
                    try:
                        await client.create_container()
                        log.info("created blob %s", self.where)
                    except ResourceExistsError:
                        pass  # another worker created it first
            except AzureError as exc:
                raise self._error("opening the container", exc) from None
            self._ready_done = True
        return client

    async def _run(self, doing: str, call: Callable[[ContainerClient], Awaitable[T]]) -> T:
        client = await self._ready()
        try:
            return await call(client)
        except AzureError as exc:
            raise self._error(doing, exc) from None

    async def _list(self, prefix: str) -> list[BlobProperties]:
        async def listing(client: ContainerClient) -> list[BlobProperties]:
            return [b async for b in client.list_blobs(name_starts_with=prefix, include=["metadata"])]

        return await self._run(f"listing {prefix!r}", listing)

    def _parsed(
        self, prefix: str, blobs: Iterable[BlobProperties], parse: Callable[[str, BlobProperties], T]
    ) -> list[T]:
        """Parse each blob of one listing; log and note the ones that cannot be read and go on."""
        found: list[T] = []
        problems: dict[str, CorruptRecord] = {}
        for blob in blobs:
            try:
                found.append(parse(blob.name[len(prefix):], blob))
            except ValueError as exc:
                problems[blob.name] = CorruptRecord(f"blob {blob.name!r} in {self.where}", str(exc))
                if prefix.endswith("/ownership/") and blob.etag:
                    self._corrupt_etags[blob.name] = _etag(blob.etag)
        for name in [n for n in self._corrupt if n.startswith(prefix) and n not in problems]:
            del self._corrupt[name]
            self._corrupt_etags.pop(name, None)
        for name, problem in problems.items():
            known = self._corrupt.get(name)
            level = logging.DEBUG if known is not None and known.problem == problem.problem else logging.WARNING
            log.log(level, "skipped %s", problem)
            self._corrupt[name] = problem
        return found

    # the clock -----------------------------------------------------------------------------

    async def now(self) -> float:
        """The service's clock (see the module docstring); costs a request only before the first one."""
        if self._anchor is None:
            await self._ready()
        if self._anchor is None:
            await self._run("reading the service's clock", lambda client: client.exists())
        if self._anchor is None:
            raise StoreError(f"blob store {self.where}: the service sent no Date header")
        served, received = self._anchor
        self._last_now = max(self._last_now, served + math.floor(time.monotonic() - received))
        return self._last_now

    # ownership -----------------------------------------------------------------------------

    async def snapshot(self, ref: HubRef) -> Snapshot:
        """Ownership, members and controls from ONE listing of the scope (checkpoint blobs come
        along and are ignored), with the service's clock from that response."""
        scope = scope_prefix(ref)
        blobs = await self._list(scope)
        parts: dict[str, list[BlobProperties]] = {
            "ownership/": [], "leaseboard/members/": [], "leaseboard/controls/": []
        }
        for blob in blobs:
            for sub, found in parts.items():
                if blob.name.startswith(scope + sub):
                    found.append(blob)
        return Snapshot(
            self._parsed(scope + "ownership/", parts["ownership/"], lambda pid, b: parse_ownership(ref, pid, b)),
            self._parsed(
                scope + "leaseboard/members/", parts["leaseboard/members/"], lambda e, b: parse_member(ref, e, b)
            ),
            self._parsed(
                scope + "leaseboard/controls/", parts["leaseboard/controls/"], lambda x, b: parse_control(ref, x, b)
            ),
            await self.now(),
        )

    async def list_ownership(self, ref: HubRef) -> list[OwnershipRecord]:
        """Every readable ownership record of ``ref`` (one request); unreadable blobs are skipped."""
        prefix = scope_prefix(ref) + "ownership/"
        blobs = await self._list(prefix)
        return self._parsed(prefix, blobs, lambda pid, blob: parse_ownership(ref, pid, blob))

    async def claim_ownership(self, records: Sequence[OwnershipRecord]) -> list[OwnershipRecord]:
        """Write each record at once (one request each); return those won.

        Raises StoreUnavailable or StoreError if any write failed for another reason than a lost
        race; writes that went through before it stay written, and the next listing shows them.
        """
        for record in records:
            _header_value(record.owner_id, "owner id")
        if not records:
            return []
        client = await self._ready()
        results = await asyncio.gather(*(self._claim_one(client, r) for r in records), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            first = failures[0]
            if not isinstance(first, AzureError):
                raise first
            written = sum(isinstance(r, OwnershipRecord) for r in results)
            raise self._error(f"claiming {len(records)} partition(s), {written} written before the error", first)
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
        etag = record.etag if record.etag is not None else self._corrupt_etags.get(name)
        try:
            if etag is None:
                props = await blob.upload_blob(b"", metadata=metadata, overwrite=False)
            else:
                props = await blob.set_blob_metadata(metadata, etag=etag, match_condition=MatchConditions.IfNotModified)
        except (ResourceModifiedError, ResourceExistsError):
            return None  # someone wrote the record since the caller looked (or created it first)
        except ResourceNotFoundError as exc:
            if _container_gone(exc):
                raise
            return None  # the ETag names a record that was deleted since
        self._corrupt_etags.pop(name, None)
        return replace(record, etag=_etag(str(props["etag"])), last_modified=_written(props))

    # checkpoints ---------------------------------------------------------------------------

    async def list_checkpoints(self, ref: HubRef) -> list[Checkpoint]:
        """Every readable checkpoint of ``ref`` (one request); unreadable blobs are skipped."""
        prefix = scope_prefix(ref) + "checkpoint/"
        blobs = await self._list(prefix)
        return self._parsed(prefix, blobs, lambda pid, blob: parse_checkpoint(ref, pid, blob))

    async def update_checkpoint(self, checkpoint: Checkpoint, owner_id: str) -> Checkpoint:
        """Write ``checkpoint`` if the ownership blob names ``owner_id`` (two requests: read, write).

        Raises OwnershipLost, writing nothing, when it does not. The check and the write are two
        requests, and a blob write cannot be conditioned on *another* blob: a claim landing
        between them lets the old owner's last checkpoint in after it. That needs a steal within
        milliseconds of a checkpoint: expiry cannot do it (the runtime stops checkpointing once
        ``holds()`` says the lease may be gone, before the service's expiry), and a planned
        handoff releases only after the final checkpoint. The late checkpoint is of events the
        old owner did process, and Microsoft's own store does not check ownership at all.
        """
        name = ownership_blob(checkpoint.ref, checkpoint.partition_id)
        pid = checkpoint.partition_id
        offset = NO_OFFSET if checkpoint.offset is None else _header_value(checkpoint.offset, "offset")

        # No retry by the SDK (its backoff is a second or two): the pump waits for this call, and it
        # must go on handling events through an outage. It tries again at its next checkpoint.
        async def write(client: ContainerClient) -> Checkpoint:
            try:
                owner_props = await client.get_blob_client(name).get_blob_properties(retry_total=0)
            except ResourceNotFoundError as exc:
                if _container_gone(exc):
                    raise
                raise OwnershipLost(pid, owner_id, None) from None
            holder = _metadata(owner_props).get("ownerid", "")
            if not owner_id or holder != owner_id:
                raise OwnershipLost(pid, owner_id, holder or None)
            metadata = {"offset": offset, "sequencenumber": str(checkpoint.sequence_number)}
            blob = client.get_blob_client(checkpoint_blob(checkpoint.ref, pid))
            props = await blob.upload_blob(b"", metadata=metadata, overwrite=True, retry_total=0)
            return replace(checkpoint, last_modified=_written(props))

        return await self._run(f"checkpointing partition {pid}", write)

    # members and controls ------------------------------------------------------------------

    async def heartbeat(self, member: Member) -> None:
        """One write; ``last_seen`` becomes the blob's Last-Modified (the service's clock)."""
        info = json.dumps(dict(member.info), ensure_ascii=True, sort_keys=True)
        name = member_blob(member.ref, member.owner_id)

        async def write(client: ContainerClient) -> None:
            await client.get_blob_client(name).upload_blob(b"", metadata={"info": info}, overwrite=True)

        await self._run(f"heartbeat of {member.owner_id!r}", write)

    async def list_members(self, ref: HubRef) -> list[Member]:
        prefix = scope_prefix(ref) + "leaseboard/members/"
        blobs = await self._list(prefix)
        return self._parsed(prefix, blobs, lambda encoded, blob: parse_member(ref, encoded, blob))

    async def remove_member(self, ref: HubRef, owner_id: str) -> None:
        await self._delete(member_blob(ref, owner_id), f"removing member {owner_id!r}")

    async def list_controls(self, ref: HubRef) -> list[Control]:
        prefix = scope_prefix(ref) + "leaseboard/controls/"
        blobs = await self._list(prefix)
        return self._parsed(prefix, blobs, lambda suffix, blob: parse_control(ref, suffix, blob))

    async def put_control(self, control: Control) -> None:
        """Create or replace (one write); ``created`` becomes the blob's Last-Modified."""
        name = control_blob(control.ref, control.kind, control.target)
        metadata = {"value": quote(control.value, safe="")}

        async def write(client: ContainerClient) -> None:
            await client.get_blob_client(name).upload_blob(b"", metadata=metadata, overwrite=True)

        await self._run(f"writing control {control.kind.value} {control.target!r}", write)

    async def delete_control(self, ref: HubRef, kind: str, target: str) -> None:
        await self._delete(control_blob(ref, ControlKind(kind), target), f"deleting control {kind} {target!r}")

    async def _delete(self, name: str, doing: str) -> None:
        async def delete(client: ContainerClient) -> None:
            try:
                await client.get_blob_client(name).delete_blob()
            except ResourceNotFoundError as exc:
                if _container_gone(exc):
                    raise

        await self._run(doing, delete)
