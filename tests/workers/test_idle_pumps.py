"""An idle pump costs nothing: it waits for its reader's wake-up instead of polling the source.

The embedded hub's readers are woken by one ``FileWatch`` per process (inotify, else one stat
poller) when their log is written, and only the readers of that log; the Event Hubs reader when the
SDK hands it a batch. A pump reads once, finds nothing, and reads again only when woken, when a
pending checkpoint is due, when told its lease's deadline passed unrenewed (the processor's one
timer for all its pumps), or after ``idle_seconds``.
Waiting is by polling with a deadline; "does not wake" is judged with a sleep that never ends (the
pump's timers then never fire, so every read after the first is a wake-up).
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from balancer.model import OwnershipRecord
from balancer.stores.memory import MemoryStore
from tests.azure_source.fake import CONNECTION_STRING, Clients, Hub, sdk_event
from tests.support.waiting import until, until_sync
from workers.handlers import PartitionContext
from workers.hub.embedded import EmbeddedHub
from workers.hub.reader import HubReader
from workers.runtime.config import PumpConfig
from workers.runtime.deadletters import DeadLetters
from workers.runtime.pump import PartitionPump
from workers.sources import arrivals
from workers.sources.arrivals import FileWatch
from workers.sources.base import Position, ReceivedEvent
from workers.sources.eventhubs import EventHubsSource

from .conftest import REF


class Counter:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.n = 0

    def __call__(self) -> None:
        with self.lock:
            self.n += 1


# the watcher -------------------------------------------------------------------------------------


@pytest.mark.parametrize("inotify", [True, False], ids=["inotify", "poll"])
def test_a_file_watch_wakes_the_watchers_of_the_file_written_and_no_other(tmp_path: Path, inotify: bool) -> None:
    watch = FileWatch(inotify=inotify, poll_seconds=0.01)
    if inotify:
        assert watch.kind == "inotify"  # Linux: the fallback would hide a broken inotify
    paths = [str(tmp_path / f"{name}.log") for name in ("written", "quiet", "sentinel")]
    for path in paths:
        Path(path).touch()
    written, quiet, sentinel, second = Counter(), Counter(), Counter(), Counter()
    tokens = [watch.watch(p, c) for p, c in zip(paths, (written, quiet, sentinel), strict=True)]
    tokens.append(watch.watch(paths[0], second))  # two readers of one log (a handoff inside a process)
    assert watch.watching() == 3

    with open(paths[0], "ab") as f:
        f.write(b"event")
    with open(paths[2], "ab") as f:
        f.write(b"event")
    until_sync(lambda: written.n and second.n and sentinel.n, "the readers of both written logs to be woken")
    assert quiet.n == 0

    for token in tokens:
        watch.unwatch(token)
    assert watch.watching() == 0
    before = written.n
    with open(paths[0], "ab") as f:
        f.write(b"unwatched")
    sentinel_again = Counter()
    token = watch.watch(paths[2], sentinel_again)
    with open(paths[2], "ab") as f:
        f.write(b"event")
    until_sync(lambda: sentinel_again.n, "the sentinel's new watcher to be woken")
    assert written.n == before  # unwatched: no more wake-ups
    watch.unwatch(token)


def test_one_watch_per_process(tmp_path: Path) -> None:
    assert arrivals.shared() is arrivals.shared()


def test_a_hub_reader_stops_its_wake_ups_when_closed(tmp_path: Path) -> None:
    hub = EmbeddedHub(tmp_path, "hub", partitions=2)
    reader = hub.reader("0", Position.earliest())
    assert isinstance(reader, HubReader)
    watching = arrivals.shared().watching()
    woken = Counter()
    reader.notify(woken)
    assert arrivals.shared().watching() == watching + 1
    hub.send(b"x", partition_id="0")
    until_sync(lambda: woken.n, "the reader's wake-up")
    reader.close()
    assert arrivals.shared().watching() == watching
    hub.close()


# the pump ----------------------------------------------------------------------------------------


class CountingReader:
    """A reader that counts its reads and forwards ``notify`` (or hides it: then it is polled)."""

    def __init__(self, inner: Any, notifying: bool) -> None:
        self.inner = inner
        self.reads = 0
        if notifying:
            self.notify = inner.notify
        if hasattr(inner, "nothing_new"):
            self.nothing_new = inner.nothing_new

    def receive(self, max_events: int) -> list[ReceivedEvent]:
        self.reads += 1
        result: list[ReceivedEvent] = self.inner.receive(max_events)
        return result

    def close(self) -> None:
        self.inner.close()


class CountingSource:
    def __init__(self, source: Any, notifying: bool = True) -> None:
        self.source = source
        self.notifying = notifying
        self.readers: list[CountingReader] = []

    def reader(self, partition_id: str, position: Position) -> CountingReader:
        reader = CountingReader(self.source.reader(partition_id, position), self.notifying)
        self.readers.append(reader)
        return reader


class Sleeps:
    """The pump's sleep: records what it was asked and never ends (or ends after ``seconds`` if real)."""

    def __init__(self, real: bool = False) -> None:
        self.asked: list[float] = []
        self.real = real

    async def __call__(self, seconds: float) -> None:
        self.asked.append(seconds)
        if self.real:
            await asyncio.sleep(seconds)
        else:
            await asyncio.Event().wait()


