"""001's lease race's command-line options for ``runworkers``: its spans, ``--load-weighted`` and
``--load-unit`` (``add_race_options``), and the spans they give (``race_times``).

The wiring (``workers.wiring``) builds the race: its store, the process's race hub and the start-up
check that waits for the race's store to answer.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from balancer.race.times import RaceTimes

SPANS = ("normal_lease", "maximum_lease", "maximum_shutdown", "minimum_lease_grab", "leases_held_delay")


def add_race_options(parser: argparse.ArgumentParser) -> None:
    """``--normal-lease`` ... ``--leases-held-delay``, ``--load-weighted``, ``--load-unit``."""
    group = parser.add_argument_group("--strategy race (001's lease race; spans in seconds)")
    defaults = RaceTimes()
    for name in SPANS:
        value = getattr(defaults, name)
        group.add_argument(f"--{name.replace('_', '-')}", type=float, default=value, help=f"(default {value:g})")
    group.add_argument(
        "--load-weighted",
        action="store_true",
        help="weigh by measured events per second instead of partitions held: the default "
        "strategy's load-weighted shares, or the race's wait (LEASEBOARD_LOAD_WEIGHTED)",
    )
    group.add_argument(
        "--load-unit",
        type=float,
        default=100.0,
        help="events per second that weigh as much as one partition (default 100)",
    )


def race_times(options: Mapping[str, Any], interval: float) -> RaceTimes:
    """The spans ``add_race_options`` parsed; ValueError naming what does not fit."""
    times = RaceTimes(**{name: float(options.get(name, getattr(RaceTimes(), name))) for name in SPANS})
    if times.maximum_shutdown <= interval:
        raise ValueError(
            f"--maximum-shutdown ({times.maximum_shutdown:g}s) must be longer than --interval ({interval:g}s): "
            "it is also how long a worker processes without hearing from the race's store"
        )
    return times
