"""The dead-letter files: ``<directory>/<hub>/<partition>.jsonl``, one JSON object a line, and beside
them ``<hub>/replayed/<partition>.jsonl``, one line per dead letter replayed (sent to the hub again,
or handed to the owner's handler in place: ``inplace.py``).

Writers append a line under ``flock`` on the file; a purge copies the lines it keeps to a new file
and renames it over the old one under the same lock, so a writer that opened the old file before
the rename finds, once it has the lock, that the path names another file, and opens it again
(``append_line``): no line is written into a file that is no longer there. Readers take no lock:
a last line without its newline is still being written, and is left for the next read.

A dead letter is named by its consumer group, partition and sequence number: the same event set
aside twice (handled again after a checkpoint reset) is one dead letter, its newest line.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from balancer.model import pid_key

Entry = dict[str, Any]
MAX_LINE = 4 * 1024 * 1024  # bytes: a line longer than this (no writer writes one) is skipped unread
MARKERS = "replayed"  # the folder of the replay markers, beside the dead-letter files
_FILE = re.compile(r"(0|[1-9][0-9]{0,5})\.jsonl")


def folder_of(directory: Path, hub: str) -> Path:
    return directory / hub


def letters_path(folder: Path, partition_id: str) -> Path:
    return folder / f"{partition_id}.jsonl"


def markers_path(folder: Path, partition_id: str) -> Path:
    return folder / MARKERS / f"{partition_id}.jsonl"


def partitions(folder: Path) -> list[str]:
    """The partitions with a dead-letter file in ``folder``, in id order ([] when there is no folder)."""
    if not folder.is_dir():
        return []
    found = [m.group(1) for p in folder.iterdir() if (m := _FILE.fullmatch(p.name)) and p.is_file()]
    return sorted(found, key=pid_key)


def append_line(path: Path, line: str) -> None:
    """Append ``line`` (ending in a newline) to ``path`` under its lock. Raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        with path.open("a", encoding="utf-8") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                current = os.stat(path).st_ino
            except FileNotFoundError:
                continue  # removed after we opened it: open (create) it again
            if current != os.fstat(f.fileno()).st_ino:
                continue  # a purge renamed a new file over the one we opened: write to that one
            f.write(line)
            f.flush()
            return


def parse(line: bytes) -> Entry | None:
    """The entry of one line; None for a line that is no JSON object (cut short by a crash)."""
    try:
        entry = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return entry if isinstance(entry, dict) else None


def sequence_of(entry: Entry) -> int | None:
    value = entry.get("sequence_number")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def b64(value: object) -> bytes:
    """The bytes of a base64 field (b"" for none); ValueError when it is not base64."""
    if value is None or value == "":
        return b""
    if not isinstance(value, str):
        raise ValueError(f"not base64 text: {type(value).__name__}")
    return base64.b64decode(value, validate=True)


