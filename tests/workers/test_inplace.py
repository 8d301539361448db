"""Dead letters replayed in place: the owner's pump hands each to its handler between two reads,
with the property naming where it was, without moving the checkpoint; each marked handled or
failed; a second request refused unless forced; a worker that loses the partition half way leaves
the rest to the next owner. On a real embedded hub, store and dead-letter folder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.waiting import until
from workers.deadletter import files, inplace
from workers.deadletter.decode import properties_of
from workers.deadletter.replay import REPLAYED_FROM, AlreadyReplayed, EmbeddedSender, Letter, replay
from workers.handlers import PartitionContext, batch_handler
from workers.runtime.processor import EventProcessor
from workers.sources.base import ReceivedEvent

from .conftest import REF, Rig, checkpoints, metric, own_all


class Fixable:
    """A handler that fails on the sequence numbers in ``broken`` until they are taken out."""

    def __init__(self, *broken: int) -> None:
        self.broken = set(broken)
        self.handled: list[ReceivedEvent] = []

    def __call__(self, event: ReceivedEvent, ctx: PartitionContext) -> None:
        if event.sequence_number in self.broken:
            raise RuntimeError(f"cannot handle {event.sequence_number}")
        self.handled.append(event)

    def replayed(self) -> list[tuple[int, str]]:
        return [(e.sequence_number, properties_of(e.amqp)[REPLAYED_FROM]) for e in self.handled if e.amqp]


def folder(rig: Rig) -> Path:
    return files.folder_of(rig.dead_dir, REF.hub)


def set_aside_now(rig: Rig) -> list[int]:
    return sorted(files.read_letters(folder(rig), "3", REF.consumer_group))


async def set_aside(rig: Rig, handler: Callable[..., Any], *broken: int) -> EventProcessor:
    """A worker owning every partition whose handler set ``broken`` of partition 3's 0..5 aside."""
    rig.send("3", 6)
    worker = rig.worker("a", handler, retries=0)
    await own_all(worker, 4)
    await until(lambda: set_aside_now(rig) == sorted(broken), what="the broken ones set aside")
    await until(lambda: worker.stats()["3"].processed == 6, what="every event handled or set aside")
    return worker


async def test_a_fixed_handler_gets_the_dead_letters_again_without_the_checkpoint_moving(rig: Rig) -> None:
    handler = Fixable(1, 4)
    worker = await set_aside(rig, handler, 1, 4)
    await worker.step()  # the final checkpoints of the first pass are written by now
    before = (await checkpoints(rig))["3"]
    handled = metric("leaseboard_dead_letters_replayed_in_place_total", outcome="handled")
    handler.broken.clear()

    asked = inplace.request(folder(rig), REF.consumer_group, "3", [1, 4], user="ops")
    pending = files.read_markers(folder(rig), "3", REF.consumer_group)
    await worker.step()  # the cycle that a console's wake-up runs
    await until(lambda: not asked.path.exists(), what="the request done")

    marks = files.read_markers(folder(rig), "3", REF.consumer_group)
    assert [pending[n]["to"] for n in (1, 4)] == [inplace.PENDING] * 2
    assert {n: (m["to"], m["user"], m["request"]) for n, m in marks.items()} == {
        1: ("in place by a", "ops", asked.id),
        4: ("in place by a", "ops", asked.id),
    }
    assert handler.replayed() == [(1, "3:1"), (4, "3:4")]
    assert [e.body for e in handler.handled[-2:]] == [b'{"n": 1}'] * 2
    assert (await checkpoints(rig))["3"] == before  # behind the checkpoint: it does not move
    assert metric("leaseboard_dead_letters_replayed_in_place_total", outcome="handled") == handled + 2
    with pytest.raises(AlreadyReplayed, match=r"3:1 already replayed at .* by ops \(as in place by a\)"):
        inplace.request(folder(rig), REF.consumer_group, "3", [1], user="ann")
    await worker.shutdown()


async def test_a_handler_that_fails_again_marks_the_dead_letter_failed_and_it_may_be_replayed_again(
    rig: Rig,
) -> None:
    handler = Fixable(2)
    worker = await set_aside(rig, handler, 2)
    failed = metric("leaseboard_dead_letters_replayed_in_place_total", outcome="failed")

    asked = inplace.request(folder(rig), REF.consumer_group, "3", [2], user="ops")
    await worker.step()
    await until(lambda: not asked.path.exists(), what="the request done")

    assert files.read_markers(folder(rig), "3", REF.consumer_group) == {}  # not replayed
    (failure,) = files.read_failures(folder(rig), "3", REF.consumer_group).values()
    assert (failure["failed"], failure["owner"]) == ("RuntimeError: cannot handle 2", "a")
    assert metric("leaseboard_dead_letters_replayed_in_place_total", outcome="failed") == failed + 1
    assert sorted(files.read_letters(folder(rig), "3", REF.consumer_group)) == [2]  # still there, not again

    handler.broken.clear()
    again = inplace.request(folder(rig), REF.consumer_group, "3", [2], user="ops")  # no force needed
    await worker.step()
    await until(lambda: not again.path.exists(), what="the second request done")
    assert handler.replayed() == [(2, "3:2")]
    await worker.shutdown()


