"""Hosts on one machine: Linux network namespaces joined by a switch, with links a test can cut.

``Network`` makes, for a test, a *switch* namespace holding a bridge, and one namespace per host,
each joined to the bridge by a veth pair and given an address of its own (``10.R.0.N/24``, R a
random byte so two runs never meet). The test process itself is joined too, as the host
``observer`` (``10.R.0.254``), whose link nothing cuts: it reads the store and the landing
while the hosts are cut off from each other.

Cuts are routes, not link changes, so each can name one peer: ``cut(a, b)`` routes a's packets for
b, and b's for a, through a gateway that does not exist (a neighbour entry with a MAC address no
host has: the switch floods the frames and every host ignores them). Nothing reports an error to
the sender, as in a real partition: a connection attempt or a request hangs until its own
timeouts, nothing is refused. (A blackhole route would fail locally at once with EINVAL; this
kernel has no netem or prio queueing disciplines to drop packets with.) ``heal(a, b)`` removes
the routes.
``isolate(a)`` cuts a from every other host (not from the observer). Commands run in a host with
``Host.run`` or start there with ``Host.popen`` (``ip netns exec``).

``close()`` kills what was started in the namespaces, deletes them (which deletes their veth
ends) and the observer's veth end; ``leftovers()`` says what of this network still exists. Use
``Network`` as a context manager, so a failing test leaves nothing behind. A test process that is
killed (SIGKILL, a CI job's timeout) cannot close its network: every name carries the pid of the
process that made it, and a new ``Network`` first deletes the networks of processes that are gone
(``sweep_stale``). Needs root and iproute2 (``ip``), both on the CI machines.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

IP = shutil.which("ip") or "/usr/sbin/ip"
OBSERVER = "observer"
NOWHERE = 250  # the host number of the cut routes' gateway, which no host has
NOWHERE_MAC = "02:00:00:00:00:fa"


# Every name starts with lb<tag>, the tag being the making process's pid, "r" and two random digits
# (interface names have at most 15 characters: lb + 7 + 3 + 2 for the longest, lb<tag>po).
TAGGED = re.compile(r"lb(\d+)r\d\d")


class NetworkError(RuntimeError):
    pass


def _new_tag() -> str:
    return f"{os.getpid()}r{random.randrange(100):02d}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> list[str]:
    """Deletes the namespaces (with what runs in them) and the observer links of networks whose
    making process is gone without closing them; returns what it deleted."""
    namespaces = [line.split()[0] for line in _ip("netns", "list", check=False).stdout.splitlines() if line.strip()]
    links = [
        line.split(":")[1].strip().split("@")[0]
        for line in _ip("-o", "link", "show", check=False).stdout.splitlines()
        if line.count(":") >= 2
    ]
    deleted = []
    for namespace in namespaces:
        tagged = TAGGED.match(namespace)
        if tagged is None or _alive(int(tagged.group(1))):
            continue
        for pid in _ip("netns", "pids", namespace, check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), 9)
        if _ip("netns", "del", namespace, check=False).returncode == 0:
            deleted.append(namespace)
    for link in links:
        tagged = TAGGED.match(link)
        stale = tagged is not None and not _alive(int(tagged.group(1)))
        if stale and _ip("link", "del", link, check=False).returncode == 0:
            deleted.append(link)
    return deleted


def _ip(*args: str, namespace: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    command = [IP, *(("netns", "exec", namespace, IP) if namespace else ()), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise NetworkError(f"{' '.join(command)}: {done.stderr.strip() or done.returncode}")
    return done


def available() -> str | None:
    """None when namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not Path(IP).exists():
        return "iproute2's ip is not installed"
    probe = f"lbprobe{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass
