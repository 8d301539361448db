"""Collecting each store's own history of ownership and checkpoint writes (``history.History``).

What each store really offers, and the bound each gives (``History.resolution``):

- PostgreSQL: triggers the test installs on ``dashboard_ownership`` and ``dashboard_checkpointrow``
  record every row change in a table of their own, in the writing transaction (a rolled-back write
  leaves nothing): owner, ETag, the row's ``last_modified`` (the store's stamp, taken by the claim's
  own transaction after it was sent: ``since``), ``clock_timestamp()`` as the row changed (before
  the commit the writer waits for: ``at``) and ``inet_client_addr()``. Complete by construction;
  the server's clock, to the microsecond.
- Redis: a ``MONITOR`` connection from the observer (whose link no nemesis cuts). The server
  feeds it every command, including the ``HSET`` each claim or checkpoint script makes, stamped
  with the server's clock to the microsecond; the ``EVALSHA`` line before a script's commands names
  the client's address. ``since`` is the record's own ``modified`` (the script's ``TIME``), ``at``
  the ``HSET``'s stamp. Complete unless the connection dropped (said as a gap).
- Azurite: its request log (``--debug FILE``), one line per step of every request, stamped with
  its clock (the machine's) to the millisecond: arrival with headers (the owner in
  ``x-ms-meta-ownerid``, the client's address) is ``since``, the end of the response ``at``: the
  bound is a millisecond. But under load both stamps come late: a worker handled 0.28 s before its
  claim's logged end, then (CI) 0.18 s before its claim's logged arrival, and after a 3.5 s stall of
  the server every request waiting was stamped at the same millisecond, renewals sent in time
  included; and the release before a claim as late as the claim (CI: a new owner handled 0.08 s
  before the release it claimed after was stamped). So (``History.late_ends``) an owner's tenure is
  judged from the end of the one before it (the server serves writes in order), a release's end from
  when its writer made it (``made_at``: the SDK's request id holds the writer's clock), no tenure
  from before its claim was made, and an owner's renewals in a row stay one tenure. The service
  judges leases by ``Last-Modified``, whole seconds truncated, and the Blob store's ``now()`` is
  truncated too, so a claim needs ``now - Last-Modified > expiry`` in whole seconds: with an integer
  expiry it lands at least the expiry after the previous owner's write arrived, and the history
  checks that to the millisecond. (With a fractional expiry ``n + f`` the same comparison lets a
  claim land up to ``f`` seconds early: the history would show it.) Azurite keeps no blob versions;
  its database holds only the current state.
"""

from __future__ import annotations

import json
import math
import re
import socket
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from balancer.model import HubRef
from tests.netsplit.history import CheckpointWrite, History, Write

if TYPE_CHECKING:
    import psycopg

UUID1_EPOCH = 0x01B21DD213814000  # 1970-01-01 in a version-1 UUID's time: 100 ns since 1582-10-15

# PostgreSQL ------------------------------------------------------------------------------------

_NOW = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"
_CLIENT = "COALESCE(host(inet_client_addr()), '')"
TRIGGERS = f"""
CREATE TABLE IF NOT EXISTS netsplit_history (
    id bigserial PRIMARY KEY, kind text NOT NULL, namespace text NOT NULL, hub text NOT NULL,
    consumer_group text NOT NULL, partition_id text NOT NULL, owner_id text, etag text,
    sequence_number bigint, stamped double precision, at double precision NOT NULL, client text NOT NULL
);
CREATE OR REPLACE FUNCTION netsplit_ownership() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO netsplit_history (kind, namespace, hub, consumer_group, partition_id, owner_id, etag, stamped,
                                      at, client)
        VALUES ('ownership', OLD.namespace, OLD.hub, OLD.consumer_group, OLD.partition_id, '', '', {_NOW}, {_NOW},
                {_CLIENT});
        RETURN OLD;
    END IF;
    INSERT INTO netsplit_history (kind, namespace, hub, consumer_group, partition_id, owner_id, etag, stamped, at,
                                  client)
    VALUES ('ownership', NEW.namespace, NEW.hub, NEW.consumer_group, NEW.partition_id, NEW.owner_id, NEW.etag,
            NEW.last_modified, {_NOW}, {_CLIENT});
    RETURN NEW;
END $$;
CREATE OR REPLACE FUNCTION netsplit_checkpoint() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO netsplit_history (kind, namespace, hub, consumer_group, partition_id, sequence_number, stamped, at,
                                  client)
    VALUES ('checkpoint', NEW.namespace, NEW.hub, NEW.consumer_group, NEW.partition_id, NEW.sequence_number,
            NEW.last_modified, {_NOW}, {_CLIENT});
    RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS netsplit_ownership ON dashboard_ownership;
CREATE TRIGGER netsplit_ownership AFTER INSERT OR UPDATE OR DELETE ON dashboard_ownership
    FOR EACH ROW EXECUTE FUNCTION netsplit_ownership();
DROP TRIGGER IF EXISTS netsplit_checkpoint ON dashboard_checkpointrow;
CREATE TRIGGER netsplit_checkpoint AFTER INSERT OR UPDATE ON dashboard_checkpointrow
    FOR EACH ROW EXECUTE FUNCTION netsplit_checkpoint();
"""
READ = """
SELECT kind, partition_id, owner_id, etag, sequence_number, stamped, at, client FROM netsplit_history
WHERE namespace = %s AND hub = %s AND consumer_group = %s ORDER BY at, id
"""


