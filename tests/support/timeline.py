"""Where a run's time went: each test's start and end on each pytest-xdist worker.

With ``PYTEST_TIMELINE=FILE`` set, every test appends one JSON line to FILE (worker, test, start,
end, wall clock, setup and teardown included; cpu: the CPU seconds its worker's whole process tree
spent meanwhile, servers and JVMs it started included, so a server shared by later tests is
charged to them too); ``python -m tests.support.timeline FILE`` then
prints, per worker, when it was busy and idle and its longest tests, and which worker ended last:
what bounds the run's length (its critical path) and which tests to spread or shorten. The plugin
is loaded by ``tests/conftest.py``; without the variable it does nothing.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ENV = "PYTEST_TIMELINE"
_started: dict[str, tuple[float, float]] = {}
_TICK = os.sysconf("SC_CLK_TCK")
_recording = [False]  # this process records: the variable is set and it runs tests (not xdist's controller)


def pytest_configure(config: Any) -> None:
    # xdist's controller (-n N, not itself a worker) sees each worker's tests start and end too: not twice.
    controller = not os.environ.get("PYTEST_XDIST_WORKER") and bool(getattr(config.option, "numprocesses", None))
    _recording[0] = bool(os.environ.get(ENV)) and not controller


def _worker() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def tree_cpu(root: int) -> float:
    """CPU seconds of ``root`` and every live descendant, each with the children it has reaped."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        times[pid] = sum(int(f) for f in fields[11:15]) / _TICK  # utime, stime, cutime, cstime
    children: dict[int, list[int]] = defaultdict(list)
    for pid, parent in parents.items():
        children[parent].append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += times.get(pid, 0.0)
        todo.extend(children.get(pid, ()))
    return total


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    if _recording[0]:
        _started[nodeid] = (time.time(), tree_cpu(os.getpid()))


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    path = os.environ.get(ENV)
    if not _recording[0] or not path or nodeid not in _started:
        return
    start, cpu = _started.pop(nodeid)
    used = round(tree_cpu(os.getpid()) - cpu, 2)
    line = json.dumps({"worker": _worker(), "test": nodeid, "start": start, "end": time.time(), "cpu": used})
    with open(path, "a", encoding="utf-8") as out:  # one short append per test: whole lines across workers
        out.write(line + "\n")


def summary(rows: list[dict[str, Any]], top: int = 5) -> list[str]:
    """Per worker: busy seconds, idle seconds between tests, end (from the run's first start) and
    its ``top`` longest tests; the worker that ended last first."""
    if not rows:
        return ["no tests recorded"]
    origin = min(r["start"] for r in rows)
    by_worker: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_worker[row["worker"]].append(row)
    out = []
    ends = {w: max(r["end"] for r in rs) - origin for w, rs in by_worker.items()}
    for worker in sorted(by_worker, key=lambda w: -ends[w]):
        tests = sorted(by_worker[worker], key=lambda r: r["start"])
        busy = sum(r["end"] - r["start"] for r in tests)
        out.append(
            f"{worker}: {len(tests)} tests, busy {busy:.0f}s, idle {ends[worker] - busy:.0f}s, "
            f"ended at {ends[worker]:.0f}s, CPU {sum(r.get('cpu', 0.0) for r in tests):.0f}s"
        )
        for row in sorted(tests, key=lambda r: r["start"] - r["end"])[:top]:
            out.append(f"    {_line(row, origin)}")
    out.append(f"most CPU (of {sum(r.get('cpu', 0.0) for r in rows):.0f}s in all):")
    out.extend(f"    {_line(row, origin)}" for row in sorted(rows, key=lambda r: -r.get("cpu", 0.0))[: top * 4])
    return out


def _line(row: dict[str, Any], origin: float) -> str:
    return (
        f"{row['end'] - row['start']:7.1f}s, CPU {row.get('cpu', 0.0):6.1f}s, from {row['start'] - origin:6.0f}s  "
        f"{row['test'][:100]}"
    )


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.support.timeline FILE (written by a run with PYTEST_TIMELINE=FILE)")
        return 2
    rows = [json.loads(line) for line in Path(argv[0]).read_text(encoding="utf-8").splitlines() if line.strip()]
    print("\n".join(summary(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