@pytest.mark.parametrize("kind", ["batch", "async"])
async def test_batch_and_async_handlers_get_them_too(rig: Rig, kind: str) -> None:
    fixable = Fixable(0)

    @batch_handler(max_events=4)  # type: ignore[untyped-decorator]  # batch_handler(...) is typed as Any
    def in_batches(events: list[ReceivedEvent], ctx: PartitionContext) -> None:
        assert len(events) == 1 or not any(e.amqp for e in events)  # a dead letter comes alone
        for event in events:
            fixable(event, ctx)

    async def on_the_loop(event: ReceivedEvent, ctx: PartitionContext) -> None:
        fixable(event, ctx)

    if kind == "batch":  # the whole batch with 0 in it is set aside
        worker = await set_aside(rig, in_batches, 0, 1, 2, 3)
    else:
        worker = await set_aside(rig, on_the_loop, 0)
    fixable.broken.clear()
    asked = inplace.request(folder(rig), REF.consumer_group, "3", [0], user="ops")
    await worker.step()
    await until(lambda: not asked.path.exists(), what="the request done")
    assert fixable.replayed() == [(0, "3:0")]
    await worker.shutdown()


async def test_what_a_worker_did_not_hand_over_before_losing_the_partition_is_the_next_owners(rig: Rig) -> None:
    """The first worker stops after one of three (its lease gone for good); the next one hands over
    the other two only."""
    handler = Fixable(0, 1, 2)
    first = await set_aside(rig, handler, 0, 1, 2)
    handler.broken.clear()
    asked = inplace.request(folder(rig), REF.consumer_group, "3", [0, 1, 2], user="ops")
    inplace.settle(folder(rig), asked, {0: None}, "a", lambda: 1.0)  # as the first owner does for one
    await first.shutdown()  # releases: the request stays for whoever owns partition 3 next

    second = rig.worker("b", handler, retries=0)
    await own_all(second, 4)
    await until(lambda: not asked.path.exists(), what="the request done by the next owner")

    marks = files.read_markers(folder(rig), "3", REF.consumer_group)
    assert {n: m["to"] for n, m in marks.items()} == {0: "in place by a", 1: "in place by b", 2: "in place by b"}
    assert handler.replayed() == [(1, "3:1"), (2, "3:2")]
    await second.shutdown()


async def test_a_replay_to_the_hub_and_one_in_place_do_not_both_take_a_dead_letter(rig: Rig) -> None:
    handler = Fixable(5)
    worker = await set_aside(rig, handler, 5)
    await worker.shutdown()  # nobody hands the request over: it stays pending
    letter = Letter.of(files.read_letters(folder(rig), "3", REF.consumer_group)[5])

    inplace.request(folder(rig), REF.consumer_group, "3", [5], user="ops")
    with pytest.raises(AlreadyReplayed, match=r"3:5 already replayed at .* by ops \(as in place \(pending\)\)"):
        replay(folder(rig), REF.consumer_group, [letter], EmbeddedSender(rig.hub), user="ann")
    forced = replay(folder(rig), REF.consumer_group, [letter], EmbeddedSender(rig.hub), user="ann", force=True)

    assert forced[0]["to"] == "3:6"
    (request,) = inplace.requests_folder(folder(rig)).iterdir()
    assert inplace.to_handle(inplace.Request.load(request), files.read_markers(folder(rig), "3", "$Default")) == []


def test_a_request_file_that_is_not_one_is_left_alone(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    requests = inplace.requests_folder(folder(rig))
    requests.mkdir(parents=True)
    (requests / f"3.{'a' * 32}.json").write_text("{not json")
    (requests / "notes.txt").write_text("hello")

    with pytest.raises(ValueError, match="is not an in-place request"):
        inplace.Request.load(requests / f"3.{'a' * 32}.json")
    assert inplace.partition_of(requests / "notes.txt") is None


async def test_a_request_whose_marks_cannot_be_read_is_left_and_the_pump_goes_on(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    handler = Fixable(1)
    worker = await set_aside(rig, handler, 1)
    asked = inplace.request(folder(rig), REF.consumer_group, "3", [1], user="ops")
    marks = files.markers_path(folder(rig), "3")
    marks.unlink()
    marks.mkdir()  # reading the marks now fails (IsADirectoryError)

    await worker.step()
    await until(lambda: "in-place request" in caplog.text, what="the request left, said in the log")
    rig.send("3", 2)
    await until(lambda: worker.stats()["3"].processed == 8, what="the pump to go on with new events")

    assert asked.path.exists() and worker.stats()["3"].ended is None
    assert f"in-place request {asked.path.name} left" in caplog.text
    await worker.shutdown()
