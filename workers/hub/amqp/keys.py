"""The shared access key the AMQP hub accepts: from ``LEASEBOARD_HUB_KEY``, else generated once into var/.

The generated key is written with mode 0600 and read back on the next start, so clients keep
working across restarts. Nothing here logs the key.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from workers.hub.amqp.auth import KEY_NAME, SasKey

ENV_KEY = "LEASEBOARD_HUB_KEY"
ENV_KEY_NAME = "LEASEBOARD_HUB_KEY_NAME"
KEY_FILE = "hub-amqp.key"


class KeyFileError(RuntimeError):
    """The key file exists but cannot be used (readable by others, empty)."""


def load_key(var_dir: Path, env: Mapping[str, str] = os.environ) -> tuple[SasKey, str]:
    """The key, and where it came from (for a message that names the place, never the key).
    Raises KeyFileError, OSError."""
    name = env.get(ENV_KEY_NAME) or KEY_NAME
    if env.get(ENV_KEY):
        return SasKey(name, env[ENV_KEY]), f"${ENV_KEY}"
    path = Path(var_dir) / KEY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise KeyFileError(f"{path} is readable by others (mode {mode:o}); chmod 600 it or delete it") from None
        value = path.read_text(encoding="ascii").strip()
        if not value:
            raise KeyFileError(f"{path} is empty; delete it and a new key is generated") from None
        return SasKey(name, value), str(path)
    key = SasKey.generate(name)
    with os.fdopen(fd, "w", encoding="ascii") as out:
        out.write(key.key + "\n")
    return key, str(path)
