"""Fixtures: a scripted "service" (Hub), the fake client factory, a source on them, the fake clock."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.clock import FakeClock
from workers.sources.eventhubs import EventHubsSource

from .fake import CONNECTION_STRING, Clients, Hub


@pytest.fixture
def hub() -> Hub:
    return Hub()


@pytest.fixture
def clients(hub: Hub) -> Clients:
    return Clients(hub)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def source(clients: Clients, clock: FakeClock) -> Iterator[EventHubsSource]:
    opened = EventHubsSource("sensors", connection_string=CONNECTION_STRING, client_factory=clients, clock=clock)
    yield opened
    opened.close()
