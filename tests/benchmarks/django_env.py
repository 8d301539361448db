"""Django for a benchmark that starts its own servers and processes: settings, and a var directory
and SQLite file of its own under a temporary folder (unless the environment names them)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def temporary_django(prefix: str) -> Iterator[Path]:
    """``django.setup()`` with ``LEASEBOARD_VAR_DIR`` and ``DATABASE_URL`` in a temporary folder,
    which is yielded and removed afterwards."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    with tempfile.TemporaryDirectory(prefix=prefix) as name:
        tmp = Path(name)
        os.environ.setdefault("LEASEBOARD_VAR_DIR", name)
        os.environ.setdefault("DATABASE_URL", f"sqlite:///{tmp / 'bench.sqlite3'}")
        import django

        django.setup()
        yield tmp
