"""What the server allows one connection: frame and message sizes, silences, unsent bytes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Limits:
    """What one connection may ask of the server, and how long it may stay silent."""

    max_frame_size: int = 256 * 1024
    max_message_size: int = 1024 * 1024  # what Event Hubs' standard tier takes
    # Seconds advertised to the peer as our idle timeout in ``open`` (Azure Event Hubs advertises 120 s);
    # a peer silent for twice as long is closed (proton's rule: it advertises half its local timeout).
    idle_timeout: float = 120.0
    handshake_timeout: float = 30.0  # seconds from connecting to the peer's open
    write_buffer: int = 4 * 1024 * 1024  # stop pumping events into a connection that has this much unsent
