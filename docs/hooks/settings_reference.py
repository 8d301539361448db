"""The settings reference, rendered from the settings modules when the site is built (an MkDocs hook).

``docs/settings.md`` holds the marker ``<!-- settings-reference -->``; ``on_page_markdown`` replaces it
with one table per section of ``dashboard/settings.py`` (its ``# --- name ---`` lines) and one for
``dashboard/production.py``, then a table of the environment variables the product reads elsewhere.

Nothing is imported: the modules are parsed (``ast``), so the build needs no Django, no database and no
environment. A setting is a call of ``dashboard.env``'s readers (``envstr``, ``envint``, ``envfloat``,
``envbool``) with the variable's name as a literal; its description is the comment block right above the
line of the call or of its statement (or the comment at the end of either line), else that of the setting
just before it when the two statements touch (``LEASEBOARD_INTERVAL`` and ``LEASEBOARD_EXPIRY`` share one).
A setting without a description stops the build: document it where it is defined.

``python docs/hooks/settings_reference.py`` prints the rendered Markdown.
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PAGE = "settings.md"
MARKER = "<!-- settings-reference -->"
SETTINGS = ("dashboard/settings.py", "dashboard/production.py")
PACKAGES = ("balancer", "dashboard", "workers")
READERS = {
    "envstr": "text",
    "envint": "whole number",
    "envfloat": "number",
    "envbool": "true or false",
    "envlevels": "logger=LEVEL pairs",
}
# How a default built from a path reads: the variable that moves it, or the checkout itself.
PLACES = {"VAR_DIR": "$LEASEBOARD_VAR_DIR", "BASE_DIR": "<checkout>"}
ENV_NAME = re.compile(r"^[A-Z][A-Z0-9]*(_[A-Z0-9]+)+$")
SECTION = re.compile(r"^#\s*-{3,}\s*(?P<name>.*?)\s*-{3,}\s*$")


class SettingsDocError(Exception):
    """A setting the reference cannot describe (no comment), named with its file and line."""


@dataclass(frozen=True, slots=True)
class Setting:
    variable: str
    kind: str  # "text", "whole number", "number", "true or false"
    default: str  # as a reader of the page would type it
    minimum: str | None
    target: str  # the Django setting it becomes ("" when it only steers a statement)
    section: str
    source: str  # "dashboard/settings.py:229"
    description: str


@dataclass(frozen=True, slots=True)
class ReadElsewhere:
    variable: str
    default: str
    source: str
    description: str


class Source:
    """One module's text, its tree and its comments by line."""

    def __init__(self, root: Path, relative: str) -> None:
        self.relative = relative
        self.text = (root / relative).read_text(encoding="utf-8")
        self.lines = self.text.splitlines()
        self.tree = ast.parse(self.text, relative)
        self.comments: dict[int, str] = {}  # line -> comment text, whole-line or trailing
        self.trailing: set[int] = set()
        for token in tokenize.generate_tokens(io.StringIO(self.text).readline):
            if token.type == tokenize.COMMENT:
                line = token.start[0]
                self.comments[line] = token.string.lstrip("#").strip()
                if self.lines[line - 1][: token.start[1]].strip():
                    self.trailing.add(line)

    def block_above(self, line: int) -> str:
        """The whole-line comments right above ``line`` (section rulers left out), else its trailing comment."""
        found: list[str] = []
        above = line - 1
        while above >= 1 and above in self.comments and above not in self.trailing:
            if not SECTION.match(self.lines[above - 1].strip()):
                found.insert(0, self.comments[above])
            above -= 1
        if found:
            return " ".join(found)
        return self.comments[line] if line in self.trailing else ""

    def section_of(self, line: int) -> str:
        section = ""
        for number in range(1, line):
            match = SECTION.match(self.lines[number - 1].strip())
            if match:
                section = match["name"]
        return section


