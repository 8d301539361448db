"""Sensor events, the producer loop and ``manage.py produce``."""

from __future__ import annotations

import io
import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from tests.support.waiting import until_sync
from workers.hub.embedded import EmbeddedHub
from workers.sensors import SENSORS, Producer, SensorEvent, SensorFleet, run_producer
from workers.sources.base import Position, ReceivedEvent

REPO = Path(__file__).resolve().parents[2]


def everything(hub: EmbeddedHub) -> list[ReceivedEvent]:
    events: list[ReceivedEvent] = []
    for pid in hub.partition_ids():
        reader = hub.reader(pid, Position.earliest())
        while batch := reader.receive(1000):
            events.extend(batch)
        reader.close()
    return events


@pytest.fixture
def hub_dir(tmp_path: Path, settings: object) -> Path:
    settings.LEASEBOARD_HUB_DIR = tmp_path  # type: ignore[attr-defined]
    settings.LEASEBOARD_PARTITIONS = 16  # type: ignore[attr-defined]
    return tmp_path


def test_the_same_seed_gives_the_same_events() -> None:
    def stream(seed: int) -> list[SensorEvent]:
        fleet = SensorFleet(50, random.Random(seed), clock=lambda: 1700000000.0)
        return [fleet.next_event() for _ in range(200)]

    assert stream(3) == stream(3)
    assert stream(3) != stream(4)


def test_sensor_events_are_small_json_of_known_sensors_and_round_trip() -> None:
    fleet = SensorFleet(20, random.Random(1))
    events = [fleet.next_event() for _ in range(2000)]
    for event in events:
        body = event.to_json()
        assert len(body) < 250 and SensorEvent.from_json(body) == event
        assert event.home.startswith("home-000") and event.event in SENSORS[event.sensor][2]
    assert {e.sensor for e in events} == set(SENSORS)
    assert len({e.event_id for e in events}) == len(events)
    assert {e.armed for e in events} == {True, False}


@pytest.mark.parametrize("body", [b"not json", b'{"home": "home-00001"}', b"\xff", b"[]"])
def test_a_body_that_is_not_a_sensor_event_is_refused(body: bytes) -> None:
    with pytest.raises(ValueError, match="not a sensor event"):
        SensorEvent.from_json(body)


def test_the_producer_paces_itself_on_the_clock_it_is_given(tmp_path: Path) -> None:
    hub = EmbeddedHub(tmp_path, "h", partitions=2)
    producer = Producer(hub, SensorFleet(10, random.Random(0)), rate=10)
    assert producer.step(100.0) == 0.0 and producer.sent == 1
    assert producer.step(100.05) == pytest.approx(0.05)
    assert producer.sent == 1
    producer.step(100.1)
    assert producer.sent == 2
    producer.step(101.0)
    assert producer.sent == 11
    producer.step(1000.0)  # far behind: one burst, then the pace starts again from now
    assert producer.sent == 11 + Producer.BURST
    assert producer.step(1000.0) == pytest.approx(0.1)
    assert sum(hub.properties(pid).last_enqueued_sequence_number + 1 for pid in hub.partition_ids()) == producer.sent


def test_run_producer_stops_when_told_and_reports_what_it_wrote(tmp_path: Path) -> None:
    hub = EmbeddedHub(tmp_path, "h", partitions=4)
    stop = threading.Event()
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(run_producer(hub, 2000, stop, random.Random(1))))
    thread.start()
    until_sync(
        lambda: sum(hub.properties(p).last_enqueued_sequence_number + 1 for p in hub.partition_ids()) >= 50,
        "the producer to write 50 events",
        20,
    )
    stop.set()
    thread.join(timeout=10)
    assert not thread.is_alive()
    (produced,) = result
    assert produced.count == len(everything(hub)) >= 50  # type: ignore[attr-defined]


def test_produce_writes_exactly_count_parseable_sensor_events_keyed_by_home(hub_dir: Path) -> None:
    out = io.StringIO()
    call_command("produce", "--hub", "t", "--count", "750", "--rate", "0", "--homes", "40", "--seed", "5", stdout=out)
    assert "wrote 750 events to hub 't' (16 partitions)" in out.getvalue()
    hub = EmbeddedHub(hub_dir, "t")
    events = everything(hub)
    assert len(events) == 750
    parsed = [SensorEvent.from_json(e.body) for e in events]
    assert all(e.partition_key == s.home for e, s in zip(events, parsed, strict=True))
    assert all(hub.partition_for_key(s.home) == e.partition_id for e, s in zip(events, parsed, strict=True))
    assert len({s.event_id for s in parsed}) == 750 and len({s.home for s in parsed}) == 40


def test_produce_creates_grows_and_will_not_shrink_the_hub(hub_dir: Path) -> None:
    call_command("produce", "--count", "1", "--partitions", "4", stdout=io.StringIO())
    assert EmbeddedHub(hub_dir, "sensors").partition_count == 4
    out = io.StringIO()
    call_command("produce", "--count", "1", "--partitions", "6", stdout=out)
    assert "grew hub 'sensors' from 4 to 6 partitions" in out.getvalue()
    with pytest.raises(CommandError, match="already has 6 partitions, more than --partitions 2"):
        call_command("produce", "--count", "1", "--partitions", "2", stdout=io.StringIO())
    call_command("produce", "--count", "1", stdout=io.StringIO())  # no --partitions: keeps 6
    hub = EmbeddedHub(hub_dir, "sensors")
    assert hub.partition_count == 6 and len(everything(hub)) == 3


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--rate", "-1", "--rate must be 0"),
        ("--duration", "0", "--duration must be more than 0"),
        ("--count", "-5", "--count must be 0 or more"),
        ("--homes", "0", "--homes must be at least 1"),
        ("--partitions", "0", "--partitions must be at least 1"),
        ("--hub", "a/b", "hub name must be"),
    ],
)
def test_produce_refuses_bad_options(hub_dir: Path, option: str, value: str, message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("produce", "--count", "1", option, value, stdout=io.StringIO())
    assert not any(EmbeddedHub.exists(hub_dir, name) for name in ("sensors", "a"))


def test_produce_stops_cleanly_on_sigterm_and_says_what_it_wrote(tmp_path: Path) -> None:
    env = {**os.environ, "LEASEBOARD_HUB_DIR": str(tmp_path), "LEASEBOARD_PARTITIONS": "3"}
    child = subprocess.Popen(
        [sys.executable, "manage.py", "produce", "--rate", "500", "--seed", "1"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def producing() -> None:
            assert child.poll() is None, "produce exited"

        until_sync(
            lambda: EmbeddedHub.exists(tmp_path, "sensors") and everything(EmbeddedHub(tmp_path, "sensors")),
            "produce to write an event",
            30,
            step=0.05,
            check=producing,
        )
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=30)
    finally:
        child.kill()
    assert child.returncode == 0, err
    written = len(everything(EmbeddedHub(tmp_path, "sensors")))
    assert f"wrote {written} events to hub 'sensors' (3 partitions)" in out
