"""The one fake clock: seconds that move only when a test says so.

Pass the clock itself where code takes ``clock`` or ``monotonic`` (a ``Callable[[], float]``);
``advance`` moves it. It starts at a plausible wall-clock time, so the same object serves as both.
"""

from __future__ import annotations

EPOCH = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC


class FakeClock:
    """Time that moves only when a test says so."""

    def __init__(self, start: float = EPOCH) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
