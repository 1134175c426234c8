"""A throwaway PostgreSQL cluster for the tests, from the installed server binaries.

The cluster lives in a new directory under the system's temp dir and listens on
a Unix socket there only (``listen_addresses = ''``): nothing on any network
address, unless a test gives it one of its own networks' (``listen``:
tests/support/netns.py, 198.18.0.0/15 only). initdb refuses to run as root, so as root
the server runs as the ``postgres`` system user, which owns the directory. Each test gets a fresh
database (``CREATE DATABASE``, ~0.1 s), dropped when the test ends.

fsync is off: the tests kill clients and restart the server (``restart()``, an
immediate shutdown, then crash recovery from the WAL), which loses nothing the
operating system holds; only a power cut would need fsync, and no test makes one.

Where the binaries are: ``$EFFECTFUL_DURABLE_PG_BIN``, else ``pg_config
--bindir``, else ``/usr/lib/postgresql/<newest>/bin``, else ``initdb`` on PATH.
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: Set to 1 (as .ci/run does) to make a missing server fail the PostgreSQL tests.
REQUIRE_ENV = "EFFECTFUL_DURABLE_REQUIRE_POSTGRES"
#: The directory holding initdb, pg_ctl and postgres, if not found otherwise.
BIN_ENV = "EFFECTFUL_DURABLE_PG_BIN"

HOW_TO_ENABLE = (
    "PostgreSQL tests skipped: no PostgreSQL server binaries (initdb, pg_ctl) or no "
    "psycopg; install them (apt-get install postgresql; pip install -e '.[postgres]') "
    f"or set {BIN_ENV}=/path/to/bin"
)


def find_bindir() -> str | None:
    """The directory of the server binaries, or None if there are none."""
    candidates: list[str] = []
    if os.environ.get(BIN_ENV):
        candidates.append(os.environ[BIN_ENV])
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, check=True, timeout=10
            )
            candidates.append(out.stdout.strip())
        except (OSError, subprocess.SubprocessError):
            pass
    candidates += sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda path: int(Path(path).parent.name) if Path(path).parent.name.isdigit() else 0,
        reverse=True,
    )
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(os.path.dirname(initdb))
    for bindir in candidates:
        if all(os.access(os.path.join(bindir, tool), os.X_OK) for tool in ("initdb", "pg_ctl")):
            return bindir
    return None


def unavailable() -> str | None:
    """Why the PostgreSQL tests cannot run here, or None if they can."""
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError:
        return HOW_TO_ENABLE
    if find_bindir() is None:
        return HOW_TO_ENABLE
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return HOW_TO_ENABLE + " (as root, a 'postgres' system user must exist to run it)"
    return None


@contextmanager
def running[S: PostgresServer](kind: type[S]) -> Iterator[S]:
    """A started cluster of ``kind``, stopped after the block.

    Skips the tests, with one line saying how to enable them, where no server
    binaries or no psycopg are installed; fails them instead when $REQUIRE_ENV is set.
    """
    import pytest

    reason = unavailable()
    if reason is not None:
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{reason} (and {REQUIRE_ENV} is set)")
        pytest.skip(reason)
    bindir = find_bindir()
    assert bindir is not None
    server = kind(bindir)
    server.start()
    try:
        yield server
    finally:
        server.stop()


class PostgresServer:
    """One throwaway cluster: ``start()``, ``new_database()``, ``restart()``, ``stop()``."""

    def __init__(self, bindir: str, *, listen: str = "") -> None:
        self.bindir = bindir
        #: An address of the tests' own networks to listen on too (tests/support/netns.py),
        #: trusting every client from them; none by default.
        self.listen = listen
        self.directory = tempfile.mkdtemp(prefix="effdur-pg-")
        self.data = os.path.join(self.directory, "data")
        self.log = os.path.join(self.directory, "server.log")
        self._user: str | None = None
        if os.geteuid() == 0:
            self._user = "postgres"
            account = pwd.getpwnam(self._user)
            os.chown(self.directory, account.pw_uid, account.pw_gid)
        os.chmod(self.directory, 0o700)
        self._names = itertools.count(1)

    # -- the server --------------------------------------------------------------

    def start(self) -> None:
        """initdb (first time only) and start, waiting until it accepts connections."""
        if not os.path.exists(self.data):
            self._run(
                "initdb",
                "-D", self.data, "-U", "postgres", "-A", "trust", "-E", "UTF8",
                "--locale=C", "--no-sync",
            )  # fmt: skip
            if self.listen:
                hba = Path(self.data) / "pg_hba.conf"
                hba.write_text(f"{hba.read_text()}host all all 198.18.0.0/15 trust\n")
        self._pg_ctl("start")

    def restart(self, *, down: float = 0.0) -> None:
        """Stop at once as a crash would (``-m immediate``) and start again (crash
        recovery), after ``down`` seconds."""
        self._run("pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")
        time.sleep(down)
        self._pg_ctl("start")

    def stop(self) -> None:
        """Stop the server and delete the cluster."""
        try:
            self._run("pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)

    def _pg_ctl(self, action: str) -> None:
        options = (
            f"-c listen_addresses='{self.listen}' -c unix_socket_directories='{self.directory}' "
            "-c fsync=off -c full_page_writes=off -c max_connections=200 "
            "-c shared_buffers=32MB"
        )
        self._run("pg_ctl", "-D", self.data, "-o", options, "-l", self.log, "-w", action)

    def _run(self, tool: str, *args: str) -> None:
        command = [os.path.join(self.bindir, tool), *args]
        if self._user is not None:
            command = ["runuser", "-u", self._user, "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            log = Path(self.log).read_text() if os.path.exists(self.log) else ""
            msg = f"{' '.join(command)} failed:\n{result.stdout}{result.stderr}\n{log[-2000:]}"
            raise RuntimeError(msg)

    # -- databases ---------------------------------------------------------------

    def url(
        self, database: str = "postgres", *, user: str = "postgres", password: str | None = None
    ) -> str:
        """A ``postgresql://`` URL for ``database`` on this server's socket."""
        host = urllib.parse.quote(self.directory, safe="")
        login = user if password is None else f"{user}:{urllib.parse.quote(password, safe='')}"
        return f"postgresql://{login}@{host}/{database}"

    def new_database(self) -> str:
        """Create an empty database and return its URL."""
        name = f"test_{os.getpid()}_{next(self._names)}"
        self.admin(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def clone_database(self, url: str) -> str:
        """A new database holding what the database of ``url`` holds now; its URL.

        The source's sessions are ended first (a killed client's may linger a moment):
        PostgreSQL copies a database only while nobody is connected to it.
        """
        source = urllib.parse.urlsplit(url).path.lstrip("/")
        name = f"test_{os.getpid()}_{next(self._names)}"
        self.admin(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            f" WHERE datname = '{source}' AND pid <> pg_backend_pid()"
        )
        self.admin(f'CREATE DATABASE "{name}" TEMPLATE "{source}"')
        return self.url(name)

    def drop_database(self, url: str) -> None:
        """Drop the database of ``url``, closing its connections."""
        name = urllib.parse.urlsplit(url).path.lstrip("/")
        self.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def new_password_role(self, password: str) -> str:
        """Create a role that the server lets in with ``password`` only; its name.

        A ``scram-sha-256`` rule for that role alone goes first in ``pg_hba.conf``
        (on the Unix socket, as every rule here): every other role stays trusted.
        Returns once the server applies the rule (a reload is asynchronous).
        """
        import psycopg

        role = f"pw_{os.getpid()}_{next(self._names)}"
        self.admin(f"CREATE ROLE \"{role}\" LOGIN PASSWORD '{password}'")
        hba = Path(self.data) / "pg_hba.conf"
        hba.write_text(f"local all {role} scram-sha-256\n{hba.read_text()}")
        self._run("pg_ctl", "-D", self.data, "reload")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                psycopg.connect(self.url(user=role)).close()
            except psycopg.OperationalError:
                return role  # a password is asked for now
            time.sleep(0.05)
        msg = f"the server did not apply the password rule for {role} within 10 s"
        raise RuntimeError(msg)

    @contextmanager
    def another_database_writing(self, per_second: float) -> Iterator[None]:
        """A thread inserting ``per_second`` rows a second into a new database of this
        server until the block ends (which drops it)."""
        import psycopg

        url = self.new_database()
        stop = threading.Event()
        written = [0]

        def write() -> None:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("CREATE TABLE t (x int)")
                while not stop.wait(1 / per_second):
                    conn.execute("INSERT INTO t VALUES (1)")
                    written[0] += 1

        thread = threading.Thread(target=write, daemon=True)
        thread.start()
        try:
            time.sleep(0.5)
            yield
        finally:
            stop.set()
            thread.join(timeout=30)
            self.drop_database(url)
            assert written[0] > 0

    def admin(self, sql: str) -> None:
        """Run one statement outside a transaction on the ``postgres`` database."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(sql.encode())
