"""A fleet for the schema fuzz test: two workers balance each of the given hubs on the SQL store.

Run as ``python -m tests.dashboard.seed_fleet HUB...`` with the Django settings of the console
under test (its environment): for each hub, real Coordinators ``w1`` and ``w2`` run cycles until
every partition of the embedded hub is owned, so the store knows the hub (``Host.admit``), the
state has owners and the event log has claims. Their leases are left to expire.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys


async def main(hubs: list[str]) -> None:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    django.setup()
    from django.conf import settings

    from balancer.lease import Coordinator
    from balancer.model import BalancerEvent
    from balancer.strategies import get_strategy
    from dashboard.live.broadcast import apublish
    from workers.wiring import build_source, build_stores, close_stores, hub_ref

    stores = build_stores("sql")
    published: list[asyncio.Task[object]] = []

    def on_event(event: BalancerEvent) -> None:
        published.append(asyncio.get_running_loop().create_task(apublish(event)))

    for hub in hubs:
        source = build_source(None, hub)
        ids = source.partition_ids()

        async def partitions(ids: tuple[str, ...] = tuple(ids)) -> tuple[str, ...]:
            return ids

        coordinators = [
            Coordinator(
                ref=hub_ref(hub),
                owner_id=owner,
                store=stores.ownership,
                partitions=partitions,
                strategy=get_strategy("balanced"),
                expiry=settings.LEASEBOARD_EXPIRY,
                controls=stores.controls,
                on_event=on_event,
                rng=random.Random(1),
            )
            for owner in ("w1", "w2")
        ]
        for _ in range(2 * len(ids)):
            for coordinator in coordinators:
                await coordinator.cycle()
            if sum(len(c.owned) for c in coordinators) == len(ids):
                break
        source.close()
    await asyncio.gather(*published)
    await close_stores(stores)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
