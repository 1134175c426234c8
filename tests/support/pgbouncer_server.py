"""A throwaway PgBouncer in transaction mode, in front of the tests' PostgreSQL cluster.

Debian's ``pgbouncer`` (1.18) runs in a new directory under the system's temp
dir and listens on a Unix socket there only (``listen_addr`` empty): nothing on
any network address. As root it runs as the ``postgres`` system user, which
owns the directory, as the cluster does (tests/support/postgres_server.py). It lets in
the cluster's own user without a password (``auth_type = trust``, the name
listed in its ``auth_file``), as the cluster does.

Every other setting is PgBouncer's default, ``pool_mode = transaction`` apart:
in particular no ``ignore_startup_parameters``, ``max_prepared_statements`` or
``track_extra_parameters``. The library must cope with the pooler as
installed. A test may start one with more settings of its own (``settings``).

Its one ``[databases]`` entry, ``*``, sends every database name to the
cluster's socket: a database a test makes (``PostgresServer.new_database``) is
reached through the pooler at once, by the same name (:meth:`PgBouncer.pooled`).

Where pgbouncer is: ``$EFFECTFUL_DURABLE_PGBOUNCER``, else ``pgbouncer`` on
PATH or in ``/usr/sbin``.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from helpers import alive
from postgres_server import REQUIRE_ENV, PostgresServer

#: The pgbouncer executable, if not found otherwise.
BIN_ENV = "EFFECTFUL_DURABLE_PGBOUNCER"
#: The port in the name of its socket (``.s.PGSQL.6432``): PgBouncer's default.
PORT = 6432

HOW_TO_ENABLE = (
    "PgBouncer tests skipped: no pgbouncer executable; install it "
    f"(apt-get install pgbouncer) or set {BIN_ENV}=/path/to/pgbouncer"
)


def find_pgbouncer() -> str | None:
    """The pgbouncer executable, or None if there is none."""
    given = os.environ.get(BIN_ENV)
    if given:
        return given if os.access(given, os.X_OK) else None
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])
    return shutil.which("pgbouncer", path=path)


@contextmanager
def running(
    cluster: PostgresServer, settings: Mapping[str, str | int] | None = None
) -> Iterator[PgBouncer]:
    """A started PgBouncer in front of ``cluster``, stopped after the block.

    Skips the tests, with one line saying how to enable them, where pgbouncer is
    not installed; fails them instead when $REQUIRE_ENV is set (CI).
    """
    import pytest

    executable = find_pgbouncer()
    if executable is None:
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{HOW_TO_ENABLE} (and {REQUIRE_ENV} is set)")
        pytest.skip(HOW_TO_ENABLE)
    bouncer = PgBouncer(executable, cluster, settings)
    bouncer.start()
    try:
        yield bouncer
    finally:
        bouncer.stop()


class PgBouncer:
    """One throwaway pooler: ``start()``, ``pooled(url)``, ``stop()``."""

    def __init__(
        self,
        executable: str,
        cluster: PostgresServer,
        settings: Mapping[str, str | int] | None = None,
    ) -> None:
        self.executable = executable
        self.cluster = cluster
        self.directory = tempfile.mkdtemp(prefix="effdur-pgbouncer-")
        self.config = os.path.join(self.directory, "pgbouncer.ini")
        self.log = os.path.join(self.directory, "pgbouncer.log")
        self.pidfile = os.path.join(self.directory, "pgbouncer.pid")
        self._user: str | None = None
        if os.geteuid() == 0:  # pgbouncer refuses to run as root
            self._user = "postgres"
        own = {
            "listen_addr": "",  # no TCP listener: the Unix socket only
            "listen_port": str(PORT),
            "unix_socket_dir": self.directory,
            "auth_type": "trust",
            "auth_file": os.path.join(self.directory, "userlist.txt"),
            "pool_mode": "transaction",
            "logfile": self.log,
            "pidfile": self.pidfile,
        }
        own.update({name: str(value) for name, value in (settings or {}).items()})
        lines = [
            "[databases]",
            f"* = host={cluster.directory} port=5432",
            "",
            "[pgbouncer]",
            *(f"{name} = {value}" for name, value in own.items()),
        ]
        Path(self.config).write_text("\n".join(lines) + "\n")
        Path(own["auth_file"]).write_text('"postgres" ""\n')
        if self._user is not None:
            account = pwd.getpwnam(self._user)
            for path in (self.directory, self.config, own["auth_file"]):
                os.chown(path, account.pw_uid, account.pw_gid)
        os.chmod(self.directory, 0o700)

    def start(self) -> None:
        """Start it as a daemon, waiting until its socket takes connections."""
        import psycopg

        command = [self.executable, "-d", self.config]
        if self._user is not None:
            command = ["runuser", "-u", self._user, "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            msg = f"{' '.join(command)} failed:\n{result.stdout}{result.stderr}\n{self._log()}"
            raise RuntimeError(msg)
        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(self.pooled(self.cluster.url()), connect_timeout=5).close()
                return
            except psycopg.OperationalError as error:
                if time.monotonic() > deadline:
                    msg = f"pgbouncer did not take connections within 30 s: {error}\n{self._log()}"
                    raise RuntimeError(msg) from error
                time.sleep(0.05)

    def stop(self) -> None:
        """Stop it and delete its directory.

        SIGTERM: PgBouncer 1.18 shuts down at once, closing its clients'
        connections; from 1.23 on it waits for its clients to leave, so after
        20 s it is killed.
        """
        try:
            pid = int(Path(self.pidfile).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pid = None
        try:
            if pid is not None:
                with_signal(pid, signal.SIGTERM)
                deadline = time.monotonic() + 20
                while alive(pid) and time.monotonic() < deadline:
                    time.sleep(0.05)
                if alive(pid):
                    with_signal(pid, signal.SIGKILL)
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)

    def pooled(self, url: str) -> str:
        """The URL of the database of ``url`` (one of the cluster's) through this pooler."""
        host = urllib.parse.quote(self.directory, safe="")
        parts = urllib.parse.urlsplit(url)
        login = parts.netloc.rsplit("@", 1)[0]
        return urllib.parse.urlunsplit(
            (parts.scheme, f"{login}@{host}:{PORT}", parts.path, parts.query, "")
        )

    def _log(self) -> str:
        return Path(self.log).read_text()[-2000:] if os.path.exists(self.log) else ""


def with_signal(pid: int, number: int) -> None:
    """Send signal ``number`` to ``pid``, unless it ended already."""
    try:
        os.kill(pid, number)
    except ProcessLookupError:
        pass
