"""The landing handler: one durable Parquet file per handler call, named by partition and sequence
range; malformed bodies set aside; checkpoints only ever cover landed events."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from prometheus_client import REGISTRY

from balancer.model import Checkpoint, OwnershipRecord
from balancer.stores.memory import MemoryStore
from tests.support.waiting import until
from workers.handlers import NotHeld, PartitionContext, batch_size
from workers.hub.embedded import EmbeddedHub
from workers.landing import MAX_EVENTS, LandingHandler, file_name, read_markers, sequence_range, writer_of
from workers.pipeline.ranges import LandedFile, landed_file
from workers.runtime.config import PumpConfig
from workers.runtime.deadletters import DeadLetters
from workers.runtime.pump import PartitionPump

from .conftest import HUB, REF, T0, Landing, fleet_events, received


def dead_letters_counted() -> float:
    return REGISTRY.get_sample_value("leaseboard_dead_letters_total") or 0.0


def landed_files(root: Path, partition_id: str) -> list[str]:
    return sorted(p.name for p in (root / HUB / partition_id).iterdir())


def test_a_batch_lands_as_one_parquet_file_named_by_its_sequence_range(landing: Landing) -> None:
    readings = fleet_events(5)
    landing.land("3", 40, [r.to_json() for r in readings])

    assert landed_files(landing.root, "3") == [file_name(40, 44)]  # no temporary file left behind
    assert sequence_range(file_name(40, 44)) == (40, 44)
    table = pq.read_table(landing.root / HUB / "3" / file_name(40, 44))
    rows = table.to_pylist()
    assert [(r["partition_id"], r["sequence_number"]) for r in rows] == [("3", s) for s in range(40, 45)]
    assert [r["event_id"] for r in rows] == [r.event_id for r in readings]
    assert rows[0]["event_time"].timestamp() == readings[0].timestamp
    assert rows[-1]["enqueued_time"].timestamp() == T0 + 44
    assert read_markers(landing.root, HUB)["3"]["sequence_number"] == 44


def test_an_event_delivered_twice_lands_with_the_same_partition_and_sequence_number(landing: Landing) -> None:
    bodies = [r.to_json() for r in fleet_events(6)]
    landing.land("1", 0, bodies[:4])
    first = pq.read_table(landing.root / HUB / "1" / file_name(0, 3))
    landing.land("1", 2, bodies[2:6])  # a new owner's batch overlapping it, after a crash before the checkpoint

    assert landed_files(landing.root, "1") == [file_name(0, 3), file_name(2, 5)]
    assert pq.read_table(landing.root / HUB / "1" / file_name(0, 3)).equals(first)
    keys = [
        (r["partition_id"], r["sequence_number"], r["event_id"])
        for name in landed_files(landing.root, "1")
        for r in pq.read_table(landing.root / HUB / "1" / name).to_pylist()
    ]
    assert sorted(set(keys)) == sorted(set(keys[:4] + keys[4:]))
    assert len(keys) - len(set(keys)) == 2  # sequence numbers 2 and 3: the same keys, removable downstream


def test_each_file_names_its_writer_and_the_tenure_it_landed_in(landing: Landing) -> None:
    handler = landing.handler()
    bodies = [r.to_json() for r in fleet_events(4)]
    first, again = PartitionContext(REF, "4", "w1-0"), PartitionContext(REF, "4", "w1-0")
    handler([received("4", 0, bodies[0]), received("4", 1, bodies[1])], first)
    handler([received("4", 2, bodies[2])], first)
    handler([received("4", 3, bodies[3])], again)  # the same owner's next pump: a new tenure

    writers = [writer_of(landing.root / HUB / "4" / file_name(s, e)) for s, e in ((0, 1), (2, 2), (3, 3))]
    assert [w["owner_id"] for w in writers if w] == ["w1-0"] * 3
    tenures = [w["tenure"] for w in writers if w]
    assert tenures[0] == tenures[1] != tenures[2]
    assert all(w and w["pid"] == os.getpid() and abs(float(str(w["landed_at"])) - time.time()) < 60 for w in writers)
    # the name stays the pipeline's: it reads the partition and the range from it
    path = landing.root / HUB / "4" / file_name(0, 1)
    assert landed_file(path.as_uri()) == LandedFile("4", 0, 1)


def test_two_owners_landing_the_same_range_leave_two_files_each_naming_its_writer(landing: Landing) -> None:
    handler = landing.handler()
    bodies = [r.to_json() for r in fleet_events(3)]
    events = [received("6", s, b) for s, b in enumerate(bodies)]
    handler(events, PartitionContext(REF, "6", "w1-0"))
    kept = (landing.root / HUB / "6" / file_name(0, 2)).read_bytes()
    handler(events, PartitionContext(REF, "6", "w2-0"))  # the next owner, the same range again

    names = landed_files(landing.root, "6")
    assert len(names) == 2 and names[1] == file_name(0, 2), names
    assert names[0].startswith(f".{file_name(0, 2)}.w2-0.") and not names[0].endswith(".parquet")
    assert (landing.root / HUB / "6" / file_name(0, 2)).read_bytes() == kept, "the first file was replaced"
    owners = [writer_of(landing.root / HUB / "6" / name) for name in names]
    assert [w["owner_id"] for w in owners if w] == ["w2-0", "w1-0"]
    tables = [pq.read_table(landing.root / HUB / "6" / name) for name in names]
    assert tables[0].column("sequence_number").to_pylist() == tables[1].column("sequence_number").to_pylist()
    assert landed_file((landing.root / HUB / "6" / names[0]).as_uri()) is None  # the pipeline never counts it


def test_without_hard_links_a_range_landed_again_still_keeps_the_first_file(
    landing: Landing, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(source: object, target: object) -> None:
        raise OSError(errno.EPERM, "no hard links on this file system")

    monkeypatch.setattr(os, "link", refused)
    handler = landing.handler()
    events = [received("7", 0, fleet_events(1)[0].to_json())]
    handler(events, PartitionContext(REF, "7", "w1-0"))
    handler(events, PartitionContext(REF, "7", "w2-0"))
    names = landed_files(landing.root, "7")
    assert [writer_of(landing.root / HUB / "7" / n)["owner_id"] for n in names] == ["w2-0", "w1-0"]  # type: ignore[index]


def test_a_malformed_body_is_set_aside_with_partition_sequence_and_error_and_the_rest_lands(
    landing: Landing,
) -> None:
    good = [r.to_json() for r in fleet_events(3)]
    before = dead_letters_counted()
    landing.land("2", 10, [good[0], b"not json", good[1], b'{"sensor": "door"}', good[2]])

    lines = [json.loads(line) for line in (landing.dead / HUB / "2.jsonl").read_text().splitlines()]
    assert [(e["partition_id"], e["sequence_number"]) for e in lines] == [("2", 11), ("2", 13)]
    assert all(e["error"].startswith("MalformedEvent: not a sensor event") for e in lines)
    assert dead_letters_counted() - before == 2
    table = pq.read_table(landing.root / HUB / "2" / file_name(10, 14))
    assert table.column("sequence_number").to_pylist() == [10, 12, 14]


def test_a_batch_of_only_malformed_bodies_lands_no_file(landing: Landing) -> None:
    landing.land("0", 0, [b"{}", b"[]"])
    assert not (landing.root / HUB / "0").exists()
    assert len((landing.dead / HUB / "0.jsonl").read_text().splitlines()) == 2


def test_a_new_pump_removes_the_temporaries_a_writer_killed_mid_write_left_but_not_fresh_ones(
    landing: Landing,
) -> None:
    folder = landing.root / HUB / "6"
    folder.mkdir(parents=True)
    stale, fresh = folder / ".tmp-4242-dead.parquet", folder / ".tmp-4243-writing.parquet"
    stale.write_bytes(b"")  # empty, as a SIGKILL before the first write leaves it (ci-under-load)
    fresh.write_bytes(b"")
    an_hour_ago = time.time() - 3600
    os.utime(stale, (an_hour_ago, an_hour_ago))
    landing.land("6", 0, [fleet_events(1)[0].to_json()])
    assert landed_files(landing.root, "6") == [".tmp-4243-writing.parquet", file_name(0, 0)]


def test_a_failed_write_raises_and_leaves_no_landing_file(landing: Landing) -> None:
    (landing.root / HUB).mkdir(parents=True)
    (landing.root / HUB / "5").write_text("a file where the partition's folder should be")
    with pytest.raises(OSError):
        landing.land("5", 0, [fleet_events(1)[0].to_json()])
    assert [p.name for p in (landing.root / HUB).iterdir()] == ["5"]


@pytest.mark.parametrize("looks_held", [0, 1])  # the lease gone at the first look, or by the last one
def test_a_batch_whose_lease_runs_out_in_hand_lands_nothing_and_raises_not_held(
    landing: Landing, looks_held: int
) -> None:
    looks: list[int] = []

    def holds() -> bool:  # True for the first ``looks_held`` looks, then the lease has run out
        looks.append(1)
        return len(looks) <= looks_held

    abandoned = REGISTRY.get_sample_value("leaseboard_landing_abandoned_total") or 0.0
    events = [received("2", 10 + i, r.to_json()) for i, r in enumerate(fleet_events(3))]
    with pytest.raises(NotHeld, match="partition 2: the lease of w1-0 may have run out"):
        landing.handler()(events, PartitionContext(REF, "2", "w1-0", holds=holds))
    assert len(looks) == looks_held + 1
    assert not [p for p in landing.root.rglob("*") if p.is_file()]  # no landing, no temporary file, no marker
    assert REGISTRY.get_sample_value("leaseboard_landing_abandoned_total") == abandoned + 1
    landing.handler()(events, PartitionContext(REF, "2", "w1-0"))  # renewed: the same batch lands
    assert landed_files(landing.root, "2") == [file_name(10, 12)]


def test_after_a_short_batch_the_handler_lingers_so_a_trickle_makes_few_files(landing: Landing) -> None:
    now = [100.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    handler = LandingHandler(
        landing.root,
        dead_letters=DeadLetters(landing.dead),
        linger=2.0,
        sleep=sleep,
        monotonic=lambda: now[0],
        alerts=False,
    )
    ctx = PartitionContext(REF, "0", "owner")
    body = fleet_events(1)[0].to_json()
    handler([received("0", 0, body)], ctx)
    assert slept == [2.0]
    now[0] += 0.5  # the pump read again half a second later
    handler([received("0", 1, body)], ctx)
    assert slept == [2.0, 2.0]  # counted from each file
    handler([received("0", s, body) for s in range(2, 2 + MAX_EVENTS)], ctx)
    assert slept == [2.0, 2.0], "a full batch means a backlog: no waiting"
    assert batch_size(handler) == MAX_EVENTS


class CheckingStore(MemoryStore):
    """The in-memory store, which on every checkpoint records whether the landing files on disk
    hold every event up to it (the property under test)."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root
        self.checked: list[tuple[int, bool]] = []

    async def update_checkpoint(self, checkpoint: Checkpoint, owner_id: str) -> Checkpoint:
        folder = self.root / HUB / checkpoint.partition_id
        landed = {
            s
            for path in folder.glob("*.parquet")
            for s in pq.read_table(path, columns=["sequence_number"]).column(0).to_pylist()
        }
        self.checked.append((checkpoint.sequence_number, landed >= set(range(checkpoint.sequence_number + 1))))
        return await super().update_checkpoint(checkpoint, owner_id)


