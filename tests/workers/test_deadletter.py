"""``workers.deadletter``: bodies and properties decoded for people, a property added for a replay,
the files paged by cursor and bounded, purged under the writers' lock, replays marked and refused
the second time."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from proton import Message

from balancer.model import HubRef
from workers.deadletter import files
from workers.deadletter.decode import BODY_SHOWN, body_view, properties_of, with_property
from workers.deadletter.replay import REPLAYED_FROM, AlreadyReplayed, EmbeddedSender, EventHubsSender, Letter, replay
from workers.hub.amqp.auth import SasKey
from workers.hub.amqp.connection import Limits
from workers.hub.amqp.messages import parse
from workers.hub.amqp.server import HubServer
from workers.hub.amqp.thread import ServerThread
from workers.hub.embedded import EmbeddedHub
from workers.runtime.deadletters import DeadLetters
from workers.sources.base import Position, ReceivedEvent

REF = HubRef("test.example", "sensors", "$Default")


def sent_with_properties(body: bytes, properties: dict[str, object]) -> bytes:
    """The AMQP sections the embedded hub keeps of a message a producer sent with ``properties``."""
    return parse(bytes(Message(body=body, properties=properties).encode()), 0).amqp[0]


def event(sequence: int, body: bytes = b"{}", partition: str = "0", amqp: bytes = b"") -> ReceivedEvent:
    return ReceivedEvent(partition, sequence, str(sequence * 100), 1_700_000_000.0 + sequence, "home-1", body, amqp)


def set_aside(directory: Path, *events: ReceivedEvent, ref: HubRef = REF) -> None:
    letters = DeadLetters(directory)
    for e in events:
        letters.add(ref, "w1", e, ValueError(f"bad {e.sequence_number}"), 3)


def test_a_body_is_shown_as_json_where_it_is_json_as_text_where_text_else_in_hex() -> None:
    assert body_view(b'{"a": [1, 2]}') == {"encoding": "json", "value": {"a": [1, 2]}, "size": 13, "truncated": False}
    assert body_view("héllo\nworld".encode()) == {
        "encoding": "text",
        "value": "héllo\nworld",
        "size": 12,
        "truncated": False,
    }
    assert body_view(b"\x00\x01\xff") == {"encoding": "hex", "value": "0001ff", "size": 3, "truncated": False}
    assert body_view(b"NaN")["encoding"] == "text"  # Python reads NaN as JSON; JSON has none
    assert body_view(b"bell\x07")["encoding"] == "hex"  # valid UTF-8, but not text


def test_a_long_body_is_cut_and_a_character_it_splits_is_left_out() -> None:
    text = ("é" * BODY_SHOWN).encode()  # two bytes each: the cut falls inside one, at BODY_SHOWN

    shown = body_view(text)
    binary = body_view(b"\xff" * (BODY_SHOWN + 10))

    assert shown["encoding"] == "text" and shown["truncated"] and shown["size"] == 2 * BODY_SHOWN
    assert shown["value"] == "é" * (BODY_SHOWN // 2)
    assert binary["encoding"] == "hex" and len(binary["value"]) == 2 * BODY_SHOWN


def test_properties_come_from_the_sections_kept_and_a_replay_adds_its_own() -> None:
    amqp = sent_with_properties(b"x", {"Diagnostic-Id": "00-abc-def-01", "n": 5, "raw": b"\xff"})

    replayed = with_property(amqp, REPLAYED_FROM, "3:17")
    again = with_property(replayed, REPLAYED_FROM, "3:40")

    assert properties_of(amqp) == {"Diagnostic-Id": "00-abc-def-01", "n": 5, "raw": "0xff"}
    assert properties_of(replayed) == {**properties_of(amqp), REPLAYED_FROM: "3:17"}
    assert properties_of(again) == {**properties_of(amqp), REPLAYED_FROM: "3:40"}  # replaced, not repeated
    assert properties_of(with_property(b"", REPLAYED_FROM, "0:1")) == {REPLAYED_FROM: "0:1"}
    assert properties_of(b"") == {}


def test_pages_follow_the_cursor_across_partitions_and_keep_to_their_group(tmp_path: Path) -> None:
    set_aside(tmp_path, *(event(s, partition=p) for p in ("0", "1", "10") for s in range(3)))
    set_aside(tmp_path, event(9, partition="1"), ref=HubRef(REF.namespace, REF.hub, "other"))
    folder = files.folder_of(tmp_path, REF.hub)

    seen: list[tuple[str, int]] = []
    cursor: tuple[str, int] | None = None
    pages = 0
    while True:
        page = files.read_page(folder, REF.consumer_group, None, cursor, 4, 1 << 20)
        seen += [(e["partition_id"], e["sequence_number"]) for e in page.entries]
        pages += 1
        if page.next is None:
            break
        cursor = page.next

    assert seen == [(p, s) for p in ("0", "1", "10") for s in range(3)]
    assert pages == 3
    only = files.read_page(folder, REF.consumer_group, "1", None, 50, 1 << 20)
    assert [e["sequence_number"] for e in only.entries] == [0, 1, 2] and only.next is None
    assert files.partitions(folder) == ["0", "1", "10"]
    assert files.read_page(tmp_path / "nothing", REF.consumer_group, None, None, 50, 1 << 20).entries == []


def test_a_page_stops_at_its_byte_budget_and_a_line_still_being_written_waits(tmp_path: Path) -> None:
    set_aside(tmp_path, *(event(s, body=b"x" * 1000) for s in range(10)))
    folder = files.folder_of(tmp_path, REF.hub)
    with files.letters_path(folder, "0").open("a") as f:
        f.write('{"consumer_group": "$Default", "sequence_number": 99')  # no newline yet

    first = files.read_page(folder, REF.consumer_group, None, None, 50, 3000)
    rest = files.read_page(folder, REF.consumer_group, None, first.next, 50, 1 << 20)

    shown = len(first.entries)
    assert 0 < shown < 10 and first.bytes_read >= 3000 and first.next is not None
    assert [e["sequence_number"] for e in rest.entries] == list(range(shown, 10)) and rest.next is None


def test_a_cursor_in_a_file_purged_since_resumes_at_the_next_whole_line(tmp_path: Path) -> None:
    folder = files.folder_of(tmp_path, REF.hub)
    for s in range(6):  # the first line shorter than the rest: the cursor falls inside a line once it is gone
        line = {"consumer_group": REF.consumer_group, "partition_id": "0", "sequence_number": s, "pad": "x" * (50 + s)}
        files.append_line(files.letters_path(folder, "0"), json.dumps(line if s else {**line, "pad": ""}) + "\n")
    page = files.read_page(folder, REF.consumer_group, None, None, 3, 1 << 20)
    assert page.next is not None

    assert files.purge(folder, "0", lambda e: e["sequence_number"] == 0) == 1
    rest = files.read_page(folder, REF.consumer_group, None, page.next, 50, 1 << 20)

    assert [e["sequence_number"] for e in rest.entries] == [4, 5]  # the line under the cursor moved: skipped whole


def test_a_purge_keeps_every_line_written_while_it_runs(tmp_path: Path) -> None:
    set_aside(tmp_path, *(event(s) for s in range(200)))
    folder = files.folder_of(tmp_path, REF.hub)
    writer = threading.Thread(target=set_aside, args=(tmp_path, *(event(s) for s in range(1000, 1300))))

    writer.start()
    removed = sum(files.purge(folder, "0", lambda e: e["sequence_number"] < 1000) for _ in range(5))
    writer.join()
    removed += files.purge(folder, "0", lambda e: e["sequence_number"] < 1000)

    assert removed == 200
    assert sorted(files.read_letters(folder, "0", REF.consumer_group)) == list(range(1000, 1300))


def test_a_replay_reaches_the_hub_with_its_origin_and_a_second_one_is_refused(tmp_path: Path) -> None:
    amqp = sent_with_properties(b'{"door": "open"}', {"trace": "t-1"})
    set_aside(tmp_path / "dead", event(4, b'{"door": "open"}', amqp=amqp), event(5, b"\x00"))
    folder = files.folder_of(tmp_path / "dead", REF.hub)
    letters = [Letter.of(e) for e in files.read_letters(folder, "0", REF.consumer_group).values()]

    with EmbeddedHub(tmp_path / "hub", REF.hub, partitions=2) as hub:
        marks = replay(folder, REF.consumer_group, letters, EmbeddedSender(hub), user="ops", clock=lambda: 1e9)
        with pytest.raises(AlreadyReplayed, match=r"0:4 already replayed at 2001-09-09 01:46:40 UTC by ops \(as 0:0\)"):
            replay(folder, REF.consumer_group, letters[:1], EmbeddedSender(hub), user="ann")
        forced = replay(folder, REF.consumer_group, letters[:1], EmbeddedSender(hub), user="ann", force=True)
        reader = hub.reader("0", Position.earliest())
        back = reader.receive(10)
        reader.close()

    assert [(m["sequence_number"], m["to"], m["again"]) for m in marks] == [(4, "0:0", False), (5, "0:1", False)]
    assert [(m["to"], m["again"]) for m in forced] == [("0:2", True)]
    assert [(e.body, e.partition_key, properties_of(e.amqp)) for e in back] == [
        (b'{"door": "open"}', "home-1", {"trace": "t-1", REPLAYED_FROM: "0:4"}),
        (b"\x00", "home-1", {REPLAYED_FROM: "0:5"}),
        (b'{"door": "open"}', "home-1", {"trace": "t-1", REPLAYED_FROM: "0:4"}),
    ]
    assert sorted(files.read_markers(folder, "0", REF.consumer_group)) == [4, 5]
    assert files.read_markers(folder, "0", "other") == {}


def test_the_dead_letter_file_keeps_the_events_sections(tmp_path: Path) -> None:
    amqp = sent_with_properties(b"x", {"k": "v"})
    set_aside(tmp_path, event(1, amqp=amqp), event(2))

    lines = [json.loads(line) for line in (tmp_path / REF.hub / "0.jsonl").read_text().splitlines()]

    assert "amqp_base64" in lines[0] and "amqp_base64" not in lines[1]
    assert properties_of(files.b64(lines[0]["amqp_base64"])) == {"k": "v"}


def test_a_replay_through_the_event_hubs_sdk_carries_the_properties_and_the_origin(tmp_path: Path) -> None:
    """The SDK's producer against the embedded hub's AMQP server, which keeps what it sent."""
    amqp = sent_with_properties(b"payload", {"trace": "t-9"})
    set_aside(tmp_path / "dead", event(6, b"payload", partition="1", amqp=amqp))
    folder = files.folder_of(tmp_path / "dead", REF.hub)
    letters = [Letter.of(e) for e in files.read_letters(folder, "1", REF.consumer_group).values()]
    EmbeddedHub(tmp_path / "hub", REF.hub, partitions=2).close()
    server = ServerThread(HubServer(tmp_path / "hub", SasKey.generate(), limits=Limits(), poll_interval=0.01)).start()
    try:
        sender = EventHubsSender(server.connection_string, REF.hub)
        try:
            marks = replay(folder, REF.consumer_group, letters, sender, user="ops")
        finally:
            sender.close()
    finally:
        server.stop()

    with EmbeddedHub(tmp_path / "hub", REF.hub) as hub:
        reader = hub.reader("1", Position.earliest())
        (back,) = reader.receive(10)
        reader.close()
    assert [(m["sequence_number"], m["to"]) for m in marks] == [(6, None)]  # the service does not say where
    assert back.body == b"payload"
    assert properties_of(back.amqp) == {"trace": "t-9", REPLAYED_FROM: "1:6"}
