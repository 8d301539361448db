"""``$cbs`` and ``$management``: what a put-token and a READ request are answered with, and the hubs served.

put-token: the token is verified against the key (``auth.verify``); 202 and the grant, or 401
with why. READ of ``com.microsoft:eventhub`` answers ``name, type, created_at, partition_count,
partition_ids``; of ``com.microsoft:partition`` answers ``name, type, partition,
begin_sequence_number`` (sic), ``last_enqueued_sequence_number, last_enqueued_offset`` (a string,
"-1" while empty), ``last_enqueued_time_utc`` (a timestamp) and ``is_partition_empty``. A request
needs a grant for the hub on its connection, or a valid ``security_token`` of its own.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from proton import timestamp

from workers.hub.amqp.auth import TOKEN_TYPE, AuthError, Grant, SasKey, verify
from workers.hub.amqp.messages import millis
from workers.hub.amqp.requests import Request, Response
from workers.hub.embedded import EmbeddedHub


class HubDirectory:
    """The hubs under ``root``, opened on first use; only hubs that exist are served."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._hubs: dict[str, EmbeddedHub] = {}

    def get(self, name: str) -> EmbeddedHub | None:
        hub = self._hubs.get(name)
        if hub is not None:
            return hub
        if not name or "/" in name or not EmbeddedHub.exists(self.root, name):
            return None
        try:
            hub = EmbeddedHub(self.root, name)
        except (TypeError, ValueError):  # not a name the embedded hub takes
            return None
        self._hubs[name] = hub
        return hub

    def created_at(self, hub: EmbeddedHub) -> float:
        # hub.lock is created with the hub and never written; hub.json is replaced when it grows.
        times = [os.stat(p).st_mtime for p in (hub.path / "hub.lock", hub.path / "hub.json") if p.exists()]
        return min(times) if times else time.time()

    def close(self) -> None:
        for hub in self._hubs.values():
            hub.close()
        self._hubs.clear()


def put_token(request: Request, key: SasKey, now: float) -> tuple[Response, Grant | None]:
    """The answer to a ``$cbs`` request, and what it grants (None when refused). Raises AuthError
    never: a refusal is a 401 whose description says why (without the token)."""
    props = request.properties
    if props.get("operation") != "put-token":
        return Response(400, f"unsupported $cbs operation {props.get('operation')!r}; only put-token"), None
    if props.get("type") != TOKEN_TYPE:
        return Response(400, f"unsupported token type {props.get('type')!r}; only {TOKEN_TYPE}"), None
    try:
        grant = verify(request.body, key, now)
    except AuthError as exc:
        return Response(401, str(exc)), None
    return Response(202, "Accepted"), grant


def read_properties(
    request: Request,
    hubs: HubDirectory,
    key: SasKey,
    now: float,
    granted: Callable[[str], bool],
    entity_url: Callable[[str], str],
) -> Response:
    """The answer to a ``$management`` request. ``granted(entity)`` says whether the connection
    holds a grant for it; ``entity_url(hub)`` names a hub in a not-found description."""
    props = request.properties
    if props.get("operation") != "READ":
        return Response(400, f"unsupported $management operation {props.get('operation')!r}; only READ")
    name = props.get("name")
    if not isinstance(name, str):
        return Response(400, "the request names no event hub (application property 'name')")
    allowed = granted(name.lower())
    token = props.get("security_token")
    if not allowed and token is not None:
        try:
            allowed = verify(token, key, now).covers(name.lower(), now)
        except AuthError as exc:
            return Response(401, str(exc))
    if not allowed:
        return Response(401, f"Unauthorized access to '{name}': no valid token for it")
    hub = hubs.get(name)
    if hub is None:
        return Response(404, f"The messaging entity '{entity_url(name)}' could not be found.")
    return _describe(hubs, hub, name, props)


def _describe(hubs: HubDirectory, hub: EmbeddedHub, name: str, props: dict[str, Any]) -> Response:
    """The READ answer for ``hub``: the hub itself or one of its partitions, by ``props["type"]``."""
    kind = props.get("type")
    if kind == "com.microsoft:eventhub":
        ids = list(hub.partition_ids())
        created = timestamp(millis(hubs.created_at(hub)))
        return Response(
            200,
            "OK",
            {
                "name": hub.name,
                "type": kind,
                "created_at": created,
                "partition_count": len(ids),
                "partition_ids": ids,
            },
        )
    if kind == "com.microsoft:partition":
        partition = str(props.get("partition"))
        if partition not in hub.partition_ids():
            return Response(404, f"event hub '{name}' has no partition '{partition}'")
        p = hub.properties(partition)
        return Response(
            200,
            "OK",
            {
                "name": hub.name,
                "type": kind,
                "partition": partition,
                "begin_sequence_number": p.begin_sequence_number,
                "last_enqueued_sequence_number": p.last_enqueued_sequence_number,
                "last_enqueued_offset": p.last_enqueued_offset if p.last_enqueued_offset is not None else "-1",
                "last_enqueued_time_utc": timestamp(millis(p.last_enqueued_time or 0.0)),
                "is_partition_empty": p.is_empty,
            },
        )
    return Response(400, f"unsupported $management type {kind!r}")
