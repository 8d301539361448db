"""The embedded hub's record formats: format 1 (before events kept their AMQP sections) still reads,
format 2 keeps the sections, and a log holding both reads in order."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

from workers.hub.embedded import EmbeddedHub
from workers.hub.log import encode
from workers.sources.base import Position, ReceivedEvent

from .hubfiles import log_path, read_all


def format_1_record(sequence: int, enqueued: float, key: bytes | None, body: bytes) -> bytes:
    """A record laid out by hand as format 1 was written (before format 2 existed), not by ``encode``."""
    key_field = 0xFFFF if key is None else len(key)
    length = 4 + 4 + 8 + 8 + 2 + len(key or b"") + len(body) + 4
    rest = struct.pack("<IqdH", length, sequence, enqueued, key_field) + (key or b"") + body + struct.pack("<I", length)
    return struct.pack("<I", zlib.crc32(rest)) + rest


def test_a_log_written_in_format_1_still_reads_and_grows_in_format_2(tmp_path: Path) -> None:
    hub = EmbeddedHub(tmp_path, "old", partitions=1)
    old = format_1_record(0, 1000.0, b"home-1", b"first") + format_1_record(1, 1001.0, None, b"second")
    log_path(hub, "0").write_bytes(old)
    assert [(e.sequence_number, e.partition_key, e.body, e.amqp) for e in read_all(hub, "0")] == [
        (0, "home-1", b"first", b""),
        (1, None, b"second", b""),
    ]
    sections = b"\x00\x53\x74\xc1\x05\x02\xa1\x01a\x41"  # application properties {"a": true}
    added = hub.send_batch([b"third", b"fourth"], partition_key="home-2", partition_id="0", amqp=[sections, b""])
    assert [e.sequence_number for e in added] == [2, 3]
    events = read_all(hub, "0")
    assert [(e.body, e.partition_key, e.amqp) for e in events] == [
        (b"first", "home-1", b""),
        (b"second", None, b""),
        (b"third", "home-2", sections),
        (b"fourth", "home-2", b""),
    ]
    assert hub.properties("0").last_enqueued_sequence_number == 3
    assert hub.reader("0", Position(sequence_number=1)).receive(10)[0].amqp == sections


def test_format_2_records_keep_keys_of_every_kind_and_no_key(tmp_path: Path) -> None:
    hub = EmbeddedHub(tmp_path, "new", partitions=1)
    for key in (None, "", "k", "ключ", "k" * 256):
        event = hub.send_batch([b"b"], partition_key=key, partition_id="0", amqp=[b"\x00\x53\x70\x45"])[0]
        assert (
            read_all(hub, "0")[-1]
            == event
            == ReceivedEvent(
                "0", event.sequence_number, event.offset, event.enqueued_time, key, b"b", b"\x00\x53\x70\x45"
            )
        )


def test_format_1_is_still_what_an_event_without_sections_is_written_as(tmp_path: Path) -> None:
    assert encode(0, 1.0, b"k", b"body") == format_1_record(0, 1.0, b"k", b"body")
    assert encode(0, 1.0, None, b"body") == format_1_record(0, 1.0, None, b"body")
