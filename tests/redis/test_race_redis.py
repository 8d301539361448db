"""The race's Redis backend against a real redis-server: what ``RaceBackend`` promises, only the
scope's keys and channels touched (an ACL user allowed nothing else runs it), a broken
subscription reported, and two coordinators in this process racing over real pub/sub."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from balancer.errors import StoreError, StoreUnavailable
from balancer.model import HubRef, partition_ids
from balancer.race.backend import Channel
from balancer.race.coordinator import RaceCoordinator
from balancer.race.redis import RedisRaceBackend
from balancer.race.times import RaceTimes
from balancer.stores.memory import MemoryStore
from balancer.stores.redis.layout import scope
from balancer.stores.redis.store import RedisStore
from tests.support.redis_server import RedisServer
from tests.support.waiting import until

REF = HubRef("race.example", "sensors", "$Default")
NEIGHBOUR = HubRef("race.example", "sensors", "analytics")


@pytest.fixture
async def store(redis_server: RedisServer) -> AsyncIterator[RedisStore]:
    async with RedisStore(redis_server.url) as store:
        yield store


async def test_hsetnx_answers_who_holds_the_field_and_a_guarded_delete_removes_only_its_value(
    store: RedisStore,
) -> None:
    a, b = RedisRaceBackend(store, REF), RedisRaceBackend(store, REF)
    assert await a.hsetnx("grab", "0", "a") == "a"
    assert await b.hsetnx("grab", "0", "b") == "a"  # first setter wins, and b learns who it was
    assert await b.hdel("grab", "0", expect="b") is False
    assert await a.hget("grab", "0") == "a"
    assert await a.hdel("grab", "0", expect="a") is True and await a.hget("grab", "0") is None
    await a.hset("allocation", "1", "a")
    await a.hset("grab", "2", "b")
    before = a.requests
    assert await a.hgetall(("allocation", "grab")) == {"allocation": {"1": "a"}, "grab": {"2": "b"}}
    assert a.requests == before + 1  # both hashes in one round trip
    assert await a.hdel("allocation", "1") is True
    assert store.requests == 0  # the race's round trips are counted by the race backend


async def test_a_race_is_won_only_in_the_generation_it_began_in(redis_server: RedisServer, store: RedisStore) -> None:
    a, b = RedisRaceBackend(store, REF), RedisRaceBackend(store, REF)
    generation = await a.generation()
    assert await b.generation() == generation  # the first subscriber's token stays
    assert await a.grab("0", "a", generation) == "a"
    assert await b.grab("0", "b", generation) == "a"  # as hsetnx: who holds it
    async with Redis.from_url(redis_server.url) as admin:
        await admin.flushall()  # what a restart without persistence leaves
    assert await b.grab("0", "b", generation) is None  # a racer that has not noticed: refused
    assert await a.hgetall(("grab",)) == {"grab": {}}  # and nothing written
    renewed = await b.generation()
    assert renewed != generation and await b.grab("0", "b", renewed) == "b"


async def test_a_notification_reaches_every_subscriber_and_a_lost_server_breaks_the_subscription(
    redis_server: RedisServer, store: RedisStore
) -> None:
    heard: dict[str, list[tuple[Channel, str]]] = {"a": [], "b": []}
    ready: set[str] = set()

    def listen(name: str) -> asyncio.Task[None]:
        backend = RedisRaceBackend(store, REF)
        return asyncio.create_task(backend.listen(lambda c, p: heard[name].append((c, p)), lambda g: ready.add(name)))

    tasks = {name: listen(name) for name in heard}
    deadline = time.monotonic() + 10
    while ready != {"a", "b"}:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    publisher = RedisRaceBackend(store, REF)
    await publisher.publish("grab", "3")
    await publisher.publish("allocated", "3")
    await RedisRaceBackend(store, NEIGHBOUR).publish("grab", "9")  # another consumer group's race
    while any(len(h) < 2 for h in heard.values()):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    assert heard == {n: [("grab", "3"), ("allocated", "3")] for n in heard}
    redis_server.shutdown()
    for task in tasks.values():
        with pytest.raises(StoreUnavailable, match=f"cannot reach Redis at 127.0.0.1:{redis_server.port}"):
            await asyncio.wait_for(task, 10)


async def test_the_race_touches_only_its_scopes_keys_and_channels(redis_server: RedisServer) -> None:
    async with Redis.from_url(redis_server.url) as admin:
        await admin.acl_setuser(
            "racer",
            enabled=True,
            passwords=["+racer-pw"],
            commands=["+@all"],
            keys=[f"{scope(REF)}:*"],
            channels=[f"{scope(REF)}:*"],
            reset_keys=True,
            reset_channels=True,
        )
    url = f"redis://racer:racer-pw@127.0.0.1:{redis_server.port}/0"
    async with RedisStore(url) as scoped:
        race = RedisRaceBackend(scoped, REF)
        assert await race.hsetnx("grab", "0", "a") == "a"
        await race.hset("allocation", "0", "a")
        assert (await race.hgetall(("allocation", "grab")))["allocation"] == {"0": "a"}
        assert await race.hdel("grab", "0", expect="a") and await race.hdel("allocation", "0")
        await race.publish("grab", "0")
        assert await race.grab("1", "a", await race.generation()) == "a"
        listening = asyncio.create_task(race.listen(lambda c, p: None, lambda g: None))
        async with Redis.from_url(redis_server.url) as admin:  # the server says it subscribed: allowed

            async def subscribed() -> bool:
                return [n for _, n in await admin.pubsub_numsub(*race.channels.values())] == [1, 1]

            def still_listening() -> None:
                assert not listening.done(), listening

            await until(subscribed, "the server to report both subscriptions", 10, check=still_listening)
        assert not listening.done()
        listening.cancel()
        other = RedisRaceBackend(scoped, NEIGHBOUR)
        for call in (other.hsetnx("grab", "0", "a"), other.publish("grab", "0"), other.hgetall(("grab",))):
            with pytest.raises(StoreError, match=r"(?i)no permissions"):
                await call


async def test_two_coordinators_share_the_partitions_over_real_pub_sub(store: RedisStore) -> None:
    times = RaceTimes(
        normal_lease=2.0, maximum_lease=4.0, maximum_shutdown=1.0, minimum_lease_grab=1.2, leases_held_delay=0.1
    )
    ownership = MemoryStore()

    async def pids() -> tuple[str, ...]:
        return partition_ids(4)

    nodes = [RaceCoordinator(REF, name, ownership, RedisRaceBackend(store, REF), pids, times) for name in ("a", "b")]

    stopping = asyncio.Event()

    async def cycles(node: RaceCoordinator) -> None:
        # Stopped between cycles, never inside one: a cycle cancelled after its HSET reached Redis and
        # before its answer came back leaves an allocation its node does not know it made (seen under
        # load), which release_all cannot take back; in a fleet its lease would lapse.
        while not stopping.is_set():
            await node.cycle()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), 0.2)

    running = [asyncio.create_task(cycles(n)) for n in nodes]
    try:

        def shared() -> bool:
            return sorted(len(n.owned) for n in nodes) == [2, 2] and not nodes[0].owned & nodes[1].owned

        def cycling() -> None:
            assert not any(t.done() for t in running), running

        await until(
            shared,
            "a and b to own two partitions each",
            3 * times.normal_lease,
            step=0.05,
            check=cycling,
            detail=lambda: f"owned {[n.owned for n in nodes]}",
        )
        allocation = (await nodes[0].backend.hgetall(("allocation",)))["allocation"]
        assert allocation == {p: n.owner_id for n in nodes for p in n.owned}
    finally:
        stopping.set()
        await asyncio.gather(*running, return_exceptions=True)
        for node in nodes:
            await node.release_all()
    assert (await nodes[0].backend.hgetall(("allocation", "grab"))) == {"allocation": {}, "grab": {}}