class Recorder(Protocol):
    def start(self) -> None:
        """Begin recording (before any worker starts). Raises if the store offers no history."""

    def stop(self) -> None:
        """Stop recording (idempotent); what was recorded stays readable."""

    def history(self, ref: HubRef) -> History:
        """The writes recorded for ``ref``."""


class PostgresHistory:
    """The triggers above, in the store's database at ``url`` (reached from the observer)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def _connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        import psycopg

        return psycopg.connect(self.url, connect_timeout=10, autocommit=True)

    def start(self) -> None:
        with self._connect() as connection:
            connection.execute(TRIGGERS)

    def stop(self) -> None:
        pass

    def history(self, ref: HubRef) -> History:
        with self._connect() as connection:
            rows = connection.execute(READ, (ref.namespace, ref.hub, ref.consumer_group)).fetchall()
        return postgres_history(rows)


def postgres_history(rows: Iterable[tuple[Any, ...]]) -> History:
    """A History from ``netsplit_history`` rows (kind, partition, owner, etag, sequence, stamped, at, client)."""
    found = History("postgresql", "triggers on its tables (row's last_modified, clock_timestamp())", 1e-6)
    for kind, pid, owner, etag, sequence, stamped, at, client in rows:
        if kind == "ownership":
            found.writes.append(
                Write(str(pid), str(owner or ""), float(stamped), float(at), str(etag or ""), str(client))
            )
        else:
            found.checkpoints.append(CheckpointWrite(str(pid), int(sequence), float(at), str(client)))
    return found


# Redis -----------------------------------------------------------------------------------------

_MONITOR_LINE = re.compile(r"\+(\d+\.\d+) \[(\d+) ([^\]]+)\] (.*)")
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "a": "\a", "b": "\b", '"': '"', "\\": "\\"}


def monitor_arguments(text: str) -> list[str]:
    """The arguments of one ``MONITOR`` line's command (``"hset" "k" "v\\"x"`` -> [hset, k, v"x])."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] != '"':
            i += 1
            continue
        i += 1
        raw = bytearray()
        while i < len(text) and text[i] != '"':
            if text[i] == "\\" and i + 1 < len(text):
                if text[i + 1] == "x":
                    raw.append(int(text[i + 2 : i + 4], 16))
                    i += 4
                    continue
                raw += _ESCAPES.get(text[i + 1], text[i + 1]).encode()
                i += 2
                continue
            raw += text[i].encode("latin-1")
            i += 1
        i += 1
        out.append(raw.decode("utf-8", "replace"))
    return out


