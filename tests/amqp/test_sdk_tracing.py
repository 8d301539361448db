"""Microsoft's ``EventHubProducerClient`` with Azure's tracing on sends to the embedded hub over AMQP;
a real ``runworkers`` process handles the events, reading the hub's files (``--source embedded``) or,
as it reads Azure Event Hubs, through Microsoft's consumer over AMQP (``--source eventhubs``), and its
``process`` spans are children of the contexts the SDK put on them (``traceparent``). Both export to
a real OTLP/HTTP receiver."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.amqp.conftest import Served, new_hub
from tests.support.otlp import Received, collector
from tests.support.processes import ROOT, Processes, manage, migrated_sqlite

pytestmark = pytest.mark.slow
COUNT = 4


@pytest.fixture(name="env")
def env_fixture(tmp_path: Path, django_db_blocker: Any) -> Iterator[dict[str, str]]:
    """A worker's environment on a migrated SQLite file (entered outside the event loop: see ``migrated_sqlite``)."""
    with migrated_sqlite(tmp_path, django_db_blocker, partitions=4) as (env, _):
        yield env


@pytest.mark.parametrize("source", ["embedded", "eventhubs"])
async def test_a_worker_s_span_continues_the_trace_microsoft_s_producer_put_on_the_event(
    served: Served, tmp_path: Path, env: dict[str, str], source: str
) -> None:
    hub = new_hub(served)
    hub.close()
    with collector() as otlp:
        otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        sender = [sys.executable, "-m", "tests.amqp.traced_producer", served.connection_string, hub.name, str(COUNT)]
        subprocess.run(sender, cwd=ROOT, env={**env, **otel}, check=True, timeout=120, capture_output=True)
        produced = [s for s in otlp.spans(service="sdk-producer") if s.kind == "producer"]
        sdk_contexts = {(s.trace_id, s.span_id) for s in produced}
        assert len(sdk_contexts) >= COUNT, otlp.spans()

        processes = Processes(tmp_path)
        command = manage(
            *("runworkers", "--count", "1", "--store", "sql", "--source", source, "--hub", hub.name),
            *("--interval", "0.5", "--expiry", "3", "--handler", "tests.workers.traced_handlers.one"),
            *("--checkpoint-seconds", "0.5"),
        )
        worker_env = {**env, **otel, "LEASEBOARD_HUB_DIR": str(served.root), "OTEL_SERVICE_NAME": "sdk-workers"}
        if source == "eventhubs":
            worker_env["EVENTHUB_CONNECTION_STRING"] = served.connection_string
        processes.spawn("workers", command, worker_env)
        try:

            def handled() -> list[Received] | None:
                spans = otlp.spans(f"process {hub.name}", service="sdk-workers")
                return spans if len(spans) >= COUNT else None

            spans = await processes.until(handled, 60, "a process span per event sent by the SDK")
        finally:
            processes.kill_all()
    assert len(spans) == COUNT
    assert {(s.trace_id, s.parent_span_id) for s in spans} <= sdk_contexts
    assert len({s.parent_span_id for s in spans}) == COUNT  # each event its own context
    assert len({s.trace_id for s in spans}) == 1  # all under the test's "traced send"
    assert {s.attributes["messaging.destination.partition.id"] for s in spans} == {"0"}
