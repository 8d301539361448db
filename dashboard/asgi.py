"""ASGI entry point: HTTP through Django, websockets through Channels.

Under ``daphne dashboard.asgi:application`` with DEBUG on (the demo), static files are served from
the project's folders by Django's own handler; ``dashboard.production`` does the same unless
``LEASEBOARD_SERVE_STATIC`` is off (a proxy serves them).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
django_asgi_app = get_asgi_application()  # sets Django up before anything imports models

from asgiref.sync import sync_to_async  # noqa: E402
from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.core.exceptions import SuspiciousOperation  # noqa: E402
from django.core.handlers.exception import response_for_exception  # noqa: E402
from django.http import Http404, HttpRequest, HttpResponseBase  # noqa: E402
from django.http.request import split_domain_port  # noqa: E402

from .live.host import watch_configured  # noqa: E402
from .web.access import ReadRuleSocket  # noqa: E402
from .web.routing import websocket_urlpatterns  # noqa: E402


class StaticFiles(ASGIStaticFilesHandler):
    """Django's static file handler, but a path it will not serve (``..`` out of the folders, a NUL
    byte, a name too long for the file system) is a 404, not a 500 with a traceback."""

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        try:
            response: HttpResponseBase = await super().get_response_async(request)
        except (SuspiciousOperation, ValueError, OSError):
            missing = Http404("no such static file")
            response = await sync_to_async(response_for_exception, thread_sensitive=False)(request, missing)
        return response


serve_static = getattr(settings, "LEASEBOARD_SERVE_STATIC", settings.DEBUG)
http_app = StaticFiles(django_asgi_app) if serve_static else django_asgi_app

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


class SampleConfiguredHub:
    """Starts the configured hub's monitor (``host.watch_configured``) on every connection of any
    kind (an API poll, a scrape, a static file, a socket), then hands it on: lag is sampled while the
    server runs, whether or not a page is open. A no-op once it runs (it never stops on its own)."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watch_configured()
        await self.app(scope, receive, send)


DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(scheme: str, netloc: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) with the scheme's default port filled in; None when unreadable."""
    host, port = split_domain_port(netloc.lower())
    if not host or scheme not in DEFAULT_PORTS:
        return None
    try:
        return scheme, host, int(port) if port else DEFAULT_PORTS[scheme]
    except ValueError:
        return None


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value).decode("latin1")
    return None


def allowed_origins(scope: Scope) -> set[tuple[str, str, int]]:
    """The console's own origin (the socket's Host, or the server's address, with the page's
    scheme) and ``CSRF_TRUSTED_ORIGINS``; empty when the socket names no host at all."""
    host = _header(scope, b"host")
    if host is None and scope.get("server"):
        server_host, server_port = scope["server"][0], scope["server"][1]
        host = f"{server_host}:{server_port}" if server_port else str(server_host)
    if host is None:
        return set()
    found: set[tuple[str, str, int]] = set()
    for trusted in getattr(settings, "CSRF_TRUSTED_ORIGINS", []):
        scheme, _, netloc = str(trusted).partition("://")
        origin = _origin(scheme.lower(), netloc)
        if origin is not None:
            found.add(origin)
    secure = scope.get("scheme") == "wss"
    proxy = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy:  # behind a TLS proxy the page is https even though the socket reached us as ws
        forwarded = _header(scope, proxy[0].removeprefix("HTTP_").replace("_", "-").lower().encode())
        secure = secure or (forwarded or "").split(",")[0].strip() == proxy[1]
    origin = _origin("https" if secure else "http", host)
    if origin is not None:
        found.add(origin)
    return found


class SameOrigin:
    """Refuses a websocket whose ``Origin`` is not, scheme, host and port alike, the console's own
    origin or a trusted one (``AllowedHostsOriginValidator`` compares the host name only: a page
    on ``http://localhost:9999`` was accepted by a console on ``:8000``). A socket that names no
    host (an in-process test) and no origin is left to the host check."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            raw = _header(scope, b"origin")
            allowed = allowed_origins(scope)
            if raw is not None and allowed:
                scheme, _, netloc = raw.partition("://")
                if _origin(scheme.lower(), netloc) not in allowed:
                    await receive()  # websocket.connect
                    await send({"type": "websocket.close", "code": 4403})
                    return
        await self.app(scope, receive, send)


application = SampleConfiguredHub(
    ProtocolTypeRouter(
        {
            "http": http_app,
            "websocket": AllowedHostsOriginValidator(
                SameOrigin(AuthMiddlewareStack(ReadRuleSocket(URLRouter(websocket_urlpatterns))))
            ),
        }
    )
)
