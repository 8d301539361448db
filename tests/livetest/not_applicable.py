"""The one list of Microsoft's azure-eventhub live tests that an emulator cannot pass, each with why.

Keys are node ids relative to the folder the suite runs in (``synctests/…``, ``asynctests/…``);
a key without ``[params]`` covers every parametrization of the test. Everything not listed here
runs, and must pass; the suite's summary line counts what this list takes out.
"""

from __future__ import annotations

_TLS = "checks TLS certificates (a bad CA file must fail, certifi's must pass) and AMQP over WebSockets"
_WS = "AMQP over WebSockets (runhub speaks AMQP on TCP only)"
_PROXY = "an HTTP proxy, which the SDK reaches through AMQP over WebSockets only"
_ARM = "the management plane: reads and changes the hub's retention through Azure Resource Manager"

NOT_APPLICABLE: dict[str, str] = {
    "synctests/test_faultinjector.py::test_receive_partition_using_fault_injector_detach_after_delay": (
        "needs Microsoft's fault-injector binary (a TLS proxy that cuts links on cue), not distributed"
    ),
    "synctests/test_auth.py::test_client_with_ssl_context": _TLS,
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
    # TLS where the test does not pass our client arguments on (so use_tls=False never reaches the client):
    "synctests/test_properties.py::test_get_partition_properties": (
        "TLS: the test hands its client_args to the client as one keyword argument, so the client connects with TLS"
    ),
    "asynctests/test_reconnect_async.py::test_send_connection_idle_timeout_and_reconnect_async": (
        "TLS: its second client (the one with retries) is built without client_args, so it connects with TLS"
    ),
    "synctests/test_reconnect.py::test_send_with_long_interval_sync": (
        "TLS: after its sends (which pass, across the idle close), it builds its receiver without client_args"
    ),
    "asynctests/test_reconnect_async.py::test_send_with_long_interval_async": (
        "TLS: after its sends (which pass, across the idle close), it builds its receiver without client_args"
    ),
    "synctests/test_send.py::test_send_amqp_annotated_message": (
        "TLS: after its sends, it builds its consumer without client_args (the async twin runs and passes)"
    ),
    "synctests/test_negative.py::test_client_invalid_credential": (
        "TLS certificate checks: its last clients pass connection_verify='cacert.pem' and expect the CA file error"
    ),
    "asynctests/test_negative_async.py::test_client_invalid_credential_async": (
        "TLS certificate checks: its last clients pass connection_verify='cacert.pem' and expect the CA file error"
    ),
    "synctests/test_send.py::test_send_and_receive_large_body_size": (
        "skipped by Microsoft for its own AMQP stack outside *.servicebus.windows.net (their write-timeout issue"
        " 29177); 250 KB events: tests/amqp/test_sdk_sync.py::test_a_large_event_goes_through_intact"
    ),
    "asynctests/test_auth_async.py::test_client_with_ssl_context_async": _TLS,
    "synctests/test_buffered_producer.py::test_long_wait_small_buffer": (
        "marked skip by Microsoft itself ('not testing correctly + flaky')"
    ),
    "asynctests/test_buffered_producer_async.py::test_long_wait_small_buffer": (
        "marked skip by Microsoft itself ('not testing correctly + flaky')"
    ),
}


def reason_for(nodeid: str) -> str | None:
    """Why the test ``nodeid`` is not applicable, or None if it must run."""
    base = nodeid.split("[", 1)[0]
    return NOT_APPLICABLE.get(nodeid) or NOT_APPLICABLE.get(base)
