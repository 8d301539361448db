"""Checkpoints of the worker runtime: every n events or t seconds, once more on stop, resumed by the
next owner, refused once ownership moved; on a real embedded hub and store, driven by a fake clock."""

from __future__ import annotations

from typing import Any

import pytest

from balancer.errors import StoreUnavailable
from balancer.model import Checkpoint, EventKind
from tests.support.clock import FakeClock
from tests.support.waiting import until

from .conftest import Recorder, Rig, checkpoints, metric, own_all


class RecordingCheckpoints:
    """The rig's store, recording the sequence number of every checkpoint it accepted."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.written: list[tuple[str, int]] = []

    async def list_checkpoints(self, ref: Any) -> list[Checkpoint]:
        return list(await self.store.list_checkpoints(ref))

    async def update_checkpoint(self, checkpoint: Checkpoint, owner_id: str) -> Checkpoint:
        stored: Checkpoint = await self.store.update_checkpoint(checkpoint, owner_id)
        self.written.append((checkpoint.partition_id, checkpoint.sequence_number))
        return stored


# checkpoints ----------------------------------------------------------------------------------------


async def test_a_checkpoint_is_written_every_n_events_and_once_more_on_stop(any_rig: Rig) -> None:
    any_rig.send("0", 12)
    recorder = Recorder()
    a = any_rig.worker("a", recorder, checkpoint_events=5)
    recording = RecordingCheckpoints(any_rig.store)
    a._checkpoints = recording
    await own_all(a, 4)
    await until(lambda: recorder.count() == 12, what="12 events handled")
    await until(lambda: len(recording.written) == 2, what="two checkpoints")
    assert recording.written == [("0", 4), ("0", 9)]
    before = metric("leaseboard_checkpoints_total")
    await a.shutdown()
    assert recording.written == [("0", 4), ("0", 9), ("0", 11)]
    assert metric("leaseboard_checkpoints_total") == before + 1


class FailingOnStop(RecordingCheckpoints):
    """Fails the first ``failures`` checkpoints written once ``stopping`` is set (a connection that died
    in an outage fails its first request after the heal)."""

    def __init__(self, store: Any, failures: int) -> None:
        super().__init__(store)
        self.stopping, self.failures, self.refused = False, failures, 0

    async def update_checkpoint(self, checkpoint: Checkpoint, owner_id: str) -> Checkpoint:
        if self.stopping and self.refused < self.failures:
            self.refused += 1
            raise StoreUnavailable("connection already closed")
        return await super().update_checkpoint(checkpoint, owner_id)


async def test_a_final_checkpoint_the_store_fails_once_is_written_on_the_next_try(rig: Rig) -> None:
    # A release after a failed final checkpoint would have the next owner handle those events again.
    rig.send("0", 12)
    recorder = Recorder()
    a = rig.worker("a", recorder, checkpoint_events=5)
    flaky = FailingOnStop(rig.store, failures=1)
    a._checkpoints = flaky
    await own_all(a, 4)
    await until(lambda: recorder.count() == 12, what="12 events handled")
    await until(lambda: len(flaky.written) == 2, what="two checkpoints")
    flaky.stopping = True
    await a.shutdown()
    assert flaky.refused == 1 and flaky.written[-1] == ("0", 11)
    assert await checkpoints(rig) == {"0": 11}


async def test_a_final_checkpoint_the_store_keeps_failing_is_given_up_after_its_tries(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    rig.send("0", 12)
    a = rig.worker("a", Recorder(), checkpoint_events=5)
    flaky = FailingOnStop(rig.store, failures=100)
    a._checkpoints = flaky
    await own_all(a, 4)
    await until(lambda: len(flaky.written) == 2, what="two checkpoints")
    await until(lambda: a.stats()["0"].processed == 12, what="12 events handled")
    flaky.stopping = True
    await a.shutdown()
    tries = flaky.refused  # 1 + the pump's retries, then given up (it does not hold the stop for ever)
    assert tries > 1 and await checkpoints(rig) == {"0": 9}
    assert (
        f"final checkpoint not written (the store failed {tries} times); the next owner resumes after 9" in caplog.text
    )


async def test_a_checkpoint_is_written_after_t_seconds_when_events_are_few(rig: Rig) -> None:
    rig.send("2", 3)
    recorder = Recorder()
    a = rig.worker("a", recorder, checkpoint_events=100, checkpoint_seconds=1.0)
    await own_all(a, 4)
    await until(lambda: recorder.count() == 3, what="3 events handled")
    assert await checkpoints(rig) == {}
    rig.clock.advance(1.5)
    await until(lambda: a.stats()["2"].checkpointed == 2, what="the time-based checkpoint")
    assert await checkpoints(rig) == {"2": 2}
    await a.shutdown()


async def test_a_new_owner_resumes_after_the_checkpoint_without_skipping_or_repeating(any_rig: Rig) -> None:
    for pid in "0123":
        any_rig.send(pid, 7)
    recorder = Recorder()
    a = any_rig.worker("a", recorder)
    await own_all(a, 4)
    await until(lambda: recorder.count() == 28, what="a's events")
    await a.shutdown()
    assert await checkpoints(any_rig) == dict.fromkeys("0123", 6)

    for pid in "0123":
        any_rig.send(pid, 4)
    b = any_rig.worker("b", recorder)
    await own_all(b, 4)  # released by a: b claims them at once, no expiry needed
    await until(lambda: recorder.count() == 44, what="b's events")
    for pid in "0123":
        assert recorder.sequences(pid, "a") == list(range(7))
        assert recorder.sequences(pid, "b") == list(range(7, 11))
    await b.shutdown()


async def test_after_a_crash_the_next_owner_repeats_only_the_uncheckpointed_tail(rig: Rig) -> None:
    rig.send("1", 13)
    recorder = Recorder()
    a = rig.worker("a", recorder, checkpoint_events=5)
    await own_all(a, 4)
    await until(lambda: recorder.count() == 13 and a.stats()["1"].checkpointed == 9, what="a's events")
    await a.abort()  # no final checkpoint, no release: the leases stay until they expire

    b = rig.worker("b", recorder)
    rig.clock.advance(31)
    rig.send("1", 2)
    await own_all(b, 4)
    await until(lambda: len(recorder.sequences("1", "b")) == 5, what="b's events")
    assert recorder.sequences("1", "a") == list(range(13))
    assert recorder.sequences("1", "b") == [10, 11, 12, 13, 14]  # 10..12 again: a's tail after checkpoint 9
    assert [e.kind for e in rig.sinks["b"].seen] == [EventKind.EXPIRE] * 4
    await b.shutdown()


async def test_a_checkpoint_refused_by_the_store_stops_the_pump_until_a_cycle_settles_ownership(rig: Rig) -> None:
    rig.send("0", 3)
    recorder, other = Recorder(), Recorder()
    frozen = FakeClock()  # a's own clock stands still (a long pause): it believes it still holds
    a = rig.worker("a", recorder, monotonic=frozen, checkpoint_events=1)
    await own_all(a, 4)
    await until(lambda: a.stats()["0"].checkpointed == 2, what="a's checkpoints")

    rig.clock.advance(31)
    b = rig.worker("b", other, checkpoint_events=1)
    await own_all(b, 4)  # took every partition after expiry, by the store's clock
    rig.send("0", 1)
    await until(lambda: a.stats()["0"].ended == "lost", what="a's pump to be refused its checkpoint")
    await until(lambda: b.stats()["0"].checkpointed == 3, what="b's checkpoint")
    assert recorder.sequences("0") == [0, 1, 2, 3]  # the one event in flight: at least once
    assert other.sequences("0") == [3]
    assert a.stats()["0"].checkpointed == 2 and await checkpoints(rig) == {"0": 3}

    report = await a.step()  # the cycle sees b's records: every lease lost, no pump restarted
    assert report is not None and {e.partition_id for e in report.lost} == set("0123")
    assert a.pumping == frozenset()
    await a.shutdown()
    await b.shutdown()


async def test_checkpoints_never_go_backwards_when_ownership_moves_back_and_forth(rig: Rig) -> None:
    rig.send("0", 20)
    recorder = Recorder()
    seen: list[int] = []
    for round_, owner in enumerate(["a", "b", "a2", "b2"]):
        worker = rig.worker(owner, recorder, checkpoint_events=3)
        await own_all(worker, 4)
        rig.send("0", 5)
        total = 25 + 5 * round_

        def all_handled(total: int = total) -> bool:
            return len(set(recorder.sequences("0"))) == total

        await until(all_handled, what=f"{owner}'s events")
        await worker.shutdown()
        seen.append((await checkpoints(rig))["0"])
    assert seen == sorted(seen) and seen[-1] == 39
    assert sorted(set(recorder.sequences("0"))) == list(range(40))
    assert len(recorder.sequences("0")) == 40  # graceful hand-overs repeat nothing
