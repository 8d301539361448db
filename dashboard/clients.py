"""Who a request comes from, behind the proxies the operator named (issue 37).

Behind a proxy every request has the proxy's address, so throttling logins by address locked every
operator out at once, and any peer's ``X-Forwarded-For`` was not to be trusted either (rotated, it
dodged the throttle; naming the admin's address locked the admin out). ``LEASEBOARD_TRUSTED_PROXIES``
(addresses or networks, comma-separated) names the proxies: a request from one of them is from the
address its ``X-Forwarded-For`` gives, read from the right and skipping the trusted proxies it passed;
a request from anyone else is from its own address, whatever it says. django-axes' throttle
(``AXES_CLIENT_IP_CALLABLE``) and the refusal counts use it. ``check --deploy`` warns when
``LEASEBOARD_BEHIND_TLS_PROXY`` is on without trusted proxies (``dashboard.checks``).
"""

from __future__ import annotations

import ipaddress
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def trusted_proxies(text: str) -> tuple[Network, ...]:
    """The networks of ``LEASEBOARD_TRUSTED_PROXIES`` ("10.0.0.5, 10.1.0.0/16"); ImproperlyConfigured
    naming a part that is no address or network."""
    found = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            found.append(ipaddress.ip_network(part, strict=False))
        except ValueError:
            raise ImproperlyConfigured(
                f"LEASEBOARD_TRUSTED_PROXIES: {part!r} is no IP address or network (e.g. 10.0.0.5 or 10.1.0.0/16)"
            ) from None
    return tuple(found)


def _trusted(address: str, proxies: tuple[Network, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address.strip())
    except ValueError:
        return False
    return any(ip in network for network in proxies)


def client_address(request: Any) -> str:
    """The client's address (see the module): REMOTE_ADDR, or behind a trusted proxy the first address
    from the right of ``X-Forwarded-For`` that is no trusted proxy; "unknown" when there is none."""
    meta = getattr(request, "META", {})
    peer = str(meta.get("REMOTE_ADDR") or "unknown")
    proxies: tuple[Network, ...] = settings.LEASEBOARD_TRUSTED_PROXIES
    if not proxies or not _trusted(peer, proxies):
        return peer[:255]
    hops = [h.strip() for h in str(meta.get("HTTP_X_FORWARDED_FOR") or "").split(",") if h.strip()]
    for hop in reversed(hops):
        if not _trusted(hop, proxies):
            return hop[:255]
    return peer[:255]
