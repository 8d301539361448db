"""Raises one alert in a console's database as the landing's writer does, from another process.

Run as ``python -m tests.dashboard.raise_alert HUB PARTITION SEQUENCE LATENCY`` with the Django
settings of the console under test (its environment): ``workers.alerts.insert`` of a glass break
whose event was enqueued LATENCY seconds before it is raised, then ``notify`` (which, with the
in-memory channel layer, reaches no other process: the console's feed finds it by polling), and a
pipeline batch finished now whose events were enqueued 2 to 4 seconds before. Prints the alert's
home.
"""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime, timedelta


def main(hub: str, partition: str, sequence: int, latency: float) -> None:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    django.setup()
    from django.db import transaction

    from workers import alerts
    from workers.models import PipelineBatch

    now = datetime.now(UTC)
    enqueued = now - timedelta(seconds=latency)
    home = f"home-{sequence:05d}"
    row = {
        "partition_id": partition,
        "sequence_number": sequence,
        "home": home,
        "kind": alerts.GLASS_BREAK,
        "sensor": alerts.GLASS_BREAK,
        "sensor_id": "glass_break-1",
        "event": "detected",
        "event_time": enqueued,
        "enqueued_time": enqueued,
    }
    with transaction.atomic():
        fresh = alerts.insert(hub, [row], raised_by="landing", raised_at=now)
        PipelineBatch.objects.create(
            hub=hub,
            query_id="browser-test",
            batch_id=sequence,
            finished_at=now,
            events=10,
            alerts=1,
            newest_enqueued=now - timedelta(seconds=2),
            oldest_enqueued=now - timedelta(seconds=4),
            write_seconds=0.1,
        )
    assert fresh, "the alert was raised before"
    alerts.notify(hub)
    print(home)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
