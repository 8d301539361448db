"""The admin-action commands: built from the registry, thin over ``dashboard.control.actions``, landing in the same
audit log."""

from __future__ import annotations

import getpass
import io
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import LazySettings
from django.core.management import CommandError, call_command, get_commands, load_command_class

from balancer.model import HubRef
from dashboard.control.command import ActionCommand
from dashboard.control.registry import REGISTRY
from dashboard.models import AuditEntry, CheckpointRow, ControlRow, EventLog, MemberRow, Ownership
from workers.hub.embedded import EmbeddedHub

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def fleet(settings: LazySettings, hub: EmbeddedHub, ref: HubRef) -> Iterator[EmbeddedHub]:
    """w1 owns 0 and 1, w2 owns 2 and 3, both alive (rows written as the SQL store writes them)."""
    settings.LEASEBOARD_STORE = "sql"
    now = time.time()
    scope = Ownership.scope(ref)
    for worker, partitions in {"w1": "01", "w2": "23"}.items():
        MemberRow.objects.create(**scope, owner_id=worker, last_seen=now)
        for p in partitions:
            Ownership.objects.create(**scope, partition_id=p, owner_id=worker, etag=f"e{p}", last_modified=now)
    yield hub


def run(*args: str, stdin: str = "") -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stdin=io.StringIO(stdin))
    return out.getvalue()


def test_drain_shows_the_moves_and_applies_with_yes(fleet: EmbeddedHub) -> None:
    output = run("drain", "w1", "--reason", "deploy", "--yes")

    assert "drain w1: 2 partitions move (w1 → w2: 2)" in output
    assert "planned with cooperative (the default strategy" in output
    assert "  w1 -> w2: partitions 0, 1\n" in output and "Applied (audit #" in output
    assert list(ControlRow.objects.values_list("kind", "target")) == [("drain", "w1")]
    entry = AuditEntry.objects.get()
    assert (entry.user, entry.action, entry.reason, entry.outcome) == (
        f"cli:{getpass.getuser()}",
        "drain",
        "deploy",
        "applied",
    )


def test_a_dry_run_writes_nothing(fleet: EmbeddedHub) -> None:
    output = run("drain", "w1", "--dry-run")

    assert "2 partitions move" in output
    assert not ControlRow.objects.exists() and not AuditEntry.objects.exists()


def test_an_unknown_worker_ends_the_command_with_the_reason(fleet: EmbeddedHub) -> None:
    with pytest.raises(CommandError, match="unknown worker 'w9'"):
        run("drain", "w9", "--reason", "x", "--yes")


def test_the_last_live_worker_is_drained_only_when_its_id_is_typed(fleet: EmbeddedHub) -> None:
    MemberRow.objects.filter(owner_id="w2").delete()
    Ownership.objects.filter(owner_id="w2").update(owner_id="w1")

    with pytest.raises(CommandError, match="last live worker"):
        run("drain", "w1", "--reason", "maintenance", "--yes")
    assert not ControlRow.objects.exists()

    with pytest.raises(CommandError, match="not confirmed; nothing was changed"):
        run("drain", "w1", "--reason", "maintenance", stdin="w2\n")
    assert not ControlRow.objects.exists()
    output = run("drain", "w1", "--reason", "maintenance", stdin="w1\n")

    assert "Applied" in output and list(ControlRow.objects.values_list("target", flat=True)) == ["w1"]


def test_pin_and_unpin_from_the_command_line(fleet: EmbeddedHub) -> None:
    pinned = run("pin", "0", "w2", "--reason", "hot partition", "--yes")
    assert list(ControlRow.objects.values_list("kind", "target", "value")) == [("pin", "0", "w2")]
    unpinned = run("unpin", "0", "--reason", "cooled down", "--yes")

    assert "  w1 -> w2: partition 0\n" in pinned
    assert not ControlRow.objects.exists() and "Applied" in unpinned
    assert list(AuditEntry.objects.order_by("id").values_list("action", flat=True)) == ["pin", "unpin"]


def test_resetcheckpoint_refuses_an_owned_partition_unless_forced(fleet: EmbeddedHub, tmp_path: Path) -> None:
    fleet.send_batch([b"{}"] * 5, partition_id="2")

    with pytest.raises(CommandError, match="owned by w2"):
        run("resetcheckpoint", "2", "--to", "latest", "--reason", "skip", "--yes")
    output = run("resetcheckpoint", "2", "--to", "latest", "--reason", "skip", "--yes", "--force")

    assert "checkpoint None -> 4, lag 5 -> 0 events" in output
    assert list(CheckpointRow.objects.values_list("partition_id", "sequence_number")) == [("2", 4)]


def test_rebalance_needs_no_argument(fleet: EmbeddedHub) -> None:
    output = run("rebalance", "--reason", "after the deploy", "--yes")

    assert "rebalance now: no partition moves" in output
    assert list(ControlRow.objects.values_list("kind", flat=True)) == ["rebalance"]


def test_an_unknown_partition_ends_the_command_with_the_reason(fleet: EmbeddedHub) -> None:
    with pytest.raises(CommandError, match=r"unknown partition '9'; the hub's partitions are 0\.\.3"):
        run("pin", "9", "w1", "--reason", "x", "--yes")
    with pytest.raises(CommandError, match="unknown worker 'w9'; known workers: w1, w2"):
        run("pin", "0", "w9", "--reason", "x", "--yes")
    assert not ControlRow.objects.exists()


def test_every_registered_action_has_its_command_built_from_its_declaration() -> None:
    for name, action in REGISTRY.items():
        assert get_commands()[name] == "dashboard", name
        command = load_command_class("dashboard", name)
        assert isinstance(command, ActionCommand) and command.action is action
        assert command.help.startswith(action.help)
        parser = command.create_parser("manage.py", name)
        dests = {a.dest for a in parser._actions}
        assert ("target" in dests) == (action.target is not None), name
        assert ("value" in dests) == (action.value is not None), name
        assert ("force" in dests) == bool(action.force), name


def test_undrain_is_recorded_as_an_undrain_not_as_a_drain_with_its_fields_swapped(fleet: EmbeddedHub) -> None:
    run("drain", "w1", "--reason", "deploy", "--yes")
    run("undrain", "w1", "--reason", "deployed", "--yes")
    run("pin", "0", "w2", "--reason", "hot", "--yes")
    run("unpin", "0", "--reason", "cooled down", "--yes")

    logged = list(EventLog.objects.order_by("id").values_list("kind", "partition_id", "owner_id", "previous_owner"))
    assert logged == [
        ("drain", "*", None, "w1"),
        ("undrain", "*", "w1", None),
        ("pin", "0", "w2", None),
        ("unpin", "0", None, "w2"),
    ]
