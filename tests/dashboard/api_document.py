"""Whether one response is one the console's OpenAPI document (``dashboard/web/openapi.py``) allows.

``conforms(method, url, status, content_type, body)`` raises AssertionError (or schemathesis's
failure group) unless the document lists ``status`` for the operation ``url`` belongs to, with that
media type, and the body matches the schema given for it. For responses outside the fuzz test: a
Django test client's (``conforms_response``), or a live console's during an outage
(``tests/dashboard/test_outages.py``).
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import requests
import schemathesis
from django.http import HttpResponse, HttpResponseBase

from dashboard.web.openapi import document


@cache
def _document() -> dict[str, Any]:
    return document()


@cache
def _loaded() -> Any:
    return schemathesis.openapi.from_dict(_document())


def operation_path(url: str) -> str:
    """The document's path for ``url``, its query left out (``/api/partitions/{partition_id}`` for
    ``/api/partitions/0``)."""
    path = url.split("?", 1)[0]
    for template in _document()["paths"]:
        pattern = re.sub(r"\\\{\w+\\\}", "[^/]+", re.escape(template))
        if re.fullmatch(pattern, path):
            return str(template)
    raise AssertionError(f"{path} is not in the OpenAPI document")


def conforms(
    method: str, url: str, status: int, content_type: str, body: bytes, headers: dict[str, str] | None = None
) -> None:
    """Raises unless the answer (``status``, ``content_type``, ``body``) to ``method url`` is a documented one."""
    doc = _document()
    path = operation_path(url)
    documented = doc["paths"][path][method.lower()]["responses"].get(str(status))
    assert documented is not None, f"{method} {url}: {status} is not documented for {path}"
    if "$ref" in documented:
        documented = doc["components"]["responses"][documented["$ref"].rsplit("/", 1)[1]]
    media_type = content_type.split(";")[0].strip()
    assert media_type in documented["content"], f"{method} {url}: {status} as {media_type} is not documented"
    request = requests.Request(method, f"http://testserver{url}").prepare()
    all_headers = {"Content-Type": [content_type], **{k: [v] for k, v in (headers or {}).items()}}
    answer = schemathesis.Response(status, all_headers, body, request, elapsed=0, verify=True)
    _loaded()[path][method.upper()].validate_response(answer)


def conforms_response(method: str, url: str, response: HttpResponseBase) -> None:
    """``conforms`` for a Django test client's response."""
    assert isinstance(response, HttpResponse), f"{url}: a streamed response ({type(response).__name__})"
    conforms(method, url, response.status_code, response["Content-Type"], response.content, dict(response.items()))
