"""Production settings: ``DJANGO_SETTINGS_MODULE=dashboard.production``.

Everything of ``dashboard.settings``, tightened so ``manage.py check --deploy`` is clean. Required:
``DJANGO_SECRET_KEY`` (50+ random characters) and ``DJANGO_ALLOWED_HOSTS`` for a public name.
Optional: ``LEASEBOARD_SSL_REDIRECT`` (default on; turn off when a proxy already redirects),
``LEASEBOARD_BEHIND_TLS_PROXY`` (trust ``X-Forwarded-Proto`` from the proxy; name the proxy in
``LEASEBOARD_TRUSTED_PROXIES`` too, or ``check --deploy`` warns), ``LEASEBOARD_HSTS_SECONDS``,
``DJANGO_CSRF_TRUSTED_ORIGINS`` (comma-separated ``https://host`` origins for the admin behind a proxy),
``LEASEBOARD_SERVE_STATIC`` (default on: Daphne serves the few static files itself; turn off when
a proxy serves ``STATIC_ROOT`` after ``collectstatic``).
"""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured

from .env import envbool, envint, envstr, weak_secret
from .settings import *  # noqa: F403

DEBUG = False

_key = os.environ.get("DJANGO_SECRET_KEY", "")
if (_weak := weak_secret(_key)) is not None:
    raise ImproperlyConfigured(
        f"dashboard.production needs DJANGO_SECRET_KEY: at least 50 random characters ({_weak}), e.g. from "
        "`python -c 'import secrets; print(secrets.token_urlsafe(50))'`"
    )
SECRET_KEY = _key

# Redirect plain HTTP to HTTPS (turn off when a proxy already redirects).
SECURE_SSL_REDIRECT = envbool("LEASEBOARD_SSL_REDIRECT", True)
# Prometheus usually scrapes over the internal network without TLS.
SECURE_REDIRECT_EXEMPT = [r"^metrics$"]
# TLS ends at a reverse proxy: trust its X-Forwarded-Proto (name it in LEASEBOARD_TRUSTED_PROXIES too).
if envbool("LEASEBOARD_BEHIND_TLS_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# Strict-Transport-Security's max-age, in seconds (0: no HSTS header).
SECURE_HSTS_SECONDS = envint("LEASEBOARD_HSTS_SECONDS", 31_536_000, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_HSTS_PRELOAD = True
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SESSION_COOKIE_SECURE = True
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_SECURE = True
X_FRAME_OPTIONS = "DENY"
# Comma-separated https://host origins trusted for forms and the websocket (the admin behind a proxy).
CSRF_TRUSTED_ORIGINS = [o for o in envstr("DJANGO_CSRF_TRUSTED_ORIGINS", "").split(",") if o]
# Daphne serves the few static files itself (turn off when a proxy serves STATIC_ROOT after collectstatic).
LEASEBOARD_SERVE_STATIC = envbool("LEASEBOARD_SERVE_STATIC", True)
