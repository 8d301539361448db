"""The Redis store: ownership, checkpoints, heartbeats and controls in Redis hashes.

Keys (one hash per kind of record, so every listing is ONE ``HGETALL``)::

    leaseboard:{<namespace>/<hub>/<consumer group>}:ownership    partition -> {"owner", "etag", "modified", "level"}
    leaseboard:{...}:checkpoints                                 partition -> {"sequence", "offset", "modified"}
    leaseboard:{...}:members                                     owner id  -> {"seen", "info"}
    leaseboard:{...}:controls                                    "<kind>/<target>" -> {"value", "created"}
    leaseboard:{...}:etags                                       counter, part of every ETag

The scope in braces is a Redis Cluster hash tag: every key of one hub and consumer group lives in
one slot, so the scripts (some touch two keys at once) would run on a cluster too. Scope parts are
percent-encoded, so no name can contain a brace and widen or split the tag. Every script receives
its keys in ``KEYS`` and touches nothing else; a test runs the store as an ACL user allowed only
one scope's keys to prove it. Keys and scripts are in ``redis_layout``, the reading of each
record in ``redis_records``; this module sends them.

Compare-and-set runs on the server, in Lua: a claim compares the stored ETag and writes in one
atomic step, and a checkpoint is written only while the ownership record names the caller (the
same script reads one key and writes the other, so no claim can land in between). Times are the
server's: each script reads Redis ``TIME`` for ``modified``/``seen``/``created``, ``now()`` is
``TIME`` too, so expiry is judged by one clock whatever the workers' clocks say. Times are kept
as decimal strings with microseconds (Lua's JSON encoder would round a number to 14 digits).
ETags are ``<server time>-<counter>``: unique even after a restart without persistence resets
the counter, so an ETag seen before a restart can never match a record written after it.

Errors: a Redis that cannot be reached (refused, reset, timed out, still loading) raises
StoreUnavailable naming host, port and database, never the password; refused credentials or a
command the server rejects (an ACL, a read-only replica) raise StoreError. A hand-edited record
costs only itself (``balancer.stores.flaws``): one whose time is not a finite number is listed with
None (an ownership record so is expired), one whose ETag is no non-empty string with a made-up one
naming its stored value (the claim script makes up the same), so the claim carrying the listed ETag
replaces it; one that cannot be read at all (not JSON, no owner, no partition id, a member without
a ``seen`` time, a checkpoint without a sequence number: read as absent, so its partition resumes
from the processor's starting position rather than stalling, and its owner's next checkpoint
rewrites it) is skipped, and a first claim may overwrite an unreadable ownership record, so it
never blocks its partition. Each is logged once, as a warning, and listed in ``corrupt``.

One ``RedisStore`` may be used from several event loops (a management command after another, a
test's threads): each loop gets its own client and connection pool.
"""

from __future__ import annotations

import asyncio
import json
import threading
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from functools import partial
from typing import Any, TypeVar
from urllib.parse import urlsplit

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import AuthenticationError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from balancer.changes import Changes
from balancer.errors import CorruptRecord, OwnershipLost, StoreError, StoreUnavailable
from balancer.model import RESET_OWNER, Checkpoint, Control, ControlKind, HubRef, Member, OwnershipRecord
from balancer.protocol import Snapshot
from balancer.stores.redis_layout import CHANGES, CHECKPOINT, CLAIM, STAMPED, Keys, scope
from balancer.stores.redis_notices import RedisReleaseChannel
from balancer.stores.redis_records import (
    ENCODING_ERRORS,
    Skipped,
    parse_checkpoint,
    parse_control,
    parse_member,
    parse_ownership,
    server_time,
    text,
    texts,
)
from balancer.stores.unchanged import LastReads

__all__ = ["URL_ENV", "Connection", "Keys", "RedisStore", "describe_url", "scope"]

T = TypeVar("T")

URL_ENV = "REDIS_URL"  # the setting of the URL, named in messages; the wiring passes its value in


# the store -----------------------------------------------------------------------------------


