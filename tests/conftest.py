"""Fixtures for every test package.

PostgreSQL: a test that names the ``postgres`` database, e.g.
``@pytest.mark.django_db(transaction=True, databases=["postgres"])``, gets a throwaway PostgreSQL
server started once for the session (about a second) and the Django alias ``postgres`` pointing at
it; pytest-django creates and migrates ``test_postgres`` there like the default database. Runs
that collect no such test never start the server. Everything else uses the default (SQLite)
database as usual. After each such test the connections that ``database_sync_to_async`` left on
asgiref's shared thread are closed (else dropping the test database hangs on "database is being
accessed by other users").

SqlStore (and anything else that reads and writes from threads of its own) needs
``django_db(transaction=True)``: its connections cannot see a test's uncommitted transaction.

SQLite: the default test database is a file in the session's temporary directory rather than
Django's shared-cache in-memory database, whose table locks fail at once ("database table is
locked") instead of waiting; a file behaves like production (WAL, busy timeout), so stores used
from several threads or processes work in tests as they do in the demo.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import hypothesis
import pytest
from asgiref.sync import SyncToAsync
from django.conf import settings
from django.db import connections

from tests.support.databases import add_django_database, remove_django_database
from tests.support.postgres import Postgres, start_postgres

# No per-example deadline for property tests (hypothesis' default is 200 ms): the suite runs on a busy
# machine by design (ci-under-load), where a stalled example is the machine, not the code; a run under
# load failed test_properties' View.active property once that way.
hypothesis.settings.register_profile("leaseboard", deadline=None)
hypothesis.settings.load_profile("leaseboard")

# The suite's JVMs (a Spark driver per SparkSession the tests, their runpipeline processes and the
# benches' tiny runs start; spark_cluster's daemons and executors) live seconds to minutes, most of it
# starting up, where the JIT's optimizing tier (C2) compiles for a future they do not have: a session
# that starts, writes and reads 200,000 rows five times took 24.6 CPU seconds, 14.1 with C1 only, and
# less time too. Same code, same results; `make bench` and production keep the JVM's default.
SPARK_TEST_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"
os.environ.setdefault("SPARK_SUBMIT_OPTS", SPARK_TEST_JAVA_OPTIONS)  # spark-submit's (the driver's) JVM

pytest_plugins = [
    "tests.support.timeline",  # PYTEST_TIMELINE=FILE: where a run's time went
    "tests.support.xdist_groups",  # the "spark" group, one per shared fixture, and loadgroup on pytest 9.2
]

POSTGRES = "postgres"

# The longest tests, longest first (each a few minutes, mostly waiting): `make test` runs the suite on
# pytest-xdist, and the run can end no sooner than its longest test started; these start first.
# xdist's --dist loadgroup still hands its work units out largest group first (--loadscope-reorder, its
# default), so some start a few minutes in. Tried (1 December 2026): --no-loadscope-reorder, these first
# for real, made the quiet main suite slower (1,034 s against 844 s): all of them at once starve each
# other on two cores, and xdist queues a second unit behind each, so a long one waited for another.
LONGEST_FIRST = (
    "tests/livetest/test_microsoft_suite.py",
    "tests/netsplit/test_partitions.py",
    "tests/pipeline/test_cluster.py",
    "tests/chaos/test_chaos.py",
    "tests/dashboard/test_schema_fuzz.py",
)
# Tests that load the machine themselves (ten worker processes started at once, spinning processes):
# after the slow suites (not in the first minutes, when the longest ones all start together and their
# timing bounds are the tightest), before the fast ones. Last of all, the 70 s stop test ran alone at
# the end of a run whose other workers were done (PYTEST_TIMELINE: 698 s where the rest ended at 630 s);
# here the ~1,500 fast tests (about 600 worker-seconds) run beside it.
AFTER_SLOW = ("tests/redis/test_stop_bound.py", "tests/contract/test_listeners_stop.py")
# xdist groups (tests/support/xdist_groups.py): the tests that use the session's SparkSession run on
# one xdist worker, so one JVM starts; the tests that share a module's, package's or class's fixture
# run on one worker, so it starts once (the chaos suite's three stores share one PostgreSQL cluster:
# a chain of about 270 s, well inside a run bound by its total CPU, as the timeline shows). The
# partition suite shares nothing and stays spread.


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        if path in LONGEST_FIRST:
            return LONGEST_FIRST.index(path)
        if path in AFTER_SLOW:
            return len(LONGEST_FIRST) + 1
        return len(LONGEST_FIRST) + (0 if item.get_closest_marker("slow") else 2)

    items.sort(key=rank)  # stable: the order within each rank stays the collection order


def _named_databases(item: pytest.Item) -> set[str]:
    marker = item.get_closest_marker("django_db")
    databases = marker.kwargs.get("databases") if marker else None
    return set(databases) if isinstance(databases, list | tuple | set | frozenset) else set()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Postgres]:
    """A PostgreSQL server for the whole session (stopped and deleted at the end)."""
    server = start_postgres()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def django_db_modify_db_settings(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    django_db_modify_db_settings_parallel_suffix: None,
) -> Iterator[None]:
    # pytest-django's hook for changing DATABASES just before it creates the test databases. The
    # server fixture is requested from here, so it outlives the test databases' teardown.
    default = settings.DATABASES["default"]
    if default["ENGINE"] == "django.db.backends.sqlite3" and not default.get("TEST", {}).get("NAME"):
        default.setdefault("TEST", {})["NAME"] = str(tmp_path_factory.mktemp("sqlite") / "test_leaseboard.sqlite3")
    if not any(POSTGRES in _named_databases(item) for item in request.session.items):
        yield
        return
    server: Postgres = request.getfixturevalue("postgres_server")
    add_django_database(POSTGRES, server.url, connect_timeout=5)
    yield
    remove_django_database(POSTGRES)


@pytest.fixture(autouse=True)
def _close_postgres_connections(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if POSTGRES in _named_databases(request.node):
        # Where sync_to_async(thread_sensitive=True) runs outside async_to_sync: one shared thread.
        SyncToAsync.single_thread_executor.submit(connections.close_all).result(timeout=30)
