"""What a fleet of workers is built from (``FleetConfig``: ``runworkers``' options, parsed once) and
the checks that refuse values that cannot work, each in one line naming the option or setting."""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from balancer.race.build import SPANS

from ..handlers import DEFAULT_HANDLER

log = logging.getLogger("leaseboard.worker")


class FleetError(Exception):
    """A fleet these options or settings cannot build; the message, one line, says what to fix."""


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """A fleet of workers in one process, as ``runworkers``' options describe it (None: the setting
    behind the option). ``count_option`` is how messages name ``count`` (``serve`` calls it ``--workers``)."""

    count: int = 1
    count_option: str = "--count"
    strategy: str | None = None
    store: str | None = None
    source: str | None = None
    hub: str | None = None
    consumer_group: str | None = None
    namespace: str | None = None
    handler: str = DEFAULT_HANDLER
    interval: float | None = None
    expiry: float | None = None
    owner_prefix: str | None = None
    checkpoint_events: int | None = None
    checkpoint_seconds: float | None = None
    handler_timeout: float | None = None
    reader_stuck: float | None = None
    initial_position: str = "earliest"
    shutdown_timeout: float = 10.0
    release_notices: bool | None = None
    metrics_port: int = 0
    load_weighted: bool = False
    load_unit: float = 100.0
    race_spans: tuple[tuple[str, float], ...] = ()  # the race's spans given (``--normal-lease`` ...)

    @classmethod
    def from_options(cls, options: Mapping[str, Any], count_option: str = "--count") -> FleetConfig:
        """The config of a command's parsed ``options`` (``add_worker_options``' destinations)."""
        return cls(
            count=options["count"],
            count_option=count_option,
            strategy=options["strategy"],
            store=options["store"],
            source=options["source"],
            hub=options["hub"],
            consumer_group=options["consumer_group"],
            namespace=options["namespace"],
            handler=options["handler"],
            interval=options["interval"],
            expiry=options["expiry"],
            owner_prefix=options["owner_prefix"],
            checkpoint_events=options["checkpoint_events"],
            checkpoint_seconds=options["checkpoint_seconds"],
            handler_timeout=options.get("handler_timeout"),
            reader_stuck=options.get("reader_stuck"),
            initial_position=options["initial_position"],
            shutdown_timeout=options["shutdown_timeout"],
            release_notices=options.get("release_notices"),
            metrics_port=options.get("metrics_port", 0),
            load_weighted=bool(options.get("load_weighted")),
            load_unit=options.get("load_unit", 100.0),
            race_spans=tuple((name, options[name]) for name in SPANS if name in options),
        )

    @property
    def store_name(self) -> str:
        return self.store or settings.LEASEBOARD_STORE


@dataclass(frozen=True, slots=True)
class Timing:
    """Seconds between cycles and of a lease, each with the name the user gave it (an option, or the
    environment variable behind its default)."""

    interval: float
    expiry: float
    interval_name: str
    expiry_name: str


def check_timing(config: FleetConfig) -> Timing:
    """The interval and expiry, refused when they cannot work and warned of when they barely do."""
    interval = config.interval if config.interval is not None else settings.LEASEBOARD_INTERVAL
    expiry = config.expiry if config.expiry is not None else settings.LEASEBOARD_EXPIRY
    if config.count < 1:
        raise FleetError(f"{config.count_option} must be at least 1, got {config.count}")
    interval_name = "--interval" if config.interval is not None else "LEASEBOARD_INTERVAL"
    expiry_name = "--expiry" if config.expiry is not None else "LEASEBOARD_EXPIRY"
    if interval <= 0:
        raise FleetError(f"{interval_name} must be more than 0 seconds, got {interval}")
    if expiry <= interval:
        raise FleetError(f"{expiry_name} ({expiry:g}s) must be longer than {interval_name} ({interval:g}s)")
    if expiry < 3 * interval:
        log.warning(
            "%s (%gs) is under three %s (%gs): one slow or missed cycle can let a lease lapse and move a "
            "partition; keep the expiry at three intervals or more (the defaults: 30s over 10s)",
            expiry_name,
            expiry,
            interval_name,
            interval,
        )
    return Timing(interval, expiry, interval_name, expiry_name)


def check_limits(config: FleetConfig) -> None:
    """Refuse option values that cannot work, in one line naming the option. Raises FleetError."""
    limits: list[tuple[str, str, float, bool]] = [  # option, field, lowest, lowest allowed itself
        ("--checkpoint-events", "checkpoint_events", 1, True),
        ("--checkpoint-seconds", "checkpoint_seconds", 0, False),
        ("--handler-timeout", "handler_timeout", 0, True),
        ("--reader-stuck", "reader_stuck", 0, True),
        ("--shutdown-timeout", "shutdown_timeout", 0, False),
        ("--metrics-port", "metrics_port", 0, True),
    ]
    for option, field, lowest, inclusive in limits:
        value = getattr(config, field)
        if value is None:
            continue
        if value < lowest or (value == lowest and not inclusive):
            bound = f"at least {lowest:g}" if inclusive else f"more than {lowest:g}"
            raise FleetError(f"{option} must be {bound}, got {value:g}")
    if config.metrics_port and config.metrics_port > 65535:
        raise FleetError(f"--metrics-port must be a TCP port (1-65535, or 0 for none), got {config.metrics_port}")


def check_resolution(store: object, expiry: float, name: str) -> None:
    """Refuse an expiry the store's clock cannot judge: one that is no whole number of its ticks (the
    Blob store's Last-Modified counts whole seconds, so a 3.5 s lease could be taken up to half a
    second before its holder stops). Raises ValueError."""
    tick = getattr(store, "clock_resolution", None)
    if tick and abs(expiry / tick - round(expiry / tick)) > 1e-9:
        raise ValueError(
            f"{name} ({expiry:g}s) must be a whole number of {tick:g}s with this store: its clock counts whole "
            f"{tick:g}s ticks, so a lease's age is judged to within one; try {math.ceil(expiry / tick) * tick:g}"
        )


# A test hook: seconds added to the wall clock the workers of this process read (their
# coordinators' ``clock``), to run one worker as if its machine's clock were off. Leases are judged
# by the store's clock with the default strategy, so a skew must change nothing; the fault-injection
# suite (tests/chaos) proves it. Not for production use.
CLOCK_SKEW_ENV = "LEASEBOARD_CLOCK_SKEW"


def clock_skew() -> float:
    """Seconds of ``LEASEBOARD_CLOCK_SKEW`` (0 when unset). Raises FleetError for a value that is not."""
    raw = os.environ.get(CLOCK_SKEW_ENV, "").strip()
    if not raw:
        return 0.0
    try:
        skew = float(raw)
    except ValueError:
        skew = math.nan
    if not math.isfinite(skew):
        raise FleetError(f"{CLOCK_SKEW_ENV} must be a number of seconds, got {raw!r}")
    return skew


def skewed_clock(skew: float) -> Callable[[], float]:
    """``time.time``, or ``time.time`` plus ``skew`` seconds."""
    if not skew:
        return time.time
    return lambda: time.time() + skew


def workers_clock() -> Callable[[], float]:
    """The wall clock this process's workers read: ``LEASEBOARD_CLOCK_SKEW`` applied (said in the log)."""
    skew = clock_skew()
    if skew:
        log.warning("%s=%g: this process's wall clock runs %+gs off (a test hook)", CLOCK_SKEW_ENV, skew, skew)
    return skewed_clock(skew)
