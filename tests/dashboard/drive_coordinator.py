"""A worker process for the browser test: a real Coordinator on the SQL store, driven over stdin.

Run as ``python -m tests.dashboard.drive_coordinator OWNER_ID`` with the Django settings of the
server under test. Each line on stdin is a command; each answer is one JSON line on stdout:
``cycle`` (one balancing cycle; answers the partitions owned), ``release`` (release all), ``quit``.
Balancer events go through ``dashboard.live.broadcast.apublish`` exactly as the runtime sends them;
with the in-memory channel layer the server sees them only by polling the event log, which is
the cross-process path under test.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys


async def main(owner_id: str) -> None:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    django.setup()
    from django.conf import settings

    from balancer.lease import Coordinator
    from balancer.model import BalancerEvent
    from balancer.strategies import get_strategy
    from dashboard.live.broadcast import apublish
    from workers.wiring import build_source, build_stores, hub_ref

    stores = build_stores("sql")
    source = build_source()
    pending: list[asyncio.Task[object]] = []

    async def partitions() -> tuple[str, ...]:
        return source.partition_ids()

    def on_event(event: BalancerEvent) -> None:
        pending.append(asyncio.get_running_loop().create_task(apublish(event)))

    coordinator = Coordinator(
        ref=hub_ref(),
        owner_id=owner_id,
        store=stores.ownership,
        partitions=partitions,
        strategy=get_strategy("balanced"),
        expiry=settings.LEASEBOARD_EXPIRY,
        controls=stores.controls,
        on_event=on_event,
        rng=random.Random(1),
    )
    loop = asyncio.get_running_loop()
    while True:
        line = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
        if line in ("", "quit"):
            break
        if line == "cycle":
            await coordinator.cycle()
        elif line == "release":
            await coordinator.release_all()
        await asyncio.gather(*pending)
        pending.clear()
        print(json.dumps({"owned": sorted(coordinator.owned)}), flush=True)
    await stores.ownership.aclose()  # type: ignore[attr-defined]
    source.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