class Handled:
    def __init__(self) -> None:
        self.events: list[tuple[int, float]] = []  # (sequence number, monotonic time handled)

    def __call__(self, event: ReceivedEvent, ctx: PartitionContext) -> None:
        self.events.append((event.sequence_number, time.monotonic()))


async def start_pump(
    source: Any, handler: Any, sleep: Sleeps, *, deadline: Any = None, **config: Any
) -> tuple[PartitionPump, asyncio.Task[Any], MemoryStore]:
    store = MemoryStore()
    await store.claim_ownership([OwnershipRecord(REF, "0", "w")])
    pump = PartitionPump(
        ref=REF,
        partition_id="0",
        owner_id="w",
        holds=lambda pid: deadline is None or time.monotonic() < deadline(pid),
        checkpoints=store,
        source=source,
        handler=handler,
        config=PumpConfig(dead_letter_dir=None, **config),
        dead_letters=DeadLetters(None),
        sleep=sleep,
        deadline=deadline,
    )
    return pump, asyncio.create_task(pump.run()), store


async def stop(pump: PartitionPump, task: asyncio.Task[Any]) -> Any:
    pump.stop()
    return await asyncio.wait_for(task, 10)


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_an_idle_pump_does_not_read_until_an_event_is_appended_then_handles_it_at_once(
    tmp_path: Path, kind: str
) -> None:
    hub = EmbeddedHub(tmp_path, "hub", partitions=1)
    source = CountingSource(hub)
    handled = Handled()
    handler: Any = handled
    if kind == "async":

        async def on_loop(event: ReceivedEvent, ctx: PartitionContext) -> None:
            handled(event, ctx)

        handler = on_loop
    sleeps = Sleeps()  # never ends: any read after the first is a wake-up from the hub's files
    pump, task, _ = await start_pump(source, handler, sleeps)
    await until(lambda: source.readers and source.readers[0].reads >= 1 and pump.stats.idle_waits, "the first read")
    reader = source.readers[0]
    for _ in range(200):
        await asyncio.sleep(0)
    assert reader.reads == 1 and pump.stats.idle_waits == 1  # idle: not one more read
    assert sleeps.asked and min(sleeps.asked) > 29  # waiting for the safety read only, not polling

    sent = time.monotonic()
    hub.send(b"hello", partition_id="0")
    await until(lambda: handled.events, "the appended event to be handled")
    assert handled.events[0][0] == 0
    assert reader.reads <= 3  # the wake-up's read (and maybe one more for a second notification)
    await until(lambda: pump.stats.idle_waits >= 2, "the pump to be idle again")
    print(f"append to handled: {(handled.events[0][1] - sent) * 1000:.1f} ms")

    stats = await stop(pump, task)
    assert stats.ended == "stopped" and stats.processed == 1 and stats.checkpointed == 0
    hub.close()


async def test_a_pump_of_a_reader_without_notify_is_polled(tmp_path: Path) -> None:
    hub = EmbeddedHub(tmp_path, "hub", partitions=1)
    source = CountingSource(hub, notifying=False)
    sleeps = Sleeps(real=True)
    pump, task, _ = await start_pump(source, Handled(), sleeps)
    await until(lambda: source.readers and source.readers[0].reads >= 3, "the pump to poll")
    assert set(sleeps.asked) == {0.05}
    await stop(pump, task)
    hub.close()


