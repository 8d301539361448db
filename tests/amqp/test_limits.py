"""Azure Event Hubs' limits, as the embedded hub applies them: the idle timeout it advertises, five
receivers per partition and consumer group, and what a client is told when it goes past them.

Message and batch sizes: a batch here (the SDK sizes it by the link's 1 MiB max-message-size);
a raw transfer over it (``amqp:link:message-size-exceeded``) in ``test_bad_input``."""

from __future__ import annotations

import pytest
from azure.eventhub import EventData
from azure.eventhub.exceptions import EventHubError

from tests.support.waiting import until_sync
from workers.hub.amqp.consumer import MAX_RECEIVERS
from workers.hub.amqp.limits import Limits

from .conftest import Receiving, Served, consumer, new_hub, producer, start_receiving
from .rawclient import RawClient


def test_the_hub_advertises_azures_idle_timeout_of_120_seconds(served: Served) -> None:
    assert Limits().idle_timeout == 120.0 and served.server.limits.idle_timeout == 120.0
    client = RawClient(served.port)
    try:
        client.open()
        client.pump(lambda: client.conn.state & client.conn.REMOTE_ACTIVE, what="the server's open")
        assert client.transport.remote_idle_timeout == 120.0
    finally:
        client.close()


def test_five_receivers_share_a_partition_and_a_sixth_is_refused_as_azure_refuses_it(
    served: Served, receivers: list[Receiving]
) -> None:
    hub = new_hub(served, partitions=1)
    five = [start_receiving(consumer(served, hub.name), partition_id="0") for _ in range(MAX_RECEIVERS)]
    receivers.extend(five)
    # Five SDK clients connect, authorize and attach at once; on a loaded machine that takes a while.
    until_sync(
        lambda: len(served.owner_levels(hub.name, "0")) == 5,
        "five receivers to attach",
        30,
        detail=lambda: f"attached {served.owner_levels(hub.name, '0')}, errors {[r.errors for r in five]}",
    )
    sixth = start_receiving(consumer(served, hub.name, retry_total=0), partition_id="0")
    receivers.append(sixth)
    until_sync(lambda: sixth.errors, "the sixth receiver to be refused")
    error = sixth.errors[0]
    assert isinstance(error, EventHubError)
    assert "amqp:resource-limit-exceeded" in str(error) or "ResourceLimitExceeded" in repr(error.__dict__)
    assert "maximum number of allowed receivers per partition in a consumer group which is 5" in str(error)
    # Another consumer group has five of its own; an exclusive receiver displaces the five.
    other = start_receiving(consumer(served, hub.name, group="other"), partition_id="0")
    receivers.append(other)
    until_sync(lambda: len(served.owner_levels(hub.name, "0")) == 6, "a receiver of another consumer group")
    with producer(served, hub.name) as client:
        client.send_event(EventData(b"to all six"), partition_id="0")
    assert all(r.wait_for(1) for r in [*five, other])
    exclusive = start_receiving(consumer(served, hub.name), partition_id="0", owner_level=1)
    receivers.append(exclusive)
    until_sync(lambda: sorted(map(str, served.owner_levels(hub.name, "0"))) == ["1", "None"], "the exclusive one")
    assert sixth.events == []


def test_a_batch_is_held_to_azures_one_mebibyte_as_a_message_is(served: Served) -> None:
    hub = new_hub(served, partitions=1)
    with producer(served, hub.name) as client:
        # The SDK reads the limit from the link the hub attaches (max-message-size 1 MiB), as on Azure.
        with pytest.raises(ValueError, match="1048576"):
            client.create_batch(partition_id="0", max_size_in_bytes=1024 * 1024 + 1)
        batch = client.create_batch(partition_id="0")
        assert batch.max_size_in_bytes == 1024 * 1024
        for _ in range(3):
            batch.add(EventData(b"x" * (300 * 1024)))  # three of 300 KiB fit, a fourth does not
        with pytest.raises(ValueError):
            batch.add(EventData(b"x" * (300 * 1024)))
        client.send_batch(batch)
    assert hub.properties("0").last_enqueued_sequence_number == 2
