"""The lease-table coordinator, in rooms: what it is built with and keeps (``state``), the fixed
shares of its schedule (``options``), event stamps (``stamping``), liveness and dark time
(``liveness``), the conditional writes (``writes``), renewal (``renewal``), the read and view
(``read``), handoffs and releases (``handoffs``) and the cycle (``cycle``), each room built on the
one before it.
"""

from .cycle import Coordinator
from .options import EARLY, RENEW_SHARE

__all__ = ["EARLY", "RENEW_SHARE", "Coordinator"]
