"""The chaos and partition suites' recording handler records a handling only while the lease holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from balancer.model import HubRef
from tests.chaos.recording import Recorder, read_handlings
from workers.handlers import MalformedEvent, NotHeld, PartitionContext
from workers.sensors import SensorEvent
from workers.sources.base import ReceivedEvent

REF = HubRef("ns", "hub", "$Default")


def event(sequence: int, body: bytes = b"{}") -> ReceivedEvent:
    return ReceivedEvent("3", sequence, str(sequence), 0.0, None, body)


def test_a_handling_is_recorded_only_while_the_lease_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEASEBOARD_RECORD_DIR", str(tmp_path))
    recorder = Recorder()
    held = [True]
    ctx = PartitionContext(REF, "3", "w1-0", holds=lambda: held[0])
    recorder(event(1), ctx)
    with pytest.raises(MalformedEvent):
        recorder(event(2, b"\xffnot json"), ctx)  # recorded as malformed, then refused
    held[0] = False  # the lease ran out between the pump's look and this call
    with pytest.raises(NotHeld, match="partition 3: the lease of w1-0 may have run out"):
        recorder(event(3), ctx)
    with pytest.raises(NotHeld):
        recorder.record([event(4), event(5)], ctx)
    held[0] = True
    recorder.record([event(4), event(5)], ctx)  # renewed: the pump hands the batch again
    found = read_handlings(tmp_path)
    assert [(h.sequence, h.owner, h.malformed) for h in found] == [
        (1, "w1-0", False),
        (2, "w1-0", True),
        (4, "w1-0", False),
        (5, "w1-0", False),
    ]
    assert found[2].at == found[3].at  # one batch, one time


def test_a_handling_the_landing_refused_is_taken_back_and_a_second_handing_is_not_a_repeat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The partition suite's landing records a batch, then finds the lease gone before its rename:
    nothing landed, the pump hands the batch on again, so the first recording is no handling."""
    from tests.netsplit.landing import LandingRecorder, read_landing

    monkeypatch.setenv("LEASEBOARD_RECORD_DIR", str(tmp_path / "records"))
    (tmp_path / "records").mkdir()
    handler = LandingRecorder()
    handler.root = tmp_path / "landing"
    looks = iter([True, True, False])  # the recorder's look, the writer's, then gone before the rename
    ctx = PartitionContext(REF, "3", "w1-0", holds=lambda: next(looks, True))
    bodies = [SensorEvent(f"e{n}", "h", "smoke", "smoke-1", "detected", False, 1.0).to_json() for n in (7, 8)]
    batch = [ReceivedEvent("3", 7 + i, str(7 + i), 0.0, None, body) for i, body in enumerate(bodies)]
    with pytest.raises(NotHeld):
        handler(batch, ctx)
    assert read_landing(tmp_path / "landing", REF.hub)[0] == []
    assert read_handlings(tmp_path / "records") == []
    handler(batch, ctx)  # renewed: handed again, and landed
    found = read_handlings(tmp_path / "records")
    assert [(h.sequence, h.owner) for h in found] == [(7, "w1-0"), (8, "w1-0")]
    assert [f.sequences for f in read_landing(tmp_path / "landing", REF.hub)[0]] == [(7, 8)]
