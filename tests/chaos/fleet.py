"""A fleet of real ``runworkers`` processes on one store, a producer, a sampler, and the faults.

The producer (a thread of the test process) writes one numbered event to every partition every
20 ms and remembers when it wrote each; the sampler (a task) reads the store's ownership records,
clock and checkpoints every 50 ms. Each fault is logged with its victims, on the monotonic clock
the workers' recordings use too. ``settle()`` waits until every partition has a live owner among
the running workers, ownership is balanced and every checkpoint has caught up with what was
produced when it was called: a fault's phase ends only once the fleet has recovered from it.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from balancer.model import HubRef
from tests.chaos.cycles import LOG_LEVELS, cycles
from tests.chaos.evidence import CheckpointSample, Evidence, Fault, Lease, OwnershipSample, Phase
from tests.chaos.recording import read_handlings
from tests.chaos.stores import Kit
from tests.support import waiting
from tests.support.processes import kill, manage, start_logged, worker_env
from workers.hub.embedded import EmbeddedHub

SETTLE_SECONDS = 45.0


WEDGED = 4.0  # seconds: the workers' LEASEBOARD_READER_WEDGED (a pump handing nothing over while events wait)
READER_STUCK = 3.0  # seconds: the workers' LEASEBOARD_READER_STUCK (a partition's reads failing in a row)
HANDLER_TIMEOUT = 4.0  # seconds: the workers' LEASEBOARD_HANDLER_TIMEOUT (one handler call in hand)


@dataclass
class Worker:
    """One ``runworkers --count 1`` process."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path
    started: float
    skew: float = 0.0
    stopped: bool = False  # SIGSTOPped right now
    ended: float | None = None
    expected_end: str | None = None  # "sigkill" or "sigterm" once the test ends it

    @property
    def owner(self) -> str:
        return f"{self.name}-0"

    @property
    def running(self) -> bool:
        return self.process.poll() is None


