"""What every store does with a record it cannot read in full (a hand edit, bit rot, another program).

A corrupt record costs only itself, never the listing it is in:

- a time that is not a finite number (NaN, infinity, text that is no number, missing) is read as
  None: an ownership record without a time counts as expired (``OwnershipRecord.expired``), so its
  partition can be claimed with the ETag the listing shows; a checkpoint or control keeps what
  else it says. A member without a readable ``last_seen`` is skipped (not alive): its worker's
  next heartbeat rewrites it;
- an ETag that is garbage is listed as it is (as text), so the claim that carries it wins;
- a record whose partition id (or whose structure) cannot be read at all is skipped.

Each such record is logged once, as a warning, until what is wrong with it changes, and is listed
in the store's ``corrupt`` until it reads again or is gone (``CorruptLog``).
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
from collections.abc import Mapping

from balancer.errors import CorruptRecord

CORRUPT_ETAG = "corrupt-"  # how an ETag made up for a record that carries none begins


def finite_time(value: object) -> float | None:
    """``value`` as seconds since the epoch when it is a finite number (or the text of one), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    if isinstance(value, int | float | str):
        try:
            number = float(value)
        except (ValueError, OverflowError):
            return None
        return number if math.isfinite(number) else None
    return None


def time_flaw(name: str, value: object) -> str:
    """What is wrong with a time ``finite_time`` read as None."""
    return f"{name} {value!r} is not a finite number: read as None"


def made_up_etag(raw: bytes) -> str:
    """The ETag listed for a stored value that carries no usable one: it names exactly that value."""
    return CORRUPT_ETAG + hashlib.sha1(raw, usedforsecurity=False).hexdigest()


class CorruptLog:
    """The corrupt records the latest listing of each scope found, each logged once as a warning.

    ``listing(scope, found)`` reports one listing: a record is logged when first found, or when what
    is wrong with it changes; one that reads again (or is gone) is forgotten, and logged again if
    it is ever damaged again. Thread-safe (the SQL store lists on two threads).
    """

    def __init__(self, log: logging.Logger, suffix: str = "") -> None:
        self._log = log
        self._suffix = suffix
        self._lock = threading.Lock()
        self._found: dict[tuple[str, str], CorruptRecord] = {}

    @property
    def records(self) -> list[CorruptRecord]:
        with self._lock:
            return list(self._found.values())

    def listing(self, scope: str, found: Mapping[str, CorruptRecord], skipped: frozenset[str] = frozenset()) -> None:
        """``found``: every corrupt record (by key) of one whole listing of ``scope``; ``skipped``:
        the keys among them that the listing left out (the others were listed in part)."""
        new: list[tuple[str, CorruptRecord]] = []
        with self._lock:
            for gone in [k for k in self._found if k[0] == scope and k[1] not in found]:
                del self._found[gone]
            for key, problem in found.items():
                known = self._found.get((scope, key))
                if known is None or known.problem != problem.problem:
                    new.append((key, problem))
                self._found[(scope, key)] = problem
        for key, problem in new:
            self._log.warning("%s %s%s", "skipped" if key in skipped else "read in part", problem, self._suffix)
