"""What a peer's raw frames say that proton's Python binding does not expose, noted before proton reads them.

- ``attach``: the link's desired capabilities (``com.microsoft:enable-receiver-runtime-metric``),
  its properties (``com.microsoft:epoch``), its source filter (the starting position) and
  addresses, kept per (link name, our role) until the link is gone;
- ``transfer``: the message format of each delivery (0x80013700 is a batch), queued per link in
  delivery order; proton completes deliveries of a link in the same order;
- ``open``: max-frame-size lowered by ``frames.HEADROOM`` (see ``frames.complete``);
- frames on a channel the peer has already ended are dropped: the Python SDK detaches links after
  ending their session, which proton answers by closing the whole connection ("no such channel");
  Event Hubs ignores them, and so do we.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

import workers.hub.amqp.frames as frames


@dataclass(slots=True)
class AttachInfo:
    """What the peer's attach frame said that proton's binding does not expose."""

    name: str
    channel: int
    handle: int
    client_is_sender: bool
    source: str | None = None
    target: str | None = None
    filters: dict[Any, Any] | None = None
    properties: dict[Any, Any] = field(default_factory=dict)
    desired_capabilities: frozenset[str] = frozenset()


class FrameNotes:
    """The notes of one connection. ``note`` raises FrameError (or IndexError, TypeError,
    ValueError) for a performative it cannot read; the frame then goes to proton unchanged."""

    def __init__(self) -> None:
        self._attaches: dict[tuple[str, bool], AttachInfo] = {}
        self._ended: set[int] = set()  # channels the peer has ended (and not begun again)
        self._handles: dict[tuple[int, int], str] = {}  # (channel, handle) of a peer's sender -> link name
        self._formats: dict[str, deque[int]] = defaultdict(deque)

    def note(self, frame: frames.Frame, code: int, fields: list[Any]) -> bytes:
        """The bytes to give proton for ``frame`` (whose performative is ``code``, ``fields``):
        the frame, a rewritten open, or nothing for a frame on an ended channel."""
        channel = frame.channel
        if channel in self._ended and code != frames.BEGIN:
            return b""
        if code == frames.OPEN:
            return frame.with_body(frames.shrink_open(frame.body)).raw
        if code == frames.BEGIN:
            self._ended.discard(channel)
        elif code == frames.ATTACH:
            self._attach(channel, fields)
        elif code == frames.TRANSFER:
            self._transfer(channel, fields)
        elif code == frames.DETACH:
            self._handles.pop((channel, int(fields[0])), None)
        elif code == frames.END:
            self._ended.add(channel)
            for key in [k for k in self._handles if k[0] == channel]:
                del self._handles[key]
        return frame.raw

    def attach(self, name: str, we_send: bool) -> AttachInfo | None:
        """The attach of the link ``name`` whose sender is us (``we_send``) or the peer."""
        return self._attaches.get((name, we_send))

    def pop_format(self, name: str) -> int:
        """The message format of the oldest delivery on link ``name`` not yet taken (0 if unknown)."""
        queue = self._formats.get(name)
        return queue.popleft() if queue else 0

    def forget(self, name: str, we_send: bool) -> None:
        self._attaches.pop((name, we_send), None)
        if not we_send:
            self._formats.pop(name, None)

    def _attach(self, channel: int, fields: list[Any]) -> None:
        name, handle, role = str(fields[0]), int(fields[1]), bool(fields[2])  # role: True is a receiver
        source_fields = getattr(frames.field(fields, 5), "value", None) or []
        target_fields = getattr(frames.field(fields, 6), "value", None) or []
        capabilities = frames.field(fields, 12)
        if capabilities is None:
            wanted: frozenset[str] = frozenset()
        elif isinstance(capabilities, str):  # a single symbol need not be sent as an array
            wanted = frozenset([str(capabilities)])
        else:
            wanted = frozenset(str(c) for c in capabilities)
        filters = frames.field(source_fields, 7)
        properties = frames.field(fields, 13)
        # Our side of the link has the other role: the peer's receiver is our sender.
        self._attaches[(name, role)] = AttachInfo(
            name=name,
            channel=channel,
            handle=handle,
            client_is_sender=not role,
            source=_text(frames.field(source_fields, 0)),
            target=_text(frames.field(target_fields, 0)),
            filters=filters if isinstance(filters, dict) else None,
            properties=dict(properties) if isinstance(properties, dict) else {},
            desired_capabilities=wanted,
        )
        if not role:
            self._handles[(channel, handle)] = name
            self._formats.pop(name, None)

    def _transfer(self, channel: int, fields: list[Any]) -> None:
        if frames.field(fields, 1) is None:  # no delivery-id: a continuation frame of a delivery
            return
        name = self._handles.get((channel, int(fields[0])))
        if name is not None:
            message_format = frames.field(fields, 3)
            self._formats[name].append(int(message_format) if message_format is not None else 0)


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes | memoryview):
        return bytes(value).decode("utf-8", "replace")
    return str(value)