def _lines(f: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """(position, line) of each whole line from where ``f`` is; a line over MAX_LINE is skipped."""
    while True:
        at = f.tell()
        line = f.readline(MAX_LINE + 1)
        if not line.endswith(b"\n"):
            if len(line) <= MAX_LINE:
                return  # the end, or a line still being written
            while line and not line.endswith(b"\n"):
                line = f.readline(MAX_LINE)
            continue
        yield at, line


@dataclass(frozen=True)
class Page:
    entries: list[Entry]  # in file order, each with its file's partition id
    next: tuple[str, int] | None  # where the next page starts: (partition, byte position); None: no more
    bytes_read: int


def read_page(
    folder: Path, consumer_group: str, partition: str | None, after: tuple[str, int] | None, limit: int, budget: int
) -> Page:
    """Up to ``limit`` dead letters of ``consumer_group`` from ``after`` on (partition by partition, each
    file oldest first), stopping once ``budget`` bytes were read. A file cut under a cursor (a purge
    since) resumes at the next whole line."""
    ids = [partition] if partition is not None else partitions(folder)
    if after is not None:
        ids = [p for p in ids if pid_key(p) >= pid_key(after[0])]
    entries: list[Entry] = []
    read = 0
    for pid in ids:
        start = after[1] if after is not None and pid == after[0] else 0
        try:
            with letters_path(folder, pid).open("rb") as f:
                _seek_line(f, start)
                for at, line in _lines(f):
                    if len(entries) >= limit or read >= budget:
                        return Page(entries, (pid, at), read)
                    read += len(line)
                    entry = parse(line)
                    if entry is None or entry.get("consumer_group") != consumer_group or sequence_of(entry) is None:
                        continue
                    entries.append({**entry, "partition_id": pid})  # the file says which partition
        except FileNotFoundError:
            continue
    return Page(entries, None, read)


def _seek_line(f: IO[bytes], position: int) -> None:
    """Put ``f`` at the first line that starts at or after ``position``."""
    if position <= 0:
        return
    f.seek(position - 1)
    if f.read(1) != b"\n":
        f.readline()


def read_letters(folder: Path, partition: str, consumer_group: str) -> dict[int, Entry]:
    """Every dead letter of ``consumer_group`` in ``partition``'s file, by sequence number (the newest
    line of each), read line by line. Blocking."""
    found: dict[int, Entry] = {}
    try:
        with letters_path(folder, partition).open("rb") as f:
            for _, line in _lines(f):
                entry = parse(line)
                if entry is None or entry.get("consumer_group") != consumer_group:
                    continue
                sequence = sequence_of(entry)
                if sequence is not None:
                    found[sequence] = entry
    except FileNotFoundError:
        pass
    return found


def purge(folder: Path, partition: str, drop: Callable[[Entry], bool]) -> int:
    """Remove the lines of ``partition``'s file whose entry ``drop`` says, under the writers' lock;
    the number removed. Blocking; raises OSError."""
    path = letters_path(folder, partition)
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return 0
    with f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        if os.stat(path).st_ino != os.fstat(f.fileno()).st_ino:
            f.close()
            return purge(folder, partition, drop)  # another purge replaced it meanwhile: that one
        kept = path.with_name(f".{path.name}.purging")
        removed = 0
        with kept.open("wb") as out:
            for _, line in _lines(f):
                entry = parse(line)
                if entry is not None and drop(entry):
                    removed += 1
                else:
                    out.write(line)
        if removed:
            os.replace(kept, path)  # still under the lock: writers waiting for it write to the new file
        else:
            kept.unlink()
        return removed


# --- the replay markers --------------------------------------------------------------------------


def read_markers(folder: Path, partition: str, consumer_group: str) -> dict[int, Entry]:
    """The replays of ``consumer_group``'s dead letters of ``partition``, by sequence number (the last)."""
    try:
        with markers_path(folder, partition).open("rb") as f:
            return _markers(f, consumer_group)
    except FileNotFoundError:
        return {}


def read_failures(folder: Path, partition: str, consumer_group: str) -> dict[int, Entry]:
    """The in-place replays that failed, by sequence number, where no replay came after."""
    try:
        with markers_path(folder, partition).open("rb") as f:
            return _markers(f, consumer_group, failed=True)
    except FileNotFoundError:
        return {}


def _markers(f: IO[bytes], consumer_group: str, *, failed: bool = False) -> dict[int, Entry]:
    """The last marker of each sequence number; one saying ``failed`` (an in-place replay whose
    handler call failed) unmarks it: it was not replayed (with ``failed``: only those)."""
    found: dict[int, Entry] = {}
    for _, line in _lines(f):
        marker = parse(line)
        if marker is not None and marker.get("consumer_group") == consumer_group:
            sequence = sequence_of(marker)
            if sequence is not None:
                found[sequence] = marker
    return {n: m for n, m in found.items() if bool(m.get("failed")) == failed}


@contextmanager
def markers_locked(folder: Path, partition: str, consumer_group: str) -> Iterator[tuple[dict[int, Entry], IO[bytes]]]:
    """The markers of ``partition`` as they are now, and the file to append new ones to, under a lock
    held until the block ends: two replays of one partition run one after the other, the second
    seeing what the first sent."""
    path = markers_path(folder, partition)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        f.seek(0)
        yield _markers(f, consumer_group), f


def add_marker(f: IO[bytes], marker: Entry) -> None:
    f.write(json.dumps(marker, sort_keys=True).encode() + b"\n")
    f.flush()
