"""workers.wiring: stores and the event publisher come from settings, by dotted path."""

from __future__ import annotations

import pytest
from django.conf import LazySettings
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command

from balancer.lease import Coordinator
from balancer.model import BalancerEvent, EventKind, HubRef
from balancer.race.coordinator import RaceCoordinator
from balancer.race.times import RaceTimes
from balancer.stores.memory import MemoryStore
from balancer.strategies import get_strategy
from tests.support.waiting import until_sync
from workers.sources.base import PartitionProperties, PartitionReader, Position
from workers.wiring import build_coordinator, build_sink, build_stores, close_stores, instrument, store_names

RECEIVED: list[BalancerEvent] = []


async def collect(event: BalancerEvent) -> None:
    RECEIVED.append(event)


def _event() -> BalancerEvent:
    return BalancerEvent(EventKind.CLAIM, HubRef("ns", "hub", "$Default"), "0", "a", None, "a", "free", 1.0)


async def test_a_store_named_only_in_settings_is_built_and_offered_to_runworkers(settings: LazySettings) -> None:
    settings.LEASEBOARD_STORES = {
        **settings.LEASEBOARD_STORES,
        "mine": {"BACKEND": "balancer.stores.memory.MemoryStore", "CONFIG": {}},
    }
    assert "mine" in store_names()
    stores = build_stores("mine")
    assert isinstance(stores.ownership, MemoryStore) and isinstance(stores.checkpoints, MemoryStore)
    assert stores.ownership is stores.checkpoints is stores.controls
    assert build_stores("mine").ownership is not stores.ownership  # not process-wide: a new one each time
    await close_stores(stores)


def test_the_memory_store_is_one_per_process() -> None:
    assert build_stores("memory").ownership is build_stores("memory").ownership


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"BACKEND": "balancer.stores.nowhere.Store"}, r"store 'bad' .*balancer\.stores\.nowhere"),
        ({"CONFIG": {}}, r'LEASEBOARD_STORES\[\'bad\'\] needs a "BACKEND"'),
        ({"BACKEND": "balancer.stores.memory.MemoryStore", "CONFIG": []}, r"CONFIG.*must be a dict"),
    ],
)
def test_a_wrong_store_entry_is_refused_naming_the_setting(
    settings: LazySettings, entry: dict[str, object], message: str
) -> None:
    settings.LEASEBOARD_STORES = {**settings.LEASEBOARD_STORES, "bad": entry}
    with pytest.raises(ImproperlyConfigured, match=message):
        build_stores("bad")


def test_an_unknown_store_name_lists_the_known_ones() -> None:
    with pytest.raises(ImproperlyConfigured, match=r"unknown store 'nope'; choose one of: sql, memory, redis, blob"):
        build_stores("nope")


def test_runworkers_refuses_a_store_the_settings_do_not_name() -> None:
    with pytest.raises(CommandError, match="invalid choice: 'nope'"):
        call_command("runworkers", "--store", "nope")


async def test_the_sink_hands_events_to_the_publisher_the_settings_name(settings: LazySettings) -> None:
    settings.LEASEBOARD_EVENT_PUBLISHER = "tests.workers.test_wiring.collect"
    RECEIVED.clear()
    sink = build_sink()
    sink(_event())
    assert await sink.flush(5)
    assert [e.partition_id for e in RECEIVED] == ["0"]


async def test_an_empty_publisher_setting_broadcasts_nothing(settings: LazySettings) -> None:
    settings.LEASEBOARD_EVENT_PUBLISHER = ""
    sink = build_sink()
    sink(_event())
    assert await sink.flush(5)
    assert sink.seen == [_event()]  # still logged and counted


def test_a_publisher_that_is_not_callable_is_refused(settings: LazySettings) -> None:
    settings.LEASEBOARD_EVENT_PUBLISHER = "workers.wiring.SOURCES"
    with pytest.raises(ImproperlyConfigured, match="is a dict, not a callable"):
        build_sink()


@pytest.mark.parametrize(
    ("name", "kind"), [("cooperative", Coordinator), ("balanced", Coordinator), ("race", RaceCoordinator)]
)
def test_one_builder_gives_each_strategy_its_coordinator(name: str, kind: type) -> None:
    async def partitions() -> tuple[str, ...]:
        return ("0", "1")

    stores = build_stores("memory")
    coordinator = build_coordinator(
        HubRef("ns", "hub", "$Default"),
        "w-0",
        stores,
        partitions,
        strategy=get_strategy(name),
        expiry=10.0,
        on_event=build_sink(broadcast=False),
        race_times=RaceTimes() if name == "race" else None,
    )
    assert isinstance(coordinator, kind)  # both satisfy Balancer: mypy checks that, statically
    assert coordinator.owner_id == "w-0" and coordinator.owned == frozenset()


class Closable(MemoryStore):
    closed = 0

    async def aclose(self) -> None:
        type(self).closed += 1


