"""Events in and out: what a transfer holds, and what a stored event looks like to the SDK's decoder."""

from __future__ import annotations

from typing import Any

import pytest
from azure.eventhub._pyamqp._decode import decode_payload
from proton import Data, Described, Message, symbol, ulong
from proton._data import PythonAMQPData

from workers.hub.amqp.messages import BATCH_FORMAT, BadMessage, encode, parse, runtime_metrics
from workers.sources.base import PartitionProperties, ReceivedEvent


def data_sections(*bodies: bytes, annotations: dict[PythonAMQPData, PythonAMQPData] | None = None) -> bytes:
    out = b""
    if annotations is not None:
        d = Data()
        d.put_object(Described(ulong(0x72), annotations))
        out += bytes(d.encode())
    for body in bodies:
        d = Data()
        d.put_object(Described(ulong(0x75), body))
        out += bytes(d.encode())
    return out


def test_a_batch_is_one_event_per_data_section_with_the_key_of_the_outer_message() -> None:
    inner = [data_sections(b"a"), Message(body="text body").encode(), data_sections(b"b", b"c")]
    outer = data_sections(*inner, annotations={symbol("x-opt-partition-key"): "home-1"})
    incoming = parse(outer, BATCH_FORMAT)
    assert incoming.bodies == [b"a", b"text body", b"bc"] and incoming.partition_key == "home-1"
    assert incoming.amqp[0] == b""  # one data section alone: stored as the body, nothing more


def test_a_batch_of_one_event_is_that_event() -> None:
    outer = data_sections(data_sections(b"only"), annotations={symbol("x-opt-partition-key"): "k"})
    assert parse(outer, BATCH_FORMAT).bodies == [b"only"]


def test_a_single_event_joins_its_data_sections_and_takes_value_bodies_of_bytes_or_text() -> None:
    assert parse(data_sections(b"he", b"llo"), 0).bodies == [b"hello"]
    assert parse(Message(body=b"raw").encode(), 0).bodies == [b"raw"]
    assert parse(Message(body="txt").encode(), 0).partition_key is None


def round_trip(payload: bytes) -> Any:
    """``payload`` parsed, stored as an event, sent out again and decoded by the SDK's own decoder."""
    incoming = parse(payload, 0)
    event = ReceivedEvent("1", 7, "700", 1_700_000_000.5, incoming.partition_key, incoming.bodies[0], incoming.amqp[0])
    return decode_payload(memoryview(encode(event)))


def test_every_section_of_a_message_comes_back_exactly_as_sent() -> None:
    message = Message(
        id="m-1",
        correlation_id="c-1",
        content_type="application/json",
        content_encoding="gzip",
        subject="s",
        reply_to="r",
        user_id=b"u",
        group_id="g",
        group_sequence=3,
        reply_to_group_id="rg",
        creation_time=1.5,
        expiry_time=9.5,
        address="a",
        durable=True,
        priority=7,
        ttl=60,
        first_acquirer=True,
        delivery_count=2,
        properties={"Diagnostic-Id": "00-abc-def-01", "n": 5, "f": 1.5, "b": True},
        annotations={symbol("x-opt-partition-key"): "home-3", symbol("custom"): "kept"},
        instructions={symbol("x-da"): "delivery"},
        body=b"payload",
    )
    out = round_trip(message.encode())
    assert out.properties.message_id == b"m-1" and out.properties.correlation_id == b"c-1"
    assert out.properties.content_type == b"application/json" and out.properties.subject == b"s"
    assert out.properties.user_id == b"u" and out.properties.group_sequence == 3
    assert out.properties.creation_time == 1500 and out.properties.absolute_expiry_time == 9500
    assert out.application_properties == {b"Diagnostic-Id": b"00-abc-def-01", b"n": 5, b"f": 1.5, b"b": True}
    assert out.header.durable is True and out.header.priority == 7 and out.header.ttl == 60_000
    assert out.header.first_acquirer is True and out.header.delivery_count == 2
    assert out.message_annotations[b"custom"] == b"kept"
    assert out.message_annotations[b"x-opt-partition-key"] == b"home-3"
    assert out.message_annotations[b"x-opt-sequence-number"] == 7
    assert out.delivery_annotations == {b"x-da": b"delivery"}
    assert out.value == b"payload" and out.data is None  # proton sent a value body of binary: kept as one


def test_several_data_sections_come_back_as_several() -> None:
    assert round_trip(data_sections(b"a", b"", b"bc")).data == [b"a", b"", b"bc"]


@pytest.mark.parametrize(
    "body",
    [{"a": 1, "b": [1, 2]}, {b"binary key": b"v"}, [1, "two", 3.0], 42, None, "text", b"bytes", True],
    ids=["map", "binary-keys", "list", "int", "null", "text", "bytes", "bool"],
)
def test_value_bodies_of_every_kind_come_back_as_sent(
    body: bytes | str | dict[Any, Any] | list[Any] | int | None,
) -> None:
    out = round_trip(Message(body=body, inferred=False).encode())
    expected = body.encode() if isinstance(body, str) else body
    if isinstance(body, dict):
        expected = {k.encode() if isinstance(k, str) else k: v for k, v in body.items()}
        expected = {k: ([1, 2] if v == [1, 2] else v) for k, v in expected.items()}
    if isinstance(body, list):
        expected = [b"two" if v == "two" else v for v in body]
    assert out.value == expected


