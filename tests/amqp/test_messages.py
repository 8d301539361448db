"""Events in and out: what a transfer holds, and what a stored event looks like to the SDK's decoder."""

from __future__ import annotations

import pytest
from azure.eventhub._pyamqp._decode import decode_payload
from proton import Data, Described, Message, symbol, ulong

from workers.hub.amqp.messages import BATCH_FORMAT, BadMessage, encode, parse, runtime_metrics
from workers.sources.base import PartitionProperties, ReceivedEvent


def data_sections(*bodies: bytes, annotations: dict[object, object] | None = None) -> bytes:
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


def test_a_single_event_joins_its_data_sections_and_takes_value_bodies_of_bytes_or_text() -> None:
    assert parse(data_sections(b"he", b"llo"), 0).bodies == [b"hello"]
    assert parse(Message(body=b"raw").encode(), 0).bodies == [b"raw"]
    assert parse(Message(body="txt").encode(), 0).partition_key is None


@pytest.mark.parametrize(
    ("payload", "message_format", "condition"),
    [
        (Message(body={"a": 1}).encode(), 0, "amqp:not-implemented"),
        (Message(body=[1, 2], inferred=True).encode(), 0, "amqp:not-implemented"),
        (data_sections(b"x"), 0x1234, "amqp:not-implemented"),
        (data_sections(annotations={}), BATCH_FORMAT, "amqp:invalid-field"),
        (data_sections(b"x", annotations={symbol("x-opt-partition-key"): 7}), 0, "amqp:invalid-field"),
        (b"\x00\x53\x75\xa0\x09short", 0, "amqp:decode-error"),
    ],
    ids=["map-value", "sequence", "unknown-format", "empty-batch", "numeric-key", "truncated"],
)
def test_what_cannot_be_stored_is_refused_with_a_condition(payload: bytes, message_format: int, condition: str) -> None:
    with pytest.raises(BadMessage) as refused:
        parse(payload, message_format)
    assert refused.value.condition == condition


def test_a_stored_event_carries_the_annotations_event_hubs_sets() -> None:
    event = ReceivedEvent("3", 41, "4100", 1_700_000_000.123, "home-9", b"body")
    last = PartitionProperties("3", 0, 50, "5000", 1_700_000_009.5, False)
    message = decode_payload(memoryview(encode(event, runtime_metrics(last, 1_700_000_010.0))))
    assert message.message_annotations == {
        b"x-opt-sequence-number": 41, b"x-opt-offset": b"4100", b"x-opt-enqueued-time": 1_700_000_000_123,
        b"x-opt-partition-key": b"home-9",
    }  # fmt: skip
    assert message.delivery_annotations == {
        b"last_enqueued_sequence_number": 50, b"last_enqueued_offset": b"5000",
        b"last_enqueued_time_utc": 1_700_000_009_500, b"runtime_info_retrieval_time_utc": 1_700_000_010_000,
    }  # fmt: skip
    assert message.data == [b"body"]
    big = ReceivedEvent("0", 0, "0", 0.0, None, b"x" * 70_000)
    assert decode_payload(memoryview(encode(big))).data == [b"x" * 70_000]
