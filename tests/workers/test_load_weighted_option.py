"""``runworkers --load-weighted`` and ``LEASEBOARD_LOAD_WEIGHTED``: the default strategy's weighted variant."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError

from balancer.lease import Coordinator


def build(settings: Any, tmp_path: Path, *args: str) -> Any:
    from workers.management.commands.runworkers import Command, fleet_of

    settings.LEASEBOARD_HUB_DIR = tmp_path
    command = Command()
    options = vars(command.create_parser("manage.py", "runworkers").parse_args(["--store", "memory", *args]))
    return fleet_of(options)


@pytest.mark.parametrize(
    ("flag", "setting", "weighted"),
    [
        ([], False, False),
        (["--load-weighted"], False, True),
        ([], True, True),
    ],
)
def test_the_option_or_the_setting_makes_the_default_strategy_weigh_by_load(
    flag: list[str], setting: bool, weighted: bool, settings: Any, tmp_path: Path
) -> None:
    settings.LEASEBOARD_LOAD_WEIGHTED = setting
    built = build(settings, tmp_path, "--count", "2", *flag)
    try:
        coordinators = [p.coordinator for p in built.processors]
        assert all(isinstance(c, Coordinator) for c in coordinators)
        assert all(c.strategy.name == "cooperative" and c.strategy.uses_load is weighted for c in coordinators)
        assert all(c.checkpoints is built.stores.checkpoints for c in coordinators)  # where rates are measured
    finally:
        built.source.close()


def test_load_weighting_a_strategy_without_a_weighted_variant_is_refused(settings: Any, tmp_path: Path) -> None:
    settings.LEASEBOARD_LOAD_WEIGHTED = False
    with pytest.raises(CommandError, match="--load-weighted works with cooperative"):
        build(settings, tmp_path, "--strategy", "greedy", "--load-weighted")