async def test_an_idle_pump_writes_its_pending_checkpoint_when_due(tmp_path: Path) -> None:
    hub = EmbeddedHub(tmp_path, "hub", partitions=1)
    source = CountingSource(hub)
    pump, task, store = await start_pump(
        source, Handled(), Sleeps(real=True), checkpoint_events=100, checkpoint_seconds=0.2, idle_seconds=1000.0
    )
    hub.send_batch([b"a", b"b", b"c"], partition_id="0")
    await until(lambda: pump.stats.processed == 3, "the events to be handled")

    async def checkpointed() -> bool:
        return [c.sequence_number for c in await store.list_checkpoints(REF)] == [2]

    await until(checkpointed, "the pending checkpoint, once due, without any new event")
    await stop(pump, task)
    hub.close()


async def test_an_idle_pump_pauses_when_told_its_lease_ran_out_and_does_not_watch_the_deadline_itself(
    tmp_path: Path,
) -> None:
    # The processor keeps one timer for all its pumps' deadlines (tests/workers/test_runtime.py): an
    # idle pump does not wake at its own, so a renewal wakes no pump at the old deadline.
    hub = EmbeddedHub(tmp_path, "hub", partitions=1)
    source = CountingSource(hub)
    # A deadline far enough ahead that a slow start (a busy machine) still finds the lease held: at
    # 0.3 s, a pump that took longer to start paused at its first look and was never idle (seen under
    # load). A pump that watched its own deadline would still ask to sleep at most 60 s.
    lease = {"until": time.monotonic() + 60.0}
    sleeps = Sleeps(real=True)
    pump, task, _ = await start_pump(
        source, Handled(), sleeps, deadline=lambda pid: lease["until"], idle_seconds=1000.0
    )
    await until(lambda: pump.stats.idle_waits == 1 and sleeps.asked, "the pump to be idle")
    assert min(sleeps.asked) > 999  # woken by its safety read at the latest, not at its lease's deadline
    lease["until"] = time.monotonic() - 1.0  # ran out unrenewed
    assert not pump.paused and source.readers[0].reads == 1
    pump.deadline_passed()  # the processor's timer
    await until(lambda: pump.paused, "the idle pump to pause")
    assert source.readers[0].reads == 1  # paused without reading
    lease["until"] = math.inf
    pump.wake()  # the processor, after a cycle renewed the lease
    await until(lambda: not pump.paused, "the pump to resume")
    hub.send(b"x", partition_id="0")
    await until(lambda: pump.stats.processed == 1, "the event after the pause")
    await stop(pump, task)
    hub.close()


async def test_an_event_hubs_reader_wakes_its_idle_pump_when_a_batch_arrives() -> None:
    clients = Clients(Hub())
    with EventHubsSource("sensors", connection_string=CONNECTION_STRING, client_factory=clients) as source:
        counting = CountingSource(source)
        handled = Handled()
        pump, task, _ = await start_pump(counting, handled, Sleeps())
        await until(lambda: counting.readers and pump.stats.idle_waits == 1, "the pump to be idle")
        for _ in range(100):
            await asyncio.sleep(0)
        assert counting.readers[0].reads == 1
        clients.last.feed([sdk_event(0, body=b"a"), sdk_event(1, body=b"b")])
        await until(lambda: len(handled.events) == 2, "the batch to be handled")
        await stop(pump, task)


class Deaf:
    """A notifying reader whose wake-ups are all lost (``notify`` accepts and never calls): only the
    safety read finds new events. ``looks`` counts its ``nothing_new`` answers; ``broken`` makes it raise."""

    def __init__(self, inner: HubReader, broken: bool = False) -> None:
        self.inner, self.broken = inner, broken
        self.reads = self.looks = 0

    def notify(self, wake: Any) -> None:
        pass

    def nothing_new(self) -> bool:
        self.looks += 1
        if self.broken:
            raise OSError(9, "Bad file descriptor")
        return self.inner.nothing_new()

    def receive(self, max_events: int) -> list[ReceivedEvent]:
        self.reads += 1
        return self.inner.receive(max_events)

    def close(self) -> None:
        self.inner.close()


