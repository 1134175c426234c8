"""Hosts of the tests' own, on a network the tests can cut: network namespaces and veth pairs.

A :class:`Network` gives the servers an address of their own in this (the root)
namespace, and each :meth:`Network.host` a network namespace joined to it by a
veth pair, on a /30 of its own (the servers' address is on each pair's outer
end too, and reached from the host through the /24's route). Everything lives in
198.18.0.0/15 (RFC 2544's benchmarking range: never routed beyond this
machine), one /24 per Network, chosen free. :meth:`Host.cut` adds a blackhole
route on each side, so that packets vanish without a reset or an ICMP error,
as when a host is powered off or a switch drops them; :meth:`Host.heal` deletes
the routes. The servers also keep their Unix sockets, which the tests' own
clients use: only the hosts' traffic crosses the network.

A process runs "on" a host with ``ip netns exec`` (:meth:`Host.command`), and as
a container would, under a host name and in a PID namespace of its own, with
:func:`container` (``unshare -u -p -f -m --mount-proc``). Making namespaces takes
root: where it is refused, :func:`namespaces` (network namespaces) and
:func:`containers` skip a test, saying so in one line (fail it where
``EFFECTFUL_DURABLE_REQUIRE_POSTGRES`` is set, as CI does).
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pytest
from postgres_server import REQUIRE_ENV

#: Every address the tests' networks use.
RANGE = ipaddress.ip_network("198.18.0.0/15")

HOW_TO_ENABLE = (
    "partition tests skipped: making network namespaces needs root and iproute2 "
    "('ip netns add' was refused or 'ip' is missing)"
)
CONTAINERS_REFUSED = (
    "container tests skipped: a container needs root and util-linux "
    "('unshare -u -p -f -m --mount-proc' was refused or 'unshare' is missing)"
)


def _ip(*args: str, namespace: str | None = None) -> None:
    command = ["ip", *args]
    if namespace is not None:
        command = ["ip", "netns", "exec", namespace, *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        msg = f"{' '.join(command)} failed: {done.stderr.strip()}"
        raise RuntimeError(msg)


def _subnets_in_use() -> set[ipaddress.IPv4Network]:
    shown = subprocess.run(
        ["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    used = set()
    for line in shown.splitlines():
        words = line.split()
        address = ipaddress.ip_interface(words[words.index("inet") + 1])
        if address.ip in RANGE:
            used.add(ipaddress.ip_network(f"{address.ip}/24", strict=False))
    return used


class Host:
    """A network namespace joined to its Network by a veth pair; cut and healed at will."""

    def __init__(self, network: Network, number: int) -> None:
        self.network = network
        self.namespace = f"{network.name}h{number}"
        base = network.subnet.network_address + 4 * (number + 1)
        self._outer, self.address = base + 1, base + 2
        self._outer_link, inner_link = f"{network.name}r{number}", f"{network.name}n{number}"
        _ip("netns", "add", self.namespace)
        network.cleanups.append(lambda: _ip("netns", "del", self.namespace))
        _ip("link", "add", self._outer_link, "type", "veth", "peer", "name", inner_link)
        network.cleanups.append(lambda: _ip("link", "del", self._outer_link))
        _ip("link", "set", inner_link, "netns", self.namespace)
        _ip("addr", "add", f"{self._outer}/30", "dev", self._outer_link)
        _ip("addr", "add", f"{network.server}/32", "dev", self._outer_link)
        _ip("link", "set", self._outer_link, "up")
        _ip("addr", "add", f"{self.address}/30", "dev", inner_link, namespace=self.namespace)
        _ip("link", "set", inner_link, "up", namespace=self.namespace)
        _ip("link", "set", "lo", "up", namespace=self.namespace)
        # The network's /24, not the server's /32: a cut's blackhole route is that /32.
        subnet = str(network.subnet)
        _ip("route", "add", subnet, "via", str(self._outer), namespace=self.namespace)
        self.is_cut = False

    def cut(self) -> None:
        """Drop every packet between this host and the servers, in both directions,
        without a word to either side."""
        self.is_cut = True
        _ip("route", "add", "blackhole", f"{self.address}/32")
        _ip("route", "add", "blackhole", f"{self.network.server}/32", namespace=self.namespace)

    def heal(self) -> None:
        """Let packets through again."""
        for args, namespace in (
            (("route", "del", "blackhole", f"{self.address}/32"), None),
            (("route", "del", "blackhole", f"{self.network.server}/32"), self.namespace),
        ):
            try:
                _ip(*args, namespace=namespace)
            except RuntimeError as error:  # a cut that failed half way
                if "No such process" not in str(error):
                    raise
        self.is_cut = False

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run on this host (``[]``: the prefix that runs a command there)."""
        return ["ip", "netns", "exec", self.namespace, *argv]


