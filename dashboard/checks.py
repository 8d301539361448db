"""The console's own ``manage.py check`` rules (registered by ``apps.DashboardConfig``)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Tags, Warning, register


@register(Tags.security, deploy=True)
def proxy_without_trusted_hops(app_configs: Any, **kwargs: Any) -> list[Warning]:
    """Behind a TLS proxy with no trusted proxies named, every client has the proxy's address."""
    if getattr(settings, "SECURE_PROXY_SSL_HEADER", None) and not settings.LEASEBOARD_TRUSTED_PROXIES:
        return [
            Warning(
                "LEASEBOARD_BEHIND_TLS_PROXY is on but LEASEBOARD_TRUSTED_PROXIES names no proxy: every client "
                "has the proxy's address, so a few wrong passwords lock out every operator and refusals are "
                "counted against the proxy.",
                hint="Set LEASEBOARD_TRUSTED_PROXIES to the proxy's addresses (comma-separated, networks allowed).",
                id="leaseboard.W001",
            )
        ]
    return []
