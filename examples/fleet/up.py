"""Start the whole fleet on this machine, on throwaway servers, until Ctrl-C.

    python examples/fleet/up.py             # then, in another terminal:
    python examples/fleet/drive.py --users 20 --requests 100 --events 50

In order: a PostgreSQL cluster and PgBouncer (pool_mode = transaction) in a new
temporary directory, on Unix sockets there only; then, all through PgBouncer,
the web service (uvicorn service:app), two runners (effectful-durable run) and
the page (effectful-durable ui). It prints where each one is, then their logs,
each line headed by its name. Ctrl-C stops them in the reverse order (the
runners finish their turns) and removes the temporary directory. With --db URL
it starts no server and runs the service, runners and page on that database.
"""

import argparse
import contextlib
import ctypes
import glob
import json
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATABASE = "fleet"
POSTGRES_PORT, POOLER_PORT = 5432, 6432  # in the sockets' names only: no TCP
#: Where the binaries are, if not found otherwise (as the project's tests read them).
PG_BIN_ENV, PGBOUNCER_ENV = "EFFECTFUL_DURABLE_PG_BIN", "EFFECTFUL_DURABLE_PGBOUNCER"
STARTUP = 300.0  # seconds a process may take to start (each Python one imports litellm)
#: How each server is stopped: pgbouncer at once, postgres by a fast shutdown.
STOP = {"pgbouncer": signal.SIGTERM, "postgres": signal.SIGINT}


# -- Finding the servers' programs -------------------------------------------------------
def find_pg_bindir() -> str | None:
    """The directory of PostgreSQL's initdb and postgres: $EFFECTFUL_DURABLE_PG_BIN,
    ``pg_config --bindir``, the newest /usr/lib/postgresql/*/bin, or PATH."""
    candidates = [os.environ.get(PG_BIN_ENV, "")]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        found = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True)
        candidates.append(found.stdout.strip())
    versions = glob.glob("/usr/lib/postgresql/*/bin")
    candidates += sorted(versions, key=lambda p: int(Path(p).parent.name), reverse=True)
    candidates.append(os.path.dirname(shutil.which("initdb") or ""))
    for bindir in filter(None, candidates):
        if all(os.access(os.path.join(bindir, tool), os.X_OK) for tool in ("initdb", "postgres")):
            return bindir
    return None


def find_pgbouncer() -> str | None:
    """pgbouncer: $EFFECTFUL_DURABLE_PGBOUNCER, else on PATH or in /usr/sbin."""
    if os.environ.get(PGBOUNCER_ENV):
        given = os.environ[PGBOUNCER_ENV]
        return given if os.access(given, os.X_OK) else None
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])
    return shutil.which("pgbouncer", path=path)


def missing() -> str | None:
    """Why the throwaway servers cannot start here, or None if they can."""
    if find_pg_bindir() is None:
        return (
            "no PostgreSQL server programs (initdb, postgres): apt-get install postgresql, "
            f"or set {PG_BIN_ENV}=/path/to/bin"
        )
    if find_pgbouncer() is None:
        return f"no pgbouncer: apt-get install pgbouncer, or set {PGBOUNCER_ENV}=/path/to/it"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "as root, the servers run as the 'postgres' system user, and there is none"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "no psycopg: pip install 'effectful-durable[postgres]'"
    return None


# -- The processes: each line of their output printed with their name -------------------
PRINTING = threading.Lock()


def say(line: str) -> None:
    with PRINTING:
        print(line, flush=True)


def _die_with_parent() -> None:
    """In the child: end (SIGTERM) if up.py dies without stopping it, e.g. by kill -9.
    Children run in process groups of their own, so that Ctrl-C reaches up.py alone
    and up.py stops them in order; this keeps them from outliving it."""
    if sys.platform == "linux":
        pr_set_pdeathsig = 1
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGTERM)


