"""``read_only``: the decorator of the views that only read (the JSON API, ``/metrics``).

Such a view answers GET and HEAD; any other method gets 405 with ``Allow: GET, HEAD``, as the
OpenAPI document (``openapi.py``) says. Django's CSRF check runs before a view and would answer a
POST without a token with 403 first; it guards writes, and these views write nothing, so they are
exempt from it (an exempt view still refuses every method but GET and HEAD).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET

V = TypeVar("V", bound=Callable[..., Any])


def read_only(view: V) -> V:
    """``view`` for GET and HEAD only, a 405 for any other method (before the CSRF check)."""
    exempt: V = csrf_exempt(require_GET(view))
    return exempt
