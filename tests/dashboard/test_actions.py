"""``dashboard.control.actions``: refusals, dry runs computed with the real planner, and what applying writes."""

from __future__ import annotations

import asyncio
import importlib
import random
from dataclasses import replace
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.apps import apps as django_apps
from django.conf import LazySettings
from django.db import connection
from django.db.models import F

from balancer.errors import OwnershipLost
from balancer.lease import Coordinator
from balancer.model import Checkpoint, Control, ControlKind, HubRef, Member, OwnershipRecord
from balancer.notices import OPERATOR, LocalChannel, Released
from balancer.strategies import get_strategy
from dashboard.control import actions
from dashboard.control.actions import Refused, Request
from dashboard.models import AuditEntry, EventLog, MemberRow, Ownership
from tests.support.notices import listening
from tests.support.waiting import until
from workers.hub.embedded import EmbeddedHub
from workers.wiring import Stores

from .conftest import PARTITIONS

pytestmark = pytest.mark.django_db(transaction=True)


async def own(stores: Stores, ref: HubRef, holdings: dict[str, list[str]]) -> None:
    """Each worker heartbeats and claims its partitions (as first claims)."""
    for worker, partitions in holdings.items():
        await stores.controls.heartbeat(Member(ref, worker, 0.0))
        await stores.ownership.claim_ownership([OwnershipRecord(ref, p, worker) for p in partitions])


async def dead(worker: str) -> None:
    """Its heartbeat and its leases 10 minutes old (a worker holding partitions is alive by its renewals)."""
    await database_sync_to_async(MemberRow.objects.filter(owner_id=worker).update)(last_seen=F("last_seen") - 600)
    await database_sync_to_async(Ownership.objects.filter(owner_id=worker).update)(
        last_modified=F("last_modified") - 600
    )


def cooperative(stores: Stores, ref: HubRef, worker: str) -> Coordinator:
    async def ids() -> tuple[str, ...]:
        return tuple(str(i) for i in range(PARTITIONS))

    return Coordinator(
        ref=ref,
        owner_id=worker,
        store=stores.ownership,
        partitions=ids,
        strategy=get_strategy("cooperative"),
        expiry=30.0,
        controls=stores.controls,
        rng=random.Random(1),
    )


async def owners(stores: Stores, ref: HubRef) -> dict[str, str]:
    return {r.partition_id: r.owner_id for r in await stores.ownership.list_ownership(ref) if r.owner_id}


async def audit() -> list[AuditEntry]:
    entries: list[AuditEntry] = await database_sync_to_async(lambda: list(AuditEntry.objects.order_by("id")))()
    return entries