class Child:
    """A process of the fleet: its output is printed line by line as ``name | line``
    (or written to ``log``), and ``wait_for`` waits for a line of it."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        *,
        cwd: Path,
        env: dict[str, str] | None = None,
        user: str | None = None,
        log: Path | None = None,
    ) -> None:
        self.name, self.log = name, log
        self.lines: list[str] = []
        self._seen = threading.Condition()
        output = open(log, "ab") if log else subprocess.PIPE
        self.process = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            user=user,
            group=user and pwd.getpwnam(user).pw_gid,
            extra_groups=[] if user else None,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            process_group=0,
            preexec_fn=_die_with_parent,
        )
        if log:
            output.close()
        else:
            threading.Thread(target=self._read, name=f"{name}-output", daemon=True).start()
        self.ended_reported = False

    @property
    def pid(self) -> int:
        return self.process.pid

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.decode(errors="replace").rstrip()
            say(f"{self.name:<9} | {line}")
            with self._seen:
                self.lines.append(line)
                self._seen.notify_all()
        with self._seen:
            self._seen.notify_all()

    def wait_for(self, match: Callable[[str], bool], what: str) -> str:
        """The first line of output for which ``match`` is true; raises if the
        process ends or STARTUP seconds pass first."""
        deadline = time.monotonic() + STARTUP
        with self._seen:
            while True:
                for line in self.lines:
                    if match(line):
                        return line
                if self.process.poll() is not None:
                    msg = f"up.py: {self.name} ended ({self.exit}) before {what}"
                    raise SystemExit(msg)
                if time.monotonic() > deadline:
                    msg = f"up.py: {self.name}: no {what} within {STARTUP:g} s"
                    raise SystemExit(msg)
                self._seen.wait(0.5)

    @property
    def exit(self) -> str:
        code = self.process.returncode
        if code is not None and code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return f"exit status {code}"

    def send(self, number: signal.Signals) -> None:
        if self.process.poll() is None:
            self.process.send_signal(number)

    def wait(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for it to end; then SIGKILL it."""
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            say(f"up.py: {self.name} did not stop within {timeout:g} s: SIGKILL")
            self.process.kill()
            self.process.wait()


