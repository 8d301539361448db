"""Fixtures for the pipeline: one SparkSession for the whole test session (about 4.5 s to start),
landing folders, and helpers that land sensor events the way the landing handler does."""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from balancer.model import HubRef
from workers.alerts import AlertWriter
from workers.handlers import PartitionContext
from workers.landing import LandingHandler
from workers.pipeline.job import Paths
from workers.pipeline.spark import build_session
from workers.runtime.deadletters import DeadLetters
from workers.sensors import SensorEvent, SensorFleet
from workers.sources.base import ReceivedEvent

HUB = "sensors"
REF = HubRef("localhost", HUB, "$Default")
T0 = 1_767_225_600.0  # 2026-01-01 00:00:00 UTC


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = build_session("local[2]", "leaseboard-tests")
    yield session
    session.stop()
    # Java objects finalised at interpreter exit make py4j log "Exception while sending command" to a
    # closed gateway (and a closed stream): noise after the run, not a failure. Silence it.
    logging.getLogger("py4j").disabled = True


def received(partition_id: str, sequence_number: int, body: bytes, enqueued: float | None = None) -> ReceivedEvent:
    """An event as a hub would deliver it (offset and enqueued time follow from the sequence number)."""
    return ReceivedEvent(
        partition_id,
        sequence_number,
        str(sequence_number * 100),
        T0 + sequence_number if enqueued is None else enqueued,
        None,
        body,
    )


def reading(home: str, sensor: str, event: str, *, armed: bool = False, at: float = T0, n: int = 0) -> SensorEvent:
    return SensorEvent(f"e-{home}-{n}", home, sensor, f"{sensor}-1", event, armed, at)


def fleet_events(count: int, seed: int = 7, homes: int = 20) -> list[SensorEvent]:
    """``count`` sensor readings of a seeded fleet, one every 0.5 s from T0."""
    ticks = iter(T0 + 0.5 * i for i in range(count))
    fleet = SensorFleet(homes, random.Random(seed), clock=lambda: next(ticks))
    return [fleet.next_event() for _ in range(count)]


@dataclass
class Landing:
    """A landing root and pipeline folder in a test's temporary directory."""

    root: Path
    pipeline: Path
    dead: Path
    alerts: AlertWriter | bool = False  # the landing's own alerts: off unless a test turns them on

    @property
    def paths(self) -> Paths:
        return Paths.for_hub(HUB, self.root, self.pipeline)

    def handler(self) -> LandingHandler:
        return LandingHandler(self.root, dead_letters=DeadLetters(self.dead), linger=0, alerts=self.alerts)

    def land(self, partition_id: str, first: int, bodies: Sequence[bytes]) -> None:
        """Land ``bodies`` as sequence numbers ``first``.. of ``partition_id``, as one handler call."""
        events = [received(partition_id, first + i, body) for i, body in enumerate(bodies)]
        self.handler()(events, PartitionContext(REF, partition_id, "test-owner"))


@pytest.fixture
def landing(tmp_path: Path) -> Landing:
    return Landing(tmp_path / "landing", tmp_path / "pipeline", tmp_path / "deadletter")
