"""``/api/state`` and ``/api/events`` against the SQL store and a real embedded hub."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.db.models import F
from django.test import AsyncClient

from balancer.model import Checkpoint, Control, ControlKind, HubRef, OwnershipRecord
from dashboard.live.broadcast import apublish
from dashboard.models import LagSample, Ownership
from workers.hub.embedded import EmbeddedHub
from workers.wiring import Stores

from .conftest import PARTITIONS, coordinator, event

pytestmark = pytest.mark.django_db(transaction=True)

TOP_KEYS = {"namespace", "hub", "consumer_group", "generated_at", "partitions", "workers"}
PARTITION_KEYS = {
    "id",
    "owner",
    "last_modified",
    "sequence_number",
    "last_enqueued_sequence_number",
    "lag",
    "pinned_to",
    "status",
}
# Added to DESIGN.md's keys by the console: when the newest event and the checkpoint were written, lag in
# seconds, the lag status and the checkpointed rate.
CONSOLE_KEYS = {"last_enqueued_time", "checkpoint_modified", "lag_seconds", "lag_status", "events_per_second"}
WORKER_KEYS = {"id", "owned", "draining", "last_seen", "alive"}
CONSOLE_WORKER_KEYS = {"events_per_second", "purgeable", "avoiding"}


async def get_state(client: AsyncClient, **query: str) -> dict[str, Any]:
    response = await client.get("/api/state", query)
    assert response.status_code == 200, response.content
    data: dict[str, Any] = response.json()
    return data


def by_id(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {item["id"]: item for item in items}


async def test_state_has_the_keys_of_design_md(
    async_client: AsyncClient, stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    await coordinator(stores, ref, "w1").cycle()

    state = await get_state(async_client)

    assert set(state) >= TOP_KEYS and "last_event_id" in state
    assert (state["namespace"], state["hub"], state["consumer_group"]) == (ref.namespace, ref.hub, ref.consumer_group)
    assert [p["id"] for p in state["partitions"]] == [str(i) for i in range(PARTITIONS)]
    for partition in state["partitions"]:
        assert set(partition) == PARTITION_KEYS | CONSOLE_KEYS
    assert [set(w) for w in state["workers"]] == [WORKER_KEYS | CONSOLE_WORKER_KEYS]
    assert isinstance(state["generated_at"], float)


async def test_an_owned_partition_shows_its_owner_checkpoint_and_lag(
    async_client: AsyncClient, stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    worker = coordinator(stores, ref, "w1", partitions=1)
    await worker.cycle()
    hub.send_batch([b"{}"] * 10, partition_id="0")  # sequence numbers 0..9
    await stores.checkpoints.update_checkpoint(Checkpoint(ref, "0", 6, "0"), "w1")

    p0 = by_id((await get_state(async_client))["partitions"])["0"]

    assert p0["owner"] == "w1" and p0["status"] == "owned"
    assert p0["sequence_number"] == 6
    assert p0["last_enqueued_sequence_number"] == 9
    assert p0["lag"] == 3
    assert isinstance(p0["last_modified"], float)


async def test_an_unowned_partition_has_owner_null_and_everything_as_lag(
    async_client: AsyncClient, stores: Stores, hub: EmbeddedHub
) -> None:
    hub.send_batch([b"{}"] * 3, partition_id="1")

    partitions = by_id((await get_state(async_client))["partitions"])

    p1 = {k: v for k, v in partitions["1"].items() if k not in CONSOLE_KEYS}
    assert p1 == {
        "id": "1",
        "owner": None,
        "last_modified": None,
        "sequence_number": None,
        "last_enqueued_sequence_number": 2,
        "lag": 3,
        "pinned_to": None,
        "status": "unowned",
    }
    assert isinstance(partitions["1"]["last_enqueued_time"], float) and partitions["1"]["checkpoint_modified"] is None
    assert partitions["2"]["last_enqueued_sequence_number"] == -1 and partitions["2"]["lag"] == 0


async def test_an_expired_owner_is_shown_as_null(
    async_client: AsyncClient, stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    await coordinator(stores, ref, "w1", partitions=1).cycle()
    # w1 stopped renewing a minute ago (expiry is 30 s).
    await database_sync_to_async(Ownership.objects.update)(last_modified=F("last_modified") - 60)

    state = await get_state(async_client)

    p0 = by_id(state["partitions"])["0"]
    assert p0["owner"] is None and p0["status"] == "expired"
    assert by_id(state["workers"])["w1"]["owned"] == 0


async def test_a_released_partition_is_unowned(
    async_client: AsyncClient, stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    worker = coordinator(stores, ref, "w1")
    await worker.cycle()
    await worker.release_all()

    state = await get_state(async_client)

    assert {p["status"] for p in state["partitions"]} == {"unowned"}
    assert state["workers"] == []  # a clean shutdown removes the heartbeat too


async def test_workers_come_from_heartbeats_drains_and_owners(
    async_client: AsyncClient, stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    await coordinator(stores, ref, "w1", partitions=1).cycle()  # claims "0" and sends a heartbeat
    # w2 owns a partition but never sent a heartbeat; w3 is drained and gone; "2" is pinned to w1.
    await stores.ownership.claim_ownership([OwnershipRecord(ref, "3", "w2")])
    await stores.controls.put_control(Control(ref, ControlKind.DRAIN, "w3"))
    await stores.controls.put_control(Control(ref, ControlKind.PIN, "2", "w1"))

    state = await get_state(async_client)

    workers = by_id(state["workers"])
    assert list(workers) == ["w1", "w2", "w3"]
    assert workers["w1"]["alive"] is True and workers["w1"]["owned"] == 1 and workers["w1"]["draining"] is False
    assert workers["w1"]["last_seen"] <= state["generated_at"]
    w2 = {k: v for k, v in workers["w2"].items() if k not in CONSOLE_WORKER_KEYS}
    assert w2 == {"id": "w2", "owned": 1, "draining": False, "last_seen": None, "alive": False}
    assert workers["w2"]["purgeable"] is False  # it still holds a lease
    assert workers["w3"]["draining"] is True and workers["w3"]["owned"] == 0
    assert by_id(state["partitions"])["2"]["pinned_to"] == "w1"


async def test_a_worker_shows_the_partitions_it_gave_up_stuck_on_it(
    async_client: AsyncClient, stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    worker = coordinator(stores, ref, "w1", partitions=2)
    await worker.cycle()
    given_up = sorted(worker.owned)[0]
    await worker.give_up(given_up, "stuck: reader failing 31 s", 300.0)

    state = await get_state(async_client)

    w1 = by_id(state["workers"])["w1"]
    assert w1["avoiding"] == [given_up] and w1["alive"] is True
    assert by_id(state["partitions"])[given_up]["owner"] is None


async def test_an_unreachable_source_still_renders_with_nulls_and_says_why(
    async_client: AsyncClient, stores: Stores, ref: HubRef, settings: Any, tmp_path: Path
) -> None:
    settings.LEASEBOARD_SOURCE = "embedded"
    settings.LEASEBOARD_HUB_DIR = tmp_path / "nowhere"
    await coordinator(stores, ref, "w1", partitions=1).cycle()

    state = await get_state(async_client)

    assert state["source"]["available"] is False and "does not exist" in state["source"]["error"]
    assert [(p["id"], p["owner"], p["lag"], p["last_enqueued_sequence_number"]) for p in state["partitions"]] == [
        ("0", "w1", None, None)
    ]
    assert not (tmp_path / "nowhere").exists(), "a page view must not create a hub"


async def test_without_a_running_monitor_the_newest_stored_round_gives_lag_seconds_and_status(
    async_client: AsyncClient, stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    hub.send_batch([b"{}"] * 3, partition_id="1")
    rows = [
        LagSample(**LagSample.scope(ref), partition_id=pid, at=at, lag=lag, lag_seconds=seconds, status=status)
        for pid, at, lag, seconds, status in (
            ("1", 900.0, 3, 9.0, "OK"),
            ("1", 1000.0, 3, 2.5, "STALL"),
            ("2", 1000.0, 4, 7.0, "REWIND"),
        )
    ]
    await database_sync_to_async(LagSample.objects.bulk_create)(rows)

    state = await get_state(async_client)  # /api/state starts no monitor

    partitions = by_id(state["partitions"])
    assert [partitions["1"][k] for k in ("lag", "lag_seconds", "lag_status", "events_per_second")] == [
        3,
        2.5,
        "STALL",
        None,
    ]
    assert (partitions["2"]["lag"], partitions["2"]["lag_seconds"], partitions["2"]["lag_status"]) == (0, 0.0, "REWIND")
    assert (partitions["0"]["lag_seconds"], partitions["0"]["lag_status"]) == (0.0, "OK")  # no lag now: OK
    assert state["sampled_at"] == 1000.0
    assert state["summary"]["by_lag_status"] == {"OK": 2, "WARN": 0, "STALL": 1, "STOP": 0, "REWIND": 1}


async def test_another_hub_and_consumer_group_can_be_asked_for(
    async_client: AsyncClient, stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    other = HubRef(ref.namespace, ref.hub, "analytics")
    await coordinator(stores, other, "w9").cycle()

    state = await get_state(async_client, consumer_group="analytics")

    assert state["consumer_group"] == "analytics"
    assert [w["id"] for w in state["workers"]] == ["w9"]
    assert (await get_state(async_client))["workers"] == []


@pytest.mark.parametrize(
    "query, complaint",
    [({"hub": "../etc"}, "hub"), ({"consumer_group": "a b"}, "consumer_group"), ({"hub": "x" * 300}, "hub")],
)
async def test_a_bad_hub_or_consumer_group_is_a_400_saying_which(
    async_client: AsyncClient, stores: Stores, query: dict[str, str], complaint: str
) -> None:
    response = await async_client.get("/api/state", query)

    assert response.status_code == 400
    assert response.json()["error"].startswith(complaint)


async def test_last_event_id_is_the_newest_event_of_this_hub(
    async_client: AsyncClient, stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    assert (await get_state(async_client))["last_event_id"] == 0
    await apublish(event(ref, "0"))
    newest = await apublish(event(ref, "1"))
    await apublish(event(HubRef(ref.namespace, "elsewhere", ref.consumer_group), "1"))

    assert (await get_state(async_client))["last_event_id"] == newest["id"]


async def test_events_after_an_id_come_in_order_and_bounded(
    async_client: AsyncClient, stores: Stores, ref: HubRef
) -> None:
    ids = [(await apublish(event(ref, str(i))))["id"] for i in range(5)]

    after = (await async_client.get("/api/events", {"after": ids[1]})).json()
    limited = (await async_client.get("/api/events", {"after": ids[1], "limit": 2})).json()
    newest = (await async_client.get("/api/events", {"limit": 2})).json()

    assert [e["id"] for e in after] == ids[2:]
    assert [e["id"] for e in limited] == ids[2:4]
    assert [e["id"] for e in newest] == ids[3:]
    assert after[0]["partition_id"] == "2" and after[0]["kind"] == "claim"


@pytest.mark.parametrize("query", [{"after": "x"}, {"after": "-1"}, {"limit": "0"}, {"limit": "100000"}])
async def test_events_with_a_bad_bound_is_a_400(
    async_client: AsyncClient, stores: Stores, query: dict[str, str]
) -> None:
    response = await async_client.get("/api/events", query)

    assert response.status_code == 400
    assert next(iter(query)) in response.json()["error"]


async def test_a_store_outage_is_a_503_with_the_reason(async_client: AsyncClient, settings: Any, ref: HubRef) -> None:
    settings.LEASEBOARD_STORE = "memory"
    from dashboard.live.state import configured_stores

    memory = configured_stores().ownership
    memory.down = True  # type: ignore[attr-defined]
    try:
        response = await async_client.get("/api/state")
    finally:
        memory.down = False  # type: ignore[attr-defined]

    assert response.status_code == 503
    assert "store unavailable" in response.json()["error"]