# -- The fleet ---------------------------------------------------------------------------
class Fleet:
    """Everything up.py started, stopped in the reverse order by ``stop``."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.directory: Path | None = None  # the throwaway servers' directory
        self.servers: list[Child] = []  # postgres, pgbouncer
        self.apps: list[Child] = []  # the service, the runners, the page
        self.info: dict[str, object] = {}
        self.env = {
            **os.environ,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # litellm stays offline
            "PYTHONUNBUFFERED": "1",  # log lines as they come
            "FLEET_MODEL_SECONDS": str(args.model_seconds),
        }

    # The servers: PostgreSQL and PgBouncer, run as `postgres` when up.py runs as root
    # (initdb and pgbouncer refuse root), on Unix sockets in a directory only they
    # and root may enter.
    def start_servers(self) -> str:
        """Start the cluster and the pooler; the URL of the database through the pooler."""
        import psycopg

        bindir, pgbouncer = find_pg_bindir(), find_pgbouncer()
        assert bindir and pgbouncer, missing()
        user = "postgres" if os.geteuid() == 0 else None
        self.directory = directory = Path(tempfile.mkdtemp(prefix="effdur-fleet-"))
        if user:
            account = pwd.getpwnam(user)
            os.chown(directory, account.pw_uid, account.pw_gid)
        say(f"up.py: a throwaway PostgreSQL and PgBouncer in {directory}")
        initdb = subprocess.run(
            [f"{bindir}/initdb", "-D", f"{directory}/data", "-U", "postgres", "-A", "trust",
             "-E", "UTF8", "--locale=C", "--no-sync"],
            cwd=directory, user=user, capture_output=True, text=True,
        )  # fmt: skip
        if initdb.returncode != 0:
            msg = f"up.py: initdb failed:\n{initdb.stdout}{initdb.stderr}"
            raise SystemExit(msg)
        self.servers.append(
            Child(
                "postgres",
                [f"{bindir}/postgres", "-D", f"{directory}/data",
                 "-c", "listen_addresses=", "-c", f"unix_socket_directories={directory}",
                 "-c", f"port={POSTGRES_PORT}", "-c", "max_connections=100"],
                cwd=directory, user=user, log=directory / "postgres.log",
            )
        )  # fmt: skip
        direct = url(directory, POSTGRES_PORT, "postgres")
        wait_for_server(self.servers[-1], direct)
        with psycopg.connect(direct, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{DATABASE}"')

        # PgBouncer's defaults, pool_mode = transaction apart; the library copes with
        # them as installed. stats_users only lets `postgres` read SHOW POOLS.
        settings = {
            "listen_addr": "",  # no TCP: the Unix socket only
            "listen_port": POOLER_PORT,
            "unix_socket_dir": directory,
            "auth_type": "trust",
            "auth_file": directory / "userlist.txt",
            "pool_mode": "transaction",
            "stats_users": "postgres",
        }
        lines = ["[databases]", f"* = host={directory} port={POSTGRES_PORT}", "", "[pgbouncer]"]
        lines += [f"{name} = {value}" for name, value in settings.items()]
        (directory / "pgbouncer.ini").write_text("\n".join(lines) + "\n")
        (directory / "userlist.txt").write_text('"postgres" ""\n')
        if user:
            for name in ("pgbouncer.ini", "userlist.txt"):
                os.chown(directory / name, account.pw_uid, account.pw_gid)
        self.servers.append(
            Child(
                "pgbouncer",
                [pgbouncer, str(directory / "pgbouncer.ini")],
                cwd=directory,
                user=user,
                log=directory / "pgbouncer.log",
            )
        )
        pooled = url(directory, POOLER_PORT, DATABASE)
        wait_for_server(self.servers[-1], pooled)
        self.info.update(
            directory=str(directory),
            direct=url(directory, POSTGRES_PORT, DATABASE),
            pooler={"host": str(directory), "port": POOLER_PORT},
        )
        return pooled

    def start_apps(self, db: str) -> None:
        """Start the service, the runners and the page on ``db``, all at once (each
        pays seconds to import its libraries), and wait until each one serves."""
        from effectful_durable import Store

        args, python = self.args, sys.executable
        Store(db).close()  # makes the schema in a new database (the page only reads)
        port = args.port or free_port()
        service = Child(
            "service",
            [python, "-m", "uvicorn", "service:app", "--host", "127.0.0.1",
             "--port", str(port), "--no-access-log"],
            cwd=HERE, env={**self.env, "FLEET_DB": db},
        )  # fmt: skip
        self.apps.append(service)
        runners = []
        for number in range(1, args.runners + 1):
            runner = Child(
                f"runner-{number}",
                [python, "-m", "effectful_durable", "run", db,
                 "--agents", "assistant:make_agent", "--handlers", "assistant:handlers",
                 "--concurrency", str(args.concurrency)],
                cwd=HERE, env=self.env,
            )  # fmt: skip
            self.apps.append(runner)
            runners.append(runner)
        page = Child(
            "page",
            [python, "-m", "effectful_durable", "ui", db, "--no-browser"],
            cwd=HERE,
            env=self.env,
        )
        self.apps.append(page)

        opened = page.wait_for(lambda line: line.startswith("open http"), "its address")
        for runner in runners:
            runner.wait_for(lambda line: " started on " in line, "its start")
        service_url = f"http://127.0.0.1:{port}"
        wait_for_http(service, f"{service_url}/health")
        self.info.update(
            database=db,
            service=service_url,
            page=opened.removeprefix("open "),
            pids={child.name: child.pid for child in self.servers + self.apps},
        )

    def stop(self) -> None:
        """Stop the page, the service and the runners (SIGTERM: each ends cleanly, a
        runner once its turns in flight end), then the pooler, then the server;
        remove the throwaway directory. A second Ctrl-C kills what is left."""
        try:
            for child in self.apps:
                child.send(signal.SIGTERM)
            for child in self.apps:
                child.wait(timeout=30)
            for child in reversed(self.servers):
                child.send(STOP[child.name])
                child.wait(timeout=30)
        except KeyboardInterrupt:
            for child in self.apps + self.servers:
                if child.process.poll() is None:
                    child.process.kill()
                    child.process.wait()
        finally:
            if self.directory is not None:
                shutil.rmtree(self.directory, ignore_errors=True)
                say(f"up.py: stopped; {self.directory} removed")
            else:
                say("up.py: stopped")

    def watch(self) -> None:
        """Until Ctrl-C: say when a process ends (a runner you killed, say)."""
        while True:
            time.sleep(0.5)
            for child in self.servers + self.apps:
                if child.process.poll() is not None and not child.ended_reported:
                    child.ended_reported = True
                    say(f"up.py: {child.name} (pid {child.pid}) ended: {child.exit}")


def url(directory: Path, port: int, database: str) -> str:
    """A postgresql:// URL of ``database`` on the Unix socket of ``port`` in ``directory``."""
    host = urllib.parse.quote(str(directory), safe="")
    return f"postgresql://postgres@{host}:{port}/{database}"


def wait_for_server(child: Child, address: str) -> None:
    import psycopg

    deadline = time.monotonic() + STARTUP
    while True:
        try:
            psycopg.connect(address, connect_timeout=5).close()
            return
        except psycopg.OperationalError as error:
            log = child.log.read_text()[-2000:] if child.log and child.log.exists() else ""
            if child.process.poll() is not None:
                msg = f"up.py: {child.name} ended ({child.exit}):\n{log}"
                raise SystemExit(msg) from error
            if time.monotonic() > deadline:
                msg = f"up.py: {child.name} did not answer: {error}\n{log}"
                raise SystemExit(msg) from error
            time.sleep(0.1)


