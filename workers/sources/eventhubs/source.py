"""``EventHubsSource``: one event hub and consumer group as a ``workers.sources.base.EventSource``.

The connection string, the consumer group and the prefetch are given (``workers.wiring`` reads
them from the settings: ``EVENTHUB_CONNECTION_STRING``, ``LEASEBOARD_CONSUMER_GROUP``,
``EVENTHUB_PREFETCH``; the source reads no environment). The string is checked, and the hub is
asked for its partition ids, when the source is built, so a wrong string, a rejected key or an
unknown hub is one clear ``EventHubsConfigError`` at start.

Lag. Readers ask the service to attach the partition's last-enqueued properties to every delivery
(``track_last_enqueued_event_properties``); ``properties`` answers from those while a reader of this
source has fresh ones, and asks the service otherwise.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Callable

from azure.eventhub import parse_connection_string
from azure.eventhub.exceptions import AuthenticationError

from workers.sources.base import Browsed, PartitionProperties, Position, Start
from workers.sources.eventhubs.browse import browse_with
from workers.sources.eventhubs.errors import (
    CONNECTION_STRING_FORMAT,
    ENV_CONNECTION_STRING,
    EventHubsConfigError,
    Redactor,
)
from workers.sources.eventhubs.reader import EventHubsReader
from workers.sources.eventhubs.sdk import (
    ClientFactory,
    LastEnqueued,
    properties,
    sdk_client,
    sdk_probe_client,
    starting_position,
)

log = logging.getLogger("leaseboard.eventhubs")

DEFAULT_PREFETCH = 20  # events per read (the link credit; setting EVENTHUB_PREFETCH); see reader.py on latency


class EventHubsSource:
    """Implements ``workers.sources.base.EventSource`` on one event hub and consumer group.

    ``owner_level`` is the epoch of every reader (None: non-exclusive receivers, which the service
    never cuts off: two owners of one partition would both read it). ``owner_id`` only labels
    threads and messages. Raises EventHubsConfigError as described in the module docstring."""

    def __init__(
        self,
        hub: str,
        *,
        connection_string: str = "",
        consumer_group: str = "$Default",
        owner_level: int | None = 0,
        owner_id: str | None = None,
        refresh_seconds: float = 5.0,
        tracked_max_age: float = 5.0,
        queue_events: int = 300,
        prefetch: int = DEFAULT_PREFETCH,
        client_factory: ClientFactory = sdk_client,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if owner_level is not None and (isinstance(owner_level, bool) or not isinstance(owner_level, int)):
            raise TypeError(f"owner_level must be a whole number or None, got {owner_level!r}")
        if queue_events < 1:
            raise ValueError(f"queue_events must be at least 1, got {queue_events}")
        self._prefetch = prefetch
        if isinstance(self._prefetch, bool) or not isinstance(self._prefetch, int) or self._prefetch < 1:
            raise ValueError(f"prefetch must be a whole number of at least 1, got {self._prefetch!r}")
        self._connection_string = connection_string.strip()
        self._redact = Redactor(self._connection_string)
        self.hub = hub
        self.consumer_group = consumer_group or "$Default"
        self.namespace = self._check_connection_string()
        self.owner_level = owner_level
        self.owner_id = owner_id
        self._refresh_seconds = refresh_seconds
        self._tracked_max_age = tracked_max_age
        self._queue_events = queue_events
        self._factory = client_factory
        self._clock = clock
        self._lock = threading.Lock()  # one management request at a time on the shared client
        self._ids: tuple[str, ...] | None = None
        self._ids_at = 0.0
        self._ids_failing = False
        self._properties: dict[str, tuple[float, PartitionProperties]] = {}
        self._tracked: dict[str, tuple[float, LastEnqueued]] = {}
        self._readers: weakref.WeakSet[EventHubsReader] = weakref.WeakSet()
        self._open()

    # -- the EventSource protocol ------------------------------------------------------------------

    def partition_ids(self) -> tuple[str, ...]:
        """The hub's partition ids, asked of the service at most every ``refresh_seconds``. While
        the service cannot be asked, the last answer (partitions are never removed, so it is a
        true subset) with a warning at the first failure."""
        now = self._clock()
        if self._ids is not None and now - self._ids_at < self._refresh_seconds:
            return self._ids
        if self._ids is not None and self._lock.locked():
            # A refresh is under way, perhaps hanging in a network cut until the SDK gives up (15 s and
            # more): the last answer meanwhile, not a wait behind it (a pump opening a reader just after
            # the heal waited 3 s for it in the partition suite).
            return self._ids
        try:
            ids = self._fetch_ids()
        except Exception as exc:
            if self._ids is None:
                raise
            if not self._ids_failing:
                log.warning(
                    "event hub %s: cannot refresh partition ids (%s); using the last %d",
                    self.hub,
                    self._redact(exc),
                    len(self._ids),
                )
            self._ids_failing, self._ids_at = True, now
            return self._ids
        if self._ids is not None and len(ids) > len(self._ids):
            log.info("event hub %s grew from %d to %d partitions", self.hub, len(self._ids), len(ids))
        self._ids, self._ids_at, self._ids_failing = ids, now, False
        return ids

    def properties(self, partition_id: str) -> PartitionProperties:
        """The partition's properties: from a reader's tracked last-enqueued event when that was
        delivered within ``tracked_max_age`` and is not behind the service's last answer (which
        gives the beginning sequence number), else asked of the service. Raises ValueError for an
        unknown partition, the SDK's EventHubError when the service cannot answer."""
        self._check_partition(partition_id)
        now = self._clock()
        asked = self._properties.get(partition_id)
        tracked = self._tracked.get(partition_id)
        # A delivery's annotation may predate the last answer (events wait in the SDK's buffer and
        # our queue): last-enqueued sequence numbers only grow, so the smaller one is the stale one.
        if (
            asked is not None
            and tracked is not None
            and now - tracked[0] <= self._tracked_max_age
            and tracked[1].sequence_number >= asked[1].last_enqueued_sequence_number
        ):
            last = tracked[1]
            return PartitionProperties(
                partition_id=partition_id,
                begin_sequence_number=asked[1].begin_sequence_number,
                last_enqueued_sequence_number=last.sequence_number,
                last_enqueued_offset=last.offset,
                last_enqueued_time=last.enqueued_time,
                is_empty=False,  # the service has just delivered an event of it
            )
        with self._lock:
            raw = self._client.get_partition_properties(partition_id)
        props = properties(partition_id, raw)
        self._properties[partition_id] = (self._clock(), props)
        return props

    def reader(self, partition_id: str, position: Position) -> EventHubsReader:
        """A reader of ``partition_id`` starting after ``position``, on a client of its own.
        Raises ValueError for an unknown partition, TypeError for a position of another type."""
        if not isinstance(position, Position):
            raise TypeError(f"position must be a workers.sources.base.Position, got {type(position).__name__}")
        self._check_partition(partition_id)
        reader = EventHubsReader(
            self._factory(self._connection_string, self.hub, self.consumer_group),
            hub=self.hub,
            partition_id=partition_id,
            starting_position=starting_position(position),
            owner_level=self.owner_level,
            owner_id=self.owner_id,
            consumer_group=self.consumer_group,
            queue_events=self._queue_events,
            prefetch=self._prefetch,
            on_tracked=self._note_tracked,
        )
        self._readers.add(reader)
        return reader

    def browse(
        self,
        partition_id: str,
        start: Start,
        max_events: int,
        max_bytes: int,
        *,
        until: int | None = None,
        consumer_group: str | None = None,
    ) -> list[Browsed]:
        """A bounded read that takes nothing (``workers.sources.base.Browsing``, ``browse.py``), on a
        client of its own, as ``consumer_group`` (None: this source's). Raises ValueError for an
        unknown partition, ConnectionError (the SDK's error, redacted) when the hub cannot be read."""
        self._check_partition(partition_id)
        client = self._factory(self._connection_string, self.hub, consumer_group or self.consumer_group)
        try:
            return browse_with(client, partition_id, start, max_events, max_bytes, until)
        except Exception as exc:  # said without the key, and never a ValueError (that is the caller's mistake)
            raise ConnectionError(f"{type(exc).__name__}: {self._redact(exc)}") from None

    def probe(self) -> None:
        """Asks the hub for its partition ids on a client of its own, made for this probe and closed after
        it (not the shared one, whose lock a request hanging in a network cut holds; with no retries, so
        an unreachable hub fails it in about a second): returns once answered, raises what the SDK raised.
        ``workers.runtime.hubwatch`` asks it once the worker's readers have gone quiet."""
        factory = sdk_probe_client if self._factory is sdk_client else self._factory
        client = factory(self._connection_string, self.hub, self.consumer_group)
        try:
            client.get_partition_ids()
        finally:
            with contextlib.suppress(Exception):
                client.close()

    def close(self) -> None:
        """Closes every reader of this source and the management client."""
        for reader in list(self._readers):
            reader.close()
        try:
            self._client.close()
        except Exception as exc:  # closing a half-broken connection must not mask why we close
            log.warning("event hub %s: closing the client failed: %s", self.hub, self._redact(exc))

    def __enter__(self) -> EventHubsSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- inside ------------------------------------------------------------------------------------

    def _check_connection_string(self) -> str:
        """The namespace's host name. Raises EventHubsConfigError."""
        if not self._connection_string:
            raise EventHubsConfigError(
                f"{ENV_CONNECTION_STRING} is not set; --source eventhubs needs the connection string of the"
                f" Event Hubs namespace or hub: {CONNECTION_STRING_FORMAT}"
            )
        try:
            parsed = parse_connection_string(self._connection_string)
        except Exception as exc:
            raise EventHubsConfigError(
                f"{ENV_CONNECTION_STRING} is not a valid Event Hubs connection string ({self._redact(exc)});"
                f" expected {CONNECTION_STRING_FORMAT}"
            ) from None
        if parsed.eventhub_name and parsed.eventhub_name != self.hub:
            raise EventHubsConfigError(
                f"{ENV_CONNECTION_STRING} is for event hub {parsed.eventhub_name!r} (EntityPath) but the hub to"
                f" read is {self.hub!r}; set --hub or LEASEBOARD_HUB to {parsed.eventhub_name!r}, or use a"
                " namespace-level connection string"
            )
        return parsed.fully_qualified_namespace

    def _open(self) -> None:
        """Makes the management client and asks the hub for its partition ids. Raises EventHubsConfigError."""
        try:
            self._client = self._factory(self._connection_string, self.hub, self.consumer_group)
            self._ids = self._fetch_ids()
        except AuthenticationError as exc:
            raise EventHubsConfigError(
                f"Event Hubs namespace {self.namespace} refused the credentials of {ENV_CONNECTION_STRING} for"
                f" event hub {self.hub!r}: {self._redact(exc)}"
            ) from None
        except Exception as exc:
            raise EventHubsConfigError(
                f"cannot read event hub {self.hub!r} in namespace {self.namespace} (consumer group"
                f" {self.consumer_group!r}): {type(exc).__name__}: {self._redact(exc)}"
            ) from None
        self._ids_at = self._clock()
        log.info(
            "event hub %s/%s: %d partitions, consumer group %r",
            self.namespace,
            self.hub,
            len(self._ids),
            self.consumer_group,
        )

    def _fetch_ids(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(str(pid) for pid in self._client.get_partition_ids())

    def _check_partition(self, partition_id: str) -> None:
        if not isinstance(partition_id, str):
            raise TypeError(f"partition ids are strings like '0', got {partition_id!r}")
        ids = self.partition_ids()
        if partition_id not in ids and self._clock() - self._ids_at >= 1.0:
            self._ids_at = float("-inf")  # it may have just been added: ask once more, at most every second
            ids = self.partition_ids()
        if partition_id not in ids:
            raise ValueError(f"event hub {self.hub!r} has no partition {partition_id!r}; its ids are {', '.join(ids)}")

    def _note_tracked(self, partition_id: str, last: LastEnqueued) -> None:
        self._tracked[partition_id] = (self._clock(), last)
