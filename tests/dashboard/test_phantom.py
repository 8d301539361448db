"""A hand-written ownership record over a worker's partition, as the console tells it (issue 36, item 8).

Three real coordinators on the SQL store, their events published as the runtime publishes them; an
operator's ``UPDATE`` gives one partition to a made-up owner with a made-up ETag and a time far in
the future. Its worker loses it to the phantom and takes it back: the event log says so in that
order, the partition's timeline shows the phantom between the two holdings, and the history's last
episode ends balanced, with the phantom holding nothing.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient

from balancer.lease import Coordinator
from balancer.model import BalancerEvent, HubRef
from balancer.strategies import get_strategy
from dashboard.live.broadcast import apublish
from dashboard.models import Ownership
from workers.hub.embedded import EmbeddedHub
from workers.wiring import Stores

from .conftest import PARTITIONS

pytestmark = pytest.mark.django_db(transaction=True)


async def test_a_phantom_over_a_workers_partition_is_told_in_order_and_leaves_the_fleet_balanced(
    stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    pending: list[asyncio.Task[object]] = []

    def on_event(event: BalancerEvent) -> None:
        pending.append(asyncio.get_running_loop().create_task(apublish(event)))

    async def partitions() -> tuple[str, ...]:
        return tuple(str(p) for p in range(PARTITIONS))

    workers = [
        Coordinator(
            ref=ref,
            owner_id=name,
            store=stores.ownership,
            partitions=partitions,
            strategy=get_strategy(None),  # the default: judges expiry by the store's clock
            expiry=30.0,
            controls=stores.controls,
            on_event=on_event,
            rng=random.Random(i),
        )
        for i, name in enumerate(("a", "b"))
    ]

    async def cycles(n: int) -> None:
        for _ in range(n):
            for worker in workers:
                await worker.cycle()
        await asyncio.gather(*pending)
        pending.clear()

    await cycles(4)
    owners = {p: w.owner_id for w in workers for p in w.owned}
    assert sorted(owners) == [str(p) for p in range(PARTITIONS)]
    victim = owners["1"]
    await sync_to_async(
        lambda: Ownership.objects.filter(hub=ref.hub, partition_id="1").update(
            owner_id="phantom", etag="made-up", last_modified=1e12
        )
    )()
    for _ in range(10):
        await cycles(1)
        if {p: w.owner_id for w in workers for p in w.owned} == owners:
            break
    assert {p: w.owner_id for w in workers for p in w.owned} == owners  # taken back: nothing else moved

    client = AsyncClient()
    query = {"hub": ref.hub, "consumer_group": ref.consumer_group}
    shown = (await client.get("/api/partitions/1", query)).json()
    spans = [(s["owner"], s["came"], s["ended"]) for s in shown["timeline"]]
    assert spans[-3:] == [(victim, "claim", "lost"), ("phantom", "lost", "expire"), (victim, "expire", None)], spans
    assert all(s["until"] is None or s["until"] >= s["since"] for s in shown["timeline"])
    history = (await client.get("/api/history", query)).json()
    newest = history["episodes"][0]  # newest first
    assert "phantom" not in newest["counts"] and newest["balanced"] is True, newest
