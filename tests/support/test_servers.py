"""The server starter: a port taken between choosing and binding it is retried elsewhere, and a
stopped server leaves no process behind."""

from __future__ import annotations

import itertools
import os
import socket

import pytest

from tests.support import servers
from tests.support.redis_server import start_redis


def test_a_port_taken_before_the_server_binds_it_is_retried_on_another(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as squatter:  # answers connections: only the listening process tells ours apart
        squatter.bind((servers.HOST, 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        chosen = itertools.chain([taken], iter(servers.free_port, None))
        monkeypatch.setattr(servers, "free_port", lambda host=servers.HOST: next(chosen))
        server = start_redis()
        try:
            assert server.port != taken and server.running
            assert "Address already in use" in server.log_path.read_text()
        finally:
            server.stop()
        assert not server.home.exists()


def test_a_port_taken_at_every_attempt_fails_with_the_servers_log(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as squatter:
        squatter.bind((servers.HOST, 0))
        squatter.listen()
        monkeypatch.setattr(servers, "free_port", lambda host=servers.HOST: squatter.getsockname()[1])
        with pytest.raises(servers.PortTaken, match="Address already in use"):
            start_redis(attempts=2)


def test_kill_ends_the_process_and_start_brings_it_back_on_the_same_port() -> None:
    server = start_redis()
    try:
        first = server.process
        assert first is not None
        server.kill()
        assert first.returncode is not None and not server.running
        with pytest.raises(ProcessLookupError):
            os.killpg(first.pid, 0)  # nothing of its group is left
        server.start()
        assert server.running and server.process is not first
    finally:
        server.stop()
