"""The Blob Storage container the blob store works in, as the store reaches it.

``BlobContainer`` holds the SDK's container client (one per event loop: an aiohttp session belongs
to the loop that opened it), creates the container on first use, counts HTTP requests, keeps the
service's clock from the Date header of every response, and turns the SDK's errors into
StoreError or StoreUnavailable with every secret redacted. ``balancer.stores.blob.store`` builds
the store's operations on it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar
from urllib.parse import urlsplit

from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    ResourceExistsError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.storage.blob import BlobProperties
from azure.storage.blob.aio import ContainerClient, LinearRetry

from balancer.errors import StoreError, StoreUnavailable

log = logging.getLogger("balancer.stores.azure_blob")  # the store's own log: operators look for it there
T = TypeVar("T")

# The settings the connection comes from, named in messages; the wiring (``workers.wiring``) reads
# them and passes their values in: no store reads the environment.
CONNECTION_STRING_ENV = "AZURE_STORAGE_CONNECTION_STRING"
CONTAINER_ENV = "LEASEBOARD_BLOB_CONTAINER"
DEFAULT_CONTAINER = "leaseboard"
_CONTAINER_NAME = re.compile(r"^(?=.{3,63}$)[a-z0-9]+(-[a-z0-9]+)*$")
_SIG = re.compile(r"(?i)(sig=)[^&;\s]+")


def container_gone(exc: AzureError) -> bool:
    """A 404 for the whole container, not for one blob."""
    return getattr(exc, "error_code", None) == "ContainerNotFound"


def _secrets(connection_string: str) -> list[str]:
    """The parts of a connection string that must never be printed."""
    found = []
    for part in connection_string.split(";"):
        key, _, value = part.partition("=")
        if key.strip().lower() in ("accountkey", "sharedaccesssignature") and value.strip():
            found.append(value.strip())
    return found


def _check_connection_string(connection_string: str) -> None:
    """Raise StoreError naming what is wrong with a connection string the SDK would accept
    silently and fail on later (no credential, an AccountKey that is not base64)."""
    pairs = {}
    for part in connection_string.split(";"):
        key, sep, value = part.partition("=")
        if sep:
            pairs[key.strip().lower()] = value.strip()
    if "accountkey" in pairs:
        try:
            base64.b64decode(pairs["accountkey"], validate=True)
        except (binascii.Error, ValueError):
            raise StoreError(f"the AccountKey of {CONNECTION_STRING_ENV} is not valid base64") from None
    elif "sharedaccesssignature" not in pairs and pairs.get("usedevelopmentstorage", "").lower() != "true":
        raise StoreError(f"{CONNECTION_STRING_ENV} has neither AccountKey nor SharedAccessSignature")


class BlobContainer:
    """One container (``name``) of the account a connection string names; one event loop at a time.

    ``requests`` counts HTTP requests sent (retries included).
    """

    def __init__(
        self, connection_string: str | None, container: str | None, *, timeout: float = 10.0, retries: int = 1
    ) -> None:
        """Raises StoreError at once when the connection string is missing or malformed or the
        container name is invalid; the service itself is first contacted by the first call."""
        conn = connection_string or ""
        if not conn.strip():
            raise StoreError(f"no Blob Storage connection string: set {CONNECTION_STRING_ENV}")
        name = container or DEFAULT_CONTAINER
        if not _CONTAINER_NAME.match(name):
            raise StoreError(
                f"blob container name {name!r} is invalid: 3-63 lowercase letters, digits and single hyphens"
            )
        self._secrets = _secrets(conn)
        self.connection_string = conn
        self.name = name
        self.timeout = timeout
        self.retries = retries
        self._client = self._new_client()
        _check_connection_string(conn)
        url = urlsplit(self._client.url)
        self.where = f"container {name!r} at {url.scheme}://{url.netloc}{url.path.rsplit('/', 1)[0]}"
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop self._client's session belongs to
        self._used = False
        self._ready_done = False
        self._anchor: tuple[float, float] | None = None  # (service Date, local monotonic when received)
        self._last_now = 0.0
        self.requests = 0

    async def aclose(self) -> None:
        """Close the HTTP session (only from the event loop that used it)."""
        if self._loop is not None and self._loop is asyncio.get_running_loop():
            await self._client.close()
            self._loop = None

    def _new_client(self) -> ContainerClient:
        try:
            return ContainerClient.from_connection_string(
                self.connection_string,
                self.name,
                # Fail within seconds: a lease renewal stuck behind the SDK's default backoff
                # (15 s and more) would outlast the lease it renews.
                retry_policy=LinearRetry(backoff=1, retry_total=self.retries, random_jitter_range=1),
                connection_timeout=min(5.0, self.timeout),
                read_timeout=self.timeout,
                raw_request_hook=self._on_request,
                raw_response_hook=self._on_response,
            )
        except ValueError as exc:
            problem = self._redact(exc)
            raise StoreError(f"{CONNECTION_STRING_ENV} is not a storage connection string: {problem}") from None

    def _on_request(self, request: Any) -> None:
        self.requests += 1

    def _on_response(self, response: Any) -> None:
        date = response.http_response.headers.get("Date")
        if not date:
            return
        try:
            served = parsedate_to_datetime(date).timestamp()
        except (TypeError, ValueError):
            return
        # Any response is a lower bound of the service's clock when it arrived; keep the newest.
        if self._anchor is None or served > self._anchor[0]:
            self._anchor = (served, time.monotonic())

    def _redact(self, exc: BaseException | str) -> str:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return _SIG.sub(r"\1***", text)

    def error(self, doing: str, exc: AzureError) -> StoreError:
        """The StoreError (StoreUnavailable when the service could not be reached) for ``exc``."""
        status = getattr(exc, "status_code", None)
        code = getattr(exc, "error_code", None)
        cls: type[StoreError] = StoreError
        if isinstance(exc, ServiceRequestError | ServiceResponseError):
            cls, why = StoreUnavailable, "cannot reach the service"
        elif status is not None and (status >= 500 or status in (408, 429)):
            cls, why = StoreUnavailable, f"the service answered {status}"
        elif isinstance(exc, ClientAuthenticationError) or status in (401, 403):
            why = f"the service refused the credentials of {CONNECTION_STRING_ENV} ({status or 'signing'})"
        elif code == "ContainerNotFound":
            why = "the container does not exist (deleted while running?)"
        else:
            why = f"the service answered {status} {code or ''}".rstrip()
        return cls(f"blob store {self.where}: {doing}: {why}: {self._redact(exc)}")

    def _container(self) -> ContainerClient:
        # An aiohttp session belongs to the loop that opened it: a store used from another loop
        # (a thread with asyncio.run) gets a client of its own there.
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._used:  # by another loop, or closed by aclose()
                self._client = self._new_client()
            self._loop, self._used = loop, True
        return self._client

    async def ready(self) -> ContainerClient:
        """The client, the container created on first use (a wrong key or endpoint fails here)."""
        client = self._container()
        if not self._ready_done:
            try:
                if not await client.exists():
                    try:
                        await client.create_container()
                        log.info("created blob %s", self.where)
                    except ResourceExistsError:
                        pass  # another worker created it first
            except AzureError as exc:
                raise self.error("opening the container", exc) from None
            self._ready_done = True
        return client

    async def run(self, doing: str, call: Callable[[ContainerClient], Awaitable[T]]) -> T:
        """``call`` on the client; an SDK error becomes StoreError/StoreUnavailable (see ``error``)."""
        client = await self.ready()
        try:
            return await call(client)
        except AzureError as exc:
            raise self.error(doing, exc) from None

    async def list(self, prefix: str) -> list[BlobProperties]:
        """Every blob whose name starts with ``prefix``, with its metadata (one request per page)."""

        async def listing(client: ContainerClient) -> list[BlobProperties]:
            return [b async for b in client.list_blobs(name_starts_with=prefix, include=["metadata"])]

        return await self.run(f"listing {prefix!r}", listing)

    async def now(self) -> float:
        """The service's clock (see ``balancer.stores.blob``); costs a request only before the first one."""
        if self._anchor is None:
            await self.ready()
        if self._anchor is None:
            await self.run("reading the service's clock", lambda client: client.exists())
        if self._anchor is None:
            raise StoreError(f"blob store {self.where}: the service sent no Date header")
        served, received = self._anchor
        self._last_now = max(self._last_now, served + math.floor(time.monotonic() - received))
        return self._last_now
