"""Resolving ``--handler`` and refusing bad ``runworkers`` options, each in one clear line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from workers.handlers import HandlerNotFound, resolve_handler

from .conftest import REF, Recorder


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("nodots", "must be a dotted path"),
        ("no_such_module.handler", "cannot import module 'no_such_module'"),
        ("workers.handlers.nope", "module 'workers.handlers' has no attribute 'nope'"),
        ("workers.handlers.DEFAULT_HANDLER", "is a str, not a callable"),
    ],
)
def test_a_wrong_handler_path_is_refused_with_a_clear_message(path: str, message: str) -> None:
    with pytest.raises(HandlerNotFound, match=message):
        resolve_handler(path)


def test_a_handler_class_is_instantiated_once() -> None:
    handler = resolve_handler("tests.workers.conftest.Recorder")
    assert isinstance(handler, Recorder)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--interval", "2", "--expiry", "2"], r"--expiry \(2s\) must be longer than --interval \(2s\)"),
        (["--strategy", "fastest"], "unknown strategy 'fastest'; choose one of: "),
        (["--handler", "workers.handlers.nope"], "has no attribute 'nope'"),
        (["--count", "0"], "--count must be at least 1"),
    ],
)
def test_runworkers_refuses_bad_options_in_one_line(options: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message) as refused:
        call_command("runworkers", *options, "--store", "memory")
    assert "\n" not in str(refused.value)


def test_an_expiry_the_stores_clock_cannot_judge_is_refused_with_the_next_one_that_works() -> None:
    from balancer.stores.blob.store import BlobStore
    from workers.wiring import check_resolution

    check_resolution(BlobStore, 10.0, "--expiry")  # whole seconds: fine
    check_resolution(object(), 3.5, "--expiry")  # a store with a finer clock says nothing
    with pytest.raises(ValueError, match=r"--expiry \(3\.5s\) must be a whole number of 1s .* try 4$"):
        check_resolution(BlobStore, 3.5, "--expiry")


class _StoreWithAChannel:
    channel = object()  # stands for the store's channel

    def __init__(self) -> None:
        self.asked = 0

    def release_channel(self, ref: object) -> object:
        self.asked += 1
        return self.channel


@pytest.mark.parametrize(
    ("flag", "setting", "across"),
    [
        ([], True, True),
        (["--no-release-notices"], True, False),
        ([], False, False),
        (["--release-notices"], False, True),
    ],
)
def test_release_notices_cross_processes_unless_turned_off_by_option_or_setting(
    flag: list[str], setting: bool, across: bool, settings: Any, tmp_path: Path
) -> None:
    from workers.management.commands.runworkers import Command, fleet_of
    from workers.releases import Notices

    settings.LEASEBOARD_RELEASE_NOTICES = setting
    settings.LEASEBOARD_HUB_DIR = tmp_path
    command = Command()
    options = vars(command.create_parser("manage.py", "runworkers").parse_args(["--store", "memory", *flag]))
    built = fleet_of(options)
    try:
        assert built.notices.across_processes is across
        assert all(p.poll_waiting is not across for p in built.processors)  # else a receiver polls while waiting
        assert built.notices.kind.endswith("(turned off across processes)") is not across
    finally:
        built.source.close()
    store = _StoreWithAChannel()
    off = Notices(store, REF, across_processes=False)
    assert (store.asked, off.across_processes) == (0, False)
    assert off.kind == "in this process only (turned off across processes)"
    assert Notices(store, REF).channel is store.channel
