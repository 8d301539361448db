"""Where one hub's pipeline reads and writes: the landing, the Spark checkpoint, the results, the archive."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Paths:
    """Where one hub's pipeline reads and writes."""

    landing: Path  # <landing root>/<hub>: <partition>/<first>-<last>.parquet
    checkpoint: Path  # the query's offsets, commits and the file source's log
    results: Path  # aggregates/ and alerts/, one batch_id=N folder per batch

    @property
    def archive(self) -> Path:
        """Where the file source moves the landing files of committed batches (``cleanSource``): under it,
        each file keeps its whole original path."""
        return self.checkpoint.parent / "archive"

    @classmethod
    def for_hub(cls, hub: str, landing_root: Path | None = None, pipeline_root: Path | None = None) -> Paths:
        """The paths from settings (``LEASEBOARD_LANDING_DIR``, ``LEASEBOARD_PIPELINE_DIR``) unless given."""
        from django.conf import settings

        from workers.landing import landing_root as default_landing

        landing = Path(landing_root) if landing_root is not None else default_landing()
        default_pipeline = Path(settings.VAR_DIR) / "pipeline"
        configured = getattr(settings, "LEASEBOARD_PIPELINE_DIR", default_pipeline)
        pipeline = Path(pipeline_root if pipeline_root is not None else configured) / hub
        return cls(landing / hub, pipeline / "checkpoint", pipeline / "results")

    def located(self, path: Path) -> Path:
        """Where a landing file is now: ``path``, or its place in the archive once a batch committed it."""
        archived = self.archive / path.relative_to(path.anchor)
        return archived if not path.exists() and archived.exists() else path

    def restore_archive(self) -> int:
        """Move the archived landing files back where they were landed (``runpipeline --reset``: a new
        query counts every landed event again); returns how many."""
        moved = 0
        for archived in sorted(self.archive.rglob("*.parquet")) if self.archive.is_dir() else []:
            original = Path(archived.anchor) / archived.relative_to(self.archive)
            if not original.is_relative_to(self.landing) or original.exists():
                continue  # not ours, or landed again meanwhile (the same range: the same events)
            original.parent.mkdir(parents=True, exist_ok=True)
            archived.replace(original)
            moved += 1
        return moved

    def query_id(self) -> str | None:
        """The id of the query this checkpoint belongs to (stable across restarts); None before its first start."""
        try:
            return str(json.loads((self.checkpoint / "metadata").read_text(encoding="utf-8"))["id"])
        except (OSError, ValueError, KeyError):
            return None
