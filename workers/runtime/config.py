"""What a pump is told (``PumpConfig``: checkpoint, read, retry and dead-letter policy) and what it
reports (``PumpStats``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.sources.base import Position


@dataclass(frozen=True, slots=True)
class PumpConfig:
    checkpoint_events: int = 100
    checkpoint_seconds: float = 1.0
    initial_position: Position = field(default_factory=Position.earliest)
    max_events: int = 100  # events per read (a batch handler's own size wins)
    poll_seconds: float = 0.05  # pause when the partition has nothing new (a reader without notify())
    # A reader with notify() wakes its idle pump on new events; the pump reads anyway after this long.
    idle_seconds: float = 30.0
    retries: int = 3
    backoff_seconds: float = 0.1
    backoff_max: float = 5.0
    dead_letter_dir: Path | None = None  # None: dead letters are kept in memory only
    # A handler call running longer than this many seconds is stuck (like Kafka's max.poll.interval.ms,
    # per partition): its thread is abandoned and the partition restarted from its checkpoint
    # (``pumps.py``). 0: never.
    handler_timeout: float = 300.0
    # Handler threads abandoned by one worker after which it stops, for its supervisor to restart it.
    abandon_max: int = 3
    # A partition whose reader has kept failing this many seconds (restarted at every cycle meanwhile)
    # is given up: released for another worker to take (``stuck.py``). 0: never.
    reader_stuck: float = 30.0
    # A reader that has handed nothing over for this many seconds while the hub holds events past it is
    # a wedged reader (``wedged.py``): restarted as a failing one. 0: never.
    reader_wedged: float = 15.0

    def __post_init__(self) -> None:
        if self.checkpoint_events < 1 or self.max_events < 1 or self.retries < 0:
            raise ValueError("checkpoint_events and max_events must be >= 1, retries >= 0")
        if not self.poll_seconds > 0 or not self.idle_seconds > 0:
            raise ValueError("poll_seconds and idle_seconds must be > 0")
        if not self.reader_stuck >= 0 or not self.reader_wedged >= 0:  # also refuses NaN
            raise ValueError(
                f"reader_stuck and reader_wedged must be >= 0 seconds (0: never), got {self.reader_stuck!r} "
                f"and {self.reader_wedged!r}"
            )
        if not self.handler_timeout >= 0 or self.abandon_max < 1:  # also refuses NaN
            raise ValueError(
                f"handler_timeout must be >= 0 seconds (0: never) and abandon_max >= 1, got "
                f"{self.handler_timeout!r} and {self.abandon_max!r}"
            )

    @classmethod
    def from_settings(cls, **overrides: Any) -> PumpConfig:
        """The config from Django settings (LEASEBOARD_CHECKPOINT_*, _HANDLER_*, _READER_*), with
        ``overrides`` applied."""
        from django.conf import settings

        values: dict[str, Any] = {
            "checkpoint_events": settings.LEASEBOARD_CHECKPOINT_EVENTS,
            "checkpoint_seconds": settings.LEASEBOARD_CHECKPOINT_SECONDS,
            "handler_timeout": settings.LEASEBOARD_HANDLER_TIMEOUT,
            "abandon_max": settings.LEASEBOARD_HANDLER_ABANDON_MAX,
            "reader_stuck": settings.LEASEBOARD_READER_STUCK,
            "reader_wedged": settings.LEASEBOARD_READER_WEDGED,
            "dead_letter_dir": Path(getattr(settings, "LEASEBOARD_DEADLETTER_DIR", settings.VAR_DIR / "deadletter")),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


@dataclass
class PumpStats:
    """What one pump did, for status output and tests."""

    processed: int = 0
    errors: int = 0
    dead_lettered: int = 0
    gaps: int = 0
    checkpoints: int = 0
    idle_waits: int = 0  # times the pump waited for new events (a notifying reader) or paused to poll again
    last_sequence: int | None = None
    checkpointed: int | None = None
    ended: str | None = None  # why the pump stopped: stopped, expired, lost, failed
