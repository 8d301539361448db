"""The body of ``/api/groups`` in the console's OpenAPI document (``schemas.py``): every hub and
consumer group, each summed up as its fleet page's header sums it up."""

from __future__ import annotations

from ..live.lag import STATUSES
from .schema_parts import BOOLEAN, INTEGER, NUMBER, STRING, Schema, array, counts, nullable, obj

LAG_STATUSES = tuple(s.value for s in STATUSES)

GROUP = obj(
    {
        "hub": STRING,
        "consumer_group": STRING,
        "partitions": {**INTEGER, "description": "the hub's partitions (the source's; else those the store has)"},
        "owned": {**INTEGER, "description": "partitions with an unexpired owner"},
        "workers": INTEGER,
        "workers_alive": INTEGER,
        "workers_draining": INTEGER,
        "lag": {**nullable(INTEGER), "description": "events behind: the sum of the known lags"},
        "lag_status": {
            **nullable({"type": "string", "enum": list(LAG_STATUSES)}),
            "description": "the worst status of any partition (OK < REWIND < WARN < STALL < STOP, as the alert "
            "rules rank them); null when no round sampled the group",
        },
        "by_lag_status": counts(LAG_STATUSES),
        "desired_workers": {**nullable(INTEGER), "description": "the workers the group needs (capacity)"},
        "desired_reason": nullable(STRING),
        "sampled_at": nullable(NUMBER),
        "source": obj({"name": STRING, "available": BOOLEAN, "error": nullable(STRING)}),
        "fleet_url": {"type": "string", "description": "the group's fleet page: /?hub=&consumer_group="},
    }
)

GROUPS = obj(
    {
        "namespace": STRING,
        "store": {"type": "string", "description": "the store read (LEASEBOARD_STORE)"},
        "generated_at": {"type": "number", "description": "the store's clock when it was read"},
        "store_requests": {"type": "integer", "description": "the requests the read of every group took"},
        "groups": array(GROUP),
    }
)

SCHEMAS: dict[str, Schema] = {"Groups": GROUPS}
