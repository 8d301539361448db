"""The dead-letter actions ``replay``, ``replayinplace`` and ``purgedeadletters``: a preview naming how
many and which, a replay that reaches the embedded hub with the property naming where each event was
(or a request to the partition's owner, in place), a second replay refused (saying when) unless
forced, a purge of the chosen ones only; each in the audit log and the metric, over HTTP for staff
with a CSRF token only, and as a command."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from channels.db import database_sync_to_async
from django.conf import LazySettings
from django.core.management import CommandError, call_command
from prometheus_client import REGISTRY

from balancer.model import HubRef
from dashboard.control import actions
from dashboard.control.actions import Refused, Request
from dashboard.models import AuditEntry
from workers.deadletter import files, inplace
from workers.deadletter.decode import properties_of
from workers.deadletter.replay import REPLAYED_FROM
from workers.hub.embedded import EmbeddedHub
from workers.wiring import Stores

from . import test_action_views
from .dead import read_after, set_aside, with_properties
from .test_action_views import logged_in, post

pytestmark = pytest.mark.django_db(transaction=True)

fleet = test_action_views.fleet  # w1 and w2 own the hub's partitions: the store knows it, its pages open


@pytest.fixture
def letters(settings: LazySettings, tmp_path: Path, hub: EmbeddedHub, ref: HubRef) -> EmbeddedHub:
    """Partition 1 holds events 0..2, all set aside as dead letters of ``ref``'s group (0 with a property)."""
    settings.LEASEBOARD_DEADLETTER_DIR = tmp_path / "dead"
    amqp = [with_properties(b'{"n": 0}', {"trace": "t-0"}), b"", b""]
    set_aside(settings, ref, hub, [b'{"n": 0}', b'{"n": 1}', b"\x00\x02"], partition="1", amqp=amqp)
    return hub


def counted(action: str, outcome: str) -> float:
    return REGISTRY.get_sample_value("leaseboard_admin_actions_total", {"action": action, "outcome": outcome}) or 0.0


async def audit() -> list[tuple[str, str, str, str]]:
    rows = AuditEntry.objects.order_by("id").values_list("action", "target", "value", "outcome")
    found: list[tuple[str, str, str, str]] = await database_sync_to_async(lambda: list(rows))()
    return found


def remaining(settings: LazySettings, ref: HubRef, partition: str = "1", group: str | None = None) -> list[int]:
    folder = files.folder_of(Path(settings.LEASEBOARD_DEADLETTER_DIR), ref.hub)
    return sorted(files.read_letters(folder, partition, group or ref.consumer_group))


async def test_a_replay_shows_which_then_sends_each_again_with_where_it_was(
    stores: Stores, letters: EmbeddedHub, ref: HubRef
) -> None:
    before = counted("replay", "applied")

    shown = await actions.preview(ref, Request("replay", "1", "all"))
    assert read_after(letters, "1", 2) == []  # a preview sends nothing
    entry = await actions.apply(ref, Request("replay", "1", "all", reason="handler fixed"), "ops")

    assert shown.summary.startswith(
        "replay 3 dead letters of partition 1 (sequence numbers 0, 1, 2) to the embedded hub 'sensors': each is sent "
        'again to partition 1 with the property leaseboard-replayed-from = "1:<its sequence number>"'
    )
    again = read_after(letters, "1", 2)
    assert [(e.sequence_number, e.body, e.partition_key) for e in again] == [
        (3, b'{"n": 0}', "home-7"),
        (4, b'{"n": 1}', "home-7"),
        (5, b"\x00\x02", "home-7"),
    ]
    assert [properties_of(e.amqp) for e in again] == [
        {"trace": "t-0", REPLAYED_FROM: "1:0"},
        {REPLAYED_FROM: "1:1"},
        {REPLAYED_FROM: "1:2"},
    ]
    assert entry["outcome"] == "applied" and entry["message"].startswith(
        "replayed 3 dead letters of partition 1 as 1:3"
    )
    assert await audit() == [("replay", "1", "all", "applied")]
    assert counted("replay", "applied") == before + 1


