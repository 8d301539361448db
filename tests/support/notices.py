"""Listening to a release channel (``balancer.notices``) in a test."""

from __future__ import annotations

import asyncio
from typing import Any

from balancer.notices import Released


def listening(channel: Any, heard: list[Released]) -> asyncio.Task[None]:
    """A task appending to ``heard`` every notice ``channel`` delivers, until it is cancelled."""

    async def listen() -> None:
        async for notice in channel.listen():
            heard.append(notice)

    return asyncio.create_task(listen())
