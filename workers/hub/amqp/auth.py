"""Shared access signatures: the key, tokens, and what a connection has been granted.

A client puts a token on ``$cbs`` before it attaches links; the token is
``SharedAccessSignature sr=<resource>&sig=<signature>&se=<expiry>&skn=<key name>`` where the
signature is base64(HMAC-SHA256(key, url-quoted resource + "\\n" + expiry)), the key being used
as its UTF-8 text (not base64-decoded), exactly as the SDKs sign. A token for
``sb://host:port/hub`` covers the hub and everything below it (its consumer groups and
partitions); one for ``sb://host:port/`` covers every hub. The host is not checked: one key
serves every name this server is reached by.

Nothing here logs or formats a key, a signature or a token.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass, field
from urllib.parse import parse_qs, quote_plus, urlsplit

KEY_NAME = "RootManageSharedAccessKey"
TOKEN_TYPE = "servicebus.windows.net:sastoken"
_PREFIX = "SharedAccessSignature "


class AuthError(Exception):
    """A token that grants nothing; the message is safe to send back and to log."""


@dataclass(frozen=True, slots=True)
class SasKey:
    """A shared access policy: its name and key."""

    name: str
    key: str = field(repr=False)

    @classmethod
    def generate(cls, name: str = KEY_NAME) -> SasKey:
        """A new random key, base64 of 32 bytes like the keys Azure issues."""
        return cls(name, base64.b64encode(secrets.token_bytes(32)).decode("ascii"))

    def sign(self, resource: str, expiry: int) -> str:
        """A token for ``resource`` valid until ``expiry`` (seconds since the epoch)."""
        signature = _signature(self.key, resource, expiry)
        return f"{_PREFIX}sr={quote_plus(resource)}&sig={quote_plus(signature)}&se={expiry}&skn={quote_plus(self.name)}"


@dataclass(frozen=True, slots=True)
class Grant:
    """What a valid token allows: ``path`` (lowercased, no slashes at the ends) and below, until ``expires``."""

    path: str
    expires: float

    def covers(self, entity: str, now: float) -> bool:
        if now >= self.expires:
            return False
        return not self.path or entity == self.path or entity.startswith(self.path + "/")


def verify(token: object, key: SasKey, now: float) -> Grant:
    """The grant of ``token`` if ``key`` signed it and it has not expired. Raises AuthError."""
    if isinstance(token, bytes):
        token = token.decode("utf-8", "replace")
    if not isinstance(token, str) or not token.startswith(_PREFIX):
        raise AuthError("the token is not a shared access signature")
    fields = parse_qs(token[len(_PREFIX) :], keep_blank_values=True)
    try:
        [resource], [signature], [expiry_text] = fields["sr"], fields["sig"], fields["se"]
    except (KeyError, ValueError):
        raise AuthError("the shared access signature lacks sr, sig or se") from None
    name = (fields.get("skn") or [""])[0]
    if name != key.name:
        raise AuthError(f"unknown shared access policy {name!r}")
    try:
        expiry = int(expiry_text)
    except ValueError:
        raise AuthError("the shared access signature has a malformed expiry (se)") from None
    if not hmac.compare_digest(_signature(key.key, resource, expiry), signature):
        raise AuthError("the shared access signature is not valid for this key (InvalidSignature)")
    if expiry <= now:
        raise AuthError("the shared access signature has expired (ExpiredToken)")
    return Grant(resource_path(resource), float(expiry))


def resource_path(resource: str) -> str:
    """``sb://host:port/Hub/ConsumerGroups/x`` -> ``hub/consumergroups/x``."""
    path = urlsplit(resource).path if "://" in resource else resource
    return path.strip("/").lower()


def _signature(key: str, resource: str, expiry: int) -> str:
    message = f"{quote_plus(resource)}\n{expiry}".encode()
    return base64.b64encode(hmac.new(key.encode("utf-8"), message, hashlib.sha256).digest()).decode("ascii")
