"""A dry run's printout (``manage.py drain WORKER --dry-run`` and the other action commands) names each
move once: one line per pair of owners, the moves that happen anyway on their pair's line."""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path

import pytest
from django.conf import LazySettings

from balancer.model import HubRef
from dashboard.control.command import move_lines
from dashboard.control.request import Move
from dashboard.models import AuditEntry, ControlRow, MemberRow, Ownership
from tests.dashboard.test_commands import run
from workers.hub.embedded import EmbeddedHub


def named_partitions(output: str) -> list[str]:
    """Every partition id the move lines of ``output`` name (the lines after the summary, before the notes)."""
    found = []
    for line in output.splitlines()[1:]:
        match = re.match(r"  (\S+) -> (.+?): (.*)$", line)
        if match and not line.startswith("  note:"):
            found += re.findall(r"\d+", match.group(3))
    return found


@pytest.mark.django_db(transaction=True)
def test_draining_a_worker_lists_each_move_once_even_when_a_pair_has_moves_that_happen_anyway(
    settings: LazySettings, ref: HubRef, tmp_path: Path
) -> None:
    """Partitions no one owns yet go to w3 whether or not w1 drains: the pair nobody -> w3 has moves the
    drain causes and moves that happen anyway. It was printed as two runs of lines, the second
    repeating the group; now it is one line."""
    settings.LEASEBOARD_STORE = "sql"
    settings.LEASEBOARD_SOURCE = "embedded"
    settings.LEASEBOARD_HUB_DIR = tmp_path / "hub"
    with EmbeddedHub(tmp_path / "hub", ref.hub, partitions=16):
        pass
    now = time.time()
    scope = Ownership.scope(ref)
    for worker, partitions in {"w1": "0123", "w2": "4567", "w3": "89"}.items():
        MemberRow.objects.create(**scope, owner_id=worker, last_seen=now)
        for p in partitions:
            Ownership.objects.create(**scope, partition_id=p, owner_id=worker, etag=f"e{p}", last_modified=now)

    output = run("drain", "w1", "--dry-run")

    pairs = [line.split(":")[0].strip() for line in output.splitlines()[2:] if not line.startswith("  note:")]
    assert len(pairs) == len(set(pairs)), output  # each pair of owners once
    named = named_partitions(output)
    assert sorted(Counter(named).values(), reverse=True)[:1] == [1], output  # each partition once
    assert set(named) == {"0", "1", "2", "3", "10", "11", "12", "13", "14", "15"}, output
    assert "nobody -> w3: partitions 10, 11, 12; partitions 13, 14, 15 already on their way" in output
    assert not ControlRow.objects.exists() and not AuditEntry.objects.exists()


def test_move_lines_group_by_pair_in_the_preview_order_and_drop_a_repeated_partition() -> None:
    moves = [
        Move("0", "w1", "w2", True),
        Move("1", "w1", "w2", True),
        Move("5", None, "w3", True),
        Move("4", "w1", "w2", False),
        Move("6", None, "w3", False),
        Move("1", "w1", "w2", True),
        Move("7", "w1", None, True, after_known=False),
    ]

    assert move_lines(moves) == [
        "w1 -> w2: partitions 0, 1; partition 4 already on its way",
        "nobody -> w3: partition 5; partition 6 already on its way",
        "w1 -> whichever live worker wins the race: partition 7",
    ]
    assert move_lines([]) == []
