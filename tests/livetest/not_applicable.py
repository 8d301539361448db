"""The one list of Microsoft's azure-eventhub live tests that an emulator cannot pass, each with why.

Keys are node ids relative to the folder the suite runs in (``synctests/…``, ``asynctests/…``);
a key without ``[params]`` covers every parametrization of the test. Everything not listed here
runs, and must pass; the suite's summary line counts what this list takes out.
"""

from __future__ import annotations

_WS = "AMQP over WebSockets (runhub speaks AMQP on TCP only)"
_PROXY = "an HTTP proxy, which the SDK reaches through AMQP over WebSockets only"
_ARM = "the management plane: reads and changes the hub's retention through Azure Resource Manager"
_MS_SKIP = "marked skip by Microsoft itself ('not testing correctly + flaky')"

NOT_APPLICABLE: dict[str, str] = {
    "synctests/test_faultinjector.py::test_receive_partition_using_fault_injector_detach_after_delay": (
        "needs Microsoft's fault-injector binary (a TLS proxy that cuts links on cue), not distributed"
    ),
    "synctests/test_auth.py::test_client_with_ssl_context[ws]": _WS,
    "asynctests/test_auth_async.py::test_client_with_ssl_context_async[ws]": _WS,
    "synctests/test_send.py::test_send_over_websocket_sync": _WS,
    "asynctests/test_send_async.py::test_send_over_websocket_async": _WS,
    "synctests/test_receive.py::test_receive_over_websocket_sync": _WS,
    "asynctests/test_receive_async.py::test_receive_over_websocket_async": _WS,
    "synctests/test_send.py::test_send_with_create_event_batch_with_app_prop_sync": _WS,
    "asynctests/test_send_async.py::test_send_with_create_event_batch_async": _WS,
    "synctests/test_negative.py::test_invalid_proxy_server": _PROXY,
    "asynctests/test_negative_async.py::test_invalid_proxy_server": _PROXY,
    "synctests/test_consumer_client.py::test_receive_storage_checkpoint": _ARM,
    "asynctests/test_consumer_client_async.py::test_receive_storage_checkpoint_async": _ARM,
    "synctests/test_send.py::test_send_and_receive_large_body_size": (
        "skipped by Microsoft for its own AMQP stack outside *.servicebus.windows.net (their write-timeout issue"
        " 29177); 250 KB events: tests/amqp/test_sdk_sync.py::test_a_large_event_goes_through_intact"
    ),
    "synctests/test_negative.py::test_client_invalid_credential": (
        "AMQP over WebSockets: its last clients give custom_endpoint_address, which the SDK takes over WebSockets,"
        " and the sync WebSocket transport needs websocket-client, not installed (the async twin runs and passes)"
    ),
    "synctests/test_buffered_producer.py::test_long_wait_small_buffer": _MS_SKIP,
    "asynctests/test_buffered_producer_async.py::test_long_wait_small_buffer": _MS_SKIP,
}


def reason_for(nodeid: str) -> str | None:
    """Why the test ``nodeid`` is not applicable, or None if it must run."""
    base = nodeid.split("[", 1)[0]
    return NOT_APPLICABLE.get(nodeid) or NOT_APPLICABLE.get(base)
