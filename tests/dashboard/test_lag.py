"""The Burrow-style partition status over a window of samples (``dashboard/live/lag.py``), rule by rule."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from dashboard.live.lag import Rules, Sample, Status, Window, lag_seconds

RULES = Rules(size=4, stop_seconds=60.0)


def judge(
    rows: Sequence[tuple[int | None, int | None]],
    modified: float | None = None,
    every: float = 5.0,
    rules: Rules = RULES,
) -> Status | None:
    """The status after samples of (checkpointed sequence number, lag), ``every`` seconds apart from t=1000.
    The checkpoint's last write is ``modified``, else the time of the sample where it last moved."""
    window = Window(rules)
    status = None
    written: float | None = None
    last: int | None = None
    for i, (sequence, lag) in enumerate(rows):
        at = 1000.0 + i * every
        if sequence is not None and sequence != last:
            written = at
        last = sequence
        status = window.add(Sample(at, sequence, modified if modified is not None else written, lag))
    return status


def test_no_lag_now_is_ok_whatever_came_before() -> None:
    assert judge([(10, 5), (10, 9), (10, 12), (22, 0)]) is Status.OK


def test_a_checkpoint_that_went_backwards_is_rewind_even_without_lag() -> None:
    assert judge([(100, 3), (120, 2), (40, 0)]) is Status.REWIND


def test_rewind_lasts_until_it_leaves_the_window() -> None:
    rows = [(100, 3), (40, 60), (45, 55), (50, 50), (55, 45)]  # the drop is at the second sample

    assert judge(rows[:4]) is Status.REWIND
    assert judge(rows) is Status.OK  # the window (4) no longer holds the sample before the drop


def test_a_frozen_checkpoint_with_lag_in_every_sample_of_a_full_window_is_stall() -> None:
    assert judge([(50, 5), (50, 8), (50, 12), (50, 15)]) is Status.STALL


def test_a_frozen_checkpoint_is_ok_until_the_window_is_full() -> None:
    assert judge([(50, 5), (50, 8), (50, 12)]) is Status.OK


def test_a_frozen_checkpoint_is_ok_if_the_lag_was_zero_in_the_window() -> None:
    assert judge([(50, 0), (50, 8), (50, 12), (50, 15)]) is Status.OK


def test_no_checkpoint_written_for_the_stop_period_is_stop() -> None:
    # Written at t=900, then nothing: at t=1015 that is 115 s, beyond stop_seconds (60).
    assert judge([(50, 5), (50, 8), (50, 12), (50, 15)], modified=900.0) is Status.STOP


def test_stop_comes_before_the_window_is_full() -> None:
    assert judge([(50, 5), (50, 8)], modified=900.0) is Status.STOP


def test_a_partition_never_checkpointed_is_stop_once_it_had_lag_for_the_stop_period() -> None:
    rows: list[tuple[int | None, int | None]] = [(None, 3)] * 13  # 60 s of samples 5 s apart

    assert judge(rows[:12]) is Status.STALL  # 55 s: frozen (no checkpoint) for a full window
    assert judge(rows) is Status.STOP


def test_growing_lag_while_the_checkpoint_moves_is_warn() -> None:
    assert judge([(10, 5), (12, 8), (14, 8), (16, 11)]) is Status.WARN


def test_lag_that_went_down_once_in_the_window_is_ok() -> None:
    assert judge([(10, 5), (12, 8), (20, 4), (22, 11)]) is Status.OK


def test_lag_that_stayed_level_is_not_warn() -> None:
    assert judge([(10, 5), (12, 5), (14, 5), (16, 5)]) is Status.OK


def test_an_unknown_lag_has_no_status() -> None:
    assert judge([(10, 5), (12, None)]) is None


@pytest.mark.parametrize(
    ("last", "checkpointed", "lag", "expected"),
    [
        (105.0, 100.0, 3, 5.0),
        (105.0, 100.0, 0, 0.0),
        (105.0, None, 3, None),
        (None, 100.0, 3, None),
        (99.0, 100.0, 1, 0.0),
    ],
)
def test_lag_in_seconds_is_newest_minus_checkpointed_enqueued_time(
    last: float | None, checkpointed: float | None, lag: int, expected: float | None
) -> None:
    assert lag_seconds(last, checkpointed, lag) == expected


def test_rules_refuse_a_window_of_one() -> None:
    with pytest.raises(ValueError, match="at least 2 samples"):
        Rules(size=1)