async def test_the_dry_run_of_a_drain_is_what_the_workers_then_do(
    stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    workers = {w: cooperative(stores, ref, w) for w in ("w1", "w2", "w3")}
    for _ in range(3):  # announce, claim, settle
        for coordinator in workers.values():
            await coordinator.cycle()
    before = await owners(stores, ref)
    assert sorted(before.values()).count("w1") >= 1

    shown = await actions.preview(ref, Request("drain", "w1"))

    assert {m.partition_id for m in shown.moves} == {p for p, w in before.items() if w == "w1"}
    assert all(m.caused and m.before == "w1" and m.after in ("w2", "w3") for m in shown.moves)
    assert await stores.controls.list_controls(ref) == []  # a preview writes nothing

    entry = await actions.apply(ref, Request("drain", "w1", reason="deploy"), "alice")
    for _ in range(3):
        for coordinator in workers.values():
            await coordinator.cycle()

    after = await owners(stores, ref)
    assert after == {**before, **{m.partition_id: m.after for m in shown.moves}}
    assert entry["outcome"] == "applied" and entry["user"] == "alice" and entry["moves"] == len(shown.moves)
    (row,) = await audit()
    assert (row.action, row.target, row.reason) == ("drain", "w1", "deploy")
    assert len(row.detail["moves"]) == len(shown.moves)
    drains = await database_sync_to_async(lambda: list(EventLog.objects.filter(kind="drain")))()
    assert [(e.partition_id, e.previous_owner, e.reason) for e in drains] == [("*", "w1", "drain w1: deploy")]


async def test_unknown_workers_and_partitions_are_refused(stores: Stores, hub: EmbeddedHub, ref: HubRef) -> None:
    await own(stores, ref, {"w1": ["0", "1"]})

    with pytest.raises(Refused, match="unknown worker 'w9'; known workers: w1") as drain:
        await actions.preview(ref, Request("drain", "w9"))
    with pytest.raises(Refused, match=r"unknown partition '7'; the hub's partitions are 0\.\.3") as pin:
        await actions.preview(ref, Request("pin", "7", "w1"))

    assert (drain.value.code, pin.value.code) == ("unknown_worker", "unknown_partition")


async def test_pinning_to_a_drained_or_dead_worker_is_refused(stores: Stores, hub: EmbeddedHub, ref: HubRef) -> None:
    await own(stores, ref, {"w1": ["0", "1"], "w2": ["2"], "w3": ["3"]})
    await stores.controls.put_control(Control(ref, ControlKind.DRAIN, "w2"))
    await dead("w3")

    with pytest.raises(Refused, match="it is draining") as drained:
        await actions.preview(ref, Request("pin", "0", "w2"))
    gone_message = r"w3: it is not alive \(its last heartbeat or lease renewal was 6\d\ds ago\)"
    with pytest.raises(Refused, match=gone_message) as gone:
        await actions.preview(ref, Request("pin", "0", "w3"))

    assert (drained.value.code, gone.value.code) == ("drained_worker", "dead_worker")


async def test_a_pin_moves_the_partition_to_its_worker_in_the_dry_run(
    stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    await own(stores, ref, {"w1": ["0", "1"], "w2": ["2", "3"]})

    shown = await actions.preview(ref, Request("pin", "0", "w2"))

    caused = [m for m in shown.moves if m.caused]
    assert ("0", "w1", "w2") in [(m.partition_id, m.before, m.after) for m in caused]
    assert len(caused) == 2  # and w2 gives one of its own to w1, so both keep two


async def test_draining_the_last_live_worker_needs_an_explicit_confirmation(
    stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    await own(stores, ref, {"w1": ["0", "1", "2", "3"]})

    shown = await actions.preview(ref, Request("drain", "w1"))
    assert shown.needs_confirmation and "last live worker" in shown.notes[0]
    assert [m.after for m in shown.moves] == [None] * 4

    with pytest.raises(Refused) as refused:
        await actions.apply(ref, Request("drain", "w1", reason="maintenance"), "bob")
    assert refused.value.code == "last_worker"
    assert await stores.controls.list_controls(ref) == []

    await actions.apply(ref, Request("drain", "w1", reason="maintenance", confirm_last=True), "bob")
    assert [(c.kind, c.target) for c in await stores.controls.list_controls(ref)] == [(ControlKind.DRAIN, "w1")]
    refusal, applied = await audit()
    assert (refusal.outcome, applied.outcome) == ("refused", "applied")
    assert refusal.message.startswith("w1 is the last live worker")


async def test_an_action_without_a_reason_is_refused_and_recorded(
    stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    await own(stores, ref, {"w1": ["0"], "w2": ["1"]})

    with pytest.raises(Refused, match="give a reason"):
        await actions.apply(ref, Request("drain", "w1"), "carol")

    (entry,) = await audit()
    assert (entry.user, entry.outcome, entry.action) == ("carol", "refused", "drain")


async def test_rebalance_writes_a_new_token_and_wakes_the_workers(
    stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    await own(stores, ref, {"w1": ["0", "1"]})
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(actions.WAKE_GROUP, channel)
    try:
        await actions.apply(ref, Request("rebalance", "*", reason="after the deploy"), "alice")
        message = await layer.receive(channel)
    finally:
        await layer.group_discard(actions.WAKE_GROUP, channel)

    (control,) = await stores.controls.list_controls(ref)
    assert control.kind is ControlKind.REBALANCE and control.value == message["token"]
    assert message["type"] == "worker.wake" and message["reason"] == "rebalance"


async def test_a_reset_of_an_owned_partition_is_refused_unless_forced(
    stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    hub.send_batch([b"{}"] * 10, partition_id="1")
    await own(stores, ref, {"w1": ["1"]})
    await stores.checkpoints.update_checkpoint(Checkpoint(ref, "1", 8, None), "w1")

    with pytest.raises(Refused, match="owned by w1: drain or stop it first, or force") as refused:
        await actions.preview(ref, Request("resetcheckpoint", "1", "3"))
    assert refused.value.code == "owned"

    shown = await actions.preview(ref, Request("resetcheckpoint", "1", "3", force=True))
    assert shown.checkpoint is not None
    assert (shown.checkpoint["from"], shown.checkpoint["to"], shown.checkpoint["again"]) == (8, 3, 5)
    await actions.apply(ref, Request("resetcheckpoint", "1", "3", reason="replay", force=True), "alice")

    (checkpoint,) = await stores.checkpoints.list_checkpoints(ref)
    assert checkpoint.sequence_number == 3 and checkpoint.offset is not None
    assert await owners(stores, ref) == {}  # released, so the planned owner takes it at its next cycle
    with pytest.raises(OwnershipLost):  # the worker it was taken from can no longer checkpoint
        await stores.checkpoints.update_checkpoint(Checkpoint(ref, "1", 9, None), "w1")


async def test_a_reset_to_latest_skips_what_is_there_and_earliest_removes_the_checkpoint(
    stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    hub.send_batch([b"{}"] * 6, partition_id="2")

    await actions.apply(ref, Request("resetcheckpoint", "2", "latest", reason="skip the backlog"), "alice")
    assert [c.sequence_number for c in await stores.checkpoints.list_checkpoints(ref)] == [5]

    await actions.apply(ref, Request("resetcheckpoint", "2", "earliest", reason="replay all"), "alice")
    assert await stores.checkpoints.list_checkpoints(ref) == []


async def test_a_reset_to_a_time_resumes_at_the_first_event_enqueued_then(
    stores: Stores, hub: EmbeddedHub, ref: HubRef, settings: LazySettings
) -> None:
    clock = iter([1000.0, 1010.0, 1020.0, 1030.0, 1040.0])
    with EmbeddedHub(settings.LEASEBOARD_HUB_DIR, ref.hub, clock=lambda: next(clock)) as timed:
        for _ in range(5):
            timed.send(b"{}", partition_id="3")

    def at(seconds: float) -> str:
        return datetime.fromtimestamp(seconds, UTC).isoformat()

    between = await actions.preview(ref, Request("resetcheckpoint", "3", at(1015.0)))
    before = await actions.preview(ref, Request("resetcheckpoint", "3", at(900.0)))
    after = await actions.preview(ref, Request("resetcheckpoint", "3", at(2000.0).replace("+00:00", "Z")))

    assert between.checkpoint is not None and between.checkpoint["to"] == 1  # resumes at event 2, enqueued at 1020
    assert before.checkpoint is not None and before.checkpoint["to"] is None  # before everything: from the start
    assert after.checkpoint is not None and after.checkpoint["to"] == 4


async def test_a_sequence_number_outside_the_partition_is_refused(
    stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    hub.send_batch([b"{}"] * 3, partition_id="0")

    with pytest.raises(Refused, match=r"sequence number 7 is not in partition 0 \(it holds 0..2\)"):
        await actions.preview(ref, Request("resetcheckpoint", "0", "7"))
    with pytest.raises(Refused, match="earliest, latest, a sequence number or an ISO 8601 time"):
        await actions.preview(ref, Request("resetcheckpoint", "0", "yesterday"))


async def test_a_dead_worker_can_be_purged_and_a_live_one_cannot(stores: Stores, hub: EmbeddedHub, ref: HubRef) -> None:
    await stores.controls.heartbeat(Member(ref, "w1", 0.0))
    await stores.controls.heartbeat(Member(ref, "w2", 0.0))
    await stores.controls.put_control(Control(ref, ControlKind.DRAIN, "w2"))
    await dead("w2")

    with pytest.raises(Refused, match="w1 is alive") as alive:
        await actions.apply(ref, Request("purge", "w1", reason="cleanup"), "alice")
    await actions.apply(ref, Request("purge", "w2", reason="host is gone"), "alice")

    assert alive.value.code == "alive_worker"
    assert [m.owner_id for m in await stores.controls.list_members(ref)] == ["w1"]
    assert await stores.controls.list_controls(ref) == []


def test_a_request_is_parsed_strictly() -> None:
    with pytest.raises(Refused, match="unknown action 'explode'"):
        actions.parse({"action": "explode"})

    parsed = actions.parse({"action": "resetcheckpoint", "target": " 3 ", "value": "latest", "force": "true"})

    assert parsed == Request("resetcheckpoint", "3", "latest", "", True, False)


def test_undrains_and_unpins_logged_before_they_had_kinds_of_their_own_are_rewritten_as_such() -> None:
    migration = importlib.import_module("dashboard.migrations.0004_operator_event_kinds")
    scope = EventLog.scope(HubRef("ns", "sensors", "$Default"))
    old = [("drain", "*", None, "w1"), ("drain", "*", "w1", None), ("pin", "0", "w2", None), ("pin", "0", None, None)]
    for kind, pid, owner, previous in old:
        EventLog.objects.create(
            **scope,
            kind=kind,
            partition_id=pid,
            owner_id=owner,
            previous_owner=previous,
            reporter="dashboard:alice",
            reason="why",
            at=1.0,
        )

    editor = SimpleNamespace(connection=connection)  # the migration writes through the database it migrates
    migration.name_the_direction(django_apps, editor)
    named = list(EventLog.objects.order_by("id").values_list("kind", flat=True))
    migration.fold_the_direction(django_apps, editor)

    assert named == ["drain", "undrain", "pin", "unpin"]
    assert list(EventLog.objects.order_by("id").values_list("kind", "owner_id", "previous_owner")) == [
        (kind, owner, previous) for kind, _, owner, previous in old
    ]


class WithAChannel:
    """The ownership store, with a release channel of its own (as Redis's and PostgreSQL's have)."""

    def __init__(self, store: object, channel: LocalChannel) -> None:
        self._store, self.channel = store, channel

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def release_channel(self, ref: HubRef) -> LocalChannel:
        return self.channel


async def test_an_action_that_wakes_the_workers_also_tells_them_on_the_stores_channel(
    stores: Stores, hub: EmbeddedHub, ref: HubRef
) -> None:
    # The channel-layer wake-up may stay in this process; the store's channel reaches every worker
    # that listens for releases, and ends a quiet wait (``Coordinator.quiet_until``).
    await own(stores, ref, {"w1": ["0", "1"], "w2": ["2", "3"]})
    channel = LocalChannel()
    told = replace(stores, ownership=WithAChannel(stores.ownership, channel))  # type: ignore[arg-type]
    heard: list[Released] = []
    listener = listening(channel, heard)
    try:
        await until(lambda: len(channel._queues) == 1, "the listener to subscribe")
        await actions.apply(ref, Request("drain", "w2", reason="maintenance"), "alice", stores=told)
        await until(lambda: heard == [Released(ref, (), OPERATOR)], "the workers to be told")
        assert await actions.tell_workers(ref, stores) is False  # SQLite: no channel, nothing sent
    finally:
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)
    assert heard == [Released(ref, (), OPERATOR)]