class DeafSource:
    def __init__(self, hub: EmbeddedHub, broken: bool = False) -> None:
        self.hub, self.broken = hub, broken
        self.readers: list[Deaf] = []

    def reader(self, partition_id: str, position: Position) -> Deaf:
        reader = Deaf(self.hub.reader(partition_id, position), self.broken)
        self.readers.append(reader)
        return reader


def test_a_hub_reader_says_whether_its_log_holds_anything_it_has_not_read(tmp_path: Path) -> None:
    hub = EmbeddedHub(tmp_path, "hub", partitions=1)
    reader = hub.reader("0", Position.earliest())
    assert isinstance(reader, HubReader)
    assert reader.nothing_new()  # an empty log
    hub.send_batch([b"a", b"b", b"c"], partition_id="0")
    assert not reader.nothing_new()
    assert len(reader.receive(2)) == 2
    assert not reader.nothing_new()  # one left
    assert len(reader.receive(10)) == 1
    assert reader.nothing_new()
    with open(reader.watched_path, "ab") as log_file:
        log_file.write(b"\x01\x02")  # the first bytes of a record still being written
    assert not reader.nothing_new()  # something is there: a read finds out what
    assert reader.receive(10) == []
    reader.close()
    assert not reader.nothing_new()  # closed: it cannot tell
    hub.close()


async def test_an_idle_pump_reads_at_its_safety_read_only_if_its_reader_says_something_came(tmp_path: Path) -> None:
    # The safety read covers a lost wake-up. A reader that can tell from the log's size that nothing
    # came is asked on the event loop instead of being read in the pump's thread.
    hub = EmbeddedHub(tmp_path, "hub", partitions=1)
    source = DeafSource(hub)
    handled = Handled()
    pump, task, _ = await start_pump(source, handled, Sleeps(real=True), idle_seconds=0.02)
    await until(lambda: source.readers and source.readers[0].looks >= 5, "five safety reads")
    reader = source.readers[0]
    assert reader.reads == 1  # the first read only: each safety read was answered by the log's size
    hub.send_batch([b"a", b"b"], partition_id="0")  # its wake-up is lost
    await until(lambda: len(handled.events) == 2, "the events, found by the next safety read")
    await stop(pump, task)
    hub.close()


async def test_a_reader_that_cannot_tell_whether_something_came_is_read_at_each_safety_read(tmp_path: Path) -> None:
    hub = EmbeddedHub(tmp_path, "hub", partitions=1)
    source = DeafSource(hub, broken=True)
    pump, task, _ = await start_pump(source, Handled(), Sleeps(real=True), idle_seconds=0.02)
    await until(lambda: source.readers and source.readers[0].reads >= 3, "the safety reads to read")
    assert source.readers[0].looks >= 2  # asked, failed, read anyway
    await stop(pump, task)
    hub.close()


def test_idle_seconds_must_be_positive() -> None:
    with pytest.raises(ValueError):
        PumpConfig(idle_seconds=0)


def test_without_inotify_the_watch_falls_back_to_the_poller_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refused(changed: Any) -> None:
        raise OSError(24, "inotify_init1: Too many open files")  # the per-user limit of instances

    monkeypatch.setattr(arrivals, "_Inotify", refused)
    watch = FileWatch(poll_seconds=0.01)
    assert watch.kind == "poll"
    assert "inotify unavailable" in caplog.text
    path = tmp_path / "0.log"
    path.touch()
    woken = Counter()
    token = watch.watch(str(path), woken)
    path.write_bytes(b"grown")
    until_sync(lambda: woken.n, "the poller's wake-up")
    watch.unwatch(token)


def test_an_inotify_queue_overflow_wakes_every_watcher(tmp_path: Path) -> None:
    watch = FileWatch()
    counters = [Counter() for _ in range(3)]
    tokens = []
    for i, counter in enumerate(counters):
        (tmp_path / f"{i}.log").touch()
        tokens.append(watch.watch(str(tmp_path / f"{i}.log"), counter))
    watch._changed(None)  # what the reading thread does on IN_Q_OVERFLOW: any log may have grown
    assert [c.n for c in counters] == [1, 1, 1]
    for token in tokens:
        watch.unwatch(token)
