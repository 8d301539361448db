"""``within``: an await past its deadline fails naming what it waited for and where things were."""

from __future__ import annotations

import asyncio

import pytest

from tests.netsplit.deadlines import within


async def test_an_await_within_its_deadline_returns_its_result() -> None:
    async def answer() -> int:
        return 42

    assert await within(1.0, "an answer", answer()) == 42


async def test_an_await_past_its_deadline_names_what_it_waited_for_and_where_it_was() -> None:
    never = asyncio.Event()

    async def stuck_on_an_event() -> None:
        await never.wait()

    with pytest.raises(AssertionError) as failure:
        await within(0.05, "an event nobody sets", stuck_on_an_event())
    message = str(failure.value)
    assert message.startswith("netsplit: gave up after 0.05s waiting for an event nobody sets; where everything was:")
    assert "stuck_on_an_event" in message and "--- thread MainThread" in message
