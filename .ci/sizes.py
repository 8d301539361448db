"""Rooms stay small: no module over 400 lines (migrations aside) and no function over 60 lines in the
product code (balancer/, dashboard/, workers/), except the entries of an allow-list that says why.

Run: ``.venv/bin/python .ci/sizes.py`` (exit 0: within the limits; 1: an offender or a stale entry).

A module's size is its physical line count (``wc -l``); a function's is from its ``def`` line to its
last line (decorators aside, its docstring and any nested functions included), counted for every
function, method and nested function, named by its dotted path inside the module
(``Command.build``, ``serve.<locals>.stop`` is written ``serve.stop``).

The allow-list (``.ci/sizes-allowed.txt``) has one entry a line: the module's path, or
``path::function``, then its reason, after at least one space. ``#`` starts a comment. An entry
that is no longer over its limit (or no longer exists) fails the check as well, so the list only
shrinks: delete its line. ``tests/`` is not checked: its modules are flat lists of cases.
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("balancer", "dashboard", "workers")
MODULE_LINES = 400
FUNCTION_LINES = 60
ALLOWED = ROOT / ".ci" / "sizes-allowed.txt"


@dataclass(frozen=True)
class Oversize:
    key: str  # "path" or "path::Qualified.name", as the allow-list writes it
    path: str
    line: int
    name: str  # "module" or the function's dotted name
    lines: int
    limit: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line} {self.name} {self.lines} lines (limit {self.limit})"


def _functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    found: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            name = f"{prefix}{node.name}"
            found.append((name, node))
            found += _functions(node, name + ".")
        elif isinstance(node, ast.ClassDef):
            found += _functions(node, f"{prefix}{node.name}.")
        else:  # functions under if/try/with blocks keep the enclosing name
            found += _functions(node, prefix)
    return found


def measure(root: Path, packages: tuple[str, ...] = PACKAGES) -> list[Oversize]:
    """Every module and function over its limit under root's packages, in path order."""
    found: list[Oversize] = []
    for package in packages:
        for file in sorted((root / package).rglob("*.py")):
            relative = file.relative_to(root).as_posix()
            if "migrations" in file.relative_to(root).parts:
                continue
            source = file.read_text(encoding="utf-8")
            lines = len(source.splitlines())
            if lines > MODULE_LINES:
                found.append(Oversize(relative, relative, 1, "module", lines, MODULE_LINES))
            for name, node in _functions(ast.parse(source, filename=relative)):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > FUNCTION_LINES:
                    found.append(Oversize(f"{relative}::{name}", relative, node.lineno, name, size, FUNCTION_LINES))
    return found


def read_allowed(path: Path) -> tuple[dict[str, str], list[str]]:
    """The allow-list's entries (key -> reason) and its malformed lines."""
    allowed: dict[str, str] = {}
    errors: list[str] = []
    if not path.exists():
        return allowed, errors
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        key, _, reason = text.partition(" ")
        where = f"{path.name}:{number}"
        if not reason.strip():
            errors.append(f"{where}: {key} gives no reason (write it after the entry)")
        elif key in allowed:
            errors.append(f"{where}: {key} is listed twice")
        else:
            allowed[key] = reason.strip()
    return allowed, errors


def check(root: Path, allowed_file: Path, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """What is wrong, one message a line; empty when every room is within its limit or allowed."""
    oversize = measure(root, packages)
    allowed, problems = read_allowed(allowed_file)
    by_key = {o.key: o for o in oversize}
    for o in oversize:
        if o.key not in allowed:
            problems.append(f"too big: {o}")
    for key in allowed:
        if key in by_key:
            continue
        path, _, name = key.partition("::")
        limit = FUNCTION_LINES if name else MODULE_LINES
        now = _size_now(root, path, name)
        state = "no longer exists" if now is None else f"is {now} lines now, within its limit of {limit}"
        where = _shown(allowed_file, root)
        problems.append(f"stale allow-list entry: {key} {state}: delete its line from {where} (the list only shrinks)")
    return problems


def _size_now(root: Path, path: str, name: str) -> int | None:
    file = root / path
    if not file.is_file():
        return None
    source = file.read_text(encoding="utf-8")
    if not name:
        return len(source.splitlines())
    sizes = [
        (node.end_lineno or node.lineno) - node.lineno + 1
        for found, node in _functions(ast.parse(source))
        if found == name
    ]
    return max(sizes) if sizes else None


def _shown(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout (default: this one)")
    parser.add_argument("--allowed", type=Path, help="the allow-list (default: ROOT/.ci/sizes-allowed.txt)")
    parser.add_argument("--list", action="store_true", help="print every room over its limit, allowed or not")
    args = parser.parse_args(argv)
    allowed_file = args.allowed or args.root / ".ci" / "sizes-allowed.txt"
    if args.list:
        for o in measure(args.root):
            print(o)
        return 0
    problems = check(args.root, allowed_file)
    for problem in problems:
        print(problem)
    if problems:
        print(
            f"sizes: {len(problems)} problem(s); limits {MODULE_LINES} lines a module, {FUNCTION_LINES} a function "
            f"(allow-list: {_shown(allowed_file, args.root)})"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
