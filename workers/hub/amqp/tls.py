"""TLS for the AMQP hub: AMQPS, as Azure Event Hubs serves it (TLS from the first byte, port 5671).

The certificate chain and its private key are files named by ``runhub``'s options or, failing those,
by the environment (``LEASEBOARD_HUB_TLS_CERT``, ``LEASEBOARD_HUB_TLS_KEY``; an encrypted key's
password only by ``LEASEBOARD_HUB_TLS_KEY_PASSWORD``, never by an option that ``ps`` would show).
Messages name the files, never the key or its password.
"""

from __future__ import annotations

import os
import ssl
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ENV_CERT = "LEASEBOARD_HUB_TLS_CERT"
ENV_KEY = "LEASEBOARD_HUB_TLS_KEY"
ENV_KEY_PASSWORD = "LEASEBOARD_HUB_TLS_KEY_PASSWORD"
ENV_PORT = "LEASEBOARD_HUB_TLS_PORT"
AMQPS_PORT = 5671  # the only port the Event Hubs SDKs connect to with TLS (short of custom_endpoint_address)


class TlsConfigError(RuntimeError):
    """The certificate or key cannot be used (one named without the other, missing, unreadable,
    readable by everyone, not a pair, a wrong password)."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert: Path
    key: Path

    def describe(self) -> str:
        return f"certificate {self.cert}, key {self.key}"


def tls_files(cert: str | None, key: str | None, env: Mapping[str, str] = os.environ) -> TlsFiles | None:
    """The certificate and key named by the arguments, else by the environment; None if neither is
    named anywhere (TLS off). Raises TlsConfigError if only one of the two is named."""
    cert = cert or env.get(ENV_CERT) or None
    key = key or env.get(ENV_KEY) or None
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        missing = "certificate (--tls-cert or $" + ENV_CERT + ")" if cert is None else f"key (--tls-key or ${ENV_KEY})"
        raise TlsConfigError(f"TLS needs a certificate and its private key: the {missing} is not given")
    return TlsFiles(Path(cert), Path(key))


def server_context(files: TlsFiles, env: Mapping[str, str] = os.environ) -> ssl.SSLContext:
    """A server context (TLS 1.2 or later, as Azure requires) holding the certificate chain and key.
    Raises TlsConfigError."""
    for what, path in (("certificate", files.cert), ("key", files.key)):
        if not path.is_file():
            raise TlsConfigError(f"the TLS {what} {path} is not a file")
    mode = stat.S_IMODE(files.key.stat().st_mode)
    if mode & stat.S_IROTH:
        raise TlsConfigError(f"the TLS key {files.key} is readable by everyone (mode {mode:o}); chmod o-r it")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # A callable, so that OpenSSL never prompts on the terminal for an encrypted key's password.
    password = env.get(ENV_KEY_PASSWORD, "")
    try:
        context.load_cert_chain(files.cert, files.key, password=lambda: password)
    except (ssl.SSLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or type(exc).__name__
        hint = f" (is the key encrypted? its password goes in ${ENV_KEY_PASSWORD})" if not password else ""
        raise TlsConfigError(f"cannot use the TLS {files.describe()}: {reason}{hint}") from None
    return context


def tls_port(option: int | None, env: Mapping[str, str] = os.environ) -> int:
    """The AMQPS port: the option, else ``LEASEBOARD_HUB_TLS_PORT``, else 5671. Raises TlsConfigError."""
    if option is not None:
        return option
    text = env.get(ENV_PORT) or str(AMQPS_PORT)
    try:
        return int(text)
    except ValueError:
        raise TlsConfigError(f"${ENV_PORT} must be a port number, got {text!r}") from None
