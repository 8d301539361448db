"""A cycle never waits long on the hub's partition list: past the bound, the last ids, one request in flight."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path

import pytest

from workers.hub.embedded import EmbeddedHub
from workers.sources.partitions import PartitionList


async def test_a_hanging_hub_costs_a_cycle_the_bound_not_the_sdks_retries(caplog: pytest.LogCaptureFixture) -> None:
    answers = iter([("0", "1")])
    release = threading.Event()
    calls = 0

    def fetch() -> tuple[str, ...]:
        nonlocal calls
        calls += 1
        if calls > 1:
            release.wait(10)  # the hub cut off: the request hangs
            return ("0", "1", "2")
        return next(answers)

    partitions = PartitionList(fetch, bound=0.05, name="event hub h", warn_after=0.1)
    assert await partitions() == ("0", "1")
    with caplog.at_level(logging.WARNING):
        for _ in range(4):  # cycles while the request hangs: each gets the last ids, in the bound
            assert await asyncio.wait_for(partitions(), 1.0) == ("0", "1")
    assert calls == 2  # one request in flight, not one per cycle
    assert len([r for r in caplog.records if "has not listed its partitions for" in r.message]) == 1
    release.set()
    found = await asyncio.wait_for(partitions(), 5.0)
    assert found in (("0", "1"), ("0", "1", "2"))
    for _ in range(50):
        if await partitions() == ("0", "1", "2"):
            break
    assert partitions.known == ("0", "1", "2")


async def test_the_first_list_is_waited_for() -> None:
    partitions = PartitionList(lambda: ("0",), bound=0.0)
    assert await partitions() == ("0",)


async def test_a_source_that_lists_its_partitions_locally_is_asked_in_the_cycle_without_a_thread(
    tmp_path: Path,
) -> None:
    hub = EmbeddedHub(tmp_path, "h", partitions=2)
    asked: list[int] = []

    def fetch() -> tuple[str, ...]:
        asked.append(threading.get_ident())
        return hub.partition_ids()

    partitions = PartitionList(fetch, bound=0.05, local=getattr(hub, "lists_partitions_locally", False))
    assert await partitions() == ("0", "1")
    hub.add_partitions(3)
    assert await partitions() == ("0", "1", "2")  # asked every cycle still: added partitions show at once
    assert asked == [threading.get_ident()] * 2
    hub.close()
