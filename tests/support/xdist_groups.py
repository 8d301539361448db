"""The suite's one pytest-xdist group, and what makes ``--dist loadgroup`` group at all on pytest 9.2.

**The group.** Every test that uses the ``spark`` fixture (one SparkSession per xdist worker,
tests/pipeline/conftest.py) is marked ``xdist_group("spark")``, so under ``--dist loadgroup`` they all
run on one worker and one JVM starts for them. Spread over six workers, each worker started its own:
25-35 s of CPU and 80-100 s of a busy machine each, about 150 s of CPU in all for nothing
(``PYTEST_TIMELINE``). The mark is added ``tryfirst``: xdist's own hook reads the marks and must find
this one there already.

**Shared fixtures.** Every other test that uses a fixture a module, package or class shares (a
browser, a console with its workers and Spark pipeline, a store server) is grouped by that fixture
(the first by name), so the fixture is set up once, not once per xdist worker its tests were spread
over: the manual's eight screenshots ran on four workers, each starting its own console, runworkers
and Spark pipeline (PYTEST_TIMELINE: 205 s of the run for one 75 s module).

**The shim.** xdist 3.8 groups by appending ``@group`` to each grouped item's ``_nodeid``; pytest 9.2
derives ``nodeid`` from a structured ``_id`` instead, so the suffix is silently lost and no group ever
forms (pytest-dev/pytest-xdist#1386, fix proposed in #1388). Until a release has it, this module puts
the suffixed id into ``_id`` after xdist's hook (``trylast``); it does nothing where xdist set no
suffix or where pytest still reads ``_nodeid``.
"""

from __future__ import annotations

import pytest

SHARED_SESSIONS = {"spark": "spark"}  # fixture -> the xdist group of every test that uses it


SHARED_SCOPES = ("module", "package", "class")


def shared_fixture(item: pytest.Item) -> str | None:
    """The first (by name) fixture ``item`` uses that a module, package or class shares: where it is
    defined and its name; None when it uses none."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    for name in sorted(info.name2fixturedefs):
        definition = info.name2fixturedefs[name][-1]
        if definition.scope in SHARED_SCOPES and definition.baseid:
            return f"{definition.baseid}::{name}"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for fixture, group in SHARED_SESSIONS.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.xdist_group(group))
        if item.get_closest_marker("xdist_group") is None and (shared := shared_fixture(item)) is not None:
            item.add_marker(pytest.mark.xdist_group(shared))


class _LoadgroupShim:
    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            suffixed = vars(item).get("_nodeid")
            if isinstance(suffixed, str) and "@" in suffixed and item.nodeid != suffixed:
                from _pytest.nodeid import NodeId  # pytest 9.2 and later only

                item._id = NodeId.parse(suffixed)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_LoadgroupShim(), "leaseboard-loadgroup-shim")
