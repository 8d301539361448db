"""The names and metadata of the blob store's records: those of Microsoft's blob checkpoint store
for ownership and checkpoints, so its processors and Leaseboard's can share one container, and
Leaseboard's own beside them (the layout is drawn in ``balancer.stores.blob``).

Pure: listed blobs come in as ``ListedBlob`` (what the SDK's ``BlobProperties`` has), records come out.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any, Protocol, TypeVar
from urllib.parse import quote, unquote

from balancer.errors import CorruptRecord
from balancer.model import Checkpoint, Control, ControlKind, HubRef, Member, OwnershipRecord, check_partition_id

log = logging.getLogger("balancer.stores.azure_blob")  # the store's own log: operators look for it there
T = TypeVar("T")

NO_OFFSET = "-1"  # Event Hubs' "start of stream": what a checkpoint without an offset is written with


class ListedBlob(Protocol):
    """What a listing (or a read of its properties) tells of one blob."""

    @property
    def name(self) -> str: ...

    @property
    def etag(self) -> str | None: ...

    @property
    def last_modified(self) -> datetime | None: ...

    @property
    def metadata(self) -> Mapping[str, str | None] | None: ...


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


def header_value(value: str, what: str) -> str:
    """``value`` if it can travel as a metadata header (printable ASCII); ValueError otherwise."""
    if not (value.isascii() and value.isprintable()) or value != value.strip():
        raise ValueError(f"{what} {value!r} cannot be stored in blob metadata: use printable ASCII without edge spaces")
    return value


def bare_etag(value: str) -> str:
    """ETags without quotes: List Blobs returns them bare, writes return them quoted; If-Match takes both."""
    return value.strip('"')


def metadata_of(blob: ListedBlob) -> dict[str, str]:
    """A blob's metadata with lowercased keys."""
    # Keys are case-insensitive in the service; an empty value is listed as None by the SDK.
    return {str(k).lower(): (v or "") for k, v in (blob.metadata or {}).items()}


def _modified(blob: ListedBlob) -> float:
    if blob.last_modified is None:
        raise ValueError("the listing gave no Last-Modified")
    return float(blob.last_modified.timestamp())


def written_at(props: Mapping[str, Any]) -> float:
    """The Last-Modified of a write's response, as seconds since the epoch."""
    return float(props["last_modified"].timestamp())


def _required(meta: Mapping[str, str], key: str) -> str:
    if key not in meta:
        found = ", ".join(sorted(meta)) or "none"
        raise ValueError(f"no {key!r} metadata (keys found: {found})")
    return meta[key]


def parse_ownership(ref: HubRef, partition_id: str, blob: ListedBlob) -> OwnershipRecord:
    """The record an ownership blob holds; ValueError saying what is wrong with it."""
    meta = metadata_of(blob)
    owner = _required(meta, "ownerid")
    level_text = meta.get("ownerlevel") or "0"
    try:
        level = int(level_text)
    except ValueError:
        raise ValueError(f"ownerlevel {level_text!r} is not an integer") from None
    if blob.etag is None:
        raise ValueError("the listing gave no ETag")
    return OwnershipRecord(ref, check_partition_id(partition_id), owner, bare_etag(blob.etag), _modified(blob), level)


def parse_checkpoint(ref: HubRef, partition_id: str, blob: ListedBlob) -> Checkpoint:
    """The checkpoint a checkpoint blob holds (offset optional, sequencenumber required)."""
    meta = metadata_of(blob)
    text = _required(meta, "sequencenumber")
    try:
        sequence_number = int(text)
    except ValueError:
        raise ValueError(f"sequencenumber {text!r} is not an integer") from None
    offset = meta.get("offset") or None
    if offset in (NO_OFFSET, "None"):  # "None": what Microsoft's store writes for a missing offset
        offset = None
    return Checkpoint(ref, check_partition_id(partition_id), sequence_number, offset, _modified(blob))


def parse_member(ref: HubRef, encoded_id: str, blob: ListedBlob) -> Member:
    owner_id = unquote(encoded_id)
    if not owner_id or "/" in encoded_id:
        raise ValueError(f"{encoded_id!r} is not an encoded owner id")
    info_text = metadata_of(blob).get("info") or "{}"
    try:
        info = json.loads(info_text)
    except ValueError:
        raise ValueError(f"info {info_text[:80]!r} is not JSON") from None
    if not isinstance(info, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in info.items()):
        raise ValueError(f"info {info_text[:80]!r} is not an object of strings")
    return Member(ref, owner_id, _modified(blob), info)


def parse_control(ref: HubRef, suffix: str, blob: ListedBlob) -> Control:
    kind_text, _, encoded = suffix.partition("/")
    try:
        kind = ControlKind(kind_text)
    except ValueError:
        raise ValueError(f"unknown control kind {kind_text!r}") from None
    if not encoded or "/" in encoded:
        raise ValueError(f"{suffix!r} is not <kind>/<encoded target>")
    value = unquote(_required(metadata_of(blob), "value"))
    return Control(ref, kind, unquote(encoded), value, _modified(blob))


class Skipped:
    """The blobs the latest listing of each kind could not read (``BlobStore.corrupt``), and the
    ETags of the ownership blobs among them (a claim may overwrite those: see ``etag_of``)."""

    def __init__(self, where: str) -> None:
        self._where = where
        self._found: dict[str, CorruptRecord] = {}
        self._etags: dict[str, str] = {}  # ownership blobs skipped as corrupt -> their ETag

    @property
    def records(self) -> list[CorruptRecord]:
        return list(self._found.values())

    def etag_of(self, name: str) -> str | None:
        """The ETag of ownership blob ``name`` if the latest listing skipped it as unreadable."""
        return self._etags.get(name)

    def overwritten(self, name: str) -> None:
        self._etags.pop(name, None)

    def parsed(self, prefix: str, blobs: Iterable[ListedBlob], parse: Callable[[str, ListedBlob], T]) -> list[T]:
        """Parse each blob of one listing of ``prefix``; log and note the ones that cannot be read and go on."""
        found: list[T] = []
        problems: dict[str, CorruptRecord] = {}
        for blob in blobs:
            try:
                found.append(parse(blob.name[len(prefix) :], blob))
            except ValueError as exc:
                problems[blob.name] = CorruptRecord(f"blob {blob.name!r} in {self._where}", str(exc))
                if prefix.endswith("/ownership/") and blob.etag:
                    self._etags[blob.name] = bare_etag(blob.etag)
        for name in [n for n in self._found if n.startswith(prefix) and n not in problems]:
            del self._found[name]
            self._etags.pop(name, None)
        for name, problem in problems.items():
            known = self._found.get(name)
            level = logging.DEBUG if known is not None and known.problem == problem.problem else logging.WARNING
            log.log(level, "skipped %s", problem)
            self._found[name] = problem
        return found