async def test_replaying_a_dead_letter_twice_is_refused_saying_when_unless_forced(
    stores: Stores, letters: EmbeddedHub, ref: HubRef
) -> None:
    await actions.apply(ref, Request("replay", "1", "1", reason="one"), "ops")

    with pytest.raises(Refused, match=r"1:1 already replayed at .* UTC by ops \(as 1:3\): force to replay again") as r:
        await actions.preview(ref, Request("replay", "1", "0,1"))
    with pytest.raises(Refused, match="already replayed"):
        await actions.apply(ref, Request("replay", "1", "1", reason="again"), "ann")
    rest = await actions.preview(ref, Request("replay", "1", "all"))
    forced = await actions.preview(ref, Request("replay", "1", "1", force=True))
    await actions.apply(ref, Request("replay", "1", "1", reason="really", force=True), "ann")

    assert (r.value.code, r.value.http_status) == ("already_replayed", 409)
    assert "(sequence numbers 0, 2)" in rest.summary
    assert "left out, replayed already: sequence number 1 (force to replay them again)" in rest.notes
    assert forced.notes[0].startswith("forced: 1:1 already replayed at") and "sent once more" in forced.notes[0]
    assert [properties_of(e.amqp)[REPLAYED_FROM] for e in read_after(letters, "1", 2)] == ["1:1", "1:1"]
    assert [a[3] for a in await audit()] == ["applied", "refused", "applied"]
    await actions.apply(ref, Request("replay", "1", "all", reason="the rest"), "ops")
    with pytest.raises(Refused, match="every dead letter of partition 1 was replayed already") as done:
        await actions.preview(ref, Request("replay", "1", "all"))
    assert done.value.code == "no_change"


async def test_selections_naming_nothing_there_are_refused(stores: Stores, letters: EmbeddedHub, ref: HubRef) -> None:
    cases = {
        ("1", "7"): ("bad_request", "partition 1 has no dead letter with sequence number 7"),
        ("1", "1,x"): ("bad_request", "say all, or sequence numbers separated by commas"),
        ("1", ""): ("bad_request", "say all, or sequence numbers"),
        ("2", "all"): ("no_change", "partition 2 has no dead letter of consumer group $Default"),
        ("9", "all"): ("unknown_partition", "unknown partition '9'"),
    }
    for (partition, value), (code, message) in cases.items():
        for action in ("replay", "purgedeadletters"):
            with pytest.raises(Refused) as refused:
                await actions.preview(ref, Request(action, partition, value))
            assert (refused.value.code, refused.value.message.startswith(message)) == (code, True), refused.value


async def test_a_purge_removes_the_chosen_dead_letters_of_its_group_only(
    settings: LazySettings, stores: Stores, letters: EmbeddedHub, ref: HubRef
) -> None:
    other = HubRef(ref.namespace, ref.hub, "other")
    set_aside(settings, other, letters, [b"{}"], partition="1")
    await actions.apply(ref, Request("replay", "1", "0", reason="first"), "ops")
    before = counted("purgedeadletters", "applied")

    shown = await actions.preview(ref, Request("purgedeadletters", "1", "2,0"))
    assert remaining(settings, ref) == [0, 1, 2]  # a preview removes nothing
    entry = await actions.apply(ref, Request("purgedeadletters", "1", "0,2", reason="junk"), "ops")
    every = await actions.preview(ref, Request("purgedeadletters", "1", "all"))
    await actions.apply(ref, Request("purgedeadletters", "1", "all", reason="all junk"), "ops")

    assert shown.summary.startswith(
        "purge 2 dead letters of partition 1 (sequence numbers 0, 2), consumer group $Default"
    )
    assert shown.notes[:2] == [
        "never replayed: sequence number 2; once purged they cannot be replayed",
        "1 of them was replayed before",
    ]
    assert entry["message"].startswith("purged 2 dead letters of partition 1 (2 lines removed)")
    assert "(sequence number 1)" in every.summary
    assert remaining(settings, ref) == [] and remaining(settings, ref, group="other") == [3]
    assert counted("purgedeadletters", "applied") == before + 2


