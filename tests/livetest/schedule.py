"""How Microsoft's live tests are spread over pytest-xdist workers so the suite takes about as long
as its longest test.

The suite's wall time cannot go below its longest tests, and those are long by Microsoft's design:
they sleep past Event Hubs' idle timeout (220 s, 250 s) or wait out the SDK's retries and event
processor stops, several times over. Each of them gets a worker of its own from the start
(``LONG``: a pytest of their own, one test per worker, since xdist queues a second test on a worker
behind its first); the rest run beside them on the other workers, the slow ones first
(``SLOW_FIRST``), so that no slow test starts late and ends after the long ones.
"""

from __future__ import annotations

# Node ids (relative to the run folder) of the tests that take minutes against any hub, with why.
LONG: dict[str, str] = {
    "synctests/test_buffered_producer.py::test_long_sleep": "sleeps 220 s between sends",
    "asynctests/test_buffered_producer_async.py::test_long_sleep": "sleeps 220 s between sends",
    "synctests/test_reconnect.py::test_send_with_long_interval_sync": "sleeps 250 s, past the idle close",
    "asynctests/test_reconnect_async.py::test_send_with_long_interval_async": "sleeps 250 s, past the idle close",
    "asynctests/test_negative_async.py::test_client_invalid_credential_async": (
        "nine clients that must fail, each given 15 s and then the event processor's stop (about 5 min)"
    ),
}

# Name prefixes of the other tests that take a minute or so: run first, so none starts late.
SLOW_FIRST: tuple[str, ...] = (
    "test_receive_with_event_position",
    "test_send_with_invalid_hostname",
    "test_send_batch_with_invalid_hostname",
    "test_send_with_timing_configuration",
    "test_receive_owner_level",
)


def is_long(nodeid: str) -> bool:
    return nodeid.split("[", 1)[0] in LONG


def slow_first(nodeid: str, name: str) -> int:
    """A sort key: 0 for the slow tests of ``SLOW_FIRST``, 1 for the others (a stable sort keeps
    the order of each kind)."""
    return 0 if name.startswith(SLOW_FIRST) else 1
