"""Home-security sensor events (the example of the Event Hubs docs) and the producer that writes them.

Homes ("home-00042") carry motion, door, window, glass-break and smoke sensors; each event is a small
JSON object. The home is the partition key, so one home's events stay in order in one partition.
Everything random comes from the ``random.Random`` passed in, so a seed reproduces the stream.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass

from workers.hub.embedded import EmbeddedHub

# kind: (relative frequency, sensors of this kind per home, the events it reports)
SENSORS: dict[str, tuple[int, int, tuple[str, ...]]] = {
    "motion": (50, 3, ("detected", "cleared")),
    "door": (20, 2, ("opened", "closed")),
    "window": (20, 4, ("opened", "closed")),
    "glass_break": (3, 1, ("detected",)),
    "smoke": (2, 2, ("detected", "cleared")),
}
_KINDS = tuple(SENSORS)
_WEIGHTS = tuple(weight for weight, _, _ in SENSORS.values())
ARM_TOGGLE = 0.01  # chance per event that the home's alarm is armed or disarmed first


def home_id(number: int) -> str:
    return f"home-{number:05d}"


@dataclass(frozen=True, slots=True)
class SensorEvent:
    event_id: str
    home: str
    sensor: str  # kind: motion, door, window, glass_break, smoke
    sensor_id: str  # e.g. "door-2", unique within the home
    event: str  # e.g. "opened", "detected"
    armed: bool  # whether the home's alarm was armed when it happened
    timestamp: float  # seconds since the epoch, the sensor's clock

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, body: bytes) -> SensorEvent:
        """The event in ``body``. Raises ValueError if it is not a sensor event."""
        try:
            data = json.loads(body)
            event = cls(**data)
        except (TypeError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not a sensor event: {body[:80]!r} ({exc})") from None
        if event.sensor not in SENSORS or event.event not in SENSORS[event.sensor][2]:
            raise ValueError(f"unknown sensor or event in {body[:80]!r}")
        return event


class SensorFleet:
    """Endless sensor events of ``homes`` homes. Raises ValueError if ``homes`` < 1."""

    def __init__(self, homes: int, rng: random.Random, clock: Callable[[], float] = time.time) -> None:
        if isinstance(homes, bool) or not isinstance(homes, int) or homes < 1:
            raise ValueError(f"homes must be a whole number of at least 1, got {homes!r}")
        self.homes = homes
        self._rng = rng
        self._clock = clock
        self._armed: dict[str, bool] = {}

    def next_event(self) -> SensorEvent:
        rng = self._rng
        home = home_id(rng.randrange(self.homes))
        armed = self._armed.get(home, False)
        if rng.random() < ARM_TOGGLE:
            armed = self._armed[home] = not armed
        kind = rng.choices(_KINDS, _WEIGHTS)[0]
        _, per_home, events = SENSORS[kind]
        return SensorEvent(
            event_id=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
            home=home,
            sensor=kind,
            sensor_id=f"{kind}-{rng.randint(1, per_home)}",
            event=rng.choice(events),
            armed=armed,
            timestamp=self._clock(),
        )


@dataclass(frozen=True, slots=True)
class Produced:
    count: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else 0.0


class Producer:
    """Writes a fleet's events to a hub at ``rate`` events per second (0: as fast as it can).
    Raises ValueError for a negative rate."""

    BURST = 500  # events per step when unpaced; also the most a late paced step catches up at once

    def __init__(self, hub: EmbeddedHub, fleet: SensorFleet, rate: float) -> None:
        if rate < 0:
            raise ValueError(f"rate must be 0 (as fast as possible) or more events per second, got {rate}")
        self.hub = hub
        self.fleet = fleet
        self.rate = rate
        self.sent = 0
        self._started: float | None = None

    def step(self, now: float, limit: int | None = None) -> float:
        """Sends the events due by ``now`` (at most ``limit``); returns seconds until the next is due."""
        if self._started is None:
            self._started = now
        if self.rate == 0:
            due = self.BURST
        else:
            # The epsilon keeps float error from holding back an event that is due exactly now.
            due = min(int((now - self._started) * self.rate + 1e-9) + 1 - self.sent, self.BURST)
            if due <= 0:
                return (self.sent / self.rate) - (now - self._started)
        if limit is not None:
            due = min(due, limit)
        for _ in range(due):
            event = self.fleet.next_event()
            self.hub.send(event.to_json(), partition_key=event.home)
        self.sent += due
        if self.rate and self.sent < (now - self._started) * self.rate - self.BURST:
            self._started = now - (self.sent - 1) / self.rate  # far behind: go on at the pace from now
        return 0.0


def run_producer(
    hub: EmbeddedHub,
    rate: float,
    stop: threading.Event,
    rng: random.Random,
    *,
    homes: int = 1000,
    count: int | None = None,
    duration: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Produced:
    """Produces sensor events until ``stop`` is set, ``count`` events are written or ``duration``
    seconds pass; returns what it wrote. Meant for a thread (the demo) or a command's main loop."""
    producer = Producer(hub, SensorFleet(homes, rng), rate)
    started = clock()
    while not stop.is_set():
        now = clock()
        if duration is not None and now - started >= duration:
            break
        left = None if count is None else count - producer.sent
        if left is not None and left <= 0:
            break
        wait = producer.step(now, left)
        if wait > 0:
            if duration is not None:
                wait = min(wait, started + duration - now)
            stop.wait(wait)
    return Produced(producer.sent, clock() - started)
