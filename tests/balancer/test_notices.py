"""Release notices (``balancer.notices``): what a coordinator announces, and the in-process channel."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from balancer.model import HubRef
from balancer.notices import LocalChannel, Released, concerns
from balancer.strategies import Plan
from tests.support.waiting import until

from .cluster import REF, Cluster
from .test_coordinator import scripted


async def test_a_coordinator_announces_each_release_it_won_and_nothing_else() -> None:
    cluster = Cluster(3, expiry=30.0)
    told: list[Released] = []
    # A planned move through the runtime's handoff hook: announced when the release is won.
    a = cluster.add("a", on_released=told.append, on_handoff=lambda pid: None)
    await cluster.cycle(3)  # balanced claims one a cycle
    assert a.owned == {"0", "1", "2"} and told == []
    await a.cycle()  # renewals only
    assert told == []
    a.strategy = scripted(Plan(releases=("0",)))
    await a.cycle()
    assert told == []  # the pump is still winding down: nothing is released yet
    await a.release("0")
    assert told == [Released(REF, ("0",), "a")]
    # A release another worker beat (the record moved under us) is no news: nothing to claim.
    [record] = [r for r in await cluster.store.list_ownership(REF) if r.partition_id == "1"]
    await cluster.store.claim_ownership([replace(record, owner_id="b")])
    await a.release("1")
    assert told == [Released(REF, ("0",), "a")]
    # Shutting down: one notice for everything released at once.
    await a.release_all()
    assert told[-1] == Released(REF, ("2",), "a")


async def test_a_release_in_the_cycle_itself_is_announced_after_it_is_won() -> None:
    cluster = Cluster(2, expiry=30.0)
    told: list[Released] = []
    a = cluster.add("a", on_released=told.append)
    await cluster.cycle(2)
    assert told == []
    a.strategy = scripted(Plan(releases=("1", "0")))
    await a.cycle()
    assert told == [Released(REF, ("0", "1"), "a")]
    assert {r.owner_id for r in await cluster.store.list_ownership(REF)} == {""}


async def test_the_local_channel_tells_every_listener_and_a_notice_concerns_only_the_others() -> None:
    channel = LocalChannel()
    heard: list[list[Released]] = [[], []]

    async def listen(into: list[Released]) -> None:
        async for notice in channel.listen():
            into.append(notice)

    tasks = [asyncio.create_task(listen(into)) for into in heard]
    await until(lambda: len(channel._queues) == 2, "both listeners to subscribe")
    notice = Released(REF, ("3",), "a")
    await channel.publish(notice)
    await until(lambda: heard == [[notice], [notice]], "both listeners to hear the notice")
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await channel.publish(notice)  # nobody listens: dropped, no error
    assert concerns(notice, REF, "b") and not concerns(notice, REF, "a")  # not one's own release
    assert not concerns(notice, HubRef(REF.namespace, "other", REF.consumer_group), "b")
    assert concerns(notice, REF, "b", ("3", "4")) and not concerns(notice, REF, "b", ("4",))


def test_a_notice_travels_as_text_and_anything_else_on_the_channel_reads_as_none() -> None:
    notice = Released(HubRef("ns.example", "hub", "$Default"), ("0", "12"), "host-1-0")
    assert Released.decode(notice.encode()) == notice
    assert Released.decode(notice.encode().encode()) == notice
    for garbage in ("", "not json", "[]", '{"ns": "x"}', '{"ns":1,"hub":2,"cg":3,"p":5,"by":"a"}'):
        assert Released.decode(garbage) is None, garbage
