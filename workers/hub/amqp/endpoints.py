"""The sessions and links of one connection, and the handler the router gave each link it took.

Sessions the peer begins are begun in answer; a link the peer attaches goes to the router, which
opens or refuses it. Flow and deliveries go to the link's handler. A link is dropped (its handler
told, once) when the peer detaches it, when its session ends, or when the connection ends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from proton import Delivery, Event, Link, Session

from workers.hub.amqp.limits import Limits
from workers.hub.amqp.notes import AttachInfo, FrameNotes

Endpoint_LOCAL_UNINIT = Link.LOCAL_UNINIT
Endpoint_LOCAL_ACTIVE = Link.LOCAL_ACTIVE
_SESSION_EVENTS = (Event.SESSION_REMOTE_OPEN, Event.SESSION_REMOTE_CLOSE)
_LINK_EVENTS = frozenset({Event.LINK_REMOTE_OPEN, Event.LINK_FLOW, Event.LINK_REMOTE_CLOSE, Event.LINK_REMOTE_DETACH})


class LinkHandler(Protocol):
    def on_flow(self) -> None: ...

    def on_delivery(self, delivery: Delivery) -> None: ...

    def on_detach(self) -> None:
        """The link is gone (detached by the peer or by us, or the connection ended)."""


class Endpoints:
    """``attach`` opens (or refuses) a link and returns its handler, None if it was refused."""

    def __init__(
        self, limits: Limits, notes: FrameNotes, attach: Callable[[Link, AttachInfo], LinkHandler | None]
    ) -> None:
        self._limits = limits
        self._notes = notes
        self._attach = attach
        self._handlers: dict[Link, LinkHandler] = {}  # proton's wrappers compare by the C object

    def dispatch(self, event: Event) -> None:
        """Handles a session, link or delivery event (and ignores any other)."""
        kind = event.type
        if kind in _SESSION_EVENTS and event.session is not None:
            self._session_event(kind, event.session)
        elif kind in _LINK_EVENTS and event.link is not None:
            self._link_event(kind, event.link)
        elif kind == Event.DELIVERY and event.delivery is not None:
            delivery = event.delivery
            handler = self._handlers.get(delivery.link)
            if handler is not None:
                handler.on_delivery(delivery)
            elif delivery.link.is_receiver and not delivery.partial:
                delivery.settle()

    def drop_all(self) -> None:
        """Tells every link's handler that its link is gone (the connection ended)."""
        handlers = list(self._handlers.values())
        self._handlers.clear()
        for handler in handlers:
            handler.on_detach()

    def _session_event(self, kind: Any, session: Session) -> None:
        if kind == Event.SESSION_REMOTE_OPEN:
            if session.state & Endpoint_LOCAL_UNINIT:
                session.incoming_capacity = 4 * self._limits.max_message_size
                session.open()
            return
        for link in [link for link in self._handlers if link.session == session]:
            self._drop(link)
        if session.state & Endpoint_LOCAL_ACTIVE:
            session.close()

    def _link_event(self, kind: Any, link: Link) -> None:
        if kind == Event.LINK_REMOTE_OPEN:
            self._link_opened(link)
        elif kind == Event.LINK_FLOW:
            handler = self._handlers.get(link)
            if handler is not None:
                handler.on_flow()
        else:  # detached or closed by the peer
            self._drop(link)
            if link.state & Endpoint_LOCAL_ACTIVE:
                if kind == Event.LINK_REMOTE_CLOSE:
                    link.close()
                else:
                    link.detach()
            self._notes.forget(link.name, link.is_sender)
            link.free()  # proton keeps it until our detach is written

    def _link_opened(self, link: Link) -> None:
        info = self._notes.attach(link.name, link.is_sender)
        if info is None:  # cannot happen: every attach passed the wire's _inspect first
            info = AttachInfo(
                link.name, -1, -1, link.is_receiver, link.remote_source.address, link.remote_target.address
            )
        handler = self._attach(link, info)
        if handler is not None:
            self._handlers[link] = handler

    def _drop(self, link: Link) -> None:
        handler = self._handlers.pop(link, None)
        if handler is not None:
            handler.on_detach()
