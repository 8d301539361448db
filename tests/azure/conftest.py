"""Fixtures for the Azure tests: one Azurite for the package, a fresh container per test."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from azure.storage.blob.aio import ContainerClient

from balancer.model import HubRef
from balancer.stores.blob.store import BlobStore
from tests.support.azurite import Azurite, start_azurite

# An Event Hubs namespace as Microsoft's processors name it, and the default consumer group with
# its capital D: the blob names lowercase it.
REF = HubRef("leaseboard-test.servicebus.windows.net", "sensors", "$Default")


@pytest.fixture(scope="package")
def azurite() -> Iterator[Azurite]:
    server = start_azurite()
    yield server
    server.stop()


@pytest.fixture
def container_name() -> str:
    return f"azure-{uuid.uuid4().hex[:16]}"


@pytest.fixture
async def store(azurite: Azurite, container_name: str) -> AsyncIterator[BlobStore]:
    """Leaseboard's store on a fresh container (created by its first call)."""
    async with BlobStore(azurite.connection_string, container_name) as store:
        await store.now()
        yield store


@pytest.fixture
async def raw(azurite: Azurite, container_name: str, store: BlobStore) -> AsyncIterator[ContainerClient]:
    """The SDK's own client on the same container, for writing blobs by hand and reading them raw."""
    async with ContainerClient.from_connection_string(azurite.connection_string, container_name) as client:
        yield client
