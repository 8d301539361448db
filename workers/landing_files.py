"""Where the landing is and what its names say, without pyarrow: what the console reads of it.

``workers.landing`` writes the files (and re-exports these); the console only finds the landing
(``landing_root``), reads its markers (``read_markers``: the newest landed event per partition, for
the pipeline page's lag) and names files, so it does not import pyarrow and numpy for that (about
0.15 CPU seconds and 30 MB at every start of a console process).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

MARKERS = "_latest"  # <root>/<hub>/_latest/<partition>.json: the newest landed event (for lag)
_FILE = re.compile(r"(\d{20})-(\d{20})\.parquet")


def landing_root() -> Path:
    """``LEASEBOARD_LANDING_DIR``, else ``<LEASEBOARD_VAR_DIR>/landing``."""
    from django.conf import settings

    return Path(getattr(settings, "LEASEBOARD_LANDING_DIR", Path(settings.VAR_DIR) / "landing"))


def file_name(first: int, last: int) -> str:
    """The landing file name of a partition's events ``first``..``last`` (zero-padded: sorts in order)."""
    return f"{first:020d}-{last:020d}.parquet"


def sequence_range(name: str) -> tuple[int, int] | None:
    """(first, last) sequence number of a landing file's name; None for any other name."""
    match = _FILE.fullmatch(name)
    return (int(match[1]), int(match[2])) if match else None


def read_markers(root: Path, hub: str) -> dict[str, dict[str, float]]:
    """Partition id -> {"sequence_number", "enqueued_time", "landed_at"} of its newest landed event."""
    out: dict[str, dict[str, float]] = {}
    folder = root / hub / MARKERS
    if not folder.is_dir():
        return out
    for path in folder.glob("*.json"):
        try:
            out[path.stem] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # replaced under our feet or half-written by a crash: the next one will do
    return out