@dataclass
class Fleet:
    kit: Kit
    root: Path
    store: Any  # the kit's store, opened in the test process
    interval: float = 0.5
    expiry: float = 3.0
    partitions: int = 8
    ref: HubRef = field(init=False)
    hub: EmbeddedHub = field(init=False)
    env: dict[str, str] = field(init=False)
    workers: dict[str, Worker] = field(default_factory=dict)
    produced: dict[str, list[tuple[float, bool]]] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    phases: list[Phase] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # found while running (a slow or failed stop)
    notes: list[str] = field(default_factory=list)  # what the faults did, for the output
    checkpoint_samples: list[CheckpointSample] = field(default_factory=list)
    ownership_samples: list[OwnershipSample] = field(default_factory=list)
    rng: random.Random = field(default_factory=lambda: random.Random(int(os.environ.get("CHAOS_SEED", "0")) or None))

    def __post_init__(self) -> None:
        self.ref = HubRef("localhost", f"chaos-{self.kit.name}", "$Default")
        self.hub = EmbeddedHub(self.root / "hub", self.ref.hub, partitions=self.partitions)
        self.env = worker_env(
            self.root,
            **self.kit.env(),
            LEASEBOARD_DEADLETTER_DIR=str(self.root / "deadletter"),
            LEASEBOARD_READER_WEDGED=str(WEDGED),  # the "wedged-reader" fault's bound
            LEASEBOARD_HANDLER_TIMEOUT=str(HANDLER_TIMEOUT),  # the "stuck-handler" fault's
            LEASEBOARD_READER_STUCK=str(READER_STUCK),  # the "failing-reader" fault's
            # The "slow-handler" fault abandons two calls, "stuck-handler" one: a victim of several is
            # no crash (after three a worker stops by default, for its supervisor to restart it).
            LEASEBOARD_HANDLER_ABANDON_MAX="20",
            LEASEBOARD_LOG_LEVELS=LOG_LEVELS,  # every cycle: a bound waiting for one allows the slowest
        )
        self.env.pop(  # the workers run on their own store and clock, whatever the test's shell set
            "LEASEBOARD_CLOCK_SKEW", None
        )
        self._write = threading.Lock()
        self._counter = 0
        self._producing = threading.Event()
        self._producer: threading.Thread | None = None

    # processes -----------------------------------------------------------------------------

    def start(self, name: str, skew: float = 0.0) -> Worker:
        command = manage(
            "runworkers",
            "--count",
            "1",
            "--owner-prefix",
            name,
            "--store",
            self.kit.store,
            "--source",
            "embedded",
            "--hub",
            self.ref.hub,
            "--interval",
            str(self.interval),
            "--expiry",
            str(self.expiry),
            "--handler",
            "tests.chaos.recording.Recorder",
            "--checkpoint-events",
            "50",
            "--checkpoint-seconds",
            "1",
            "--shutdown-timeout",
            "5",
        )
        env = {**self.env, "LEASEBOARD_CLOCK_SKEW": str(skew)} if skew else self.env
        log = self.root / f"{name}.log"
        process = start_logged(log, command, env)
        worker = Worker(name, process, log, time.monotonic(), skew)
        self.workers[name] = worker
        return worker

    def running(self) -> list[Worker]:
        """Workers whose process runs and is not stopped."""
        return [w for w in self.workers.values() if w.running and not w.stopped]

    def pick(self) -> Worker:
        return self.rng.choice(sorted(self.running(), key=lambda w: w.name))

    def kill(self, worker: Worker) -> float:
        worker.expected_end = "sigkill"
        worker.process.send_signal(signal.SIGKILL)
        worker.process.wait(10)
        worker.ended = time.monotonic()
        return worker.ended

    def terminate(self, worker: Worker, timeout: float = 20.0) -> float:
        """SIGTERM and wait: returns how long the graceful stop took."""
        worker.expected_end = "sigterm"
        started = time.monotonic()
        worker.process.send_signal(signal.SIGTERM)
        try:
            worker.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.problems.append(f"{worker.owner} did not stop within {timeout:g}s of SIGTERM")
            kill(worker.process)
        worker.ended = time.monotonic()
        if worker.process.returncode != 0:
            self.problems.append(f"{worker.owner} exited with {worker.process.returncode} on SIGTERM")
        return worker.ended - started

    def shutdown(self) -> None:
        """Kill whatever still runs (test teardown)."""
        for worker in self.workers.values():
            if worker.running and worker.stopped:
                worker.process.send_signal(signal.SIGCONT)
            kill(worker.process)
        self.stop_producing()
        self.hub.close()

    def log_tail(self, lines: int = 40) -> str:
        out = []
        for worker in self.workers.values():
            text = worker.log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {worker.owner} ({'running' if worker.running else worker.process.returncode})")
            out += text
        return "\n".join(out)

    # the producer --------------------------------------------------------------------------

    def start_producing(self, period: float = 0.02) -> None:
        self._producing.set()

        def produce() -> None:
            while self._producing.is_set():
                for pid in self.hub.partition_ids():
                    self.send(pid, malformed=False)
                time.sleep(period)

        self._producer = threading.Thread(target=produce, name="chaos-producer", daemon=True)
        self._producer.start()

    def stop_producing(self) -> None:
        self._producing.clear()
        if self._producer is not None:
            self._producer.join(10)
            self._producer = None

    def send(self, pid: str, malformed: bool) -> None:
        with self._write:
            self._counter += 1
            body = b"\xffnot json %d" % self._counter if malformed else b'{"n": %d}' % self._counter
            event = self.hub.send(body, partition_id=pid)
            events = self.produced.setdefault(pid, [])
            assert event.sequence_number == len(events), f"partition {pid}: another writer on the hub?"
            events.append((time.monotonic(), malformed))

    def last(self) -> dict[str, int]:
        with self._write:
            return {pid: len(events) - 1 for pid, events in self.produced.items()}

    # sampling ------------------------------------------------------------------------------

    async def sample(self) -> None:
        """Read ownership, the store's clock and checkpoints every 50 ms until cancelled."""
        while True:
            try:
                records = await self.store.list_ownership(self.ref)
                leases = {r.partition_id: Lease(r.owner_id, r.last_modified) for r in records}
                now = await self.store.now()
                self.ownership_samples.append(OwnershipSample(time.monotonic(), now, self.hub.partition_ids(), leases))
                points = {c.partition_id: c.sequence_number for c in await self.store.list_checkpoints(self.ref)}
                self.checkpoint_samples.append(CheckpointSample(time.monotonic(), points))
            except Exception:  # the store is down: no sample
                await asyncio.sleep(0.1)
                continue
            await asyncio.sleep(0.05)

    def owners(self) -> dict[str, str]:
        """Partition -> live owner, by the latest ownership sample (a record modified further ahead of
        the store's clock than the expiry is no live owner's: nobody renews it)."""
        if not self.ownership_samples:
            return {}
        sample = self.ownership_samples[-1]
        return {
            pid: lease.owner
            for pid, lease in sample.leases.items()
            if lease.owner and lease.last_modified is not None and abs(sample.now - lease.last_modified) <= self.expiry
        }

    def checkpoints(self) -> dict[str, int]:
        return self.checkpoint_samples[-1].checkpoints if self.checkpoint_samples else {}

    # waiting -------------------------------------------------------------------------------

    async def until(self, condition: Callable[[], bool | Awaitable[bool]], timeout: float, what: str) -> None:
        def check() -> None:
            for worker in self.workers.values():
                if not worker.running and worker.expected_end is None:
                    raise AssertionError(
                        f"{worker.owner} exited by itself with {worker.process.returncode}\n{self.log_tail()}"
                    )

        def state() -> str:
            return (
                f"owners {self.owners()}, checkpoints {self.checkpoints()}, produced up to {self.last()}\n"
                f"{self.log_tail()}"
            )

        await waiting.until(condition, f"[{self.kit.name}] {what}", timeout, step=0.05, check=check, detail=state)

    def balanced(self) -> bool:
        owners = self.owners()
        live = {w.owner for w in self.running()}
        partitions = self.hub.partition_ids()
        if set(owners) != set(partitions) or not set(owners.values()) <= live:
            return False
        counts = [list(owners.values()).count(o) for o in live]
        return max(counts) - min(counts) <= 1

    async def settle(self, timeout: float = SETTLE_SECONDS) -> None:
        """Every partition owned by a running worker, balanced, checkpoints caught up."""
        target = self.last()

        def recovered() -> bool:
            points = self.checkpoints()
            return self.balanced() and all(points.get(pid, -1) >= last for pid, last in target.items())

        await self.until(recovered, timeout, "every partition owned, balanced and checkpointed")

    # faults --------------------------------------------------------------------------------

    def fault(
        self,
        kind: str,
        started: float,
        victims: set[str],
        *,
        ended: float | None = None,
        planned: bool = False,
        partitions: frozenset[str] = frozenset(),
    ) -> Fault:
        fault = Fault(kind, started, ended if ended is not None else started, frozenset(victims), planned, partitions)
        self.faults.append(fault)
        return fault

    async def phase(self, name: str, body: Callable[[], Awaitable[None]]) -> None:
        started = time.monotonic()
        await body()
        await self.settle()
        self.phases.append(Phase(name, started, time.monotonic()))

    # evidence ------------------------------------------------------------------------------

    def dead_letters(self) -> set[tuple[str, int]]:
        out = set()
        for path in (self.root / "deadletter" / self.ref.hub).glob("*.jsonl"):
            for line in path.read_text(encoding="utf-8").splitlines():
                entry = json.loads(line)
                out.add((entry["partition_id"], entry["sequence_number"]))
        return out

    async def evidence(self) -> Evidence:
        final = {c.partition_id: c.sequence_number for c in await self.store.list_checkpoints(self.ref)}
        return Evidence(
            expiry=self.expiry,
            produced={pid: list(events) for pid, events in self.produced.items()},
            handlings=read_handlings(self.root / "records"),
            dead_letters=self.dead_letters(),
            checkpoint_samples=list(self.checkpoint_samples),
            ownership_samples=list(self.ownership_samples),
            faults=list(self.faults),
            phases=list(self.phases),
            final_checkpoints=final,
            workers=frozenset(w.owner for w in self.workers.values()),
            store_tick=float(getattr(self.store, "clock_resolution", None) or 0.0),
            interval=self.interval,
            late_checkpoints=self.kit.name == "blob",
            cycles=cycles(self.root, time.time() - time.monotonic()),
        )