def monitor_history(lines: Iterable[str], ownership_key: str, checkpoints_key: str) -> History:
    """A History from ``MONITOR`` output: the ``HSET``/``HDEL`` of the two keys, each with the
    address of the client whose command (a script) made it."""
    found = History("redis", "MONITOR (the server's stamp of each HSET, the record's TIME)", 1e-6)
    caller = ""
    for line in lines:
        match = _MONITOR_LINE.fullmatch(line.rstrip("\r\n"))
        if not match:
            continue
        at, source, args = float(match[1]), match[3], monitor_arguments(match[4])
        if source != "lua":
            caller = source.rsplit(":", 1)[0]
        if len(args) < 3:
            continue
        command, key = args[0].lower(), args[1]
        if command == "hset" and key in (ownership_key, checkpoints_key):
            for pid, value in zip(args[2::2], args[3::2], strict=False):
                try:
                    record = json.loads(value)
                except ValueError:
                    record = {}
                if key == ownership_key:
                    since = float(record.get("modified") or at)
                    found.writes.append(
                        Write(pid, str(record.get("owner") or ""), since, at, str(record.get("etag") or ""), caller)
                    )
                elif "sequence" in record:
                    found.checkpoints.append(CheckpointWrite(pid, int(record["sequence"]), at, caller))
        elif command == "hdel" and key == ownership_key:
            found.writes += [Write(pid, "", at, at, "", caller) for pid in args[2:]]
    return found


class RedisMonitor:
    """A ``MONITOR`` connection to the Redis at ``host:port``, written raw to ``path`` by a thread."""

    def __init__(self, host: str, port: int, path: Path) -> None:
        self.host, self.port, self.path = host, port, path
        self.gaps: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None

    def start(self) -> None:
        sock = socket.create_connection((self.host, self.port), timeout=10)
        sock.sendall(b"MONITOR\r\n")
        answer = b""
        while not answer.endswith(b"\r\n"):
            chunk = sock.recv(64)
            if not chunk:
                raise ConnectionError(f"Redis at {self.host}:{self.port} closed the MONITOR connection")
            answer += chunk
        if not answer.startswith(b"+OK"):
            raise ConnectionError(f"Redis at {self.host}:{self.port} refused MONITOR: {answer!r}")
        sock.settimeout(0.2)  # so the thread sees ``stop`` within 0.2 s
        self._socket = sock
        self._thread = threading.Thread(
            target=self._run, args=(answer[answer.index(b"\r\n") + 2 :],), name="netsplit-monitor", daemon=True
        )
        self._thread.start()

    def _run(self, first: bytes) -> None:
        assert self._socket is not None
        with self.path.open("wb") as out:
            out.write(first)
            while not self._stop.is_set():
                try:
                    data = self._socket.recv(1 << 16)
                except TimeoutError:
                    continue
                except OSError as exc:
                    self.gaps.append(f"the MONITOR connection failed: {exc}")
                    return
                if not data:
                    self.gaps.append("Redis closed the MONITOR connection")
                    return
                out.write(data)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            if self._thread.is_alive():
                self.gaps.append("the MONITOR thread did not stop within 10 s")
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def history(self, ref: HubRef) -> History:
        from balancer.stores.redis.layout import Keys

        keys = Keys.of(ref)
        self.stop()
        with self.path.open(encoding="latin-1", newline="") as lines:
            found = monitor_history(lines, keys.ownership, keys.checkpoints)
        found.gaps += self.gaps
        return found


# Azurite ---------------------------------------------------------------------------------------

_LOG_LINE = re.compile(r"(\S+) (\S+) (\w+): (.*)")
_STATUS = re.compile(r"StatusCode=(\d+)")
WRITES = ("BlockBlob_Upload", "Blob_SetMetadata")


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def azurite_requests(lines: Iterable[str]) -> Iterator[dict[str, object]]:
    """Each request of an Azurite ``--debug`` log, once its response ended: ``arrived`` and ``ended``
    (seconds, Azurite's clock), ``client``, ``headers`` (of the request), ``container``, ``blob``,
    ``operation``, ``status``, ``response`` (its headers)."""
    pending: dict[str, dict[str, object]] = {}
    for line in lines:
        match = _LOG_LINE.match(line)
        if not match:
            continue
        stamp, request, message = match[1], match[2], match[4]
        if message.startswith("BlobStorageContextMiddleware: RequestMethod="):
            headers_text, _, client = message.partition("RequestHeaders:")[2].rpartition(" ClientIP=")
            try:
                headers = json.loads(headers_text)
            except ValueError:
                headers = {}
            address = client.split()[0].removeprefix("::ffff:") if client else ""
            pending[request] = {"arrived": _stamp(stamp), "headers": headers, "client": address}
        elif request not in pending:
            continue
        elif message.startswith("BlobStorageContextMiddleware: Account="):
            fields = dict(part.split("=", 1) for part in message.split(": ", 1)[1].split(" ", 2) if "=" in part)
            pending[request].update(container=fields.get("Container", ""), blob=fields.get("Blob", ""))
        elif message.startswith("DispatchMiddleware: Operation="):
            pending[request]["operation"] = message.split("=", 1)[1].strip()
        elif message.startswith("EndMiddleware: End response."):
            found = pending.pop(request)
            status = _STATUS.search(message)
            found["status"] = int(status[1]) if status else 0
            try:
                found["response"] = json.loads(message.split("Headers=", 1)[1])
            except (IndexError, ValueError):
                found["response"] = {}
            found["ended"] = _stamp(stamp)
            yield found


