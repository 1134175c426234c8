"""A PostgreSQL wire-protocol proxy that counts what clients send: statements and round trips.

``WireCounter(server_socket)`` listens on a Unix socket of its own and forwards every
byte both ways to the server's socket; ``url(database)`` names a database through it.
It reads the client's side of the protocol (postgresql.org/docs/current/protocol-flow.html)
and counts, for all connections together:

* statements: each statement the server ran to its end (its ``CommandComplete``
  answer), whether it came in a ``Query`` string of several or in an ``Execute``;
* round trips: each time the server answers after the client asked for an answer: a
  ``Query``, a ``Sync`` (each answered by ``ReadyForQuery``) or a ``Flush``. Messages
  sent before the answer travel with it (pipeline mode), and a ``Flush`` sent right
  after a ``Sync``, with nothing left to flush, is no round trip of its own.

A count is exact and deterministic, whatever the machine's speed: it is a count of
messages, not of time. Startup and authentication are not counted.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import tempfile
import threading
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field

_ASKS = frozenset(b"QSH")


@dataclass
class Counts:
    """What the clients sent since the last ``reset()``."""

    round_trips: int = 0
    statements: int = 0
    #: The text of each statement run, in order.
    sql: list[str] = field(default_factory=list)
    messages: Counter[str] = field(default_factory=Counter)


class WireCounter:
    """Forward clients to ``server_socket`` (a PostgreSQL Unix socket path), counting."""

    def __init__(self, server_socket: str) -> None:
        self.server_socket = server_socket
        self.directory = tempfile.mkdtemp(prefix="rtt-proxy-")
        self.path = os.path.join(self.directory, ".s.PGSQL.5432")
        self._lock = threading.Lock()
        self._counts = Counts()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(64)
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, database: str, user: str = "postgres") -> str:
        """A URL for ``database`` through this proxy."""
        return f"postgresql://{user}@{urllib.parse.quote(self.directory, safe='')}/{database}"

    def reset(self) -> None:
        with self._lock:
            self._counts = Counts()

    def counts(self) -> Counts:
        with self._lock:
            counts = self._counts
            return Counts(
                counts.round_trips, counts.statements, list(counts.sql), Counter(counts.messages)
            )

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
            os.rmdir(self.directory)

    # -- forwarding -------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.connect(self.server_socket)
            session = _Session()
            for side, args in (
                (self._client_side, (client, server, session)),
                (self._server_side, (server, client, session)),
            ):
                threading.Thread(target=side, args=args, daemon=True).start()

    def _server_side(
        self, server: socket.socket, client: socket.socket, session: _Session
    ) -> None:
        try:
            buffer = b""
            while data := server.recv(65536):
                buffer += data
                with self._lock:
                    if session.asked:  # the answer the client waits for: a round trip
                        session.asked = False
                        self._counts.round_trips += 1
                    while len(buffer) >= 5:  # the server's messages are all typed
                        (length,) = struct.unpack("!i", buffer[1:5])
                        if len(buffer) < 1 + length:
                            break
                        if buffer[0] == ord("C"):  # CommandComplete
                            self._counts.statements += 1
                        buffer = buffer[1 + length :]
                client.sendall(data)
        except OSError:
            pass
        finally:
            _shut(client)

    def _client_side(
        self, client: socket.socket, server: socket.socket, session: _Session
    ) -> None:
        buffer = b""
        started = False
        try:
            while data := client.recv(65536):
                buffer += data
                while True:
                    if not started:  # untyped: the startup message (or an SSL/GSS request)
                        if len(buffer) < 8:
                            break
                        (length,) = struct.unpack("!i", buffer[:4])
                        if len(buffer) < length:
                            break
                        (code,) = struct.unpack("!i", buffer[4:8])
                        started = code == 196608  # protocol 3.0: typed messages follow
                        buffer = buffer[length:]
                        continue
                    if len(buffer) < 5:
                        break
                    (length,) = struct.unpack("!i", buffer[1:5])
                    if len(buffer) < 1 + length:
                        break
                    self._count(session, buffer[0], buffer[5 : 1 + length])
                    buffer = buffer[1 + length :]
                # Counted before it is sent: the count is complete once the answer is back.
                server.sendall(data)
        except OSError:
            pass
        finally:
            _shut(server)

    def _count(self, session: _Session, kind: int, body: bytes) -> None:
        with self._lock:
            counts = self._counts
            counts.messages[chr(kind)] += 1
            if kind in _ASKS:
                session.asked = True
            if kind == ord("Q"):
                counts.sql.append(_text(body))
            elif kind == ord("P"):  # Parse: the statement's name, then its text
                name, text = body.split(b"\0", 1)
                session.statements[name] = _text(text)
            elif kind == ord("B"):  # Bind: the portal's name, then the statement's
                statement = body.split(b"\0", 2)[1]
                session.bound = session.statements.get(statement, "?")
            elif kind == ord("E"):
                counts.sql.append(session.bound)


@dataclass
class _Session:
    """One client connection: its prepared statements, by name, the one last bound,
    and whether it waits for an answer."""

    statements: dict[bytes, str] = field(default_factory=dict)
    bound: str = ""
    #: The client asked for an answer that has not come yet.
    asked: bool = False


def _text(body: bytes) -> str:
    return " ".join(body.split(b"\0", 1)[0].decode("utf-8", "replace").split())


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
