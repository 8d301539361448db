"""Which landing files a micro-batch read, and which of them could not be read.

Spark's file source skips a file it cannot read (``ignoreCorruptFiles``) with nothing but a log
line, and never lists it again: skipped, not retried forever. To report such a file, the job
asks which files the batch was given and checks their Parquet footers and schema with pyarrow
(a footer read per file, well under a millisecond). The file list comes from the file source's
own log in the checkpoint (``sources/0/<batch>`` or, every tenth batch, ``<batch>.compact``:
a "v1" line, then one JSON object per file with ``path`` and ``batchId``), the record Spark
itself replays a batch from, so a replayed batch is audited on the same files.

The same footers say whether a batch can hold a row missing a required field at all
(``nulls_ruled_out``): a landing file declares those columns REQUIRED (or its statistics count no
null), so the job skips the per-row check (``transforms.well_formed``). The stream reads only the
columns the batch uses, so without that proof the check reads the batch's files again, every column.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq

from workers.landing import ARROW_SCHEMA

from .summary import Unreadable

log = logging.getLogger("leaseboard.pipeline")


def batch_files(checkpoint: Path, batch_id: int, source: int = 0) -> list[str] | None:
    """The file URIs the file source gave batch ``batch_id``; None if its log cannot be read."""
    folder = checkpoint / "sources" / str(source)
    for name in (str(batch_id), f"{batch_id}.compact"):
        path = folder / name
        if not path.is_file():
            continue
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
            if not lines or not lines[0].startswith("v"):
                raise ValueError(f"no version line in {path}")
            entries = [json.loads(line) for line in lines[1:] if line.strip()]
            return [str(e["path"]) for e in entries if int(e.get("batchId", batch_id)) == batch_id]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("cannot read the file source's log %s: %s", path, exc)
            return None
    return None


def seen_files(checkpoint: Path, source: int = 0) -> set[Path]:
    """The local files the file source has given any batch so far (every log file and compaction)."""
    seen: set[Path] = set()
    folder = checkpoint / "sources" / str(source)
    if not folder.is_dir():
        return seen
    for log_file in folder.iterdir():
        if log_file.name.startswith("."):
            continue  # Spark's .crc and temporary files
        try:
            lines = log_file.read_text(encoding="utf-8").splitlines()[1:]
            for line in lines:
                path = local_path(str(json.loads(line)["path"])) if line.strip() else None
                if path is not None:
                    seen.add(path)
        except (OSError, ValueError, KeyError, TypeError):
            continue  # the estimate goes on without it
    return seen


def pending(landing: Path, checkpoint: Path) -> list[Path]:
    """The landing files no batch has read yet: what ``runpipeline --once`` has left to do."""
    seen = seen_files(checkpoint)
    return sorted(p for p in landing.rglob("*.parquet") if p not in seen)


def footer(path: Path) -> pq.FileMetaData:
    """The Parquet footer of ``path``. Raises OSError or ArrowException if it cannot be read.

    A batch asks for each of its files' footers three times (``unreadable``, ``nulls_ruled_out``,
    ``rows``), and ``runpipeline`` a fourth for its progress: each is read once, kept while the
    file is the same (path, inode, size and modification time: a file landed again under its name
    is a new inode, one rewritten in place has a new time)."""
    status = os.stat(path)
    return _footer(str(path), status.st_ino, status.st_size, status.st_mtime_ns)


@lru_cache(maxsize=4096)
def _footer(path: str, inode: int, size: int, modified: int) -> pq.FileMetaData:
    return pq.read_metadata(path)


def rows(paths: Iterable[Path | str]) -> int:
    """Rows in the Parquet footers of ``paths`` (files or URIs); 0 for one that cannot be read."""
    total = 0
    for item in paths:
        path = local_path(item) if isinstance(item, str) else item
        if path is None:
            continue
        try:
            total += footer(path).num_rows
        except (OSError, pa.ArrowException):
            continue
    return total


def local_path(uri: str) -> Path | None:
    """The local path of a ``file:`` URI (or plain path); None for a remote one (hdfs:, s3a:, ...)."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return Path(unquote(parsed.path))
    return None


def problem(path: Path) -> str | None:
    """Why ``path`` is not a readable landing file, or None if its footer and schema are fine."""
    try:
        schema = footer(path).schema.to_arrow_schema()
    except (OSError, pa.ArrowException) as exc:
        return f"{type(exc).__name__}: {exc}"
    for expected in ARROW_SCHEMA:
        index = schema.get_field_index(expected.name)
        if index < 0:
            if expected.nullable:
                continue  # read as nulls, which this column allows
            return f"column {expected.name!r} is missing"  # its rows are dropped (transforms.well_formed)
        if not schema.field(index).type.equals(expected.type):
            return f"column {expected.name!r} is {schema.field(index).type}, not {expected.type}"
    return None


def nulls_ruled_out(uris: Iterable[str] | None) -> bool:
    """True if no row of the files ``uris`` can be missing a required field (``schema.LANDING``'s
    non-nullable columns): each is local, has every such column with its type, and its footer says
    none holds a null (the column is REQUIRED, or every row group's statistics count 0 nulls).
    False if unsure (a remote or unreadable file, a missing column, no statistics): then the job
    checks every row."""
    if uris is None:
        return False
    required = [f for f in ARROW_SCHEMA if not f.nullable]
    for uri in uris:
        path = local_path(uri)
        if path is None:
            return False
        try:
            metadata = footer(path)
            schema = metadata.schema.to_arrow_schema()
        except (OSError, pa.ArrowException):
            return False
        columns = {metadata.schema.column(i).path: i for i in range(metadata.num_columns)}
        for field in required:
            index = columns.get(field.name)
            at = schema.get_field_index(field.name)  # -1 if missing or named twice
            if index is None or at < 0 or not schema.field(at).type.equals(field.type):
                return False
            if metadata.schema.column(index).max_definition_level == 0:
                continue  # REQUIRED: cannot hold a null
            for group in range(metadata.num_row_groups):
                stats = metadata.row_group(group).column(index).statistics
                if stats is None or not stats.has_null_count or stats.null_count != 0:
                    return False
    return True


def unreadable(uris: Iterable[str]) -> list[Unreadable]:
    """The files among ``uris`` that Spark skipped or will fail to read, with the reason."""
    out = []
    for uri in uris:
        path = local_path(uri)
        if path is None:
            continue  # a cluster's file system: Spark still skips it, the log line is the report
        reason = problem(path)
        if reason is not None:
            try:
                size: int | None = path.stat().st_size
            except OSError:
                size = None
            out.append(Unreadable(str(path), reason, size))
    return out
