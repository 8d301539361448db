"""Rooms stay small (issue 34): ``.ci/sizes.py`` on this checkout, then on hand-made trees.

The check reads its allow-list (``.ci/sizes-allowed.txt``) when it runs, so a module split while
the suite runs is judged by the list as it is then.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "sizes.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ci_sizes", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


sizes = _load()


def test_the_product_code_keeps_its_sizes_or_says_why() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{SCRIPT.relative_to(ROOT)} found:\n{done.stdout}{done.stderr}"


def test_every_allowed_entry_gives_its_reason() -> None:
    allowed, errors = sizes.read_allowed(ROOT / ".ci" / "sizes-allowed.txt")
    assert errors == []
    assert all(len(reason.split()) >= 2 for reason in allowed.values()), allowed


# --- the check itself, on trees of its own ---------------------------------------------------------


def _function(name: str, lines: int, indent: str = "") -> str:
    """A function of exactly ``lines`` lines."""
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 2))
    return f"{indent}def {name}() -> None:\n{indent}    '''Doc.'''\n{body}"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for package in ("balancer", "dashboard", "workers"):
        (tmp_path / package).mkdir()
    (tmp_path / ".ci").mkdir()
    (tmp_path / "balancer" / "small.py").write_text(_function("fine", 60))
    return tmp_path


def _check(root: Path, allowed: str = "") -> list[str]:
    (root / ".ci" / "sizes-allowed.txt").write_text(allowed)
    problems: list[str] = sizes.check(root, root / ".ci" / "sizes-allowed.txt")
    return problems


def test_a_tree_within_the_limits_passes(tree: Path) -> None:
    (tree / "dashboard" / "exact.py").write_text("x = 1\n" * 400)
    assert _check(tree) == []


def test_a_module_over_400_lines_fails_with_its_size(tree: Path) -> None:
    (tree / "workers" / "big.py").write_text("x = 1\n" * 401)
    assert _check(tree) == ["too big: workers/big.py:1 module 401 lines (limit 400)"]


def test_migrations_are_not_measured(tree: Path) -> None:
    (tree / "dashboard" / "migrations").mkdir()
    (tree / "dashboard" / "migrations" / "0001_initial.py").write_text("x = 1\n" * 900 + _function("f", 99))
    assert _check(tree) == []


def test_a_function_over_60_lines_fails_by_its_dotted_name_and_line(tree: Path) -> None:
    source = (
        "class Command:\n" + _function("build", 61, "    ") + _function("outer", 10) + _function("inner", 70, "    ")
    )
    (tree / "workers" / "cmd.py").write_text(source)
    assert _check(tree) == [
        "too big: workers/cmd.py:2 Command.build 61 lines (limit 60)",
        "too big: workers/cmd.py:63 outer 80 lines (limit 60)",  # its nested function counts as its lines
        "too big: workers/cmd.py:73 outer.inner 70 lines (limit 60)",
    ]


def test_allowed_entries_pass(tree: Path) -> None:
    (tree / "workers" / "big.py").write_text("x = 1\n" * 401 + "class A:\n" + _function("run", 61, "    "))
    allowed = "# a comment\nworkers/big.py  being split\nworkers/big.py::A.run  one table   # and a comment\n"
    assert _check(tree, allowed) == []


def test_an_entry_back_within_its_limit_fails_until_its_line_goes(tree: Path) -> None:
    (tree / "workers" / "was_big.py").write_text("x = 1\n" * 400)
    allowed = "workers/was_big.py  being split\nworkers/was_big.py::f  being split\nworkers/gone.py  moved\n"
    assert _check(tree, allowed) == [
        "stale allow-list entry: workers/was_big.py is 400 lines now, within its limit of 400: "
        "delete its line from .ci/sizes-allowed.txt (the list only shrinks)",
        "stale allow-list entry: workers/was_big.py::f no longer exists: "
        "delete its line from .ci/sizes-allowed.txt (the list only shrinks)",
        "stale allow-list entry: workers/gone.py no longer exists: "
        "delete its line from .ci/sizes-allowed.txt (the list only shrinks)",
    ]


def test_an_entry_needs_a_reason_and_only_one_line(tree: Path) -> None:
    (tree / "workers" / "big.py").write_text("x = 1\n" * 401)
    problems = _check(tree, "workers/big.py\nworkers/big.py  a reason\nworkers/big.py  again\n")
    assert problems == [
        "sizes-allowed.txt:1: workers/big.py gives no reason (write it after the entry)",
        "sizes-allowed.txt:3: workers/big.py is listed twice",
    ]


def test_the_command_prints_each_offender_and_exits_1(tree: Path) -> None:
    (tree / "balancer" / "big.py").write_text("x = 1\n" * 401)
    (tree / ".ci" / "sizes-allowed.txt").write_text("balancer/gone.py  moved\n")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(tree)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        "too big: balancer/big.py:1 module 401 lines (limit 400)",
        "stale allow-list entry: balancer/gone.py no longer exists: "
        "delete its line from .ci/sizes-allowed.txt (the list only shrinks)",
        "sizes: 2 problem(s); limits 400 lines a module, 60 a function (allow-list: .ci/sizes-allowed.txt)",
    ]