class Network:
    """The servers' address and the hosts around it; everything removed by :meth:`close`."""

    _numbers = itertools.count()

    def __init__(self) -> None:
        self.name = f"ed{os.getpid() % 100000}{next(self._numbers)}"
        taken = _subnets_in_use()
        subnets = list(RANGE.subnets(new_prefix=24))
        start = os.getpid() % len(subnets)  # test processes at once start apart
        self.subnet = next(s for s in subnets[start:] + subnets[:start] if s not in taken)
        self.server = self.subnet.network_address + 1
        self.cleanups: list = []
        self._hosts = itertools.count()
        try:
            # A veth pair of its own holds the servers' address until hosts do too: a
            # server can then listen on it before the first host is made.
            anchor = f"{self.name}a"
            _ip("link", "add", anchor, "type", "veth", "peer", "name", f"{self.name}b")
            self.cleanups.append(lambda: _ip("link", "del", anchor))
            _ip("addr", "add", f"{self.server}/32", "dev", anchor)
            _ip("link", "set", anchor, "up")
        except BaseException:
            self.close()
            raise

    def host(self) -> Host:
        """A new host on this network."""
        return Host(self, next(self._hosts))

    def close(self) -> None:
        """Remove the hosts, their links and routes, and the servers' address."""
        errors = []
        while self.cleanups:
            try:
                self.cleanups.pop()()
            except RuntimeError as error:
                errors.append(error)
        for error in errors:
            if "Cannot find device" not in str(error) and "No such file" not in str(error):
                raise error


def container(hostname: str, *, skip_pids: int = 0) -> list[str]:
    """The prefix that runs a command as a container with the host's network would:
    under ``hostname``, in a PID namespace (and ``/proc``) of its own, killed with
    it. The command is not the namespace's first process (a shell is, which passes
    SIGTERM on: :func:`terminate`), and ``skip_pids`` short processes go before it,
    so that two containers' commands get different pids."""
    first = f"for i in $(seq {skip_pids}); do /bin/true; done; " if skip_pids else ""
    # A command in the background would read /dev/null: it gets the shell's stdin.
    script = (
        f'hostname {hostname} && {first}exec 3<&0; "$@" <&3 3<&- & child=$!; '
        "trap 'kill -TERM $child' TERM; wait $child; wait $child"
    )
    return [
        "unshare", "-u", "-p", "-f", "-m", "--mount-proc", "--kill-child",
        "sh", "-c", script, "sh",
    ]  # fmt: skip


def terminate(proc: subprocess.Popen[str]) -> None:
    """SIGTERM to ``proc``, or, if it runs a :func:`container`, to the command inside
    (``unshare`` passes no signal on, and ignores SIGTERM while it waits)."""
    target = proc.pid
    if os.path.basename(str(proc.args[0])) == "unshare":  # type: ignore[index]
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as children:
            inner = children.read().split()
        if not inner:
            return
        target = int(inner[0])
    with contextlib.suppress(ProcessLookupError):
        os.kill(target, signal.SIGTERM)


def host_pid(ancestor: int, inner: int) -> int:
    """The pid, as this process sees it, of the descendant of ``ancestor`` whose pid is
    ``inner`` in its own PID namespace (a container's process names itself so)."""
    pending = [ancestor]
    while pending:
        pid = pending.pop()
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/status") as status:
                for line in status:
                    pids = line.split()[1:] if line.startswith("NSpid:") else []
                    if len(pids) > 1 and int(pids[-1]) == inner:
                        return pid
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as children:
                    pending += [int(child) for child in children.read().split()]
    msg = f"no process {inner} in a PID namespace below process {ancestor}"
    raise LookupError(msg)


def unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None if they can."""
    if shutil.which("ip") is None or shutil.which("unshare") is None or os.geteuid() != 0:
        return HOW_TO_ENABLE
    probe = f"edprobe{os.getpid()}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, check=False)
    if done.returncode != 0:
        return HOW_TO_ENABLE
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


def namespaces() -> None:
    """Skip the test where namespaces cannot be made (fail it where CI requires them)."""
    _required(unavailable())


def containers() -> None:
    """Skip the test where :func:`container` cannot run (fail it where CI requires it)."""
    _required(containers_unavailable())


def containers_unavailable() -> str | None:
    """Why :func:`container` cannot run here, or None if it can: it is tried."""
    if shutil.which("unshare") is None:
        return CONTAINERS_REFUSED
    done = subprocess.run(
        [*container(f"edprobe{os.getpid()}"), "true"], capture_output=True, check=False
    )
    return CONTAINERS_REFUSED if done.returncode != 0 else None


def _required(reason: str | None) -> None:
    if reason is not None:
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{reason} (and {REQUIRE_ENV} is set)")
        pytest.skip(reason)


@contextmanager
def network() -> Iterator[Network]:
    """A new Network, removed after the block."""
    made = Network()
    try:
        yield made
    finally:
        made.close()
