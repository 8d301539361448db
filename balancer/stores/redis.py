"""The Redis store: ownership, checkpoints, heartbeats and controls in Redis hashes.

Keys (one hash per kind of record, so every listing is ONE ``HGETALL``)::

    leaseboard:{<namespace>/<hub>/<consumer group>}:ownership    partition -> {"owner", "etag", "modified", "level"}
    leaseboard:{...}:checkpoints                                 partition -> {"sequence", "offset", "modified"}
    leaseboard:{...}:members                                     owner id  -> {"seen", "info"}
    leaseboard:{...}:controls                                    "<kind>/<target>" -> {"value", "created"}
    leaseboard:{...}:etags                                       counter, part of every ETag

The scope in braces is a Redis Cluster hash tag: every key of one hub and consumer group lives in
one slot, so the scripts below (which touch two keys at once) would run on a cluster too. Scope
parts are percent-encoded, so no name can contain a brace and widen or split the tag. Every
script receives its keys in ``KEYS`` and touches nothing else; a test runs the store as an ACL
user allowed only one scope's keys to prove it.

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
command the server rejects (an ACL, a read-only replica) raise StoreError. A record that cannot
be read (hand-edited) is logged once, listed in ``corrupt`` and skipped; a first claim may
overwrite an unreadable ownership record, so it never blocks its partition.

One ``RedisStore`` may be used from several event loops (a management command after another, a
test's threads): each loop gets its own client and connection pool.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import AuthenticationError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from balancer.errors import CorruptRecord, OwnershipLost, StoreError, StoreUnavailable
from balancer.model import Checkpoint, Control, ControlKind, HubRef, Member, OwnershipRecord, check_partition_id
from balancer.protocol import Snapshot

log = logging.getLogger(__name__)
T = TypeVar("T")

URL_ENV = "REDIS_URL"
_SAFE = "$.-_~"  # kept as they are in a scope; everything else (braces too) is percent-encoded


# keys ----------------------------------------------------------------------------------------


def scope(ref: HubRef) -> str:
    """``leaseboard:{<namespace>/<hub>/<consumer group>}``: the prefix of every key of ``ref``."""
    parts = "/".join(quote(part, safe=_SAFE) for part in (ref.namespace, ref.hub, ref.consumer_group))
    return f"leaseboard:{{{parts}}}"


@dataclass(frozen=True, slots=True)
class Keys:
    """The keys of one hub and consumer group."""

    ownership: str
    checkpoints: str
    members: str
    controls: str
    etags: str

    @classmethod
    def of(cls, ref: HubRef) -> Keys:
        prefix = scope(ref)
        return cls(*(f"{prefix}:{name}" for name in ("ownership", "checkpoints", "members", "controls", "etags")))


# scripts -------------------------------------------------------------------------------------

# The server's clock as "<seconds>.<microseconds>" (a string: see the module docstring).
_NOW = "local t = redis.call('TIME')\nlocal now = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))\n"

# The owner named by a stored ownership record, '' when released, nil when unreadable.
_READ = """
local function read(value)
  if not value then return nil end
  local ok, record = pcall(cjson.decode, value)
  if ok and type(record) == 'table' and type(record.etag) == 'string' and type(record.owner) == 'string' then
    return record
  end
  return nil
end
"""

# KEYS: ownership, etags. ARGV: (partition, owner, ETag expected or '', owner level) per record.
# Returns {now, {{n, new ETag}, ...}} for the records won, n counting records from 1.
CLAIM = (
    _NOW
    + _READ
    + """
