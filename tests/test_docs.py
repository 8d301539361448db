"""The manual: README.md is a front page into docs/, and the settings reference that docs/settings.md
gets at build time (docs/hooks/settings_reference.py) names every variable the settings modules read.
``make lint`` builds the site in strict mode, which checks the links, anchors and navigation."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location("settings_reference", DOCS / "hooks" / "settings_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_readme_is_a_front_page_with_the_two_commands_to_start() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    block = re.search(r"```sh\n(.*?)```", text, re.S)
    assert block is not None
    assert [line.split()[:2] for line in block[1].splitlines()] == [["make", "demo"], ["make", "test"]]
    assert "](docs/images/fleet.png)" in text


def test_every_file_the_readme_links_to_exists() -> None:
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    local = [link for link in links if not link.startswith(("http://", "https://"))]
    assert local and all(link.startswith("docs/") for link in local), local
    assert [link for link in local if not (ROOT / link).exists()] == []


# Imports the settings as Django would, with os.environ replaced by a mapping that notes each name read.
RECORD = """
import json, os, secrets
seen = set()
class Recording(dict):
    def get(self, key, default=None):
        seen.add(key)
        return super().get(key, default)
    def __getitem__(self, key):
        seen.add(key)
        return super().__getitem__(key)
    def __contains__(self, key):
        seen.add(key)
        return super().__contains__(key)
os.environ = Recording(os.environ)
import dashboard.production
print(json.dumps(sorted(seen)))
"""


def test_the_settings_reference_names_every_variable_the_settings_read() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "LEASEBOARD_"))}
    env["DJANGO_SECRET_KEY"] = "k" + "".join(chr(ord("a") + (i * 7) % 26) + str(i % 10) for i in range(40))
    env["LEASEBOARD_VAR_DIR"] = str(ROOT / "var")
    out = subprocess.run(
        [sys.executable, "-c", RECORD], cwd=ROOT, env=env, check=True, capture_output=True, text=True, timeout=60
    )
    read = set(json.loads(out.stdout.splitlines()[-1]))
    rendered = reference().render(ROOT)
    documented = set(re.findall(r"^\| `([A-Z0-9_]+)` \|", rendered, re.M))
    assert "LEASEBOARD_INTERVAL" in read and "DJANGO_SECRET_KEY" in read
    assert read - documented == set()


def test_every_setting_has_a_description_and_the_page_its_marker() -> None:
    module = reference()
    settings = [s for path in module.SETTINGS for s in module.read_settings(ROOT, path)]
    assert len(settings) > 40
    assert all(s.description for s in settings)
    expiry = next(s for s in settings if s.variable == "LEASEBOARD_EXPIRY")
    assert (expiry.default, expiry.kind, expiry.target) == ("10", "number", "LEASEBOARD_EXPIRY")
    assert module.MARKER in (DOCS / module.PAGE).read_text()


def test_a_setting_without_its_comment_stops_the_build(tmp_path: Path) -> None:
    module = reference()
    (tmp_path / "dashboard").mkdir()
    (tmp_path / "dashboard" / "settings.py").write_text(
        '# Seconds between cycles.\nA = envfloat("LEASEBOARD_A", 1.0)\nB = envint("LEASEBOARD_B", 2)\n\n'
        'C = envstr("LEASEBOARD_C", "")\n'
    )
    try:
        module.read_settings(tmp_path, "dashboard/settings.py")
    except module.SettingsDocError as refused:
        assert "LEASEBOARD_C" in str(refused) and "settings.py:5" in str(refused)
    else:
        raise AssertionError("a setting without a comment was described")