async def test_a_process_wide_store_stays_open_even_behind_the_metrics_wrapper(settings: LazySettings) -> None:
    settings.LEASEBOARD_STORES = {
        **settings.LEASEBOARD_STORES,
        "shared": {"BACKEND": "tests.workers.test_wiring.Closable", "PROCESS_WIDE": True},
        "own": {"BACKEND": "tests.workers.test_wiring.Closable"},
    }
    Closable.closed = 0
    await close_stores(instrument(build_stores("shared")))
    assert Closable.closed == 0
    await close_stores(instrument(build_stores("own")))
    assert Closable.closed == 1  # one object behind three protocols: closed once


class _Source:
    """An event source of no partitions: only whether it was closed is looked at."""

    closed = False

    def partition_ids(self) -> tuple[str, ...]:
        return ()

    def properties(self, partition_id: str) -> PartitionProperties:
        raise ValueError(partition_id)

    def reader(self, partition_id: str, position: Position) -> PartitionReader:
        raise ValueError(partition_id)

    def close(self) -> None:
        self.closed = True


def test_runworkers_builds_the_source_while_it_builds_the_stores(monkeypatch: pytest.MonkeyPatch) -> None:
    """An Event Hubs source lists the hub's partitions as it is built (about 0.4 s of a management link):
    the stores are built meanwhile, not after it."""
    import threading

    from workers.wiring import fleet as wiring_fleet

    stores_built = threading.Event()
    built = _Source()

    def build_source(name: str | None, hub: str) -> _Source:
        assert (name, hub) == ("embedded", "h")
        # Only a source built beside the stores sees them built while it is being built.
        assert stores_built.wait(10), "the stores were not built while the source was"
        return built

    monkeypatch.setattr(wiring_fleet, "build_source", build_source)
    with wiring_fleet.source_beside(None, "embedded", "h") as pending:
        stores_built.set()
        assert pending() is built
    assert not built.closed


def test_a_source_built_beside_stores_that_failed_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from workers.wiring import fleet as wiring_fleet

    release, built = threading.Event(), _Source()

    def build_source(name: str | None, hub: str) -> _Source:
        release.wait(10)  # still being built when the stores fail: closed once it is, without waiting for it
        return built

    monkeypatch.setattr(wiring_fleet, "build_source", build_source)
    with pytest.raises(ValueError, match="bad store"), wiring_fleet.source_beside(None, "embedded", "h"):
        raise ValueError("bad store")
    assert not built.closed
    release.set()
    until_sync(lambda: built.closed, "the source built after the failure closed")
    given = _Source()
    with wiring_fleet.source_beside(given, "embedded", "h") as pending:  # a source given: used as it is
        assert pending() is given


def test_the_stores_get_their_connections_from_settings_and_read_no_environment(
    settings: LazySettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from balancer.errors import StoreError
    from balancer.stores.blob.store import BlobStore
    from balancer.stores.redis.store import RedisStore
    from tests.support.azurite import connection_string

    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/9")  # the environment after start: nobody reads it
    settings.REDIS_URL = ""
    with pytest.raises(StoreError, match="no Redis URL: set REDIS_URL"):
        build_stores("redis")
    settings.REDIS_URL = "redis://127.0.0.1:2/3"
    redis = build_stores("redis").ownership
    assert isinstance(redis, RedisStore) and redis.url == "redis://127.0.0.1:2/3"
    settings.AZURE_STORAGE_CONNECTION_STRING = connection_string(1)
    settings.LEASEBOARD_BLOB_CONTAINER = "from-settings"
    blob = build_stores("blob").ownership
    assert isinstance(blob, BlobStore) and blob.container == "from-settings"
    settings.LEASEBOARD_STORES = {  # "CONFIG" wins over the settings' connection
        **settings.LEASEBOARD_STORES,
        "blob": {"BACKEND": "balancer.stores.blob.store.BlobStore", "CONFIG": {"container": "from-config"}},
    }
    blob = build_stores("blob").ownership
    assert isinstance(blob, BlobStore) and blob.container == "from-config"


class _GivenSource:
    """Stands in for EventHubsSource: what build_source hands it."""

    def __init__(self, **given: object) -> None:
        self.given = given


def test_the_event_hubs_source_gets_its_connection_consumer_group_and_prefetch_from_settings(
    settings: LazySettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.wiring import parts

    monkeypatch.setitem(parts.SOURCES, "eventhubs", f"{__name__}._GivenSource")
    monkeypatch.setenv("EVENTHUB_CONNECTION_STRING", "from the environment after start: nobody reads it")
    settings.EVENTHUB_CONNECTION_STRING = "Endpoint=sb://settings.example/"
    settings.LEASEBOARD_CONSUMER_GROUP = "audit"
    settings.EVENTHUB_PREFETCH = 64
    source = parts.build_source("eventhubs", hub="sensors")
    assert source.given == {  # type: ignore[attr-defined]
        "hub": "sensors",
        "consumer_group": "audit",
        "connection_string": "Endpoint=sb://settings.example/",
        "prefetch": 64,
    }
    assert parts.build_source("eventhubs", hub="sensors", consumer_group="billing").given["consumer_group"] == (  # type: ignore[attr-defined]
        "billing"
    )