def test_sequence_bodies_and_footers_come_back_as_sent() -> None:
    sequence = b"".join(described(0x76, [i, f"s{i}"]) for i in range(3))
    footer = described(0x78, {symbol("sig"): b"\x01\x02"})
    out = round_trip(sequence + footer)
    assert out.sequence == [[0, b"s0"], [1, b"s1"], [2, b"s2"]]
    assert out.footer == {b"sig": b"\x01\x02"}


def test_binary_map_keys_in_application_properties_are_kept() -> None:
    raw = described(0x74, {b"\x00bin": "v", "text": b"\xff"}) + described(0x75, b"x")
    assert round_trip(raw).application_properties == {b"\x00bin": b"v", b"text": b"\xff"}


def test_annotations_the_hub_sets_are_the_hubs_not_the_producers() -> None:
    raw = described(0x72, {symbol("x-opt-sequence-number"): 999, symbol("x-opt-offset"): "1"}) + described(0x75, b"x")
    out = round_trip(raw)
    assert out.message_annotations[b"x-opt-sequence-number"] == 7 and out.message_annotations[b"x-opt-offset"] == b"700"


def test_sections_in_another_order_are_kept_and_go_out_in_the_specs_order() -> None:
    # The SDK's encoder puts delivery annotations after the message annotations; Azure takes it.
    raw = described(0x75, b"x") + described(0x74, {"a": 1}) + described(0x72, {symbol("m"): 1})
    raw += described(0x71, {symbol("d"): 2}) + described(0x70, [True])
    out = round_trip(raw)
    assert out.application_properties == {b"a": 1} and out.message_annotations[b"m"] == 1
    assert out.delivery_annotations == {b"d": 2} and out.header.durable is True and out.data == [b"x"]


def described(code: int, value: PythonAMQPData) -> bytes:
    d = Data()
    d.put_object(Described(ulong(code), value))
    return bytes(d.encode())


@pytest.mark.parametrize(
    ("payload", "message_format", "condition"),
    [
        (described(0x75, b"x") + described(0x77, "v"), 0, "amqp:decode-error"),
        (described(0x77, "v") + described(0x77, "w"), 0, "amqp:decode-error"),
        (described(0x72, {}) + described(0x72, {}), 0, "amqp:decode-error"),
        (described(0x99, b"x"), 0, "amqp:not-implemented"),
        (described(0x74, [1, 2]) + described(0x75, b"x"), 0, "amqp:invalid-field"),
        (data_sections(b"x"), 0x1234, "amqp:not-implemented"),
        (data_sections(annotations={}), BATCH_FORMAT, "amqp:invalid-field"),
        (data_sections(b"x", annotations={symbol("x-opt-partition-key"): 7}), 0, "amqp:invalid-field"),
        (b"\x00\x53\x75\xa0\x09short", 0, "amqp:decode-error"),
    ],
    ids=[
        "two-body-kinds",
        "two-values",
        "repeated-section",
        "unknown-section",
        "properties-not-a-map",
        "unknown-format",
        "empty-batch",
        "numeric-key",
        "truncated",
    ],
)
def test_what_cannot_be_stored_whole_is_refused_with_a_condition_saying_what(
    payload: bytes, message_format: int, condition: str
) -> None:
    with pytest.raises(BadMessage) as refused:
        parse(payload, message_format)
    assert refused.value.condition == condition and str(refused.value)


def test_a_stored_event_carries_the_annotations_event_hubs_sets() -> None:
    event = ReceivedEvent("3", 41, "4100", 1_700_000_000.123, "home-9", b"body")
    last = PartitionProperties("3", 0, 50, "5000", 1_700_000_009.5, False)
    message = decode_payload(memoryview(encode(event, runtime_metrics(last, 1_700_000_010.0))))
    assert message.message_annotations == {
        b"x-opt-sequence-number": 41,
        b"x-opt-offset": b"4100",
        b"x-opt-enqueued-time": 1_700_000_000_123,
        b"x-opt-partition-key": b"home-9",
    }
    assert message.delivery_annotations == {
        b"last_enqueued_sequence_number": 50,
        b"last_enqueued_offset": b"5000",
        b"last_enqueued_time_utc": 1_700_000_009_500,
        b"runtime_info_retrieval_time_utc": 1_700_000_010_000,
    }
    assert message.data == [b"body"]
    big = ReceivedEvent("0", 0, "0", 0.0, None, b"x" * 70_000)
    assert decode_payload(memoryview(encode(big))).data == [b"x" * 70_000]
