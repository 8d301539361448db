"""``dashboard/live/delta.py``: deltas carry only changed fields, and applying one rebuilds the new state."""

from __future__ import annotations

from typing import Any

from dashboard.live.delta import apply, delta


def state(partitions: list[dict[str, Any]], workers: list[dict[str, Any]], **top: Any) -> dict[str, Any]:
    return {"generated_at": 1.0, "last_event_id": 0, "partitions": partitions, "workers": workers, **top}


def p(pid: str, owner: str | None = None, lag: int = 0) -> dict[str, Any]:
    return {"id": pid, "owner": owner, "lag": lag, "status": "owned" if owner else "unowned"}


def test_a_delta_lists_only_the_changed_fields_of_the_changed_partitions() -> None:
    old = state([p("0", "w1", 5), p("1", "w1", 0), p("2")], [{"id": "w1", "owned": 2}])
    new = state(
        [p("0", "w1", 7), p("1", "w2", 0), p("2")],
        [{"id": "w1", "owned": 1}, {"id": "w2", "owned": 1}],
        generated_at=2.0,
        last_event_id=9,
    )

    message = delta(old, new)

    assert message["partitions"] == [{"id": "0", "lag": 7}, {"id": "1", "owner": "w2"}]
    assert message["workers"] == [{"id": "w1", "owned": 1}, {"id": "w2", "owned": 1}]
    assert (message["generated_at"], message["last_event_id"]) == (2.0, 9)
    assert "order" not in message and "removed_partitions" not in message
    assert apply(old, message) == new


def test_added_and_removed_partitions_and_workers_carry_the_new_order() -> None:
    old = state([p("0"), p("1")], [{"id": "w1"}, {"id": "w2"}])
    new = state([p("0"), p("1"), p("2")], [{"id": "w2"}])

    message = delta(old, new)

    assert message["order"] == ["0", "1", "2"] and message["removed_workers"] == ["w1"]
    assert apply(old, message) == new


def test_an_unchanged_state_gives_an_empty_delta() -> None:
    same = state([p("0", "w1")], [{"id": "w1"}])

    message = delta(same, dict(same))

    assert message["partitions"] == [] and message["workers"] == []
