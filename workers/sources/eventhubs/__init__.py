"""Azure Event Hubs as an event source (``--source eventhubs``), through azure-eventhub's sync client.

- ``source.py``: ``EventHubsSource``, the hub and consumer group (partition ids, properties, readers);
  the connection string is checked, and the hub asked for its partitions, when it is built.
- ``reader.py``: ``EventHubsReader``, one partition's receiver on a thread of its own (the SDK's
  consumer driven directly, without its event processor), bridged to ``receive(max_events)``
  through a bounded queue; exclusive (``owner_level``), so a partition that moves is cut off from
  its previous reader.
- ``errors.py``: our errors for the SDK's (``EventHubsConfigError``, ``ReaderFailed``,
  ``PartitionStolen``), and the redaction that keeps the shared access key out of every message.
- ``sdk.py``: the client protocol and its factory, the SDK's private per-partition consumer (checked
  before use, with ``receive_batch`` as the fallback), and the SDK's values turned into ours.
"""

from workers.sources.eventhubs.errors import EventHubsConfigError, PartitionStolen, ReaderFailed, is_stolen
from workers.sources.eventhubs.reader import EventHubsReader
from workers.sources.eventhubs.sdk import ClientFactory, ConsumerClient, sdk_client
from workers.sources.eventhubs.source import EventHubsSource

__all__ = [
    "ClientFactory",
    "ConsumerClient",
    "EventHubsConfigError",
    "EventHubsReader",
    "EventHubsSource",
    "PartitionStolen",
    "ReaderFailed",
    "is_stolen",
    "sdk_client",
]
