"""Tiny readers of environment settings; a wrong value is refused with one line saying what to fix."""

from __future__ import annotations

import contextlib
import os
import zlib

from django.core.exceptions import ImproperlyConfigured


def envstr(name: str, default: str) -> str:
    return os.environ.get(name, default) or default


def envint(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a whole number, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {value}")
    return value


def envfloat(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from None


def envbool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise ImproperlyConfigured(f"{name} must be true or false, got {raw!r}")


LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def envlevels(name: str) -> dict[str, dict[str, str]]:
    """``logger=LEVEL`` pairs, comma-separated (``workers.runtime.cycles=DEBUG,azure=INFO``), as the
    ``loggers`` of Django's ``LOGGING``: one logger told more (or less) than the root's level."""
    loggers: dict[str, dict[str, str]] = {}
    for pair in filter(None, (p.strip() for p in os.environ.get(name, "").split(","))):
        logger, _, level = pair.partition("=")
        if not logger.strip() or level.strip().upper() not in LEVELS:
            raise ImproperlyConfigured(
                f"{name} must be logger=LEVEL pairs, comma-separated, each level one of {', '.join(LEVELS)}; "
                f"got {pair!r}"
            )
        loggers[logger.strip()] = {"level": level.strip().upper()}
    return loggers


def weak_secret(key: str) -> str | None:
    """Why ``key`` is too weak for a production secret key, or None: fewer than 50 characters, fewer
    than 10 distinct ones, a development default, or a pattern that compresses (a random key of 50
    or more characters does not: repeated runs, words typed twice, a keyboard walk do)."""
    if len(key) < 50:
        return f"it has {len(key)} characters (at least 50)"
    if len(set(key)) < 10:
        return f"it has {len(set(key))} distinct characters (at least 10)"
    if key.startswith(("django-insecure", "dev-only")):
        return "it is a development key"
    # Raw deflate with fixed codes: only repeats shrink (a hex key's small alphabet does not).
    packer = zlib.compressobj(9, zlib.DEFLATED, -15, 9, zlib.Z_FIXED)
    packed = len(packer.compress(key.encode()) + packer.flush())
    if packed < 0.75 * len(key.encode()):
        return "it repeats itself (it compresses to less than three quarters of its length)"
    return None


def create_private(path: str) -> None:
    """Create the file ``path`` readable by its owner only (0600) if it does not exist yet, its folder
    too: a SQLite database holds the console's session keys (SQLite's -wal and -shm files take the
    database file's mode)."""
    if not path or path == ":memory:" or path.startswith("file:") or os.path.exists(path):
        return
    with contextlib.suppress(OSError):  # exists by now, or cannot be made: SQLite says so when it opens it
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
