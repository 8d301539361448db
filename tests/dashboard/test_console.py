"""``dashboard/live/console.py``: the typed console state, its figures and its one JSON shape (pure, no database)."""

from __future__ import annotations

from balancer.model import Checkpoint, Control, ControlKind, HubRef, Member, OwnershipRecord
from dashboard.live.console import ConsoleState, Figures, LagRules, Lease, assemble
from dashboard.live.lag import Status
from workers.sources.base import PartitionProperties

REF = HubRef("ns.example", "sensors", "$Default")
RULES = LagRules(window=3, sample_seconds=5.0, stop_seconds=300.0)
DESIGN_TOP = {"namespace", "hub", "consumer_group", "generated_at", "partitions", "workers"}
DESIGN_PARTITION = {
    "id",
    "owner",
    "last_modified",
    "sequence_number",
    "last_enqueued_sequence_number",
    "lag",
    "pinned_to",
    "status",
}
DESIGN_WORKER = {"id", "owned", "draining", "last_seen", "alive"}


def properties(last: int) -> PartitionProperties:
    return PartitionProperties("0", 0, last, str(last), 1000.0 + last, last < 0)


def state() -> ConsoleState:
    """Partition 0 owned by w1 with lag 4, 1 expired (w2 stopped renewing), 2 never owned and empty;
    w3 is drained and gone."""
    return assemble(
        REF,
        now=100.0,
        expiry=30.0,
        ownership=[OwnershipRecord(REF, "0", "w1", "e", 95.0), OwnershipRecord(REF, "1", "w2", "e", 10.0)],
        checkpoints=[Checkpoint(REF, "0", 5, "5", 90.0)],
        members=[Member(REF, "w1", 99.0), Member(REF, "w2", 10.0)],
        controls=[Control(REF, ControlKind.DRAIN, "w3"), Control(REF, ControlKind.PIN, "2", "w1")],
        partition_ids=["0", "1", "2"],
        properties={"0": properties(9), "1": properties(3), "2": properties(-1)},
        source_name="embedded",
        source_error=None,
        last_event_id=7,
    )


def test_a_read_becomes_typed_rows_with_lease_status_lag_and_pins() -> None:
    read = state()

    assert [(p.id, p.owner, p.status, p.lag, p.pinned_to) for p in read.partitions] == [
        ("0", "w1", Lease.OWNED, 4, None),
        ("1", None, Lease.EXPIRED, 4, None),
        ("2", None, Lease.UNOWNED, 0, "w1"),
    ]
    assert [(w.id, w.owned, w.alive, w.draining, w.purgeable) for w in read.workers] == [
        ("w1", 1, True, False, False),
        ("w2", 0, False, False, True),
        ("w3", 0, False, True, True),
    ]
    assert read.summary.by_status == {Lease.OWNED: 1, Lease.UNOWNED: 1, Lease.EXPIRED: 1}
    assert (read.summary.lag, read.summary.workers_alive) == (8, 1)


def test_figures_give_lag_seconds_status_and_rates_and_no_lag_is_ok_unless_rewound() -> None:
    figures = Figures(
        RULES,
        lag_seconds={"0": 3.14159, "1": None},
        statuses={"0": Status.STALL, "2": Status.REWIND},
        rates={"0": 2.25, "1": 7.0},
        sampled_at=99.0,
    )

    shown = state().with_figures(figures)

    p0, p1, p2 = shown.partitions
    assert (p0.lag_seconds, p0.lag_status, p0.events_per_second) == (3.1, Status.STALL, 2.2)
    assert (p1.lag_seconds, p1.lag_status, p1.events_per_second) == (None, None, 7.0)
    assert (p2.lag_seconds, p2.lag_status) == (0.0, Status.REWIND)
    assert [w.events_per_second for w in shown.workers] == [2.2, 0.0, 0.0]  # w1 owns 0; 1's owner expired
    assert (shown.sampled_at, shown.lag_rules) == (99.0, RULES)
    assert shown.summary.by_lag_status[Status.STALL] == 1
    unmeasured = state().with_figures(Figures(RULES))
    assert [w.events_per_second for w in unmeasured.workers] == [None, None, None]
    assert unmeasured.partitions[2].lag_status is Status.OK


def test_the_json_has_design_mds_keys_and_plain_values() -> None:
    shown = state().with_figures(Figures(RULES, statuses={"0": Status.WARN}))

    data = shown.as_json()

    assert set(data) >= DESIGN_TOP | {"last_event_id", "source", "sampled_at", "lag_rules", "version", "summary"}
    assert all(set(p) >= DESIGN_PARTITION for p in data["partitions"])
    assert all(set(w) >= DESIGN_WORKER | {"events_per_second", "purgeable"} for w in data["workers"])
    p0 = data["partitions"][0]
    assert (p0["status"], p0["lag_status"]) == ("owned", "WARN")
    assert type(p0["status"]) is str and type(p0["lag_status"]) is str  # not the enums
    assert data["source"] == {"name": "embedded", "available": True, "error": None}
    assert data["lag_rules"] == {"window": 3, "sample_seconds": 5.0, "stop_seconds": 300.0}
    assert data["summary"]["owned"] == 1 and data["summary"]["by_status"] == {"owned": 1, "unowned": 1, "expired": 1}
