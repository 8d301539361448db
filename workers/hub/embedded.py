"""The embedded hub: a partitioned append-only log on local disk with Event Hubs semantics.

A hub lives in ``root/name/``: ``hub.json`` (the partition count), ``hub.lock`` and one log file per
partition (``0.log`` …). Any number of processes may open the same hub and write and read it at once:

- Writers take ``flock`` on the partition's log for each append. Each writer remembers where the
  log ended; if the file grew since (another process wrote), it re-reads the tail under the lock
  before numbering, so no two processes hand out the same sequence number. A torn tail left by a
  crashed writer is cut off under the lock before the next append.
- Readers never lock. What they see past the last complete record is "not yet written". A batch
  is one ``write``: its events get contiguous numbers, but a reader may get its first events before
  the last have landed, and a writer killed inside a large write may leave only the first part.
- Partitions are only ever added: new log files are created first, then ``hub.json`` is replaced
  atomically, so no process sees a partition whose file does not exist.

Sequence numbers start at 0 per partition and are contiguous; offsets are the byte positions of the
records; the enqueued time is the hub's clock (seconds since the epoch), never earlier than the
previous event of the partition. Events with a partition key go where Event Hubs puts them
(``placement``: lookup3 over the key, as the Azure SDKs' buffered producers compute it), stable
across processes and runs (so, as in Event Hubs, a key may move when partitions are added; events
written before this placement keep the partitions they were given). Events with neither key nor
partition id go round-robin over the partitions, one send (or batch) per step, starting from
partition 0 for each ``EmbeddedHub`` object. Appends are not fsynced: they survive a
crashed process, not a power cut.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from workers.hub import placement
from workers.hub.log import EMPTY, MAX_AMQP, MAX_BODY, MAX_KEY, CorruptLog, LogFile, Tail, encode
from workers.hub.reader import Drills, HubReader, browse, start_of
from workers.sources.base import Browsed, PartitionProperties, Position, ReceivedEvent, Start

__all__ = ["MAX_BODY", "MAX_KEY", "CorruptLog", "EmbeddedHub"]

log = logging.getLogger(__name__)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_META = "hub.json"


class EmbeddedHub:
    """A hub on local disk, created with ``partitions`` partitions if ``root/name`` holds none yet
    (an existing hub keeps its count). Implements ``workers.sources.base.EventSource`` and adds writing.

    Raises ValueError for a bad name or count, TypeError for arguments of the wrong type."""

    # Its partition ids come from a file on this machine: a cycle asks in the event loop, without a
    # thread (``workers.sources.partitions.PartitionList``).
    lists_partitions_locally = True

    def __init__(
        self, root: Path | str, name: str, *, partitions: int = 16, clock: Callable[[], float] = time.time
    ) -> None:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"hub name must be letters, digits, '.', '_' or '-' (at most 100), got {name!r}")
        _check_count(partitions, "partitions")
        self.name = name
        self.path = Path(root) / name
        self._clock = clock
        self._guard = threading.Lock()  # flock is per open file: threads of one process need this too
        self._writers: dict[str, tuple[threading.Lock, LogFile]] = {}
        self._pid = os.getpid()
        self._tails: dict[str, Tail] = {}
        self._readers: dict[str, LogFile] = {}
        self._meta_key: tuple[int, int, int] | None = None
        self._count = 0
        self._ids: tuple[str, ...] = ()  # partition_ids() of the last count: the same tuple while it holds
        self._next_round_robin = 0
        self.path.mkdir(parents=True, exist_ok=True)
        if not (self.path / _META).exists():
            with self._hub_lock():
                if not (self.path / _META).exists():
                    self._publish(0, partitions)

    @staticmethod
    def exists(root: Path | str, name: str) -> bool:
        """Whether a hub named ``name`` has been created under ``root``."""
        return (Path(root) / name / _META).is_file()

    # -- the EventSource protocol ------------------------------------------------------------------

    def partition_ids(self) -> tuple[str, ...]:
        """The partition ids now, "0".."P-1"; re-read when another process added partitions."""
        count = self.partition_count
        if len(self._ids) != count:  # every cycle of every worker asks: the same tuple, built once
            self._ids = tuple(str(i) for i in range(count))
        return self._ids

    @property
    def partition_count(self) -> int:
        st = os.stat(self.path / _META)
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key != self._meta_key:
            meta = json.loads((self.path / _META).read_text())
            self._count, self._meta_key = int(meta["partitions"]), key
        return self._count

    def properties(self, partition_id: str) -> PartitionProperties:
        """What the log of ``partition_id`` holds now. Raises ValueError for an unknown partition."""
        self._check_partition(partition_id)
        tail = self._tail(partition_id)
        return PartitionProperties(
            partition_id=partition_id,
            begin_sequence_number=0,
            last_enqueued_sequence_number=tail.next_sequence - 1,
            last_enqueued_offset=None if tail.last_offset is None else str(tail.last_offset),
            last_enqueued_time=tail.last_time,
            is_empty=tail.next_sequence == 0,
        )

    def reader(self, partition_id: str, position: Position) -> HubReader:
        """A reader of ``partition_id`` starting at ``position``. Offset "-1" means the start and
        "@latest" the end, as in Event Hubs. Raises ValueError for an unknown partition, or a
        position beyond the last event or naming no event."""
        self._check_partition(partition_id)
        if not isinstance(position, Position):
            raise TypeError(f"position must be a workers.sources.base.Position, got {type(position).__name__}")
        log_file = LogFile(str(self._log_path(partition_id)), self.name, partition_id)
        try:
            pos, next_sequence = start_of(log_file, position, self._tails.get(partition_id, EMPTY))
        except BaseException:
            log_file.close()
            raise
        drills = Drills(str(self._wedge_path(partition_id)), str(self._refuse_path(partition_id)))
        return HubReader(log_file, pos, next_sequence, drills)

    def browse(
        self,
        partition_id: str,
        start: Start,
        max_events: int,
        max_bytes: int,
        *,
        until: int | None = None,
        consumer_group: str | None = None,
    ) -> list[Browsed]:
        """A bounded read that takes nothing (``workers.sources.base.Browsing``); no consumer groups here."""
        self._check_partition(partition_id)
        log_file = LogFile(str(self._log_path(partition_id)), self.name, partition_id)
        hint = self._tails.get(partition_id, EMPTY)
        drills = Drills(str(self._wedge_path(partition_id)), str(self._refuse_path(partition_id)))
        return browse(log_file, start, hint, drills, max_events, max_bytes, until)

    def wedge(self, partition_id: str) -> None:
        """A fault drill: every reader of ``partition_id`` open now stops answering (it gives nothing and
        says nothing is new) without failing or closing, as a link the hub stopped serving; readers
        opened from now on read as always. ``unwedge`` ends it. Raises ValueError for an unknown
        partition."""
        self._check_partition(partition_id)
        path, now = self._wedge_path(partition_id), time.time_ns()
        path.touch()
        os.utime(
            path, ns=(now, now)
        )  # to the nanosecond (the kernel's own stamp is coarser): past every reader open now

    def unwedge(self, partition_id: str) -> None:
        self._wedge_path(partition_id).unlink(missing_ok=True)

    def _wedge_path(self, partition_id: str) -> Path:
        return self.path / f"wedged-{partition_id}"

    def refuse(self, partition_id: str, process_id: int | None = None) -> None:
        """A fault drill: every read of ``partition_id`` fails (``ReadRefused``, as a link the hub keeps
        refusing), in the process ``process_id`` only when it is given (one worker's link broke), else in
        every process; readers opened from now on too. ``admit`` ends it. Raises ValueError for an
        unknown partition."""
        self._check_partition(partition_id)
        path = self._refuse_path(partition_id)
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        temporary.write_text("" if process_id is None else str(process_id), encoding="ascii")
        temporary.replace(path)  # whole: a reader never sees it half written

    def admit(self, partition_id: str) -> None:
        self._refuse_path(partition_id).unlink(missing_ok=True)

    def _refuse_path(self, partition_id: str) -> Path:
        return self.path / f"refused-{partition_id}"

    def close(self) -> None:
        """Closes the files this object holds open; a later call reopens what it needs."""
        with self._guard:
            writers, readers = list(self._writers.values()), list(self._readers.values())
            self._writers.clear()
            self._readers.clear()
        for lock, log_file in writers:
            with lock:
                log_file.close()
        for log_file in readers:
            log_file.close()

    def __enter__(self) -> EmbeddedHub:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing -----------------------------------------------------------------------------------

    def send(self, body: bytes, *, partition_key: str | None = None, partition_id: str | None = None) -> ReceivedEvent:
        """Appends one event; returns it as a reader will see it. With a partition id, the event goes
        there (keeping its key, if given too); with a key alone, where the key is placed (see
        :meth:`partition_for_key`). Raises TypeError/ValueError for a body that is not bytes or is
        over MAX_BODY, a bad key or an unknown partition."""
        return self.send_batch([body], partition_key=partition_key, partition_id=partition_id)[0]

    def send_batch(
        self,
        bodies: Sequence[bytes],
        *,
        partition_key: str | None = None,
        partition_id: str | None = None,
        amqp: Sequence[bytes] | None = None,
    ) -> list[ReceivedEvent]:
        """Appends events to one partition with contiguous sequence numbers, in one write; returns
        them. ``amqp``, if given, holds each event's AMQP sections (``ReceivedEvent.amqp``), one per
        body. An empty batch writes nothing. Raises as :meth:`send`, and ValueError when ``amqp``
        does not match ``bodies`` or an entry is over MAX_AMQP."""
        if isinstance(bodies, bytes | bytearray | memoryview | str) or not isinstance(bodies, Sequence):
            raise TypeError(f"send_batch takes a sequence of bodies (use send for one), got {type(bodies).__name__}")
        checked = [_check_body(body) for body in bodies]
        extras = [b""] * len(checked) if amqp is None else [bytes(a) for a in amqp]
        if len(extras) != len(checked) or any(len(a) > MAX_AMQP for a in extras):
            raise ValueError(f"amqp holds one entry of at most {MAX_AMQP} bytes per body")
        key = _check_key(partition_key)
        target = self._choose(partition_key, partition_id)
        if not checked:
            return []
        lock, log_file = self._writer(target)
        with lock, _flocked(log_file.fd):
            tail = self._repair(log_file)
            now = max(self._clock(), tail.last_time or 0.0)
            records, events, pos = [], [], tail.end
            for i, body in enumerate(checked):
                record = encode(tail.next_sequence + i, now, key, body, extras[i])
                records.append(record)
                events.append(
                    ReceivedEvent(target, tail.next_sequence + i, str(pos), now, partition_key, body, extras[i])
                )
                pos += len(record)
            data = b"".join(records)
            # A failed or short write leaves a torn tail; the next append (ours or another's) cuts it.
            written = 0
            while written < len(data):
                written += os.write(log_file.fd, data[written:])
            self._tails[target] = Tail(pos, tail.next_sequence + len(checked), int(events[-1].offset), now)
        return events

    def add_partitions(self, new_count: int) -> None:
        """Grows the hub to ``new_count`` partitions (the same count is a no-op). Raises ValueError
        when asked to shrink: events and keys would be lost."""
        _check_count(new_count, "new_count")
        with self._hub_lock():
            self._meta_key = None
            current = self.partition_count
            if new_count < current:
                raise ValueError(
                    f"hub {self.name!r} has {current} partitions; partitions can be added, never removed"
                    f" (asked for {new_count})"
                )
            if new_count > current:
                self._publish(current, new_count)
                log.info("hub %r grew from %d to %d partitions", self.name, current, new_count)

    def partition_for_key(self, partition_key: str) -> str:
        """The partition a key maps to now, where Event Hubs would put it (``workers.hub.placement``)."""
        _check_key(partition_key)
        return str(placement.partition_for_key(partition_key, self.partition_count))

    # -- inside ------------------------------------------------------------------------------------

    def _choose(self, partition_key: str | None, partition_id: str | None) -> str:
        if partition_id is not None:  # with a key too, the key is kept (Event Hubs' partition links do so)
            self._check_partition(partition_id)
            return partition_id
        if partition_key is not None:
            return self.partition_for_key(partition_key)
        with self._guard:
            turn = self._next_round_robin
            self._next_round_robin += 1
        return str(turn % self.partition_count)

    def _check_partition(self, partition_id: str) -> None:
        if not isinstance(partition_id, str):
            raise TypeError(f"partition ids are strings like '0', got {partition_id!r}")
        count = self.partition_count
        if not (partition_id.isdigit() and str(int(partition_id)) == partition_id and int(partition_id) < count):
            raise ValueError(f"hub {self.name!r} has no partition {partition_id!r}; its ids are '0'..'{count - 1}'")

    def _log_path(self, partition_id: str) -> Path:
        return self.path / f"{partition_id}.log"

    def _writer(self, partition_id: str) -> tuple[threading.Lock, LogFile]:
        with self._guard:
            if self._pid != os.getpid():
                # A forked child shares its parent's open files, and flock locks belong to the open
                # file: parent and child would not exclude each other. The child opens its own.
                self._writers, self._pid = {}, os.getpid()
            if partition_id not in self._writers:
                log_file = LogFile(str(self._log_path(partition_id)), self.name, partition_id, writable=True)
                self._writers[partition_id] = (threading.Lock(), log_file)
            return self._writers[partition_id]

    def _repair(self, log_file: LogFile) -> Tail:
        """The tail, re-read if the file changed since this object last looked, with a torn tail cut
        off. Call holding the partition's flock."""
        pid = log_file.partition_id
        tail = log_file.find_tail(self._tails.get(pid, EMPTY))
        size = log_file.size()
        if size > tail.end:
            log.warning(
                "hub %r partition %s: cutting a torn tail of %d bytes at offset %d (a writer died mid-write)",
                self.name,
                pid,
                size - tail.end,
                tail.end,
            )
            os.ftruncate(log_file.fd, tail.end)
        self._tails[pid] = tail
        return tail

    def _tail(self, partition_id: str) -> Tail:
        with self._guard:
            log_file = self._readers.get(partition_id)
            if log_file is None:
                path = str(self._log_path(partition_id))
                log_file = self._readers[partition_id] = LogFile(path, self.name, partition_id)
        tail = log_file.find_tail(self._tails.get(partition_id, EMPTY))
        # Any tail once seen stays a valid lower bound: logs are only cut back to a record boundary.
        if tail.end >= self._tails.get(partition_id, EMPTY).end:
            self._tails[partition_id] = tail
        return tail

    @contextlib.contextmanager
    def _hub_lock(self) -> Iterator[None]:
        fd = os.open(self.path / "hub.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            with _flocked(fd):
                yield
        finally:
            os.close(fd)

    def _publish(self, current: int, count: int) -> None:
        """Creates logs current..count-1, then the new hub.json. Call holding the hub lock."""
        for i in range(current, count):
            os.close(os.open(self._log_path(str(i)), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
        temp = self.path / f".{_META}.{os.getpid()}"
        temp.write_text(json.dumps({"name": self.name, "partitions": count, "format": 1}))
        os.replace(temp, self.path / _META)
        self._meta_key = None


@contextlib.contextmanager
def _flocked(fd: int) -> Iterator[None]:
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def _check_count(count: object, what: str) -> None:
    if isinstance(count, bool) or not isinstance(count, int):
        raise TypeError(f"{what} must be a whole number, got {count!r}")
    if not 1 <= count <= 100_000:
        raise ValueError(f"{what} must be between 1 and 100000, got {count}")


def _check_body(body: object) -> bytes:
    if isinstance(body, str):
        raise TypeError("event bodies are bytes, got str; encode it first (body.encode())")
    if not isinstance(body, bytes | bytearray | memoryview):
        raise TypeError(f"event bodies are bytes, got {type(body).__name__}")
    data = bytes(body)
    if len(data) > MAX_BODY:
        raise ValueError(f"event body is {len(data)} bytes, over the limit of {MAX_BODY} (1 MiB)")
    return data


def _check_key(partition_key: object) -> bytes | None:
    if partition_key is None:
        return None
    if not isinstance(partition_key, str):
        raise TypeError(f"partition_key must be a string, got {type(partition_key).__name__}")
    key = partition_key.encode("utf-8")
    if len(key) > MAX_KEY:
        raise ValueError(f"partition_key is {len(key)} bytes of UTF-8, over the limit of {MAX_KEY}")
    return key
