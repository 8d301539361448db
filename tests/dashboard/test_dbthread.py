"""``DatabaseThread``: one connection kept across calls, replaced after a failure or when the
server dropped it while idle (on PostgreSQL, where a server can drop it)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from django.db.utils import DatabaseError, OperationalError

from dashboard import dbthread
from dashboard.dbthread import DatabaseThread
from tests.support.waiting import until

pytestmark = pytest.mark.django_db(transaction=True, databases=["postgres"])


def backend_pid() -> int:
    with connections["postgres"].cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def fail() -> None:
    with connections["postgres"].cursor() as cursor:
        cursor.execute("SELECT * FROM no_such_table")


def terminate(pid: int) -> None:
    with connections["postgres"].cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])


@pytest.fixture
async def thread() -> AsyncIterator[DatabaseThread]:
    kept = DatabaseThread("test-db", alias="postgres")
    yield kept
    await kept.aclose_connection()  # else the test database could not be dropped


async def test_calls_share_one_connection_until_it_is_closed(thread: DatabaseThread) -> None:
    first = await thread.acall(backend_pid)
    assert await thread.acall(backend_pid) == first
    assert thread.call(backend_pid) == first  # the blocking form runs on the same thread

    await thread.aclose_connection()
    assert await thread.acall(backend_pid) != first


async def test_a_failed_call_raises_and_the_next_one_runs_on_a_fresh_connection(thread: DatabaseThread) -> None:
    first = await thread.acall(backend_pid)
    with pytest.raises(DatabaseError, match="no_such_table"):
        await thread.acall(fail)
    assert await thread.acall(backend_pid) != first


async def test_a_connection_the_server_dropped_while_idle_is_replaced_before_use(
    thread: DatabaseThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = await thread.acall(backend_pid)
    await sync_to_async(terminate)(first)  # from another connection: the server ends the kept one
    monkeypatch.setattr(dbthread, "CHECK_AFTER", 0.0)  # "idle long enough" without waiting

    assert await thread.acall(backend_pid) not in (first, None)  # no error reached the caller


async def test_a_busy_connection_is_not_checked_so_a_drop_fails_one_call_only(thread: DatabaseThread) -> None:
    first = await thread.acall(backend_pid)
    await sync_to_async(terminate)(first)

    with pytest.raises(DatabaseError):
        await thread.acall(backend_pid)  # used a moment ago: no check, the call finds out
    assert await thread.acall(backend_pid) != first


async def test_with_retry_a_call_on_a_connection_the_server_dropped_runs_again_on_a_new_one() -> None:
    kept = DatabaseThread("test-db-retry", alias="postgres", retry=True)
    try:
        first = await kept.acall(backend_pid)
        await sync_to_async(terminate)(first)  # a database restart, as the kept connection sees it

        assert await kept.acall(backend_pid) not in (first, None)  # used a moment ago, yet no error
        with pytest.raises(DatabaseError, match="no_such_table"):
            await kept.acall(fail)  # not a connection error: raised as it is, not run twice
    finally:
        await kept.aclose_connection()


def sleep_in_the_database(seconds: float) -> None:
    with connections["postgres"].cursor() as cursor:
        cursor.execute("SELECT pg_sleep(%s)", [seconds])


async def test_with_a_deadline_a_call_that_takes_longer_is_a_database_error_and_the_next_waits_its_turn() -> None:
    # A database cut off by a silent network holds a query until the TCP timeout: the console's reads
    # give up at their deadline instead (the statement itself runs on to its end on the thread).
    kept = DatabaseThread("test-db-deadline", alias="postgres", deadline=0.3)
    try:
        with pytest.raises(OperationalError, match=r"did not answer within 0\.3 s"):
            await kept.acall(sleep_in_the_database, 1.5)
        with pytest.raises(OperationalError, match=r"did not answer within 0\.3 s"):
            await kept.acall(backend_pid)  # queued behind the slow statement
        assert await until(lambda: _answers(kept), "the thread to answer again", 10)
    finally:
        await kept.aclose_connection()


async def _answers(kept: DatabaseThread) -> bool:
    try:
        return await kept.acall(backend_pid) > 0
    except OperationalError:
        return False


async def test_an_awaited_call_gets_the_result_or_the_error_and_a_cancelled_caller_leaves_the_call_to_finish() -> None:
    # The thread hands each outcome to the loop itself; a caller cancelled meanwhile finds nothing
    # left behind, and the call it left still runs to its end on the thread.
    db = DatabaseThread("test-answer")
    try:
        assert await db.acall(lambda: 41 + 1) == 42
        with pytest.raises(ZeroDivisionError):
            await db.acall(lambda: 1 // 0)
        started, release, finished = threading.Event(), threading.Event(), threading.Event()

        def slow() -> str:
            started.set()
            release.wait(10)
            finished.set()
            return "done"

        waiting = asyncio.create_task(db.acall(slow))
        await until(started.is_set, "the call to start on the thread")
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        release.set()
        assert await db.acall(lambda: "next") == "next"  # queued behind the cancelled caller's call
        assert finished.is_set()
    finally:
        await db.aclose()
