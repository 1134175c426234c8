"""A PostgreSQL server that misbehaves on purpose: restarts, freezes, cut connections.

:class:`FaultyServer` is a throwaway cluster (``postgres_server.PostgresServer``)
that can be restarted the three ways a server goes down (``pg_ctl restart -m
fast``, ``-m immediate``, ``kill -9`` of the postmaster), frozen (SIGSTOP of
every process of the cluster) and thawed. :class:`CuttingProxy` sits between
clients and the server on a Unix socket of its own and, once armed, cuts the
connection that sends the next batch (a pipeline of several statements ending in
one Sync: a turn's commit) at a chosen point: before forwarding it, just after,
or after the server answered it (the answer is dropped).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING

from postgres_server import PostgresServer

if TYPE_CHECKING:
    from pgbouncer_server import PgBouncer

#: How a restart goes: a fast shutdown (sessions end with a FATAL message), an
#: immediate one (backends quit, crash recovery), or the postmaster killed.
RESTARTS = ("fast", "immediate", "kill")

#: Where CuttingProxy cuts an armed batch: not forwarded; forwarded, then cut at
#: once (the server may or may not get to commit); forwarded, then cut after a
#: random pause of up to 20 ms; forwarded and answered, the answer dropped.
CUTS = ("before", "after", "pause", "answered")
#: A cut outside the sweeps: forwarded, then cut once the server surely has it (after
#: LANDING seconds), for a commit that its server takes longer than that to answer.
LANDING = 0.5


class FaultyServer(PostgresServer):
    """A throwaway cluster with restarts of every kind, freezes and a connection limit."""

    def __init__(self, bindir: str, *, max_connections: int = 100) -> None:
        super().__init__(bindir)
        self.max_connections = max_connections
        self._frozen: list[int] = []

    def restart_as(self, how: str, *, down: float = 0.0) -> None:
        """Stop the server ``how`` (one of :data:`RESTARTS`) and start it again."""
        if how == "kill":
            postmaster = self.postmaster()
            children = self._children(postmaster)
            os.kill(postmaster, signal.SIGKILL)
            # Without their postmaster the backends end on their own; until they
            # have, the old shared memory is in use and a new postmaster refuses it.
            _wait_gone(children, timeout=30)
            stale = os.path.join(self.data, "postmaster.pid")
            if os.path.exists(stale):
                os.unlink(stale)
        else:
            self._run("pg_ctl", "-D", self.data, "-m", how, "-w", "stop")
        time.sleep(down)
        self._pg_ctl("start")

    def down(self) -> None:
        """Stop the server (a fast shutdown); :meth:`up` starts it again."""
        self._run("pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop")

    def up(self) -> None:
        self._pg_ctl("start")

    def freeze(self) -> None:
        """Stop every process of the cluster (SIGSTOP): the server answers nothing."""
        self._frozen = [self.postmaster(), *self._children(self.postmaster())]
        for pid in self._frozen:
            with contextlib.suppress(ProcessLookupError):  # a session ending just now
                os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        """Let the frozen processes go on (SIGCONT)."""
        for pid in self._frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self._frozen = []

    def postmaster(self) -> int:
        return int(Path(self.data, "postmaster.pid").read_text().split()[0])

    def stop(self) -> None:
        self.thaw()
        super().stop()

    def _children(self, parent: int) -> list[int]:
        out = subprocess.run(
            ["ps", "-o", "pid=", "--ppid", str(parent)], capture_output=True, text=True
        ).stdout
        return [int(pid) for pid in out.split()]

    def _pg_ctl(self, action: str) -> None:
        options = (
            f"-c listen_addresses='' -c unix_socket_directories='{self.directory}' "
            f"-c fsync=off -c full_page_writes=off -c max_connections={self.max_connections} "
            "-c shared_buffers=32MB"
        )
        self._run("pg_ctl", "-D", self.data, "-o", options, "-l", self.log, "-w", action)


def _wait_gone(pids: list[int], *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.02)


class CuttingProxy:
    """A Unix-socket proxy in front of ``server`` (or a pooler, on ``port``) that cuts an
    armed batch (see above).

    ``url(database)`` names the proxy instead of the server. ``arm(cut)`` makes
    the next batch any connection sends the one cut; ``cuts`` counts the batches
    cut so far.
    """

    def __init__(self, server: PostgresServer | PgBouncer, *, port: int = 5432) -> None:
        self.server = server
        self.port = port  # the server's, in the name of its socket
        self.directory = tempfile.mkdtemp(prefix="effdur-proxy-")
        self.path = os.path.join(self.directory, ".s.PGSQL.5432")
        self.cuts = 0
        self.refusing = False
        self._refuse_after_cut = False
        self._holding: bytes | None = None
        self._armed: str | None = None
        self._lock = threading.Lock()
        self._closing = False
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(64)
        self._cut_done = threading.Event()
        threading.Thread(target=self._accept, name="proxy", daemon=True).start()

    def url(self, server_url: str) -> str:
        """``server_url`` (a URL of the server's) with the proxy as its host."""
        parts = urllib.parse.urlsplit(server_url)
        login = parts.netloc.rpartition("@")[0]
        host = urllib.parse.quote(self.directory, safe="")
        return urllib.parse.urlunsplit(parts._replace(netloc=f"{login}@{host}"))

    def arm(self, cut: str, *, then_refuse: bool = False, holding: bytes | None = None) -> None:
        """Cut the next batch sent through the proxy, at ``cut`` (one of :data:`CUTS`, or
        ``"landing"``);
        with ``then_refuse``, refuse every connection after the cut until :meth:`allow`;
        with ``holding``, cut the next group of messages that holds those bytes instead."""
        with self._lock:
            self._armed = cut
            self._holding = holding
            self._refuse_after_cut = then_refuse
            self._cut_done.clear()

    def allow(self) -> None:
        """Let connections through again (after ``arm(..., then_refuse=True)``)."""
        self.refusing = False

    def wait_cut(self, timeout: float = 10.0) -> bool:
        return self._cut_done.wait(timeout)

    def close(self) -> None:
        self._closing = True
        self._listener.close()

    def _take(self, group: bytes, executes: int) -> str | None:
        """The cut for this group of messages, if it is the one armed for."""
        with self._lock:
            if self._armed is None:
                return None
            wanted = self._holding in group if self._holding is not None else executes >= 3
            if not wanted:
                return None
            cut, self._armed = self._armed, None
            return cut

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.refusing:
                client.close()
                continue
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(os.path.join(self.server.directory, f".s.PGSQL.{self.port}"))
            _Pair(self, client, upstream).start()


class _Pair:
    """One client's connection through the proxy: two pumps, and the cut."""

    def __init__(self, proxy: CuttingProxy, client: socket.socket, upstream: socket.socket):
        self.proxy = proxy
        self.client = client
        self.upstream = upstream
        self.drop_answers = False  # "answered": the server's next answer is swallowed
        self.closed = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._from_client, daemon=True).start()
        threading.Thread(target=self._from_server, daemon=True).start()

    def cut(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        if self.proxy._refuse_after_cut:  # before the client can see the cut
            self.proxy.refusing = True
        self._close()
        self.proxy.cuts += 1
        self.proxy._cut_done.set()

    def _from_client(self) -> None:
        """Forward the client's messages; hold each group up to its Sync to look at it."""
        buffer = b""
        started = False
        group = b""
        executes = 0
        try:
            while not self.closed.is_set():
                data = self.client.recv(65536)
                if not data:
                    break
                buffer += data
                if not started:  # the startup packet: a length, no type byte
                    if len(buffer) < 4:
                        continue
                    (length,) = struct.unpack("!I", buffer[:4])
                    if len(buffer) < length:
                        continue
                    self.upstream.sendall(buffer[:length])
                    buffer, started = buffer[length:], True
                while len(buffer) >= 5:
                    kind = buffer[:1]
                    (length,) = struct.unpack("!I", buffer[1:5])
                    if len(buffer) < length + 1:
                        break
                    message, buffer = buffer[: length + 1], buffer[length + 1 :]
                    group += message
                    if kind == b"E":
                        executes += 1
                    if kind in (b"S", b"Q", b"X", b"H", b"d", b"c", b"f"):
                        self._send_group(group, executes)
                        group, executes = b"", 0
        except OSError:
            pass
        self.cut_quietly()

    def _send_group(self, group: bytes, executes: int) -> None:
        cut = self.proxy._take(group, executes)
        if cut is None:
            self.upstream.sendall(group)
            return
        if cut == "before":
            self.cut()
            return
        # "answered": _from_server cuts once the answer came (set before it can)
        self.drop_answers = cut == "answered"
        self.upstream.sendall(group)
        if cut == "after":
            self.cut()
        elif cut == "pause":
            time.sleep(random.uniform(0, 0.02))
            self.cut()
        elif cut == "landing":
            time.sleep(LANDING)
            self.cut()

    def _from_server(self) -> None:
        try:
            while not self.closed.is_set():
                data = self.upstream.recv(65536)
                if not data:
                    break
                if self.drop_answers:
                    if b"Z\x00\x00\x00\x05" in data:  # ReadyForQuery: the Sync's answer
                        self.cut()
                        return
                    continue
                self.client.sendall(data)
        except OSError:
            pass
        self.cut_quietly()

    def cut_quietly(self) -> None:
        if not self.closed.is_set():
            self.closed.set()
            self._close()

    def _close(self) -> None:
        for sock in (self.client, self.upstream):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
