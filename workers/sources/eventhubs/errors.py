"""What goes wrong with Event Hubs, as our errors: a bad configuration, a failed receiver, a stolen
partition; and keeping the shared access key out of every message."""

from __future__ import annotations

from azure.eventhub.exceptions import EventHubError

from workers.sources.base import PartitionTaken

ENV_CONNECTION_STRING = "EVENTHUB_CONNECTION_STRING"
CONNECTION_STRING_FORMAT = (
    "Endpoint=sb://<namespace>.servicebus.windows.net/;SharedAccessKeyName=<policy>;SharedAccessKey=<key>"
    "[;EntityPath=<event hub>] (the portal shows it under the namespace's or hub's Shared access policies)"
)


class EventHubsConfigError(ValueError):
    """The connection string is missing or wrong, the service refused it, or the hub is not there."""


class ReaderFailed(RuntimeError):
    """The receiver of one partition stopped with an error; ``__cause__`` is the SDK's exception."""

    def __init__(self, message: str, partition_id: str) -> None:
        super().__init__(message)
        self.partition_id = partition_id


class PartitionStolen(ReaderFailed, PartitionTaken):
    """The service disconnected the receiver because another one, with the same or a higher owner
    level, opened the partition: another worker (or Microsoft's processor) owns it now."""


def reader_failure(label: str, partition_id: str, error: BaseException) -> ReaderFailed:
    """Our error for the SDK's ``error`` on the receiver of ``partition_id`` (``label`` names it):
    PartitionStolen when another receiver took the partition, else ReaderFailed; ``__cause__`` is
    ``error``."""
    if is_stolen(error):
        failure: ReaderFailed = PartitionStolen(
            f"{label}: another receiver took the partition (the service cut this one off:"
            f" {first_line(error)}); it is owned elsewhere now",
            partition_id,
        )
    else:
        failure = ReaderFailed(f"{label}: receiving failed: {type(error).__name__}: {first_line(error)}", partition_id)
    failure.__cause__ = error
    return failure


def is_stolen(error: BaseException) -> bool:
    """Whether ``error`` (or what it wraps) is the service disconnecting a receiver for another
    one on the same partition: AMQP condition ``amqp:link:stolen``, or an epoch refusal."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, EventHubError) and current.error == "link:stolen":
            return True
        condition = getattr(current, "condition", None)
        condition = getattr(condition, "value", condition)
        if condition in (b"amqp:link:stolen", "amqp:link:stolen"):
            return True
        if "epoch" in str(current).lower():
            return True
        current = current.__cause__ or current.__context__
    return False


class Redactor:
    """Replaces the secret parts of one connection string (the key, or a signature) by ``***``."""

    def __init__(self, connection_string: str) -> None:
        found = []
        for part in connection_string.split(";"):
            name, _, value = part.partition("=")
            if name.strip().lower() in ("sharedaccesskey", "sharedaccesssignature") and value.strip():
                found.append(value.strip())
        self._secrets = sorted(found, key=len, reverse=True)  # longest first: no secret is left half-replaced

    def __call__(self, error: object) -> str:
        """``str(error)`` without the secrets."""
        text = str(error)
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text


def first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