def _render(node: ast.expr) -> str:
    """A default as the page shows it: paths spelled out, constants as typed in the environment."""
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool):
            return "true" if node.value else "false"
        if isinstance(node.value, float):
            return f"{node.value:g}"
        return str(node.value)
    if isinstance(node, ast.Name):
        return PLACES.get(node.id, node.id)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        return f"{_render(node.left)}/{_render(node.right)}"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("str", "Path"):
        return _render(node.args[0]) if len(node.args) == 1 else ast.unparse(node)
    if isinstance(node, ast.JoinedStr):
        return "".join(_render(v.value) if isinstance(v, ast.FormattedValue) else _render(v) for v in node.values)
    return ast.unparse(node)


def _statements(tree: ast.AST) -> list[ast.stmt]:
    return sorted((n for n in ast.walk(tree) if isinstance(n, ast.stmt)), key=lambda s: s.lineno)


def _innermost(statements: list[ast.stmt], line: int) -> ast.stmt:
    holding = [s for s in statements if s.lineno <= line <= (s.end_lineno or s.lineno)]
    return max(holding, key=lambda s: s.lineno)


def _target(statement: ast.stmt) -> str:
    """The Django setting a statement assigns ('' for a private name or anything else)."""
    target: ast.expr | None = None
    if isinstance(statement, ast.Assign):
        target = statement.targets[0]
    elif isinstance(statement, ast.AnnAssign):
        target = statement.target
    return target.id if isinstance(target, ast.Name) and not target.id.startswith("_") else ""


def read_settings(root: Path = ROOT, relative: str = SETTINGS[0]) -> list[Setting]:
    """Every environment variable a settings module reads through ``dashboard.env``, in source order."""
    source = Source(root, relative)
    statements = _statements(source.tree)
    calls: list[tuple[ast.Call, str, str]] = []  # the call, the variable, the reader
    for node in ast.walk(source.tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in READERS and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                calls.append((node, first.value, node.func.id))
    found: list[Setting] = []
    described: dict[int, str] = {}  # a setting's statement's last line -> its description
    for call, variable, reader in sorted(calls, key=lambda c: (c[0].lineno, c[0].col_offset)):
        statement = _innermost(statements, call.lineno)
        description = source.block_above(call.lineno) or source.block_above(statement.lineno)
        description = description or described.get(statement.lineno - 1, "")
        where = f"{relative}:{call.lineno}"
        if not description:
            raise SettingsDocError(f"{where}: {variable} has no comment saying what it is")
        described[statement.end_lineno or statement.lineno] = description
        minimum = next((_render(k.value) for k in call.keywords if k.arg == "minimum"), None)
        found.append(
            Setting(
                variable=variable,
                kind=READERS[reader],
                default=_render(call.args[1]) if len(call.args) > 1 else "",
                minimum=minimum,
                target=_target(statement),
                section=source.section_of(call.lineno),
                source=where,
                description=description,
            )
        )
    return found


def _is_environ(node: ast.expr) -> bool:
    """``os.environ`` or a mapping parameter named ``env`` (the AMQP hub's readers take one)."""
    if isinstance(node, ast.Attribute):
        return node.attr == "environ"
    return isinstance(node, ast.Name) and node.id == "env"


def _docstring_about(node: ast.AST, names: set[str], *, named: bool) -> str:
    """The first paragraph of ``node``'s docstring that names one of ``names`` (``named``), or its first."""
    if not isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return ""
    paragraphs = [" ".join(p.split()) for p in (ast.get_docstring(node) or "").split("\n\n") if p.strip()]
    if named:
        paragraphs = [p for p in paragraphs if any(name in p for name in names)]
    return paragraphs[0] if paragraphs else ""


def _functions_holding(tree: ast.Module, line: int) -> list[ast.AST]:
    """The functions and classes whose lines hold ``line``, innermost first."""
    holding: list[ast.AST] = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and n.lineno <= line <= (n.end_lineno or n.lineno)
    ]
    return sorted(holding, key=lambda n: -getattr(n, "lineno", 0))


