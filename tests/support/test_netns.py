"""The test network itself: hosts reach each other, a cut drops packets both ways and heals, and
closing leaves no namespace, link or process behind, even when the test fails inside it."""

from __future__ import annotations

import subprocess
import sys
from functools import partial

import pytest

from tests.support.netns import Network, available, sweep_stale
from tests.support.waiting import until_sync

PORT = 8765
CONNECT = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1).close()"


def listen(net: Network) -> None:
    """A TCP listener on PORT in every host, answered until the network closes."""
    for host in net.hosts.values():
        host.popen(
            [sys.executable, "-m", "http.server", "-b", host.address, str(PORT)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    for name in net.hosts:
        until_sync(partial(reaches, net, name, name), f"{name}'s listener")


def reaches(net: Network, a: str, b: str) -> bool:
    """Whether a TCP connection from host ``a`` to host ``b``'s listener opens within a second."""
    done = net[a].run(sys.executable, "-c", CONNECT, net[b].address, str(PORT), check=False)
    return done.returncode == 0


def test_namespaces_can_be_made_here() -> None:
    assert available() is None


def test_hosts_reach_each_other_until_cut_and_again_after_heal() -> None:
    with Network(["store", "w1", "w2"]) as net:
        listen(net)
        assert reaches(net, "w1", "store") and reaches(net, "w2", "w1")
        net.cut("w1", "store")
        assert not reaches(net, "w1", "store") and not reaches(net, "store", "w1")
        assert reaches(net, "w2", "store") and reaches(net, "w1", "w2")  # only that link
        net.heal("w1", "store")
        assert reaches(net, "w1", "store")
        net.isolate("w2")
        assert not reaches(net, "w2", "store") and not reaches(net, "w2", "w1")
        observer = subprocess.run([sys.executable, "-c", CONNECT, net["w2"].address, str(PORT)], capture_output=True)
        assert observer.returncode == 0  # the observer's link is never cut
        net.heal_all()
        assert reaches(net, "w2", "w1")


def test_closing_leaves_nothing_even_after_a_failure_with_processes_running() -> None:
    net = Network(["a", "b"])
    with pytest.raises(RuntimeError), net:
        sleeper = net["a"].popen([sys.executable, "-c", "import time; time.sleep(600)"])
        assert sleeper.poll() is None
        raise RuntimeError("the test failed here")
    assert sleeper.poll() is not None
    assert net.leftovers() == []


def test_the_network_of_a_killed_test_process_is_deleted_by_the_next_one() -> None:
    # SIGKILL (or a CI job's timeout) gives a test no chance to close its network
    made = (
        "from tests.support.netns import Network; n = Network(['a', 'b']).__enter__(); print(n.tag, flush=True); "
        "n['a'].popen(['sleep', '600']); import time; time.sleep(600)"
    )
    maker = subprocess.Popen([sys.executable, "-c", made], stdout=subprocess.PIPE, text=True)
    try:
        assert maker.stdout is not None
        tag = maker.stdout.readline().strip()
        stale = Network(["a", "b"], tag=tag)
        assert {f"lb{tag}sw", f"lb{tag}h1", f"lb{tag}h2"} < set(stale.leftovers())  # and the observer's link
        assert not [name for name in sweep_stale() if tag in name]  # its process still runs: kept
    finally:
        maker.kill()
        maker.wait(10)
    with Network(["c"]) as net:  # a new network sweeps the dead one's away first
        assert stale.leftovers() == [] and net.leftovers() != []
    assert net.leftovers() == []
