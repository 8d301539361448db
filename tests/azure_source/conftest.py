"""Fixtures: a scripted "service" (Hub), the fake client factory, a source on them, the fake clock.

``clients`` comes twice: readers driving the SDK's consumer (``direct``), and readers falling back
to the public ``receive_batch`` (``legacy``, an azure-eventhub without ``_create_consumer``); every
test of the bridge holds on both."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.clock import FakeClock
from workers.sources.eventhubs import EventHubsSource

from .fake import CONNECTION_STRING, Clients, Hub


@pytest.fixture
def hub() -> Hub:
    return Hub()


@pytest.fixture(params=["direct", "legacy"])
def clients(hub: Hub, request: pytest.FixtureRequest) -> Clients:
    return Clients(hub, legacy=request.param == "legacy")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def source(clients: Clients, clock: FakeClock) -> Iterator[EventHubsSource]:
    opened = EventHubsSource("sensors", connection_string=CONNECTION_STRING, client_factory=clients, clock=clock)
    yield opened
    opened.close()
