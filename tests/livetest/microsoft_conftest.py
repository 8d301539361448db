"""Our fixture layer for Microsoft's azure-eventhub live tests, copied beside them as ``conftest.py``.

It stands in for the conftest of the SDK's source distribution, which creates an event hub in an
Azure subscription through the management plane. Here every test gets a fresh hub of the ``runhub``
whose connection string is in ``LIVETEST_CONNECTION_STRING`` (the hub is created in the directory
``LIVETEST_HUB_DIR`` that ``runhub`` serves), and where the SDK's tests ask for an Entra credential
they get a named-key credential for runhub's key.

The clients speak TLS, as they do to Azure: ``runhub`` serves AMQPS on port 5671 (the only port the
SDK uses with TLS) of a loopback address of its own, with a certificate made for this run by a CA
made for this run (``LIVETEST_CA_FILE``). Tests that take ``client_args`` get
``connection_verify=<that CA>``; for the clients a test builds without them, the CA is added to the
trust store the SDK uses by default (certifi's bundle, as ``LIVETEST_TRUST_FILE``), as an operator
adds a private CA to a machine's trust store. No client runs with TLS off.

Tests an emulator cannot pass are deselected here, through ``tests.livetest.not_applicable`` (the
one list, each with its reason); their node ids go to ``LIVETEST_DESELECTED`` for the summary.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import certifi
import pytest
from azure.core.credentials import AzureNamedKeyCredential
from azure.core.settings import settings
from azure.eventhub import EventHubProducerClient, TransportType
from azure.eventhub._pyamqp import ReceiveClient
from azure.eventhub._pyamqp.authentication import SASTokenAuth
from tracing_common import FakeSpan  # type: ignore[import-not-found]

from tests.livetest.not_applicable import reason_for
from tests.livetest.schedule import is_long, slow_first
from workers.hub.embedded import EmbeddedHub

PARTITION_COUNT = 2
CONN_STR = "Endpoint=sb://{}/;SharedAccessKeyName={};SharedAccessKey={};EntityPath={}"
CLIENT_ARGS: dict[str, Any] = {"connection_verify": os.environ["LIVETEST_CA_FILE"]}  # the SDK clients' keywords
# certifi's public authorities and runhub's CA: what the SDK trusts when a test names no CA file.
certifi.where = lambda: os.environ["LIVETEST_TRUST_FILE"]


def _runhub() -> dict[str, str]:
    text = os.environ["LIVETEST_CONNECTION_STRING"]
    parts = dict(part.split("=", 1) for part in text.split(";") if part)
    return {
        "connection_string": text,
        "hostname": parts["Endpoint"].removeprefix("sb://").rstrip("/"),
        "key_name": parts["SharedAccessKeyName"],
        "access_key": parts["SharedAccessKey"],
    }


RUNHUB = _runhub()


_record_times = True


def pytest_configure(config: pytest.Config) -> None:
    global _record_times
    for marker in ("live", "liveTest", "no_amqpproxy"):
        config.addinivalue_line("markers", f"{marker}: a marker of Microsoft's suite")
    # Under xdist the controller hears of every test too: only the process that ran it records it.
    _record_times = hasattr(config, "workerinput") or not config.getoption("numprocesses", None)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--sleep", action="store", default="True", help="sleep on reconnect test: True or False")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept: list[pytest.Item] = []
    deselected: list[pytest.Item] = []
    for item in items:
        (deselected if reason_for(item.nodeid) else kept).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
    # suite.py runs the tests that take minutes (schedule.LONG) in a pytest of their own
    # (LIVETEST_PART=long), a worker each, beside the rest (LIVETEST_PART=rest), slow ones first.
    part = os.environ.get("LIVETEST_PART")
    if part in ("long", "rest"):
        kept = [item for item in kept if is_long(item.nodeid) == (part == "long")]
    kept.sort(key=lambda item: slow_first(item.nodeid, item.name))
    items[:] = kept
    target = os.environ.get("LIVETEST_DESELECTED")
    if target:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        Path(f"{target}.{part}.{worker}").write_text(json.dumps(sorted(item.nodeid for item in deselected)))


_started: dict[str, float] = {}


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    _started[nodeid] = time.time()


def pytest_runtest_logfinish(nodeid: str, location: object) -> None:
    """Each test's start and end (wall clock), for suite.py's account of where the time went."""
    target = os.environ.get("LIVETEST_TIMES")
    if target and _record_times and nodeid in _started:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(f"{target}.{worker}", "a") as out:
            out.write(json.dumps({"nodeid": nodeid, "start": _started.pop(nodeid), "end": time.time()}) + "\n")


# -- the hub of each test ---------------------------------------------------------------------------


@pytest.fixture
def live_eventhub() -> Iterator[dict[str, str]]:
    name = f"eh{uuid.uuid4().hex[:16]}"
    EmbeddedHub(os.environ["LIVETEST_HUB_DIR"], name, partitions=PARTITION_COUNT).close()
    yield {
        "resource_group": "leaseboard",
        "hostname": RUNHUB["hostname"],
        "key_name": RUNHUB["key_name"],
        "access_key": RUNHUB["access_key"],
        "namespace": RUNHUB["hostname"],
        "event_hub": name,
        "consumer_group": "$Default",
        "partition": "0",
        "connection_str": f"{RUNHUB['connection_string'].rstrip(';')};EntityPath={name}",
    }


def _with_key(live_eventhub: dict[str, str], key_name: str, key: str) -> str:
    return CONN_STR.format(live_eventhub["hostname"], key_name, key, live_eventhub["event_hub"])


@pytest.fixture
def connection_str(live_eventhub: dict[str, str]) -> str:
    return live_eventhub["connection_str"]


@pytest.fixture
def invalid_hostname(live_eventhub: dict[str, str]) -> str:
    return CONN_STR.format(
        "invalid123.servicebus.windows.net",
        live_eventhub["key_name"],
        live_eventhub["access_key"],
        live_eventhub["event_hub"],
    )


@pytest.fixture
def invalid_key(live_eventhub: dict[str, str]) -> str:
    return _with_key(live_eventhub, live_eventhub["key_name"], "invalid")


@pytest.fixture
def invalid_policy(live_eventhub: dict[str, str]) -> str:
    return _with_key(live_eventhub, "invalid", live_eventhub["access_key"])


@pytest.fixture
def client_args() -> dict[str, Any]:
    return dict(CLIENT_ARGS)


@pytest.fixture(scope="session")
def uamqp_transport() -> bool:
    return False  # uamqp is retired; the SDK's own pure-Python AMQP stack only


@pytest.fixture(scope="session", params=[TransportType.Amqp, TransportType.AmqpOverWebsocket], ids=["amqp", "ws"])
def socket_transport(request: pytest.FixtureRequest) -> TransportType:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def timeout_factor() -> int:
    return 1


@pytest.fixture
def sleep(request: pytest.FixtureRequest) -> bool:
    return str(request.config.getoption("--sleep")).lower() in ("true", "yes", "1", "y")


@pytest.fixture(scope="session")
def fake_span() -> type:
    return FakeSpan  # type: ignore[no-any-return]


@pytest.fixture
def enable_tracing(fake_span: type) -> Iterator[type]:
    settings.tracing_implementation.set_value(fake_span)
    yield fake_span
    settings.tracing_implementation.set_value(None)


# -- credentials: runhub's named key where Microsoft's suite has Entra ------------------------------


def named_key(*args: Any, **kwargs: Any) -> AzureNamedKeyCredential:
    """What the suite's ``get_credential()`` returns here: runhub's shared access key by name."""
    return AzureNamedKeyCredential(RUNHUB["key_name"], RUNHUB["access_key"])


@pytest.fixture(scope="session")
def get_credential() -> Callable[..., AzureNamedKeyCredential]:
    return named_key


@pytest.fixture(scope="session")
def get_credential_async() -> Callable[..., AzureNamedKeyCredential]:
    return partial(named_key, is_async=True)


@pytest.fixture
def auth_credentials(live_eventhub: dict[str, str]) -> tuple[str, str, Callable[..., AzureNamedKeyCredential]]:
    return live_eventhub["hostname"], live_eventhub["event_hub"], named_key


@pytest.fixture
def auth_credentials_async(live_eventhub: dict[str, str]) -> tuple[str, str, Callable[..., AzureNamedKeyCredential]]:
    return live_eventhub["hostname"], live_eventhub["event_hub"], partial(named_key, is_async=True)


def _receivers(live_eventhub: dict[str, str], timeout: int) -> list[ReceiveClient]:
    receivers = []
    for p in range(PARTITION_COUNT):
        uri = f"sb://{live_eventhub['hostname']}/{live_eventhub['event_hub']}"
        source = (
            f"amqps://{live_eventhub['hostname']}/{live_eventhub['event_hub']}/ConsumerGroups/"
            f"{live_eventhub['consumer_group']}/Partitions/{p}"
        )
        auth = SASTokenAuth(uri, uri, live_eventhub["key_name"], live_eventhub["access_key"])
        receiver = ReceiveClient(
            live_eventhub["hostname"],
            source,
            auth=auth,
            network_trace=False,
            timeout=timeout,
            link_credit=500,
            **CLIENT_ARGS,
        )
        receiver.open()
        receivers.append(receiver)
    return receivers


@pytest.fixture
def connstr_receivers(live_eventhub: dict[str, str]) -> Iterator[tuple[str, list[ReceiveClient]]]:
    receivers = _receivers(live_eventhub, 0)
    yield live_eventhub["connection_str"], receivers
    for r in receivers:
        r.close()


@pytest.fixture
def auth_credential_receivers(live_eventhub: dict[str, str]) -> Iterator[tuple[Any, ...]]:
    receivers = _receivers(live_eventhub, 30)
    yield live_eventhub["hostname"], live_eventhub["event_hub"], named_key, receivers
    for r in receivers:
        r.close()


@pytest.fixture
def auth_credential_receivers_async(live_eventhub: dict[str, str]) -> Iterator[tuple[Any, ...]]:
    receivers = _receivers(live_eventhub, 30)
    yield live_eventhub["hostname"], live_eventhub["event_hub"], partial(named_key, is_async=True), receivers
    for r in receivers:
        r.close()


def _senders(live_eventhub: dict[str, str]) -> tuple[EventHubProducerClient, list[Any]]:
    client = EventHubProducerClient(
        fully_qualified_namespace=live_eventhub["hostname"],
        eventhub_name=live_eventhub["event_hub"],
        credential=named_key(),
        **CLIENT_ARGS,
    )
    return client, [client._create_producer(partition_id=p) for p in client.get_partition_ids()]


@pytest.fixture
def auth_credential_senders(live_eventhub: dict[str, str]) -> Iterator[tuple[Any, ...]]:
    client, senders = _senders(live_eventhub)
    yield live_eventhub["hostname"], live_eventhub["event_hub"], named_key, senders
    for s in senders:
        s.close()
    client.close()


@pytest.fixture
def auth_credential_senders_async(live_eventhub: dict[str, str]) -> Iterator[tuple[Any, ...]]:
    client, senders = _senders(live_eventhub)
    yield live_eventhub["hostname"], live_eventhub["event_hub"], partial(named_key, is_async=True), senders
    for s in senders:
        s.close()
    client.close()
