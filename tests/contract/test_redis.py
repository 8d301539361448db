"""The store contract on ``balancer.stores.redis.store.RedisStore`` against a real ``redis-server`` (flushed
before each test), plus what only the Redis store has: one slot per scope, scripts that touch only
their scope's keys (an ACL user allowed nothing else runs them), the server's clock, unreadable
records, outages and refused credentials."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, aclosing
from typing import Any, cast

import pytest
from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.crc import key_slot

from balancer.errors import StoreError, StoreUnavailable
from balancer.model import Checkpoint, Control, ControlKind, HubRef, Member, OwnershipRecord
from balancer.notices import Released
from balancer.stores.redis import notices as redis_notices
from balancer.stores.redis.connection import POOL
from balancer.stores.redis.layout import Keys, scope
from balancer.stores.redis.notices import QUIET
from balancer.stores.redis.store import RedisStore
from tests.support.notices import listening
from tests.support.redis_server import RedisServer, start_redis
from tests.support.servers import free_port
from tests.support.waiting import until

from .base import (
    DAMAGES,
    FUTURE,
    GARBAGE_ETAG,
    GHOST,
    NEIGHBOURS,
    REF,
    StoreContract,
    heard_after_publishing,
)
from .changes import ChangeFeedContract


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    server = start_redis()
    yield server
    server.stop()


async def pings_seen(pings: Any, at_least: int) -> bool:
    return bool(await pings() >= at_least)


async def flush(url: str) -> None:
    async with Redis.from_url(url) as raw:
        await raw.flushall()


class TestRedisStore(ChangeFeedContract, StoreContract):
    members_since = True
    notices = True
    refuses_going_back = True

    async def delete_by_hand(self, store: RedisStore, partition_id: str) -> None:
        async with Redis.from_url(store.url) as raw:  # redis-cli HDEL
            assert await raw.hdel(Keys.of(REF).ownership, partition_id) == 1

    async def start_over(self, store: RedisStore) -> RedisStore:
        await flush(store.url)  # FLUSHALL, or a restart without persistence
        return store

    async def test_a_release_listener_whose_connection_the_server_kills_subscribes_again(
        self, store: RedisStore, redis_server: RedisServer
    ) -> None:
        channel = store.release_channel(REF)
        heard: list[Released] = []
        listener = listening(channel, heard)
        try:
            await heard_after_publishing(channel, Released(REF, ("1",), "a"), heard, "the first notice")
            async with Redis.from_url(redis_server.url) as raw:
                assert await raw.client_kill_filter(_type="pubsub") >= 1
            await heard_after_publishing(channel, Released(REF, ("2",), "a"), heard, "a notice after the kill")
        finally:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)

    async def test_a_quiet_release_listener_wakes_only_to_ping_the_server(
        self, store: RedisStore, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # Every worker process holds one listener: on a quiet channel it waits for a message until its
        # ping is due (QUIET seconds), not a second at a time, and a pong (which the subscription
        # hides) does not count as a message that resets nothing.
        asked: list[float | None] = []
        get_message = PubSub.get_message

        async def counted(pubsub: PubSub, ignore_subscribe_messages: bool = False, timeout: float | None = 0.0) -> Any:
            asked.append(timeout)
            return await get_message(pubsub, ignore_subscribe_messages, timeout)

        monkeypatch.setattr(PubSub, "get_message", counted)
        channel = store.release_channel(REF)
        heard: list[Released] = []
        listener = listening(channel, heard)
        try:
            await until(lambda: asked, "the listener to wait for a message")
            assert asked[0] is not None and asked[0] > QUIET - 1  # one wait until the ping is due
            monkeypatch.setattr(redis_notices, "QUIET", 0.1)
            # A message sets the next ping QUIET after it: the new QUIET from now on.
            await heard_after_publishing(channel, Released(REF, ("1",), "a"), heard, "a notice")
            async with Redis.from_url(redis_server.url, decode_responses=True) as raw:
                await raw.config_resetstat()
                before, started = len(asked), time.monotonic()

                async def pings() -> int:
                    stats = await raw.info("commandstats")
                    return int(stats.get("cmdstat_ping", {}).get("calls", 0))

                await until(lambda: pings_seen(pings, 3), "three pings on a quiet channel")
                calls, pinged = len(asked) - before, await pings()
                elapsed = time.monotonic() - started
            # A ping per QUIET, each after the wait that ran out and before the pong's empty answer:
            # no spinning on the pongs (a ping each), nor on the waits.
            assert pinged <= elapsed / 0.1 + 2, (pinged, elapsed)
            assert calls <= 2 * pinged + 4, (calls, pinged)
            await heard_after_publishing(channel, Released(REF, ("2",), "a"), heard, "a notice between the pings")
        finally:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)

    @pytest.fixture
    async def store(self, redis_server: RedisServer) -> AsyncIterator[RedisStore]:
        await flush(redis_server.url)
        async with RedisStore(redis_server.url) as store:
            yield store

    def connect(self, store: RedisStore) -> AbstractAsyncContextManager[RedisStore]:
        return aclosing(RedisStore(store.url))  # its own connections, in the thread's own loop

    damages = DAMAGES  # every one: redis-cli HSET can write any text in place of the stored JSON

    async def corrupt(self, store: RedisStore, kind: str, key: str, edit: str) -> None:
        """What ``redis-cli HSET`` could leave: the stored JSON with one field changed."""
        keys = Keys.of(REF)
        hash_key = {"ownership": keys.ownership, "checkpoint": keys.checkpoints, "member": keys.members}[kind]
        async with Redis.from_url(store.url, decode_responses=True) as raw:
            stored = await raw.hget(hash_key, key)
            value = json.loads(stored) if stored else {}
            text = None
            if edit.startswith("time:") or (edit == "time" and kind != "member"):
                stamp = edit.removeprefix("time:")
                if stamp == "missing":
                    del value["modified"]
                else:
                    value["modified"] = "garbage" if stamp == "time" else stamp  # "nan", "inf", "-inf", "garbage"
            elif kind == "member":
                value.update({"seen": "nan"} if edit == "time" else {"info": [1, 2]})
            elif edit == "sequence":
                value["sequence"] = "ten"
            elif edit == "etag:garbage":
                value["etag"] = GARBAGE_ETAG
            elif edit == "etag:missing":
                del value["etag"]
            elif edit == "ghost":
                value.update(owner=GHOST, etag=GARBAGE_ETAG, modified="NaN")
            elif edit == "future":
                value["modified"] = f"{FUTURE:.6f}"
            elif edit == "unreadable":
                text = '{"owner": "a", "etag": "e", "modified": nan'  # cut off mid-write
            elif edit == "partition":
                text = '{"owner": "x", "etag": "e", "modified": "1.0", "level": 0}'
            await raw.hset(hash_key, key, text if text is not None else json.dumps(value))

    # only the Redis store ------------------------------------------------------------------

    async def test_every_listing_and_every_claim_is_one_round_trip(self, store: RedisStore) -> None:
        before = store.requests
        won = await store.claim_ownership([OwnershipRecord(REF, str(p), "w1") for p in range(40)])
        assert len(won) == 40 and store.requests - before == 1
        renewed = await store.claim_ownership(won)
        assert [r.partition_id for r in renewed] == [str(p) for p in range(40)]
        for listing in (store.list_ownership, store.list_checkpoints, store.list_members, store.list_controls):
            before = store.requests
            await listing(REF)
            assert store.requests - before == 1

    async def test_every_key_of_a_scope_hashes_to_one_cluster_slot_and_braces_cannot_split_it(
        self, store: RedisStore, redis_server: RedisServer
    ) -> None:
        tricky = HubRef("ns}{x", "hub{a}", "$Default")
        for ref in (REF, tricky):
            keys = Keys.of(ref)
            fields = (
                keys.ownership,
                keys.checkpoints,
                keys.members,
                keys.controls,
                keys.etags,
                keys.changes,
                keys.epoch,
                keys.owner_changes,
                keys.modified,
            )
            assert len({key_slot(k.encode()) for k in fields}) == 1
            assert scope(ref).count("{") == 1 and scope(ref).count("}") == 1
        await store.claim_ownership([OwnershipRecord(tricky, "0", "a")])
        await store.update_checkpoint(Checkpoint(tricky, "0", 3), "a")
        async with Redis.from_url(redis_server.url, decode_responses=True) as raw:
            written = sorted(cast(list[str], await raw.keys("*")))  # decode_responses: str, not bytes
        keys = Keys.of(tricky)
        assert written == sorted(
            [keys.ownership, keys.etags, keys.changes, keys.epoch, keys.checkpoints, keys.owner_changes, keys.modified]
        )
        assert all(k.startswith(scope(tricky) + ":") for k in written)

    async def test_a_hub_written_before_owner_changes_were_kept_reads_every_write_until_a_full_read(
        self, store: RedisStore, redis_server: RedisServer
    ) -> None:
        # Records claimed by an older version have no place in ``owner_changes`` and ``modified``: a
        # reader that leaves renewals out gets them all (nothing may be missed), until a full read
        # fills both sets from the records; from then on renewals are left out.
        won = await store.claim_ownership([OwnershipRecord(REF, p, "a") for p in "0123"])
        first = await store.snapshot_since(REF, None, 3600.0)
        keys = Keys.of(REF)
        async with Redis.from_url(redis_server.url) as raw:
            await raw.delete(keys.owner_changes, keys.modified)
        [renewed] = await store.claim_ownership([won[0]])
        delta = await store.snapshot_since(REF, first.cursor, 3600.0)
        assert not delta.full and delta.fresh_after is None and delta.ownership == [renewed]
        whole = await store.snapshot_since(REF, None, 3600.0)
        assert whole.full and len(whole.ownership) == 4
        await store.claim_ownership([renewed, *won[1:]])
        quiet = await store.snapshot_since(REF, whole.cursor, 3600.0)
        assert not quiet.full and quiet.fresh_after is not None and quiet.ownership == []
        aged = await store.snapshot_since(REF, quiet.cursor, -60.0)  # every record written before the bound
        assert [r.partition_id for r in aged.ownership] == ["0", "1", "2", "3"]

    async def test_a_hand_edit_reaches_a_reader_that_leaves_renewals_out_once_no_script_wrote_it_lately(
        self, store: RedisStore, redis_server: RedisServer
    ) -> None:
        # Why such a feed counts as seeing every write (``sees_every_write``, a rare safety-net read):
        # the record's time in ``modified`` is the last script's, so the edited record is listed as
        # stored once that time is older than ``stale_after``.
        await store.claim_ownership([OwnershipRecord(REF, p, "a") for p in "012"])
        first = await store.snapshot_since(REF, None, 3600.0)
        edited = json.dumps({"owner": "ghost", "etag": "by-hand", "modified": "1.0", "level": 0})
        async with Redis.from_url(redis_server.url) as raw:
            await raw.hset(Keys.of(REF).ownership, "1", edited)
        recent = await store.snapshot_since(REF, first.cursor, 3600.0)
        assert recent.ownership == [] and recent.sees_every_write
        aged = await store.snapshot_since(REF, recent.cursor, -60.0)
        assert [(r.partition_id, r.owner_id, r.etag) for r in aged.ownership if r.partition_id == "1"] == [
            ("1", "ghost", "by-hand")
        ]

    async def test_small_hashes_unchanged_are_not_parsed_again_and_a_change_shows(self, store: RedisStore) -> None:
        await store.heartbeat(Member(REF, "a", 0.0, {"strategy": "cooperative"}))
        await store.put_control(Control(REF, ControlKind.DRAIN, "a"))
        first = await store.snapshot_since(REF, None, 3600.0)
        again = await store.snapshot_since(REF, first.cursor, 3600.0)
        assert again.members == first.members and again.members is not first.members
        assert again.members[0] is first.members[0]  # its field came back as it was: not parsed again
        assert again.controls[0] is first.controls[0]
        listed = await store.list_members(REF)  # for callers outside the store: a copy they may change
        assert listed == first.members and listed[0].info is not first.members[0].info
        # A change the records' equality does not see (Member.info does not count in it) still shows.
        async with Redis.from_url(store.url) as raw:
            member = await raw.hget(Keys.of(REF).members, "a")
            assert member is not None
            stored = json.loads(member)
            await raw.hset(Keys.of(REF).members, "a", json.dumps({**stored, "info": {"strategy": "eph"}}))
        [edited] = (await store.snapshot_since(REF, again.cursor, 3600.0)).members
        assert edited.info == {"strategy": "eph"}
        await store.delete_control(REF, ControlKind.DRAIN, "a")
        assert await store.list_controls(REF) == []

    async def test_the_scripts_touch_only_keys_of_their_scope(
        self, store: RedisStore, redis_server: RedisServer
    ) -> None:
        # An ACL user may touch REF's keys and nothing else; Redis checks every key a script
        # touches against it. The whole protocol works for REF; a neighbour is refused.
        async with Redis.from_url(redis_server.url) as admin:
            await admin.acl_setuser(
                "scoped",
                enabled=True,
                passwords=["+scoped-pw"],
                commands=["+@all"],
                keys=[f"{scope(REF)}:*"],
                reset_keys=True,
            )
        url = f"redis://scoped:scoped-pw@127.0.0.1:{redis_server.port}/0"
        async with RedisStore(url) as scoped:
            [held] = await scoped.claim_ownership([OwnershipRecord(REF, "0", "a")])
            assert (await scoped.claim_ownership([held]))[0].owner_id == "a"
            await scoped.update_checkpoint(Checkpoint(REF, "0", 5, "500"), "a")
            await scoped.heartbeat(Member(REF, "a", 0.0, {"pid": "1"}))
            await scoped.put_control(Control(REF, ControlKind.PIN, "0", "a"))
            await scoped.delete_control(REF, "pin", "0")
            await scoped.remove_member(REF, "a")
            assert [c.sequence_number for c in await scoped.list_checkpoints(REF)] == [5]
            assert await scoped.list_members(REF) == [] and await scoped.list_controls(REF) == []
            for other in NEIGHBOURS:
                with pytest.raises(StoreError, match=r"(?i)no permissions"):
                    await scoped.claim_ownership([OwnershipRecord(other, "0", "a")])
                with pytest.raises(StoreError, match=r"(?i)no permissions"):
                    await scoped.list_ownership(other)
        assert {r.partition_id for r in await store.list_ownership(REF)} == {"0"}
        for other in NEIGHBOURS:
            assert await store.list_ownership(other) == []

    async def test_times_are_the_servers_to_the_microsecond_and_never_go_back(self, store: RedisStore) -> None:
        async with Redis.from_url(store.url) as raw:
            seconds, micros = await raw.time()
        server = seconds + micros / 1e6
        now = await store.now()
        assert server <= now < server + 5
        written = []
        for i in range(20):
            [record] = await store.claim_ownership([OwnershipRecord(REF, str(i), "a")])
            assert record.last_modified is not None
            written.append(record.last_modified)
        assert written == sorted(written) and len(set(written)) > 1  # microseconds, not rounded away
        assert now <= written[0] and written[-1] <= await store.now()

    async def test_an_unreadable_record_is_logged_once_and_skipped_and_a_first_claim_may_replace_it(
        self, store: RedisStore, caplog: pytest.LogCaptureFixture
    ) -> None:
        await store.claim_ownership([OwnershipRecord(REF, "0", "a")])
        await store.update_checkpoint(Checkpoint(REF, "0", 3), "a")
        keys = Keys.of(REF)
        async with Redis.from_url(store.url) as raw:  # what a hand edit in redis-cli could leave
            await raw.hset(keys.ownership, mapping={"1": "{not json", "abc": '{"owner":"x","etag":"e","modified":"1"}'})
            await raw.hset(keys.checkpoints, "1", '{"sequence": "-5", "modified": "1.0"}')
            await raw.hset(keys.members, "m", '{"seen": "1.0", "info": [1, 2]}')
            await raw.hset(keys.controls, "explode/1", '{"value": "", "created": "1.0"}')
        with caplog.at_level(logging.WARNING, logger="balancer.stores.redis"):
            for _ in range(2):
                assert [r.partition_id for r in await store.list_ownership(REF)] == ["0"]
                assert [c.partition_id for c in await store.list_checkpoints(REF)] == ["0"]
                assert await store.list_members(REF) == [] and await store.list_controls(REF) == []
        warnings = [r.getMessage() for r in caplog.records if r.name == "balancer.stores.redis"]
        assert len(warnings) == 5 and len(store.corrupt) == 5  # logged once, though listed twice
        assert any("'1'" in w and "not JSON" in w for w in warnings), warnings
        assert any("unknown control kind 'explode'" in w for w in warnings), warnings
        # partition 1 looks never owned to a worker: its first claim replaces the unreadable record
        [won] = await store.claim_ownership([OwnershipRecord(REF, "1", "b")])
        assert won.owner_id == "b" and len(store.corrupt) == 5
        assert sorted(r.partition_id for r in await store.list_ownership(REF)) == ["0", "1"]
        assert len(store.corrupt) == 4

    async def test_a_value_only_lua_can_read_or_that_is_not_utf8_never_blocks_its_partition(
        self, store: RedisStore, caplog: pytest.LogCaptureFixture
    ) -> None:
        # Lua's JSON reader takes a bare nan that Python's refuses, and bytes need not be UTF-8: the
        # listing skips both, and the first claim of each (carrying the made-up ETag of the value
        # skipped) replaces it, as the script compares the very value.
        keys = Keys.of(REF)
        async with Redis.from_url(store.url) as raw:
            await raw.hset(
                keys.ownership,
                mapping={
                    "0": b'{"owner": "a", "etag": "e", "modified": nan}',
                    "1": b'{"owner": "\xff", "etag": "e"}\xfe',
                },
            )
        with caplog.at_level(logging.WARNING, logger="balancer.stores.redis"):
            assert await store.list_ownership(REF) == []
        assert len(caplog.records) == 2
        assert await store.claim_ownership([OwnershipRecord(REF, p, "b", etag="made-up") for p in "01"]) == []
        won = await store.claim_ownership([OwnershipRecord(REF, p, "b") for p in "01"])
        assert [(r.partition_id, r.owner_id) for r in won] == [("0", "b"), ("1", "b")]
        assert await store.list_ownership(REF) == won and store.corrupt == []

    def test_one_store_serves_one_event_loop_after_another(self, redis_server: RedisServer) -> None:
        asyncio.run(flush(redis_server.url))
        store = RedisStore(redis_server.url)

        async def first() -> list[OwnershipRecord]:
            async with store:
                return await store.claim_ownership([OwnershipRecord(REF, "0", "w1")])

        async def second() -> list[OwnershipRecord]:
            async with store:
                return await store.list_ownership(REF)

        [held] = asyncio.run(first())
        assert asyncio.run(second()) == [held]


# outages and credentials: servers of their own -------------------------------------------------


async def test_a_redis_that_is_down_is_store_unavailable_naming_it_but_never_its_password() -> None:
    port = free_port()
    async with RedisStore(f"redis://:s3cr3t-pw@127.0.0.1:{port}/2") as store:
        for call in (store.now(), store.list_ownership(REF), store.claim_ownership([OwnershipRecord(REF, "0", "a")])):
            with pytest.raises(StoreUnavailable) as down:
                await call
            message = str(down.value)
            assert f"cannot reach Redis at 127.0.0.1:{port}/2" in message
            assert "s3cr3t-pw" not in message and "s3cr3t-pw" not in repr(down.value.__cause__)
    assert store.requests == 3


async def test_a_restarted_redis_fails_at_most_one_call_and_the_same_store_goes_on() -> None:
    server = start_redis()
    try:
        async with RedisStore(server.url) as store:
            [held] = await store.claim_ownership([OwnershipRecord(REF, "0", "a")])
            server.restart()  # no persistence: every key is gone, pooled connections are dead
            assert await store.list_ownership(REF) == []  # the retry took a fresh connection
            assert await store.claim_ownership([held]) == []  # its ETag died with the old server
            [again] = await store.claim_ownership([OwnershipRecord(REF, "0", "a")])
            assert again.etag != held.etag
            server.shutdown()
            with pytest.raises(StoreUnavailable):
                await store.claim_ownership([again])
            server.start()
            assert await store.list_ownership(REF) == []
    finally:
        server.stop()


async def test_refused_credentials_are_a_store_error_that_does_not_print_them() -> None:
    server = start_redis(password="right-pw")
    try:
        async with RedisStore(f"redis://:wrong-pw@127.0.0.1:{server.port}/0") as store:
            with pytest.raises(StoreError) as refused:
                await store.list_ownership(REF)
        assert not isinstance(refused.value, StoreUnavailable)
        assert "refused the credentials" in str(refused.value) and "wrong-pw" not in str(refused.value)
        async with RedisStore(server.url) as store:
            assert await store.list_ownership(REF) == []
    finally:
        server.stop()


def test_a_url_that_is_not_redis_is_refused_at_once() -> None:
    with pytest.raises(StoreError, match="must be a redis://"):
        RedisStore("http://127.0.0.1:6379")
    with pytest.raises(StoreError, match="no Redis URL"):
        RedisStore("")


async def test_a_server_that_never_answers_is_unavailable_within_the_timeout_every_time() -> None:
    # Each round trip is bounded by the store (its client has no read timeout of its own): a server
    # that accepts and reads but never answers (a stopped process, a black hole) is a StoreUnavailable.
    received: list[bytes] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(4096):
                received.append(data)
        finally:
            writer.close()  # at the client's close: else (Python 3.12 on) wait_closed() waits for it forever

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with RedisStore(f"redis://127.0.0.1:{port}/0", timeout=0.3) as store:
            for _ in range(2):  # the first on a fresh connection, the second after it was dropped
                started = time.monotonic()
                with pytest.raises(StoreUnavailable, match=r"no answer within 0\.3s"):
                    await asyncio.wait_for(store.now(), 10)  # a hang fails the test, not the run
                assert time.monotonic() - started < 5
        assert received  # it did reach the server
    finally:
        server.close()
        await asyncio.wait_for(server.wait_closed(), 10)


async def test_more_calls_at_once_than_the_pool_has_connections_wait_for_one_and_all_answer(
    redis_server: RedisServer,
) -> None:
    """16 workers of one process start 256 pumps, each listing checkpoints at once: redis-py's pool
    (100) said "Too many connections" to the rest; they now wait for a connection, within the timeout."""
    await flush(redis_server.url)
    async with RedisStore(redis_server.url) as store:
        listed = await asyncio.gather(*(store.list_checkpoints(REF) for _ in range(3 * POOL)))
        assert listed == [[]] * (3 * POOL)
