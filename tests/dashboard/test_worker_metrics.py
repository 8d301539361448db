"""``workers/metrics.py``: reasons reduced to a fixed set, and store calls counted by operation and outcome."""

from __future__ import annotations

import time

import pytest
from prometheus_client import REGISTRY

from balancer.errors import OwnershipLost, StoreUnavailable
from balancer.model import BalancerEvent, Checkpoint, EventKind, HubRef, OwnershipRecord
from balancer.stores.memory import MemoryStore
from workers import metrics
from workers.wiring import Stores, instrument

REF = HubRef("metrics.example", "sensors", "$Default")


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def event(kind: EventKind, reason: str, handoff: bool = False) -> BalancerEvent:
    return BalancerEvent(kind, REF, "0", "w2", "w1", "w2", reason, time.time(), handoff)


@pytest.mark.parametrize(
    ("kind", "reason", "label"),
    [
        (EventKind.CLAIM, "never owned", "never_owned"),
        (EventKind.CLAIM, "released", "released"),
        (EventKind.EXPIRE, "lease of w1 not renewed for 31.2s (expiry 30s)", "lease_expired"),
        (EventKind.EXPIRE, "corrupt record of ghost: last_modified nan", "corrupt_record"),
        (EventKind.STEAL, "w1 did not hand over within 30s", "handoff_timeout"),
        (EventKind.STEAL, "w1 holds 6, above its share", "over_share"),
        (EventKind.RELEASE, "shutting down", "shutdown"),
        (EventKind.LOST, "now held by w3", "taken"),
        (EventKind.LOST, "a reason nobody wrote a rule for", "other"),
    ],
)
def test_a_reason_becomes_one_of_a_fixed_set_of_labels(kind: EventKind, reason: str, label: str) -> None:
    assert metrics.reason_label(event(kind, reason)) == label


def test_a_release_is_labelled_a_handoff_by_its_typed_field_not_by_its_reason() -> None:
    assert metrics.reason_label(event(EventKind.RELEASE, "handed off", handoff=True)) == "handoff"
    assert metrics.reason_label(event(EventKind.RELEASE, "lost the race for it to w2", handoff=True)) == "handoff"
    assert metrics.reason_label(event(EventKind.RELEASE, "handed off")) == "other"  # a reason alone is no handoff


def test_an_event_counts_by_kind_by_reason_and_as_a_steal_or_an_expiry() -> None:
    steals, expiries = value("leaseboard_steals_total"), value("leaseboard_lease_expirations_total")
    by_reason = value("leaseboard_ownership_changes_by_reason_total", kind="steal", reason="handoff_timeout")

    metrics.observe_event(event(EventKind.STEAL, "w1 did not hand over within 30s"))
    metrics.observe_event(event(EventKind.EXPIRE, "lease of w1 not renewed for 31.2s (expiry 30s)"))

    assert value("leaseboard_steals_total") == steals + 1
    assert value("leaseboard_lease_expirations_total") == expiries + 1
    after = value("leaseboard_ownership_changes_by_reason_total", kind="steal", reason="handoff_timeout")
    assert after == by_reason + 1


async def test_an_instrumented_store_counts_each_call_by_operation_and_outcome() -> None:
    memory = MemoryStore()
    stores = instrument(Stores(memory, memory, memory))
    # One wrapper per store (compared by id: the fields' types are three different protocols).
    assert id(stores.ownership) == id(stores.checkpoints) == id(stores.controls)

    def count(operation: str, outcome: str) -> float:
        return value("leaseboard_store_requests_total", operation=operation, outcome=outcome)

    claims, lost = count("claim_ownership", "ok"), count("update_checkpoint", "lost")
    down = count("list_ownership", "unavailable")
    await stores.ownership.claim_ownership([OwnershipRecord(REF, "0", "w1")])
    with pytest.raises(OwnershipLost):
        await stores.checkpoints.update_checkpoint(Checkpoint(REF, "0", 3), "w2")
    # Reaches the wrapped store, as tests and the simulator expect (InstrumentedStore.__setattr__, at run
    # time only: the type checker knows just the protocol's methods).
    stores.ownership.down = True  # type: ignore[attr-defined]
    with pytest.raises(StoreUnavailable):
        await stores.ownership.list_ownership(REF)

    assert memory.down is True
    assert (count("claim_ownership", "ok"), count("update_checkpoint", "lost")) == (claims + 1, lost + 1)
    assert count("list_ownership", "unavailable") == down + 1
    assert value("leaseboard_store_request_duration_seconds_count", operation="claim_ownership") >= 1