async def test_a_replay_in_place_names_the_owner_then_asks_it_and_the_hub_replay_waits(
    settings: LazySettings, fleet: Stores, letters: EmbeddedHub, ref: HubRef
) -> None:
    before = counted("replayinplace", "applied")

    shown = await actions.preview(ref, Request("replayinplace", "1", "0,2"))
    entry = await actions.apply(ref, Request("replayinplace", "1", "0,2", reason="handler fixed"), "ops")
    with pytest.raises(Refused, match=r"1:0 already replayed at .* by ops \(as in place \(pending\)\)") as twice:
        await actions.preview(ref, Request("replay", "1", "0"))
    rest = await actions.preview(ref, Request("replayinplace", "1", "all"))

    assert shown.summary == (
        "replay 2 dead letters of partition 1 (sequence numbers 0, 2) in place: each is handed to the handler of "
        'worker w1, which owns partition 1, not sent to the hub, with the property leaseboard-replayed-from = "1:<its '
        'sequence number>"'
    )
    assert any("the checkpoint does not move" in note for note in shown.notes)
    assert read_after(letters, "1", 2) == []  # nothing sent to the hub
    assert entry["outcome"] == "applied" and entry["message"].startswith(
        "asked w1 to hand 2 dead letters of partition 1 to its handler in place (request "
    )
    (asked,) = inplace.requests_folder(files.folder_of(Path(settings.LEASEBOARD_DEADLETTER_DIR), ref.hub)).iterdir()
    assert inplace.Request.load(asked).sequence_numbers == (0, 2)
    assert twice.value.code == "already_replayed"
    assert "(sequence number 1)" in rest.summary
    assert counted("replayinplace", "applied") == before + 1
    assert await audit() == [("replayinplace", "1", "0,2", "applied")]


async def test_staff_replay_over_http_with_the_csrf_token_and_nobody_else(
    fleet: Stores, letters: EmbeddedHub, ref: HubRef
) -> None:
    body = {"action": "replay", "target": "1", "value": "2, 0", "reason": "fixed"}
    viewer = await logged_in(staff=False)
    refused = await post(viewer, "/api/actions/apply", {**body, "confirmed": True})
    client = await logged_in()
    no_token = await post(client, "/api/actions/apply", {**body, "confirmed": True}, csrf=False)

    preview = await post(client, "/api/actions/preview", body)
    applied = await post(client, "/api/actions/apply", {**body, "confirmed": True})
    twice = await post(client, "/api/actions/apply", {**body, "confirmed": True})

    assert refused.status_code == 403 and no_token.status_code == 403
    assert preview.status_code == 200 and preview.json()["value"] == "0,2", preview.content
    assert "(sequence numbers 0, 2)" in preview.json()["summary"]
    assert applied.status_code == 200 and applied.json()["outcome"] == "applied", applied.content
    assert twice.status_code == 409 and twice.json()["code"] == "already_replayed"
    assert "1:0 already replayed at" in twice.json()["error"] and "by ops (as 1:3)" in twice.json()["error"]
    assert [properties_of(e.amqp)[REPLAYED_FROM] for e in read_after(letters, "1", 2)] == ["1:0", "1:2"]


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stdin=io.StringIO(""))
    return out.getvalue()


def test_the_commands_replay_and_purge_with_a_dry_run_first(
    settings: LazySettings, letters: EmbeddedHub, ref: HubRef
) -> None:
    settings.LEASEBOARD_STORE = "sql"

    looked = run("replay", "1", "all", "--dry-run")
    replayed = run("replay", "1", "0,1", "--reason", "fixed", "--yes")
    with pytest.raises(CommandError, match="1:0 already replayed at"):
        run("replay", "1", "0", "--reason", "again", "--yes")
    forced = run("replay", "1", "0", "--reason", "again", "--yes", "--force")
    purged = run("purgedeadletters", "1", "all", "--reason", "done", "--yes")

    assert looked.startswith("replay 3 dead letters of partition 1") and "Applied" not in looked
    assert "Applied (audit #" in replayed and "replayed 2 dead letters of partition 1 as 1:3, 1:4" in replayed
    assert "note: forced: 1:0 already replayed at" in forced
    assert "purged 3 dead letters of partition 1" in purged
    assert [properties_of(e.amqp)[REPLAYED_FROM] for e in read_after(letters, "1", 2)] == ["1:0", "1:1", "1:0"]
    assert remaining(settings, ref) == []
    outcomes = list(AuditEntry.objects.order_by("id").values_list("action", "outcome"))
    assert outcomes == [("replay", "applied"), ("replay", "applied"), ("purgedeadletters", "applied")]
