"""The frame-level repairs between proton and the SDK, checked against the SDK's own frame decoder."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from azure.eventhub._pyamqp._decode import decode_frame
from proton import Data, Described, symbol, ubyte, uint, ulong

from workers.hub.amqp import frames


def encoded(code: int, fields: list[Any]) -> bytes:
    """A performative as proton writes one: trailing fields left out, lists as short as possible."""
    data = Data()
    data.put_object(Described(ulong(code), fields))
    return bytes(data.encode())


def frame(body: bytes, channel: int = 0) -> bytes:
    return struct.pack(">IBBH", 8 + len(body), 2, 0, channel) + body


def sdk_reads(body: bytes) -> list[Any]:
    """What the SDK's decoder makes of a frame body (it skips the 8-byte header itself)."""
    _, fields = decode_frame(memoryview(body))
    return fields


def test_a_short_transfer_puts_the_payload_where_the_sdk_looks_only_once_completed() -> None:
    short = encoded(frames.TRANSFER, [uint(3), uint(7), b"tag", uint(0), True]) + b"PAYLOAD"
    assert bytes(sdk_reads(short)[5]) == b"PAYLOAD"  # read as the "more" flag: the bug this module repairs
    fields = sdk_reads(frames.complete(short))
    assert len(fields) == 12 and bytes(fields[11]) == b"PAYLOAD"
    assert (fields[0], fields[1], fields[4], fields[5]) == (3, 7, True, None)


def test_a_list0_performative_becomes_a_list_of_nulls() -> None:
    end = b"\x00\x53\x17\x45"  # end, no error: proton's shortest encoding
    completed = frames.complete(end)
    assert completed == b"\x00\x53\x17\xc0\x02\x01\x40"
    assert sdk_reads(completed) == [None]


def test_errors_get_all_three_fields_and_an_info_map() -> None:
    error = Described(ulong(frames.ERROR), [symbol("amqp:link:stolen"), "taken"])
    detach = encoded(frames.DETACH, [uint(1), True, error])
    fields = sdk_reads(frames.complete(detach))
    assert fields[:2] == [1, True]
    assert fields[2] == [b"amqp:link:stolen", b"taken", {}]
    close = encoded(frames.CLOSE, [Described(ulong(frames.ERROR), [symbol("amqp:internal-error")])])
    assert sdk_reads(frames.complete(close))[0] == [b"amqp:internal-error", None, {}]


def test_a_rejected_outcome_carries_a_complete_error() -> None:
    rejected = Described(ulong(frames.REJECTED), [Described(ulong(frames.ERROR), [symbol("amqp:decode-error")])])
    disposition = encoded(frames.DISPOSITION, [True, uint(4), None, True, rejected])
    fields = sdk_reads(frames.complete(disposition))
    assert len(fields) == 6
    assert fields[4] == {"rejected": [[b"amqp:decode-error", None, {}]]}


def test_an_attach_is_padded_to_fourteen_fields_and_keeps_its_values() -> None:
    source = Described(ulong(0x28), ["sensors/ConsumerGroups/$Default/Partitions/0"])
    attach = encoded(frames.ATTACH, ["link", uint(0), True, ubyte(2), ubyte(0), source, None])
    completed = frames.complete(attach)
    code, fields, used = frames.decode(completed)
    assert code == frames.ATTACH and len(fields) == 14 and used == len(completed)
    assert fields[0] == "link" and fields[5].value == ["sensors/ConsumerGroups/$Default/Partitions/0"]


def test_frames_that_need_nothing_are_left_alone() -> None:
    full = frames.complete(encoded(frames.FLOW, [uint(0)] * 11))
    assert frames.complete(full) == full
    assert frames.complete(b"\x00\x53\x99\x45") == b"\x00\x53\x99\x45"  # not a performative we know


def test_shrink_open_leaves_room_for_padding() -> None:
    opened = encoded(frames.OPEN, ["client", "host", uint(65536), None])
    _, fields, _ = frames.decode(frames.shrink_open(opened))
    assert fields[2] == 65536 - frames.HEADROOM and fields[0] == "client"
    no_limit = encoded(frames.OPEN, ["client", None])
    assert frames.shrink_open(no_limit) == no_limit
    tiny = encoded(frames.OPEN, ["client", None, uint(512)])
    assert frames.shrink_open(tiny) == tiny
    with pytest.raises(frames.FrameError):
        frames.shrink_open(encoded(frames.BEGIN, [None]))


def test_malformed_performatives_raise_frame_error() -> None:
    too_many = encoded(frames.END, [None, None])
    for bad in (b"", b"\x01\x02", b"\x00\x53\x14\xc0\x05\x03\x40", b"\x00\x53\x14\xfe", too_many):
        with pytest.raises(frames.FrameError):
            frames.complete(bad)
    with pytest.raises(frames.FrameError):
        frames.decode(b"\x00\x53\x10\xff")
    with pytest.raises(frames.FrameError):
        frames.split_values(b"\x00\x53\x75\xa0\x05ab")  # the binary is cut short


def test_the_splitter_finds_headers_and_frames_however_the_bytes_arrive() -> None:
    begin = frame(encoded(frames.BEGIN, [None, uint(0)]), 3)
    stream = frames.AMQP_HEADER + begin + frame(b"") + frame(b"\x00\x53\x17\x45")
    whole = frames.FrameSplitter(1024).feed(stream)
    splitter = frames.FrameSplitter(1024)
    piecewise = [item for i in range(len(stream)) for item in splitter.feed(stream[i : i + 1])]
    assert whole == piecewise
    assert whole[0] == frames.AMQP_HEADER
    assert [(f.channel, f.body[:3]) for f in whole[1:] if isinstance(f, frames.Frame)] == [
        (3, b"\x00\x53\x11"),
        (0, b""),
        (0, b"\x00\x53\x17"),
    ]
    assert all(isinstance(f, frames.Frame) and f.raw in stream for f in whole[1:])


def test_the_splitter_stops_at_a_bad_header_and_hands_the_rest_over() -> None:
    splitter = frames.FrameSplitter(1024)
    good = frame(b"\x00\x53\x17\x45")
    bad = struct.pack(">IBBH", 1 << 20, 2, 0, 0) + b"junk"
    assert splitter.feed(good + bad) == [frames.Frame(0, 0, b"\x00\x53\x17\x45", good)]
    assert splitter.error is not None and "size" in splitter.error
    assert splitter.take_rest() == bad
    assert splitter.feed(b"more") == []


def test_with_body_rewrites_the_frame_size() -> None:
    original = frames.Frame(0, 5, b"\x00\x53\x17\x45", frame(b"\x00\x53\x17\x45", 5))
    longer = original.with_body(frames.complete(original.body))
    [parsed] = frames.FrameSplitter(1024).feed(longer.raw)
    assert parsed == longer and isinstance(parsed, frames.Frame) and parsed.channel == 5


def test_split_values_cuts_a_message_into_sections() -> None:
    sections = [b"\x00\x53\x72\xc1\x01\x00", b"\x00\x53\x75\xa0\x02hi", b"\x00\x53\x75\xb0\x00\x00\x00\x01!"]
    assert frames.split_values(b"".join(sections)) == sections