def read_elsewhere(root: Path = ROOT, known: frozenset[str] = frozenset()) -> list[ReadElsewhere]:
    """Environment variables the product reads outside the settings modules (``os.environ.get``,
    ``os.environ[...]``, an ``env`` mapping), with the module that reads them; ``known`` left out.
    Described by the comment above the read (or above the constant that names the variable), else by
    the docstring of the function, then of the module, that speaks of it."""
    found: dict[str, ReadElsewhere] = {}
    skipped = {*SETTINGS, "dashboard/env.py"}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            if relative in skipped or "/migrations/" in relative:
                continue
            source = Source(root, relative)
            constants: dict[str, tuple[str, int]] = {
                t.id: (n.value.value, n.lineno)
                for n in source.tree.body
                if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                for t in n.targets
                if isinstance(t, ast.Name)
            }
            for node in ast.walk(source.tree):
                key: ast.expr | None = None
                default = "\u2014"  # no default: unset
                at = 0
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "get"
                    and _is_environ(node.func.value)
                    and node.args
                ):
                    key, at = node.args[0], node.lineno
                    if len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
                        default = str(node.args[1].value)
                elif isinstance(node, ast.Subscript) and _is_environ(node.value) and isinstance(node.ctx, ast.Load):
                    key, at = node.slice, node.lineno
                if key is None:
                    continue
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    name, names, comment = key.value, {key.value}, source.block_above(at)
                elif isinstance(key, ast.Name) and key.id in constants:
                    name, line = constants[key.id]
                    names, comment = {name, key.id}, source.block_above(line)
                else:
                    continue
                if not ENV_NAME.match(name) or name in known or name in found:
                    continue
                holders = [*_functions_holding(source.tree, at), source.tree]
                candidates = [_docstring_about(h, names, named=True) for h in holders]
                candidates += [_docstring_about(h, names, named=False) for h in reversed(holders)]
                description = comment or next((text for text in candidates if text), "")
                found[name] = ReadElsewhere(name, default, f"{relative}:{at}", description.replace("``", "`"))
    return sorted(found.values(), key=lambda r: r.variable)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").strip()


def _code(text: str) -> str:
    return f"`{text}`" if text and text != "\u2014" else text or "(empty)"


def render(root: Path = ROOT) -> str:
    """The reference's Markdown: a table per section, production's, then the variables read elsewhere."""
    tables: dict[str, list[Setting]] = {}
    for relative in SETTINGS:
        for setting in read_settings(root, relative):
            title = f"`{relative}`" + (f": {setting.section}" if setting.section else "")
            tables.setdefault(title, []).append(setting)
    out: list[str] = []
    for title, settings in tables.items():
        out += [f"## {title}", "", "| variable | value | default | setting | what it does |", "|---|---|---|---|---|"]
        for s in settings:
            kind = s.kind + (f", at least {s.minimum}" if s.minimum is not None else "")
            target = f"`{s.target}`" if s.target else ""
            source = f"<small>{s.source}</small>"
            out.append(
                f"| `{s.variable}` | {kind} | {_cell(_code(s.default))} | {target} | {_cell(s.description)} {source} |"
            )
        out.append("")
    known = frozenset(s.variable for group in tables.values() for s in group)
    out += [
        "## Read elsewhere",
        "",
        "Variables the product reads outside the settings modules, each where it is read (none has a",
        "Django setting).",
        "",
        "| variable | default | what it does |",
        "|---|---|---|",
    ]
    for read in read_elsewhere(root, known):
        source = f"<small>{read.source}</small>"
        out.append(f"| `{read.variable}` | {_cell(_code(read.default))} | {_cell(read.description)} {source} |")
    return "\n".join(out) + "\n"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs' hook: the settings page gets its tables (a missing marker fails the build)."""
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise SettingsDocError(f"docs/{PAGE} has lost its marker {MARKER}")
    return markdown.replace(MARKER, render(ROOT))


if __name__ == "__main__":
    sys.stdout.write(render(ROOT))