@dataclass
class Connection:
    """One event loop's client and its registered scripts."""

    client: Redis
    claim: AsyncScript
    checkpoint: AsyncScript
    stamped: AsyncScript
    scripts: dict[str, AsyncScript] = dataclass_field(default_factory=dict)

    def script(self, source: str) -> AsyncScript:
        """``source`` registered on this client (once)."""
        found = self.scripts.get(source)
        if found is None:
            found = self.scripts[source] = self.client.register_script(source)
        return found


def describe_url(url: str) -> str:
    """``host:port/db`` of a Redis URL: what error messages name (never the user or password)."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"unix:{parts.path}"
    database = parts.path.strip("/") or "0"
    return f"{parts.hostname or 'localhost'}:{parts.port or 6379}/{database}"


class RedisStore:
    """Every store protocol on one Redis database (``url``: ``redis://[:password@]host:port/db``).

    ``requests`` counts round trips to Redis; ``corrupt`` lists the records the latest listings
    skipped, with what is wrong with each.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        connect_timeout: float = 2.0,
        timeout: float = 3.0,
        client_name: str | None = None,
    ) -> None:
        if not url:
            raise StoreError(f"no Redis URL: set {URL_ENV} (redis://host:port/db) or pass one")
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise StoreError(f"{URL_ENV} must be a redis://, rediss:// or unix:// URL, got scheme {parts.scheme!r}")
        self.url = url
        self.where = describe_url(url)
        self._secret = parts.password or ""
        self._connect_timeout = connect_timeout
        self._timeout = timeout
        self._client_name = client_name
        self._lock = threading.Lock()
        self._connections: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Connection] = (
            weakref.WeakKeyDictionary()
        )
        self._skipped = Skipped()
        self._unchanged = LastReads()  # the members and controls hashes, by key
        self.requests = 0

    def __repr__(self) -> str:
        return f"RedisStore({self.where!r})"

    @property
    def corrupt(self) -> list[CorruptRecord]:
        return self._skipped.records

    async def __aenter__(self) -> RedisStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close this event loop's connections (others close with their loops)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            connection = self._connections.pop(loop, None)
        if connection is not None:
            await connection.client.aclose()

    # connections ---------------------------------------------------------------------------

    def client(self) -> Redis:
        """The client of the running event loop (made on first use)."""
        return self._connection().client

    def new_client(self, retries: int = 2, *, read_timeout: bool = True) -> Redis:
        """A client of its own (e.g. for a subscription), on the same URL and timeouts. Without
        ``read_timeout`` its commands have none of their own: the caller bounds them (``run``)."""
        # Retries cover a pooled connection that died with a restarted server: the command never
        # ran there, so sending it again on a fresh connection is safe. Timeouts are not retried:
        # a renewal must fail fast rather than outlast its lease.
        retry = Retry(ExponentialBackoff(cap=0.2, base=0.02), retries, supported_errors=(RedisConnectionError,))
        return Redis.from_url(
            self.url,
            socket_connect_timeout=self._connect_timeout,
            socket_timeout=self._timeout if read_timeout else None,
            retry=retry,
            client_name=self._client_name,
            decode_responses=True,
            encoding_errors=ENCODING_ERRORS,  # a hand edit's bytes that are not UTF-8 cannot fail a listing
        )

    def release_channel(self, ref: HubRef) -> RedisReleaseChannel:
        """Release notices of ``ref`` on Redis pub/sub (``balancer.notices``)."""
        return RedisReleaseChannel(self.client, self.new_client, self.where, ref)

    def _connection(self) -> Connection:
        loop = asyncio.get_running_loop()
        with self._lock:
            connection = self._connections.get(loop)
            if connection is None:
                # No read timeout in redis-py: with one, every command's send is an asyncio.wait_for,
                # a task of its own on Python 3.11 (a third of the loop's turns of an idle worker's
                # cycle). ``run`` bounds each round trip with asyncio.timeout instead.
                client = self.new_client(read_timeout=False)
                connection = Connection(
                    client,
                    client.register_script(CLAIM),
                    client.register_script(CHECKPOINT),
                    client.register_script(STAMPED),
                )
                self._connections[loop] = connection
        return connection

    def scrub(self, message: str) -> str:
        """``message`` without the password (for messages that quote the server or the client)."""
        return message.replace(self._secret, "***") if self._secret else message

    def error(self, doing: str, exc: BaseException) -> StoreError:
        """The StoreError (or StoreUnavailable) that says why ``doing`` failed."""
        reason = self.scrub(str(exc) or type(exc).__name__)
        if isinstance(exc, AuthenticationError) or (
            isinstance(exc, ResponseError) and str(exc).startswith(("NOAUTH", "WRONGPASS"))
        ):
            return StoreError(f"Redis at {self.where} refused the credentials of {URL_ENV} ({doing}): {reason}")
        if isinstance(exc, RedisConnectionError | RedisTimeoutError | OSError):
            return StoreUnavailable(f"cannot reach Redis at {self.where} ({doing}): {reason}")
        return StoreError(f"Redis at {self.where} refused {doing}: {reason}")

    async def run(self, doing: str, call: Callable[[Connection], Awaitable[T]], count: bool = True) -> T:
        """One round trip (counted in ``requests`` unless the caller counts it itself); Redis errors
        become StoreError/StoreUnavailable (see ``error``)."""
        self.requests += count
        connection = self._connection()
        try:
            async with asyncio.timeout(self._timeout):
                return await call(connection)
        except TimeoutError:  # the connection was dropped mid-command: the next one connects afresh
            raise self.error(doing, RedisTimeoutError(f"no answer within {self._timeout:g}s")) from None
        except (RedisConnectionError, RedisTimeoutError, ResponseError, OSError) as exc:
            raise self.error(doing, exc) from None

    async def _hash(self, doing: str, key: str) -> dict[str, str]:
        async def hgetall(c: Connection) -> dict[str, str]:
            return texts(await c.client.hgetall(key))

        return await self.run(doing, hgetall)

    # clock ---------------------------------------------------------------------------------

    async def now(self) -> float:
        """Redis ``TIME``: the clock every ``modified``, ``seen`` and ``created`` is written with."""

        async def time(c: Connection) -> float:
            return server_time(*await c.client.time())

        return await self.run("TIME", time)

    # one cycle's read ----------------------------------------------------------------------

    async def snapshot(self, ref: HubRef) -> Snapshot:
        """Ownership, members, controls and ``TIME`` in one round trip (``MULTI``/``EXEC``: one
        consistent view, as the cycle needs it), rather than four."""
        keys = Keys.of(ref)

        async def read(c: Connection) -> list[Any]:
            async with c.client.pipeline(transaction=True) as pipe:
                for key in (keys.ownership, keys.members, keys.controls):
                    pipe.hgetall(key)
                pipe.time()
                return list(await pipe.execute())

        ownership, members, controls, (seconds, micros) = await self.run("reading a snapshot", read)
        return Snapshot(
            self._ownership(ref, ownership), self._members(ref, members), self._controls(ref, controls),
            server_time(seconds, micros),
        )  # fmt: skip

    async def snapshot_since(self, ref: HubRef, cursor: str | None, stale_after: float | None = None) -> Changes:
        """``snapshot`` with only the ownership records written after ``cursor`` (``balancer.changes``),
        in one round trip (a script: atomic, so the records and the counter read agree). Each write
        takes its change number from the hub's counter in the claim script, so the numbers are in the
        order of the writes; the script reads everything when the cursor is of another epoch (a
        FLUSHALL, a restart) or past the counter. ``count`` is ``HLEN``: a record deleted by hand
        shows as a copy larger than the store's. With ``stale_after`` renewals are left out (the claim
        script numbers owner changes apart and keeps each record's time in a sorted set)."""
        keys = Keys.of(ref)
        epoch, _, serial = (cursor or "").partition(":")
        stale = "" if stale_after is None else repr(float(stale_after))

        async def read(c: Connection) -> list[Any]:
            keys_ = [keys.ownership, keys.changes, keys.etags, keys.epoch, keys.members, keys.controls,
                     keys.owner_changes, keys.modified]  # fmt: skip
            return list(await c.script(CHANGES)(keys=keys_, args=[epoch, serial, stale]))

        seconds, micros, epoch, counter, full, count, flat, members, controls, fresh = await self.run(
            "reading changes", read
        )
        raw = _pairs(flat)
        ownership = self._ownership(ref, raw, whole=bool(int(full)))
        fresh_after = float(text(fresh)) if text(fresh) else None
        if not int(full) and len(ownership) < len(raw):
            # A record written lately that cannot be read (a hand edit over it): a full listing would
            # leave it out, a copy would keep its older version. Read all, as a listing would.
            ownership, full, fresh_after = await self.list_ownership(ref), 1, None
        epoch = text(epoch)
        # A whole listing is the table; after a delta, the store's count of the records a listing shows
        # (the unreadable ones it skips left out) checks the copy's size.
        shown = None if int(full) else int(count) - self._skipped.unread(keys.ownership)
        return Changes(
            ownership, self._members(ref, _pairs(members)), self._controls(ref, _pairs(controls)),
            server_time(seconds, micros), f"{epoch}:{text(counter)}" if epoch else None, bool(int(full)), shown,
            fresh_after=fresh_after,
            # Leaving renewals out, every record no script wrote for ``stale_after`` is listed as stored,
            # so a hand edit (redis-cli) shows within that, unless a script writes the record first;
            # a record added or deleted by hand shows at once in the count.
            sees_every_write=fresh_after is not None,
        )  # fmt: skip

    # ownership -----------------------------------------------------------------------------

    async def list_ownership(self, ref: HubRef) -> list[OwnershipRecord]:
        return self._ownership(ref, await self._hash("listing ownership", Keys.of(ref).ownership))

    def _ownership(self, ref: HubRef, raw: Mapping[Any, Any], whole: bool = True) -> list[OwnershipRecord]:
        key = Keys.of(ref).ownership
        return sorted(self._skipped.parsed(key, texts(raw), partial(parse_ownership, ref), whole), key=_by_pid)

    async def claim_ownership(self, records: Sequence[OwnershipRecord]) -> list[OwnershipRecord]:
        """One script call per hub and consumer group among ``records`` (usually one)."""
        won: dict[tuple[HubRef, str], OwnershipRecord] = {}
        for ref, group in _grouped(records).items():
            keys = Keys.of(ref)
            args: list[str] = []
            for r in group:
                # A first claim of a partition whose record the latest listing skipped as unreadable
                # carries that record's made-up ETag: it replaces the record only if it is unchanged.
                etag = r.etag or self._skipped.etag_of(keys.ownership, r.partition_id) or ""
                args += [r.partition_id, r.owner_id, etag, str(int(r.owner_level))]

            async def claim(c: Connection, keys: Keys = keys, args: list[str] = args) -> Any:
                return await c.claim(
                    keys=[keys.ownership, keys.etags, keys.changes, keys.epoch, keys.owner_changes, keys.modified],
                    args=args,
                )

            now_text, wins = await self.run("a claim", claim)
            now = float(now_text)
            for n, etag in wins:
                r = group[int(n) - 1]
                won[(ref, r.partition_id)] = OwnershipRecord(
                    ref, r.partition_id, r.owner_id, text(etag), now, r.owner_level
                )
        return list(won.values()) if len(won) < 2 else [won[k] for k in _order(records) if k in won]

    # checkpoints ---------------------------------------------------------------------------

    async def list_checkpoints(self, ref: HubRef) -> list[Checkpoint]:
        key = Keys.of(ref).checkpoints
        raw = await self._hash("listing checkpoints", key)
        return sorted(self._skipped.parsed(key, raw, partial(parse_checkpoint, ref)), key=_by_pid)

    async def update_checkpoint(self, checkpoint: Checkpoint, owner_id: str) -> Checkpoint:
        """Written only while the ownership record names ``owner_id`` and, unless ``owner_id`` is
        ``RESET_OWNER`` (an operator's reset), not below the stored sequence (checked in the same script).

        Raises OwnershipLost, writing nothing, when it does not own it; StoreError for a write that
        would move the checkpoint back (see ``redis_layout.CHECKPOINT``).
        """
        keys = Keys.of(checkpoint.ref)
        payload = json.dumps({"sequence": str(checkpoint.sequence_number), "offset": checkpoint.offset})

        backward = "1" if owner_id == RESET_OWNER else ""

        async def write(c: Connection) -> Any:
            return await c.checkpoint(
                keys=[keys.ownership, keys.checkpoints], args=[checkpoint.partition_id, owner_id, payload, backward]
            )

        written, value = await self.run("a checkpoint", write)
        if int(written) == 2:
            raise StoreError(
                f"checkpoint of partition {checkpoint.partition_id} would go back from {text(value)} to "
                f"{checkpoint.sequence_number}: refused (a stale write; only an operator's reset moves it back)"
            )
        if int(written) != 1:
            holder = text(value)
            raise OwnershipLost(checkpoint.partition_id, owner_id, holder or None)
        return Checkpoint(
            checkpoint.ref, checkpoint.partition_id, checkpoint.sequence_number, checkpoint.offset, float(value)
        )

    # members and controls ------------------------------------------------------------------

    async def _stamped(self, doing: str, key: str, field: str, value: dict[str, Any], stamp: str) -> None:
        async def write(c: Connection) -> Any:
            return await c.stamped(keys=[key], args=[field, json.dumps(value), stamp])

        await self.run(doing, write)

    async def heartbeat(self, member: Member) -> None:
        if not member.owner_id:
            raise ValueError("a member needs a non-empty owner id")
        key = Keys.of(member.ref).members
        await self._stamped("a heartbeat", key, member.owner_id, {"info": dict(member.info)}, "seen")

    async def list_members(self, ref: HubRef) -> list[Member]:
        return self._members(ref, await self._hash("listing members", Keys.of(ref).members))

    def _members(self, ref: HubRef, raw: Mapping[Any, Any]) -> list[Member]:
        key = Keys.of(ref).members
        parse = partial(parse_member, ref)
        return self._unchanged.records(
            key, dict(raw), lambda: sorted(self._skipped.parsed(key, texts(raw), parse), key=_owner)
        )

    async def remove_member(self, ref: HubRef, owner_id: str) -> None:
        key = Keys.of(ref).members

        async def remove(c: Connection) -> Any:
            return await c.client.hdel(key, owner_id)

        await self.run("removing a member", remove)

    async def list_controls(self, ref: HubRef) -> list[Control]:
        return self._controls(ref, await self._hash("listing controls", Keys.of(ref).controls))

    def _controls(self, ref: HubRef, raw: Mapping[Any, Any]) -> list[Control]:
        key = Keys.of(ref).controls
        parse = partial(parse_control, ref)
        return self._unchanged.records(key, dict(raw), lambda: self._skipped.parsed(key, texts(raw), parse))

    async def put_control(self, control: Control) -> None:
        if not control.target:
            raise ValueError("a control needs a non-empty target")
        key = Keys.of(control.ref).controls
        field = f"{ControlKind(control.kind).value}/{control.target}"
        await self._stamped("a control", key, field, {"value": control.value}, "created")

    async def delete_control(self, ref: HubRef, kind: str, target: str) -> None:
        key = Keys.of(ref).controls
        field = f"{ControlKind(kind).value}/{target}"

        async def delete(c: Connection) -> Any:
            return await c.client.hdel(key, field)

        await self.run("deleting a control", delete)


def _pairs(flat: Sequence[Any]) -> dict[str, str]:
    """A hash as a script returns it (field, value, field, value, ...) as a dict of text."""
    return {text(flat[i]): text(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}


def _owner(member: Member) -> str:
    return member.owner_id


def _by_pid(record: OwnershipRecord | Checkpoint) -> int:
    return int(record.partition_id)


def _grouped(records: Sequence[OwnershipRecord]) -> dict[HubRef, list[OwnershipRecord]]:
    groups: dict[HubRef, list[OwnershipRecord]] = {}
    for record in records:
        groups.setdefault(record.ref, []).append(record)
    return groups


def _order(records: Sequence[OwnershipRecord]) -> list[tuple[HubRef, str]]:
    """(ref, partition) of ``records`` in request order, each once."""
    return list(dict.fromkeys((r.ref, r.partition_id) for r in records))