class Host:
    name: str
    namespace: str
    address: str
    network: Network
    link: str  # the host's interface on the switch

    def run(self, *command: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run ``command`` in this host's namespace and wait for it."""
        done = subprocess.run(
            [IP, "netns", "exec", self.namespace, *command], capture_output=True, text=True, timeout=timeout
        )
        if check and done.returncode != 0:
            raise NetworkError(f"{self.name}: {' '.join(command)}: {done.stderr.strip() or done.returncode}")
        return done

    def popen(self, command: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start ``command`` in this host's namespace; ``Network.close`` kills it if it still runs."""
        process = subprocess.Popen([IP, "netns", "exec", self.namespace, *command], **kwargs)
        self.network.processes.append(process)
        return process


@dataclass
class Network:
    names: Sequence[str]
    tag: str = field(default_factory=_new_tag)
    subnet: int = field(default_factory=lambda: random.randrange(1, 250))
    hosts: dict[str, Host] = field(default_factory=dict)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    cuts: set[tuple[str, str]] = field(default_factory=set)
    _made: list[str] = field(default_factory=list)  # namespaces made, to delete
    _observer_link: str | None = None

    @property
    def switch(self) -> str:
        return f"lb{self.tag}sw"

    def address(self, index: int) -> str:
        return f"10.{self.subnet}.0.{index}"

    def __enter__(self) -> Network:
        sweep_stale()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self._made.append(name)
        _ip("link", "set", "lo", "up", namespace=name)

    def _build(self) -> None:
        self._namespace(self.switch)
        _ip("link", "add", "br0", "type", "bridge", namespace=self.switch)
        _ip("link", "set", "br0", "up", namespace=self.switch)
        for index, name in enumerate(self.names, start=1):
            namespace = f"lb{self.tag}h{index}"
            self._namespace(namespace)
            outside, inside = f"lb{self.tag}p{index}", f"lb{self.tag}e{index}"
            self._veth(outside, inside, namespace)
            _ip("addr", "add", f"{self.address(index)}/24", "dev", inside, namespace=namespace)
            _ip("link", "set", inside, "up", namespace=namespace)
            # The gateway of cut routes: an address nobody has, resolved to a MAC nobody has.
            _ip(
                "neigh",
                "add",
                self.address(NOWHERE),
                "lladdr",
                NOWHERE_MAC,
                "nud",
                "permanent",
                "dev",
                inside,
                namespace=namespace,
            )
            self.hosts[name] = Host(name, namespace, self.address(index), self, inside)
        # The observer: this process's own namespace, on a link nothing cuts.
        outside, inside = f"lb{self.tag}po", f"lb{self.tag}eo"
        self._observer_link = inside
        self._veth(outside, inside, None)
        _ip("addr", "add", f"{self.address(254)}/24", "dev", inside)
        _ip("link", "set", inside, "up")

    def _veth(self, outside: str, inside: str, namespace: str | None) -> None:
        """A veth pair: ``outside`` on the switch's bridge, ``inside`` in ``namespace`` (None: here)."""
        _ip("link", "add", inside, "type", "veth", "peer", "name", outside)
        if namespace is None:
            self._observer_link = inside
        else:
            _ip("link", "set", inside, "netns", namespace)
        _ip("link", "set", outside, "netns", self.switch)
        _ip("link", "set", outside, "master", "br0", namespace=self.switch)
        _ip("link", "set", outside, "up", namespace=self.switch)

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    # cuts ------------------------------------------------------------------------------------------

    def cut(self, a: str, b: str) -> None:
        """Drop every packet between hosts ``a`` and ``b`` (both ways), silently."""
        for one, other in ((a, b), (b, a)):
            if (one, other) not in self.cuts:
                host = self.hosts[one]
                route = ("route", "add", f"{self.hosts[other].address}/32", "via", self.address(NOWHERE))
                _ip(*route, "dev", host.link, namespace=host.namespace)
                self.cuts.add((one, other))

    def heal(self, a: str, b: str) -> None:
        for one, other in ((a, b), (b, a)):
            if (one, other) in self.cuts:
                _ip("route", "del", f"{self.hosts[other].address}/32", namespace=self.hosts[one].namespace)
                self.cuts.discard((one, other))

    def isolate(self, name: str) -> None:
        """Cut ``name`` from every other host (the observer still reaches it)."""
        for other in self.hosts:
            if other != name:
                self.cut(name, other)

    def heal_all(self) -> None:
        for one, other in sorted(self.cuts):
            self.heal(one, other)

    # teardown --------------------------------------------------------------------------------------

    def close(self) -> None:
        """Kill what runs in the hosts, delete the namespaces and the observer's link."""
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10)
        for namespace in self._namespaces_now():
            for pid in _ip("netns", "pids", namespace, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), 9)
        if self._observer_link is not None:
            _ip("link", "del", self._observer_link, check=False)
        for namespace in reversed(self._made):
            _ip("netns", "del", namespace, check=False)
        self._made.clear()

    def _namespaces_now(self) -> list[str]:
        listed = _ip("netns", "list", check=False).stdout.split("\n")
        return [line.split()[0] for line in listed if line.strip() and line.split()[0].startswith(f"lb{self.tag}")]

    def leftovers(self) -> list[str]:
        """Namespaces and links of this network that still exist (empty after ``close``)."""
        links = [
            line.split(":")[1].strip().split("@")[0]
            for line in _ip("-o", "link", "show", check=False).stdout.splitlines()
            if f"lb{self.tag}" in line
        ]
        return self._namespaces_now() + links


@contextlib.contextmanager
def network(names: Sequence[str]) -> Iterator[Network]:
    with Network(names) as made:
        yield made
