"""The one place that builds stores, event sources, the event sink, coordinators and whole fleets
of workers from settings.

Stores and the event publisher are named in settings by dotted path (``LEASEBOARD_STORES``,
``LEASEBOARD_EVENT_PUBLISHER``), the way Channels resolves ``CHANNEL_LAYERS``: the SQL store and
the publisher live in the dashboard, above this package, and the workers reach them only through
configuration. Classes are imported when chosen, so a store's client library is needed only when
that store is used. Settings and the environment are read here, once, and handed to the adapters'
constructors. Everything raises ``ImproperlyConfigured`` with the setting to fix (``build_fleet``:
``FleetError``, naming the option or setting).

Rooms: ``stores`` (the stores ``--store`` names), ``parts`` (a worker's hub, source, coordinator and
the event sink), ``race`` (001's lease race and the start-up check), ``config`` (a fleet's options,
checked) and ``fleet`` (``build_fleet``).
"""

from __future__ import annotations

from .config import CLOCK_SKEW_ENV, FleetConfig, FleetError, check_resolution
from .fleet import Fleet, build_fleet, source_beside, wait_for_stores
from .parts import SOURCES, build_coordinator, build_sink, build_source, event_publisher, hub_ref
from .race import close_race_stores
from .stores import Stores, build_stores, close_stores, instrument, is_process_wide, store_names

__all__ = [
    "CLOCK_SKEW_ENV",
    "SOURCES",
    "Fleet",
    "FleetConfig",
    "FleetError",
    "Stores",
    "build_coordinator",
    "build_fleet",
    "build_sink",
    "build_source",
    "build_stores",
    "check_resolution",
    "close_race_stores",
    "close_stores",
    "event_publisher",
    "hub_ref",
    "instrument",
    "is_process_wide",
    "source_beside",
    "store_names",
    "wait_for_stores",
]
