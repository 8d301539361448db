"""``until`` and ``until_sync``: what they return, when and how they fail."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from tests.support.clock import FakeClock
from tests.support.waiting import until, until_sync


async def test_until_returns_the_first_truthy_value_of_a_sync_or_async_condition() -> None:
    counter = itertools.count()
    assert await until(lambda: next(counter) >= 3 and "done", "three polls") == "done"

    async def answer() -> list[int]:
        return [42]

    assert await until(answer, "an answer") == [42]


def test_a_timeout_names_what_was_awaited_the_last_value_and_the_detail() -> None:
    clock = FakeClock()

    def never() -> int:
        clock.advance(1.0)
        return 0

    with pytest.raises(AssertionError) as failed:
        until_sync(never, "the queue to fill", 3, step=0, detail=lambda: "queue: []", clock=clock)
    assert str(failed.value) == "timed out after 3s waiting for the queue to fill; last seen: 0\nqueue: []"


def test_check_fails_the_wait_at_once_and_ignored_exceptions_mean_not_yet() -> None:
    def died() -> None:
        raise AssertionError("the process died")

    with pytest.raises(AssertionError, match="the process died"):
        until_sync(lambda: False, "anything", 60, check=died)

    def connecting(outcomes: list[object]) -> Callable[[], object]:
        attempts = iter(outcomes)

        def connect() -> object:
            result = next(attempts)
            if isinstance(result, Exception):
                raise result
            return result

        return connect

    refused = ConnectionRefusedError("not yet")
    assert until_sync(connecting([refused, refused, "up"]), "the server", ignoring=(OSError,)) == "up"
    with pytest.raises(ConnectionRefusedError):  # not ignored: raised at once
        until_sync(connecting([refused, "up"]), "the server", 60)