def wait_for_http(child: Child, address: str) -> None:
    deadline = time.monotonic() + STARTUP
    while True:
        try:
            with urllib.request.urlopen(address, timeout=5):
                return
        except OSError as error:
            if child.process.poll() is not None:
                msg = f"up.py: {child.name} ended ({child.exit})"
                raise SystemExit(msg) from error
            if time.monotonic() > deadline:
                msg = f"up.py: {child.name} did not answer: {error}"
                raise SystemExit(msg) from error
            time.sleep(0.2)


def without_password(address: str) -> str:
    """The URL to print: its password, if any, as ***."""
    parts = urllib.parse.urlsplit(address)
    if parts.password is None:
        return address
    login = f"{parts.username}:***@{parts.netloc.rpartition('@')[2]}"
    return urllib.parse.urlunsplit(parts._replace(netloc=login))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def port_taken(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
        return False


def banner(fleet: Fleet, args: argparse.Namespace) -> Iterator[str]:
    """What runs where, and what to try."""
    info, pids = fleet.info, fleet.info["pids"]
    assert isinstance(pids, dict)
    db = without_password(str(info["database"]))
    yield f"The fleet is up, after {fleet.info['started_in']} s. Ctrl-C stops it."
    if fleet.directory:
        sockets = f"socket {fleet.directory}/.s.PGSQL."
        yield f"  postgres   pid {pids['postgres']:<7} {sockets}{POSTGRES_PORT} (no TCP)"
        yield f"  pgbouncer  pid {pids['pgbouncer']:<7} {sockets}{POOLER_PORT}, pool_mode = transaction"  # noqa: E501
    yield f"  database   {db}"
    yield f"  service    pid {pids['service']:<7} {info['service']}  POST /users/{{user}}/ask"
    for number in range(1, args.runners + 1):
        yield (
            f"  runner-{number}   pid {pids[f'runner-{number}']:<7} effectful-durable run "
            f"DATABASE --agents assistant:make_agent --handlers assistant:handlers "
            f"--concurrency {args.concurrency}"
        )
    yield f"  page       pid {pids['page']:<7} {info['page']}"
    drive = os.path.relpath(HERE / "drive.py")
    if args.out != HERE / "out":
        drive += f" --out {shlex.quote(str(args.out))}"
    yield "Try:"
    yield f"  python {drive} --users 20 --requests 100 --events 50"
    yield (
        f"  curl -s {info['service']}/users/ann/ask "
        """-d '{"text": "remind me in 5 seconds to stretch"}'"""
    )
    yield f"  effectful-durable status {shlex.quote(db)}"
    if args.runners > 1:
        yield f"  kill -9 {pids['runner-1']}    # runner-1: the others take over its work"
    if fleet.directory:
        yield f"Ctrl-C stops everything and removes {fleet.directory}."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="run on this postgresql:// URL: start no server")
    parser.add_argument("--port", type=int, default=8000, help="the service's (0: any free)")
    parser.add_argument(
        "--runners", type=int, choices=range(1, 17), default=2, help="how many (default 2)"
    )
    parser.add_argument("--concurrency", type=int, default=4, help="each runner's (default 4)")
    parser.add_argument(
        "--model-seconds", type=float, default=0.05, help="the fake model's delay per request"
    )
    parser.add_argument(
        "--out", type=Path, default=HERE / "out", help="where fleet.json goes, for drive.py"
    )
    args = parser.parse_args(argv)
    if args.db is None and (problem := missing()):
        parser.error(f"cannot start the throwaway servers: {problem}")
    if args.port and port_taken(args.port):
        parser.error(f"port {args.port} is in use: pass --port N (0: any free port)")
    # Ctrl-C, and SIGTERM alike, end the wait below (and a start) with KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.getsignal(signal.SIGINT))
    fleet = Fleet(args)
    state = args.out / "fleet.json"
    started = time.monotonic()
    try:
        db = args.db or fleet.start_servers()
        fleet.start_apps(db)
        fleet.info["started_in"] = round(time.monotonic() - started, 1)
        args.out.mkdir(parents=True, exist_ok=True)
        state.write_text(json.dumps(fleet.info, indent=2) + "\n")
        say("\n".join(banner(fleet, args)))
        fleet.watch()
    except KeyboardInterrupt:
        say("up.py: stopping")
    finally:
        state.unlink(missing_ok=True)
        fleet.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
