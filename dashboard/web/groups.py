"""``/api/groups``: every hub and consumer group of the configured namespace at a glance
(``live.groups``), each with a link into its fleet page. The groups page (``pages.groups_page``)
polls it."""

from __future__ import annotations

from urllib.parse import urlencode

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import reverse

from ..live.groups.overview import read_groups
from ..live.health import outage
from .common import db
from .degrade import unavailable_json
from .methods import read_only


def fleet_url(hub: str, consumer_group: str) -> str:
    """The fleet page of one hub and consumer group (``?hub=&consumer_group=``, as every page takes it)."""
    return f"{reverse('index')}?{urlencode({'hub': hub, 'consumer_group': consumer_group})}"


@read_only
async def api_groups(request: HttpRequest) -> HttpResponse:
    """200 with every group the store knows (one read of the store, whatever their number); 503 with
    the reason while the store or the database cannot be read."""
    try:
        found = (await read_groups(db)).as_json()
    except Exception as exc:
        down = outage(exc)  # read_groups told health already: no second log line
        if down is None:
            raise
        return unavailable_json(down.reason)
    for group in found["groups"]:
        group["fleet_url"] = fleet_url(group["hub"], group["consumer_group"])
    return JsonResponse(found)