local won = {}
local serial = 0
for i = 1, #ARGV, 4 do
  local pid, owner, expected, level = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local current = redis.call('HGET', KEYS[1], pid)
  local record = read(current)
  -- a first claim wins where there is no record, or only an unreadable one; any other claim
  -- only while the stored ETag is still the one the caller saw
  local wins
  if expected == '' then wins = (record == nil) else wins = (record ~= nil and record.etag == expected) end
  if wins then
    serial = redis.call('INCR', KEYS[2])
    local etag = now .. '-' .. serial
    redis.call('HSET', KEYS[1], pid,
      cjson.encode({owner = owner, etag = etag, modified = now, level = tonumber(level)}))
    won[#won + 1] = {(i + 3) / 4, etag}
  end
end
return {now, won}
"""
)

# KEYS: ownership, checkpoints. ARGV: partition, owner, checkpoint JSON without "modified".
# Returns {1, now} when written, {0, current owner or ''} when the caller does not own it.
CHECKPOINT = (
    _NOW
    + _READ
    + """
local record = read(redis.call('HGET', KEYS[1], ARGV[1]))
local holder = ''
if record then holder = record.owner end
if ARGV[2] == '' or holder ~= ARGV[2] then return {0, holder} end
local checkpoint = cjson.decode(ARGV[3])
checkpoint.modified = now
redis.call('HSET', KEYS[2], ARGV[1], cjson.encode(checkpoint))
return {1, now}
"""
)

# KEYS: one hash. ARGV: field, JSON object, name of the time field to add. Returns now.
STAMPED = (
    _NOW
    + """
local value = cjson.decode(ARGV[2])
value[ARGV[3]] = now
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(value))
return now
"""
)


# parsing -------------------------------------------------------------------------------------


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value


def _texts(raw: Mapping[Any, Any]) -> dict[str, str]:
    return {_text(k): _text(v) for k, v in raw.items()}


def _seconds(seconds: Any, micros: Any) -> float:
    """Redis ``TIME``'s pair as seconds, exactly as the scripts write ``now`` (see the module docstring)."""
    return float(f"{int(seconds)}.{int(micros):06d}")