def made_at(headers: Mapping[str, str]) -> float:
    """When the client made the request, by its own clock (the machine's): the Azure SDK names each
    request with a version-1 UUID (``x-ms-client-request-id``), which holds the time it was made, to
    100 ns; the same for its retries. -inf when the header is no such UUID."""
    try:
        made = uuid.UUID(headers.get("x-ms-client-request-id", ""))
    except ValueError:
        return -math.inf
    return (made.time - UUID1_EPOCH) / 1e7 if made.version == 1 else -math.inf


def azurite_history(lines: Iterable[str], container: str, prefix: str) -> History:
    """A History from an Azurite ``--debug`` log: successful writes of the ownership and checkpoint
    blobs under ``prefix`` (``scope_prefix(ref)``) in ``container``."""
    found = History(
        "blob",
        "Azurite's request log (--debug; arrival and end of each request)",
        1e-3,
        late_ends=True,
        two_request_fence=True,
    )
    for request in azurite_requests(lines):
        blob = str(request.get("blob", ""))
        status = int(request["status"])  # type: ignore[call-overload]
        if request.get("container") != container or not blob.startswith(prefix) or not 200 <= status < 300:
            continue
        kind, _, pid = blob[len(prefix) :].partition("/")
        headers: dict[str, str] = request["headers"]  # type: ignore[assignment]
        response: dict[str, str] = request["response"]  # type: ignore[assignment]
        arrived, ended, client = float(request["arrived"]), float(request["ended"]), str(request["client"])  # type: ignore[arg-type]
        operation = request.get("operation")
        if kind == "ownership" and operation in WRITES:
            etag = str(response.get("etag", "")).strip('"')
            owner = headers.get("x-ms-meta-ownerid", "")
            found.writes.append(Write(pid, owner, arrived, ended, etag, client, made_at(headers)))
        elif kind == "ownership" and operation == "Blob_Delete":
            found.writes.append(Write(pid, "", arrived, ended, "", client, made_at(headers)))
        elif kind == "checkpoint" and operation in WRITES and "x-ms-meta-sequencenumber" in headers:
            found.checkpoints.append(CheckpointWrite(pid, int(headers["x-ms-meta-sequencenumber"]), ended, client))
    return found


class AzuriteLog:
    """Azurite's ``--debug`` log at ``path`` (the server writes it; this reads it)."""

    def __init__(self, path: Path, container: str) -> None:
        self.path, self.container = path, container

    def start(self) -> None:
        from tests.support.waiting import until_sync

        until_sync(self.path.exists, f"Azurite's request log at {self.path} (started with --debug?)", 10.0, step=0.05)

    def stop(self) -> None:
        pass

    def history(self, ref: HubRef) -> History:
        from balancer.stores.blob.layout import scope_prefix

        with self.path.open(encoding="utf-8", errors="replace") as lines:
            return azurite_history(lines, self.container, scope_prefix(ref))


def recorder_for(store: str, kit: object, database_url: str, directory: Path) -> Recorder:
    """The recorder of ``store``'s history for the suite's kit (``cluster.make_kit``)."""
    if store == "postgresql":
        return PostgresHistory(database_url)
    if store == "redis":
        server = kit.server  # type: ignore[attr-defined]
        return RedisMonitor(server.host, server.port, directory / "redis-monitor.txt")
    azurite = kit.azurite  # type: ignore[attr-defined]
    return AzuriteLog(azurite.debug_log, kit.container)  # type: ignore[attr-defined]