async def test_the_pump_checkpoints_only_events_whose_landing_file_is_on_disk(landing: Landing, tmp_path: Path) -> None:
    hub = EmbeddedHub(tmp_path / "hub", HUB, partitions=1)
    try:
        hub.send_batch([r.to_json() for r in fleet_events(12_000)], partition_id="0")
        store = CheckingStore(landing.root)
        await store.claim_ownership([OwnershipRecord(REF, "0", "owner")])
        pump = PartitionPump(
            ref=REF,
            partition_id="0",
            owner_id="owner",
            holds=lambda _: True,
            checkpoints=store,
            source=hub,
            handler=landing.handler(),
            config=PumpConfig(checkpoint_events=1, checkpoint_seconds=60),
            dead_letters=DeadLetters(landing.dead),
        )
        task = asyncio.create_task(pump.run())

        def pumping() -> None:
            assert not task.done(), pump.stats

        await until(
            lambda: pump.stats.checkpointed == 11_999,
            "the checkpoint at the last event",
            30,
            check=pumping,
            detail=lambda: str(pump.stats),
        )
        pump.stop()
        await task
    finally:
        hub.close()
    assert [s for s, _ in store.checked] == [4999, 9999, 11_999]  # one checkpoint per landed batch
    assert all(covered for _, covered in store.checked), store.checked