def _object(raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError:
        raise ValueError(f"{raw[:80]!r} is not JSON") from None
    if not isinstance(value, dict):
        raise ValueError(f"{raw[:80]!r} is not a JSON object")
    return value


def _string(value: Mapping[str, Any], key: str) -> str:
    found = value.get(key)
    if not isinstance(found, str):
        raise ValueError(f"{key!r} is {found!r}, not a string")
    return found


def _time(value: Mapping[str, Any], key: str) -> float:
    text = _string(value, key)
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{key!r} is {text!r}, not a time") from None


def parse_ownership(ref: HubRef, field: str, raw: str) -> OwnershipRecord:
    value = _object(raw)
    level = value.get("level", 0)
    if not isinstance(level, int):
        raise ValueError(f"'level' is {level!r}, not an integer")
    return OwnershipRecord(
        ref, check_partition_id(field), _string(value, "owner"), _string(value, "etag"), _time(value, "modified"), level
    )


def parse_checkpoint(ref: HubRef, field: str, raw: str) -> Checkpoint:
    value = _object(raw)
    sequence = _string(value, "sequence")
    if not sequence.isdigit():
        raise ValueError(f"'sequence' is {sequence!r}, not a sequence number")
    offset = value.get("offset")
    if offset is not None and not isinstance(offset, str):
        raise ValueError(f"'offset' is {offset!r}, not a string")
    return Checkpoint(ref, check_partition_id(field), int(sequence), offset, _time(value, "modified"))


def parse_member(ref: HubRef, field: str, raw: str) -> Member:
    value = _object(raw)
    info = value.get("info", {})
    if not isinstance(info, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in info.items()):
        raise ValueError(f"'info' is {info!r}, not an object of strings")
    if not field:
        raise ValueError("empty owner id")
    return Member(ref, field, _time(value, "seen"), info)


def parse_control(ref: HubRef, field: str, raw: str) -> Control:
    kind_text, _, target = field.partition("/")
    try:
        kind = ControlKind(kind_text)
    except ValueError:
        raise ValueError(f"unknown control kind {kind_text!r}") from None
    if not target:
        raise ValueError(f"{field!r} is not <kind>/<target>")
    value = _object(raw)
    return Control(ref, kind, target, _string(value, "value"), _time(value, "created"))


# the store -----------------------------------------------------------------------------------


@dataclass
class _Connection:
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
        url = url if url is not None else os.environ.get(URL_ENV, "")
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
        self._connections: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Connection] = (
            weakref.WeakKeyDictionary()
        )
        self._corrupt: dict[tuple[str, str], CorruptRecord] = {}
        self.requests = 0

    def __repr__(self) -> str:
        return f"RedisStore({self.where!r})"

    @property
    def corrupt(self) -> list[CorruptRecord]:
        return list(self._corrupt.values())

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

    def new_client(self, retries: int = 2) -> Redis:
        """A client of its own (e.g. for a subscription), on the same URL and timeouts."""
        # Retries cover a pooled connection that died with a restarted server: the command never
        # ran there, so sending it again on a fresh connection is safe. Timeouts are not retried:
        # a renewal must fail fast rather than outlast its lease.
        retry = Retry(ExponentialBackoff(cap=0.2, base=0.02), retries, supported_errors=(RedisConnectionError,))
        return Redis.from_url(
            self.url,
            socket_connect_timeout=self._connect_timeout,
            socket_timeout=self._timeout,
            retry=retry,
            client_name=self._client_name,
            decode_responses=True,
        )

    def _connection(self) -> _Connection:
        loop = asyncio.get_running_loop()
        with self._lock:
            connection = self._connections.get(loop)
            if connection is None:
                client = self.new_client()
                connection = _Connection(
                    client,
                    client.register_script(CLAIM),
                    client.register_script(CHECKPOINT),
                    client.register_script(STAMPED),
                )
                self._connections[loop] = connection
        return connection

    def scrub(self, text: str) -> str:
        """``text`` without the password (for messages that quote the server or the client)."""
        return text.replace(self._secret, "***") if self._secret else text

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

    async def run(self, doing: str, call: Callable[[_Connection], Awaitable[T]], count: bool = True) -> T:
        """One round trip (counted in ``requests`` unless the caller counts it itself); Redis errors
        become StoreError/StoreUnavailable (see ``error``)."""
        self.requests += count
        connection = self._connection()
        try:
            return await call(connection)
        except (RedisConnectionError, RedisTimeoutError, ResponseError, OSError) as exc:
            raise self.error(doing, exc) from None

    async def _hash(self, doing: str, key: str) -> dict[str, str]:
        async def hgetall(c: _Connection) -> dict[str, str]:
            return _texts(await c.client.hgetall(key))

        return await self.run(doing, hgetall)

    def _parsed(self, key: str, raw: Mapping[str, str], parse: Callable[[str, str], T]) -> list[T]:
        """Every field of ``raw`` that parses; the rest logged once each and remembered in ``corrupt``."""
        out: list[T] = []
        for field, value in raw.items():
            where = (key, field)
            try:
                out.append(parse(field, value))
            except ValueError as exc:
                problem = CorruptRecord(f"{key} field {field!r}", str(exc))
                known = self._corrupt.get(where)
                if known is None or known.problem != problem.problem:
                    log.warning("%s; skipped", problem)
                self._corrupt[where] = problem
                continue
            self._corrupt.pop(where, None)
        for where in [w for w in self._corrupt if w[0] == key and w[1] not in raw]:
            del self._corrupt[where]
        return out

    # clock ---------------------------------------------------------------------------------

    async def now(self) -> float:
        """Redis ``TIME``: the clock every ``modified``, ``seen`` and ``created`` is written with."""

        async def time(c: _Connection) -> float:
            return _seconds(*await c.client.time())

        return await self.run("TIME", time)

    # one cycle's read ----------------------------------------------------------------------

    async def snapshot(self, ref: HubRef) -> Snapshot:
        """Ownership, members, controls and ``TIME`` in one round trip (``MULTI``/``EXEC``: one
        consistent view, as the cycle needs it), rather than four."""
        keys = Keys.of(ref)

        async def read(c: _Connection) -> list[Any]:
            async with c.client.pipeline(transaction=True) as pipe:
                for key in (keys.ownership, keys.members, keys.controls):
                    pipe.hgetall(key)
                pipe.time()
                return list(await pipe.execute())

        ownership, members, controls, (seconds, micros) = await self.run("reading a snapshot", read)
        return Snapshot(
            self._ownership(ref, ownership), self._members(ref, members), self._controls(ref, controls),
            _seconds(seconds, micros),
        )  # fmt: skip

    # ownership -----------------------------------------------------------------------------

    async def list_ownership(self, ref: HubRef) -> list[OwnershipRecord]:
        return self._ownership(ref, await self._hash("listing ownership", Keys.of(ref).ownership))

    def _ownership(self, ref: HubRef, raw: Mapping[Any, Any]) -> list[OwnershipRecord]:
        key = Keys.of(ref).ownership
        return sorted(self._parsed(key, _texts(raw), lambda f, v: parse_ownership(ref, f, v)), key=_by_pid)

    async def claim_ownership(self, records: Sequence[OwnershipRecord]) -> list[OwnershipRecord]:
        """One script call per hub and consumer group among ``records`` (usually one)."""
        won: dict[tuple[HubRef, str], OwnershipRecord] = {}
        for ref, group in _grouped(records).items():
            keys = Keys.of(ref)
            args: list[str] = []
            for r in group:
                args += [r.partition_id, r.owner_id, r.etag or "", str(int(r.owner_level))]

            async def claim(c: _Connection, keys: Keys = keys, args: list[str] = args) -> Any:
                return await c.claim(keys=[keys.ownership, keys.etags], args=args)

            now_text, wins = await self.run("a claim", claim)
            now = float(now_text)
            for n, etag in wins:
                r = group[int(n) - 1]
                won[(ref, r.partition_id)] = OwnershipRecord(
                    ref, r.partition_id, r.owner_id, _text(etag), now, r.owner_level
                )
        return list(won.values()) if len(won) < 2 else [won[k] for k in _order(records) if k in won]

    # checkpoints ---------------------------------------------------------------------------

    async def list_checkpoints(self, ref: HubRef) -> list[Checkpoint]:
        key = Keys.of(ref).checkpoints
        raw = await self._hash("listing checkpoints", key)
        return sorted(self._parsed(key, raw, lambda f, v: parse_checkpoint(ref, f, v)), key=_by_pid)

    async def update_checkpoint(self, checkpoint: Checkpoint, owner_id: str) -> Checkpoint:
        """Written only while the ownership record names ``owner_id`` (checked in the same script).

        Raises OwnershipLost, writing nothing, otherwise.
        """
        keys = Keys.of(checkpoint.ref)
        payload = json.dumps({"sequence": str(checkpoint.sequence_number), "offset": checkpoint.offset})

        async def write(c: _Connection) -> Any:
            return await c.checkpoint(
                keys=[keys.ownership, keys.checkpoints], args=[checkpoint.partition_id, owner_id, payload]
            )

        written, value = await self.run("a checkpoint", write)
        if int(written) != 1:
            holder = _text(value)
            raise OwnershipLost(checkpoint.partition_id, owner_id, holder or None)
        return Checkpoint(
            checkpoint.ref, checkpoint.partition_id, checkpoint.sequence_number, checkpoint.offset, float(value)
        )

    # members and controls ------------------------------------------------------------------

    async def _stamped(self, doing: str, key: str, field: str, value: dict[str, Any], stamp: str) -> None:
        async def write(c: _Connection) -> Any:
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
        return sorted(self._parsed(key, _texts(raw), lambda f, v: parse_member(ref, f, v)), key=lambda m: m.owner_id)

    async def remove_member(self, ref: HubRef, owner_id: str) -> None:
        key = Keys.of(ref).members

        async def remove(c: _Connection) -> Any:
            return await c.client.hdel(key, owner_id)

        await self.run("removing a member", remove)

    async def list_controls(self, ref: HubRef) -> list[Control]:
        return self._controls(ref, await self._hash("listing controls", Keys.of(ref).controls))

    def _controls(self, ref: HubRef, raw: Mapping[Any, Any]) -> list[Control]:
        key = Keys.of(ref).controls
        return self._parsed(key, _texts(raw), lambda f, v: parse_control(ref, f, v))

    async def put_control(self, control: Control) -> None:
        if not control.target:
            raise ValueError("a control needs a non-empty target")
        key = Keys.of(control.ref).controls
        field = f"{ControlKind(control.kind).value}/{control.target}"
        await self._stamped("a control", key, field, {"value": control.value}, "created")

    async def delete_control(self, ref: HubRef, kind: str, target: str) -> None:
        key = Keys.of(ref).controls
        field = f"{ControlKind(kind).value}/{target}"

        async def delete(c: _Connection) -> Any:
            return await c.client.hdel(key, field)

        await self.run("deleting a control", delete)


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
