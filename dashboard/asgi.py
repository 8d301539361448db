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

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from .host import watch_configured  # noqa: E402
from .routing import websocket_urlpatterns  # noqa: E402

serve_static = getattr(settings, "LEASEBOARD_SERVE_STATIC", settings.DEBUG)
http_app = ASGIStaticFilesHandler(django_asgi_app) if serve_static else django_asgi_app

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


application = SampleConfiguredHub(
    ProtocolTypeRouter(
        {
            "http": http_app,
            "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
        }
    )
)
