"""Benchmark: a fleet's writers on one PostgreSQL, with and without NOTIFY at commit (issue 38).

A notifying transaction takes a lock shared by the whole server at its commit
(``PreCommit_Notify`` in PostgreSQL's async.c) and holds it until the commit is
flushed, so notifying commits queue behind one another, one WAL flush each,
however many writers there are. Schema 9 notified readers from triggers at every
turn's commit; schema 10 drops them (readers poll). This measures what writers gain.

It starts a throwaway PostgreSQL cluster of its own (tests/support/postgres_server.py's,
but with fsync on: ``fsync``, ``synchronous_commit`` and ``full_page_writes`` at
their defaults; 200 connections), on a Unix socket in a temporary directory and on
no network address, and removes it at the end (also on Ctrl-C or SIGTERM). Two
databases, one per arm, each with the schema the installed library makes:

* ``notify`` (before): schema 9's notify triggers (``*_committed`` on agents,
  approvals, alarms, handoffs, workflow_steps and runner_status, and
  ``alarms_due``), as the migrations up to schema 9 made them, are created where
  absent. A listener is a
  raw psycopg connection that LISTENs on ``effectful_durable_commits`` and
  ``effectful_durable_alarms`` and drains what it hears, as pages and runners did.
* ``no notify`` (after): the triggers that call those two functions (or any other
  trigger function that notifies) are dropped, if present, and the two functions.
  A listener is a reader as the installed library makes one: a read-only Store
  calling ``store.watch_commits(wake)`` (the page's watch).

A writer is a thread with its own Store on its own fresh agent, playing
Store-level turns back to back as bench_store_turn.py does: ``turns.start`` (the
hold and the handoff row, committed), ``turns.commit`` of two small messages
(committed; the transaction the triggers notify from). The writers are spread over
``--processes`` processes (default: one per core), forked once at the start; a
listener is a process of its own. On a 2-core virtual machine a process per writer
doubles the CPU of each turn (32 address spaces to switch between, on both sides
of each round trip) and caps every arm alike, at 150-300 turns/s where threads
reach 600-800: ``--processes 32`` shows it. The GIL is no ceiling at one process
per core (the ``writer process busy`` table: its CPU share).

After 5 turns each to warm up, all writers start together and stop ``--seconds``
later. Each cell (writers x arm x listeners) starts after a CHECKPOINT; the 4 cells
of a writer count run one after another, ``--rounds`` times, each round starting at
the next column, so that the arms meet the same machine; the tables give each
cell's median over its rounds:

* ``turns/s``: all writers' turns over the cell's seconds;
* ``commit_turn ms``, ``turn ms``: medians over writers of each writer's median;
* ``CPU ms per turn``: of the writers' threads, and of the server's processes;
* ``writer process busy``: a writer process's CPU over the wall time (the GIL's
  ceiling is 1.0);
* ``waiting``: writers' backends seen waiting for the notify lock (wait event
  ``Lock: object``, or an LWLock ``Notify*``) in ``pg_stat_activity``, sampled
  every 0.1 s: the mean number per sample;
* ``heard``: notifications (notify arm) or ``wake`` calls (no-notify arm) per
  listener per second; ``listeners' CPU``: of their processes (the server's work
  for them is in the server's CPU);

then ``no notify`` with 10 listeners over ``no notify`` with none at the most
writers (issue 38's target: at least 0.90), and each column's growth from 8 to 32
writers. Beside it, on the same server, ``pgbench`` commits rows plainly and with a
NOTIFY (``BEGIN; INSERT ...; END;`` against ``BEGIN; INSERT ...; SELECT
pg_notify('c', ''); END;``, ``-M prepared -j 2``, 8 and 32 clients, ``--seconds``
each, ``--rounds`` times), with one LISTEN session open on that channel.

Run: ``.venv/bin/python bench/bench_fleet.py [--seconds 8] [--writers 1,8,32]
[--listeners 10] [--rounds 3] [--processes N] [--quick]`` (as root, the server
runs as the ``postgres`` user). ``--quick`` is a smoke run of ~1 min (2 s per
cell, one round); a full run takes ~8 min. No assertions; the numbers depend on
the machine's cores and disk (printed with the tables, and the load average at the
end). Results: bench/README.md."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import multiprocessing
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))
sys.path.insert(0, str(Path(__file__).parent))

from bench_store_turn import turn  # noqa: E402
from postgres_server import PostgresServer, find_bindir, unavailable  # noqa: E402

import effectful_durable  # noqa: E402
import effectful_durable.store.history  # noqa: E402  (turn() uses it)
from effectful_durable.store.engine.postgres.schema import FIRST_VERSION, MIGRATIONS  # noqa: E402

ARMS = ("notify", "no notify")

# -- schema 9's notifications, as its migrations made them (schema 10 drops them) --


def _schema_9_notifications() -> tuple[dict[str, str], dict[tuple[str, str], str]]:
    """The notifying functions and their triggers, from the migrations that made them.

    Returns:
        ``{function: its CREATE FUNCTION}`` and ``{(trigger, table): its CREATE TRIGGER}``.
    """
    made_by = "\n".join(MIGRATIONS[version] for version in range(FIRST_VERSION, 9))
    functions = {
        match[1]: match[0] + "\n"
        for match in re.finditer(r"CREATE FUNCTION (\w+)\(\).*?\$\$;", made_by, re.DOTALL)
        if "pg_notify" in match[0]
    }
    triggers = {
        (match[1], match[2]): match[0] + "\n"
        for match in re.finditer(
            r"CREATE TRIGGER (\w+) [^;]*? ON (\w+)\s[^;]*?EXECUTE FUNCTION (\w+)\(\);", made_by
        )
        if match[3] in functions
    }
    return functions, triggers


#: The two functions and seven triggers schema 9 notified from.
NOTIFY_FUNCTIONS, NOTIFY_TRIGGERS = _schema_9_notifications()

#: The user triggers of the current schema whose function sends a notification.
NOTIFYING_TRIGGERS = """
SELECT t.tgname, c.relname, p.proname FROM pg_trigger AS t
  JOIN pg_class AS c ON c.oid = t.tgrelid
  JOIN pg_proc AS p ON p.oid = t.tgfoid
 WHERE NOT t.tgisinternal AND c.relnamespace = current_schema()::regnamespace
   AND (p.proname = ANY(%s) OR p.prosrc ILIKE '%%pg_notify%%')
"""


def prepare_arm(url: str, arm: str) -> str:
    """Give the database of ``url`` (our schema) the arm's triggers; say what was done."""
    import psycopg

    from effectful_durable import Store

    Store(url).close()  # our schema, as the installed library makes it
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        functions = list(NOTIFY_FUNCTIONS)
        found = conn.execute(NOTIFYING_TRIGGERS, (functions,)).fetchall()
        if arm == "notify":
            names = {
                row[0]
                for row in conn.execute(
                    "SELECT proname FROM pg_proc WHERE proname = ANY(%s)"
                    " AND pronamespace = current_schema()::regnamespace",
                    (functions,),
                )
            }
            for name, sql in NOTIFY_FUNCTIONS.items():
                if name not in names:
                    conn.execute(sql.encode())
            present = {(name, table) for name, table, _ in found}
            made = [key for key in NOTIFY_TRIGGERS if key not in present]
            for name, table in made:  # absent, or a trigger of that name that notifies nobody
                conn.execute(f'DROP TRIGGER IF EXISTS "{name}" ON "{table}"'.encode())
                conn.execute(NOTIFY_TRIGGERS[name, table].encode())
            done = f"{len(made)} of schema 9's {len(NOTIFY_TRIGGERS)} notify triggers created"
        else:
            for name, table, _ in found:
                conn.execute(f'DROP TRIGGER "{name}" ON "{table}"'.encode())
            for name in NOTIFY_FUNCTIONS:
                conn.execute(f"DROP FUNCTION IF EXISTS {name}()".encode())
            done = f"{len(found)} notify triggers dropped"
        left = conn.execute(NOTIFYING_TRIGGERS, (functions,)).fetchall()
    return f"{done}; {len(left)} notifying triggers now ({', '.join(r[0] for r in left)})"


# -- the cluster --------------------------------------------------------------------


class FsyncServer(PostgresServer):
    """The tests' throwaway cluster, but with fsync on and the server's default settings."""

    def _pg_ctl(self, action: str) -> None:
        options = (
            f"-c listen_addresses='' -c unix_socket_directories='{self.directory}' "
            "-c max_connections=200"
        )
        self._run("pg_ctl", "-D", self.data, "-o", options, "-l", self.log, "-w", action)

    def cpu_seconds(self) -> float:
        """The CPU time of the server's processes so far (those that ended: not counted)."""
        postmaster = int(Path(self.data, "postmaster.pid").read_text().split()[0])
        return cpu_seconds(lambda pid, parent: postmaster in (pid, parent))

    def pg_setting(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            row = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
        assert row is not None
        return str(row[0])


def cpu_seconds(which: Callable[[int, int], bool]) -> float:
    """The CPU time so far of the processes ``which(pid, parent pid)`` is true of."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        if which(int(stat.parent.name), int(fields[1])):
            total += int(fields[11]) + int(fields[12])  # utime, stime (proc(5))
    return total / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def cluster() -> Iterator[FsyncServer]:
    """A started cluster, stopped and deleted after the block (on Ctrl-C too)."""
    reason = unavailable()
    if reason is not None:
        sys.exit(f"bench_fleet: {reason}")
    bindir = find_bindir()
    assert bindir is not None
    server = FsyncServer(bindir)
    try:
        server.start()
        yield server
    finally:
        server.stop()


# -- a child process: a writer or a listener, at the parent's command ---------------


class Listener:
    """A listener of one arm, in this process, until ``stop()``."""

    def __init__(self, kind: str, url: str) -> None:
        self.heard: list[float] = []  # when (wall clock)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: Any = None
        self._watch: Any = None
        self._store: Any = None
        if kind == "notify":  # a page or runner before: LISTEN on a connection of its own
            import psycopg

            self._conn = psycopg.connect(url, autocommit=True)
            self._conn.execute("LISTEN effectful_durable_commits")
            self._conn.execute("LISTEN effectful_durable_alarms")
            self._thread = threading.Thread(target=self._drain, daemon=True)
            self._thread.start()
        else:  # a page as the installed library makes it
            from effectful_durable import Store

            self._store = Store(url, readonly=True, pool_size=1)  # as the page opens it
            self._watch = self._store.watch_commits(self._wake)
            deadline = time.monotonic() + 10
            while not getattr(self._watch, "listening", True) and time.monotonic() < deadline:
                time.sleep(0.02)

    def _wake(self) -> None:
        self.heard.append(time.time())

    def _drain(self) -> None:
        while not self._stop.is_set():
            for _ in self._conn.notifies(timeout=0.2):
                self.heard.append(time.time())

    def stop(self, start: float, end: float) -> int:
        """Stop; how many notifications or wakes it heard from ``start`` to ``end``."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._conn.close()
        if self._watch is not None:
            self._watch.close()
            self._store.close()
        return sum(1 for when in self.heard if start <= when <= end)


def play(store: Any, agent: str, start: float, end: float) -> dict[str, Any]:
    """Turns of ``agent`` back to back from ``start`` to ``end`` (wall clock); the figures."""
    times: dict[str, list[float]] = {k: [] for k in ("lock", "begin", "commit", "turn")}
    time.sleep(max(0.0, start - time.time()))
    cpu = time.thread_time()
    i = 5
    while time.time() < end:
        turn(effectful_durable, store, agent, i, times)
        i += 1
    cpu = time.thread_time() - cpu
    if times["turn"] and time.time() > end:  # the last one ended too late to count
        for values in times.values():
            values.pop()
    return {
        "turns": len(times["turn"]),
        "cpu_s": cpu,
        "turn_ms": statistics.median(times["turn"]) * 1e3 if times["turn"] else 0.0,
        "commit_ms": statistics.median(times["commit"]) * 1e3 if times["commit"] else 0.0,
    }


class Writer(threading.Thread):
    """One writer: its own Store on its own agent, in a thread of its own."""

    def __init__(self, url: str, agent: str) -> None:
        super().__init__(daemon=True)
        self.url, self.agent = url, agent
        self.window = (0.0, 0.0)
        self.figures: dict[str, Any] = {}
        self.error: BaseException | None = None
        self.ready, self.go, self.played, self.close = (threading.Event() for _ in range(4))
        self.start()

    def run(self) -> None:
        try:
            store = effectful_durable.Store(self.url)
            try:
                scratch: dict[str, list[float]] = {
                    k: [] for k in ("lock", "begin", "commit", "turn")
                }
                for i in range(5):  # warm up: the agent made, statements prepared
                    turn(effectful_durable, store, self.agent, i, scratch)
                self.ready.set()
                self.go.wait()
                self.figures = play(store, self.agent, *self.window)
                self.played.set()
                self.close.wait()
            finally:
                store.close()
        except BaseException as error:  # the child raises it
            self.error = error
            self.ready.set()
            self.played.set()


def child(commands: Connection) -> None:
    """Writers (threads) or a listener at the parent's command, until it sends None."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the parent stops us
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    writers: list[Writer] = []
    listener: Listener | None = None

    def wait(event: str) -> None:
        for writer in writers:
            getattr(writer, event).wait()
            if writer.error is not None:
                raise writer.error

    while (command := commands.recv()) is not None:
        do = command["do"]
        if do == "writers":
            writers = [Writer(command["url"], agent) for agent in command["agents"]]
            wait("ready")
            commands.send({"ready": True})
        elif do == "run":
            for writer in writers:
                writer.window = (command["start"], command["end"])
                writer.go.set()
            wait("played")
            commands.send({"writers": [writer.figures for writer in writers]})
        elif do == "close":
            for writer in writers:
                writer.close.set()
                writer.join()
            writers = []
            commands.send({})
        elif do == "listen":
            listener = Listener(command["kind"], command["url"])
            commands.send({"ready": True})
        elif do == "stop":
            assert listener is not None
            commands.send({"heard": listener.stop(command["start"], command["end"])})
            listener = None


# -- the parent -------------------------------------------------------------------


class Children:
    """Processes forked from this one (everything imported, no thread, no connection)."""

    def __init__(self, count: int) -> None:
        context = multiprocessing.get_context("fork")
        self.pipes: list[Connection] = []
        self.procs: list[Any] = []
        for _ in range(count):
            ours, theirs = context.Pipe()
            proc = context.Process(target=child, args=(theirs,), daemon=True)
            proc.start()
            theirs.close()
            self.pipes.append(ours)
            self.procs.append(proc)
        self.pids: list[int] = [proc.pid for proc in self.procs]
        self.closed = False

    def ask(self, which: range, **command: Any) -> list[dict[str, Any]]:
        """Send children ``which`` the command; their answers."""
        for k in which:
            self.pipes[k].send(command)
        return self.answers(which)

    def answers(self, which: range) -> list[dict[str, Any]]:
        """The answers of children ``which`` to what they were sent."""
        answers = []
        for k in which:
            try:
                answers.append(self.pipes[k].recv())
            except EOFError:
                self.procs[k].join()
                msg = (
                    f"bench_fleet: child {self.pids[k]} ended (exit code {self.procs[k].exitcode})"
                )
                raise RuntimeError(msg) from None
        return answers

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for pipe in self.pipes:
            with contextlib.suppress(OSError):
                pipe.send(None)
        deadline = time.monotonic() + 10
        for proc in self.procs:
            proc.join(timeout=max(0.1, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join()


class WaitSampler:
    """Counts, every 0.1 s, the writers' backends waiting for the notify lock."""

    QUERY = """
        SELECT application_name FROM pg_stat_activity
         WHERE (wait_event_type = 'Lock' AND wait_event = 'object')
            OR (wait_event_type = 'LWLock' AND wait_event LIKE 'Notify%')
    """

    def __init__(self, url: str, writer_pids: list[int], start: float, end: float) -> None:
        self.url, self.start, self.end = url, start, end
        self.names = {f" {pid}" for pid in writer_pids}
        self.samples: list[int] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            time.sleep(max(0.0, self.start - time.time()))
            while time.time() < self.end:
                rows = conn.execute(self.QUERY).fetchall()
                self.samples.append(
                    sum(1 for (name,) in rows if any(name.endswith(p) for p in self.names))
                )
                time.sleep(0.1)

    def mean(self) -> float:
        self.thread.join()
        return statistics.mean(self.samples) if self.samples else 0.0


def run_cell(
    server: FsyncServer,
    children: Children,
    count: int,
    writers: range,
    listeners: range,
    url: str,
    arm: str,
    cell: int,
    seconds: float,
) -> dict[str, float]:
    """One cell: the listeners, then the writers' turns for ``seconds``; its figures.

    Writer ``w`` is a thread of process ``writers[w % len(writers)]``.
    """
    server.admin("CHECKPOINT")
    if listeners:
        children.ask(
            listeners, do="listen", kind="notify" if arm == "notify" else "watch", url=url
        )
    processes = writers[:count]
    for p, k in enumerate(processes):
        agents = [f"c{cell}-w{w}" for w in range(p, count, len(processes))]
        children.pipes[k].send({"do": "writers", "url": url, "agents": agents})
    children.answers(processes)
    start = time.time() + 0.3
    end = start + seconds
    pids = [children.pids[k] for k in processes]
    sampler = WaitSampler(server.url(), pids, start, end)
    time.sleep(max(0.0, start - time.time()))
    listener_pids = {children.pids[k] for k in listeners}
    server_cpu = server.cpu_seconds()
    listener_cpu = cpu_seconds(lambda pid, _: pid in listener_pids)
    answers = children.ask(processes, do="run", start=start, end=end)
    server_cpu = server.cpu_seconds() - server_cpu  # before the writers' backends end
    listener_cpu = cpu_seconds(lambda pid, _: pid in listener_pids) - listener_cpu
    children.ask(processes, do="close")
    results = [figures for answer in answers for figures in answer["writers"]]
    waiting = sampler.mean()
    turns = sum(r["turns"] for r in results)
    heard = [a["heard"] for a in children.ask(listeners, do="stop", start=start, end=end)]
    return {
        "turns/s": turns / seconds,
        "client cpu": sum(r["cpu_s"] for r in results) / max(1, turns) * 1e3,
        "server cpu": server_cpu / max(1, turns) * 1e3,
        "busy": sum(r["cpu_s"] for r in results) / seconds / len(processes),
        "listener cpu": listener_cpu / seconds,
        "turn ms": statistics.median(r["turn_ms"] for r in results),
        "commit ms": statistics.median(r["commit_ms"] for r in results),
        "waiting": waiting,
        "heard/s": statistics.mean(heard) / seconds if heard else 0.0,
    }


PGBENCH_SCRIPTS = {
    "plain": "BEGIN;\nINSERT INTO t (v) VALUES (:client_id);\nEND;\n",
    "notify": (
        "BEGIN;\nINSERT INTO t (v) VALUES (:client_id);\nSELECT pg_notify('c', '');\nEND;\n"
    ),
}


def run_pgbench(
    server: FsyncServer, clients: list[int], seconds: float, rounds: int
) -> dict[str, list[float]]:
    """pgbench's commits per second, ``"script clients"`` -> tps of each round, with one
    LISTEN session open."""
    import psycopg

    server.admin('CREATE DATABASE "pgbench"')
    url = server.url("pgbench")
    tps: dict[str, list[float]] = {f"{name} {n}": [] for n in clients for name in PGBENCH_SCRIPTS}
    with (
        tempfile.TemporaryDirectory() as scripts,
        psycopg.connect(url, autocommit=True) as listen,
    ):
        listen.execute("CREATE TABLE t (v integer)")
        listen.execute("LISTEN c")
        stop = threading.Event()

        def drain() -> None:
            while not stop.is_set():
                for _ in listen.notifies(timeout=0.2):
                    pass

        drainer = threading.Thread(target=drain, daemon=True)
        drainer.start()
        try:
            for name, text in PGBENCH_SCRIPTS.items():
                (Path(scripts) / f"{name}.sql").write_text(text)
            for n, _, name in itertools.product(clients, range(rounds), PGBENCH_SCRIPTS):
                server.admin("CHECKPOINT")
                print(f"pgbench {name} x {n} ...", file=sys.stderr, flush=True)
                command = [
                    os.path.join(server.bindir, "pgbench"),
                    "-h", server.directory, "-U", "postgres", "-n",
                    "-f", str(Path(scripts) / f"{name}.sql"),
                    "-c", str(n), "-j", "2", "-T", str(max(1, round(seconds))),
                    "-M", "prepared", "pgbench",
                ]  # fmt: skip
                out = subprocess.run(command, capture_output=True, text=True, check=True)
                found = re.search(r"tps = ([0-9.]+) \(without initial", out.stdout)
                tps[f"{name} {n}"].append(float(found.group(1)) if found else float("nan"))
        finally:
            stop.set()
            drainer.join()
    return tps


def growth(rows: dict[int, dict[str, float]], key: str, low: int, high: int) -> str:
    if low in rows and high in rows and rows[low][key] > 0:
        return f"{rows[high][key] / rows[low][key]:.2f}x"
    return "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds per cell")
    parser.add_argument("--writers", default="1,8,32", help="writer process counts")
    parser.add_argument("--listeners", type=int, default=10, help="listeners in the busy cells")
    parser.add_argument(
        "--processes",
        type=int,
        help="writer processes, the writers spread over them as threads (default: one a core)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="times each cell runs")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 s per cell, 1 round")
    args = parser.parse_args()
    seconds = 2.0 if args.quick else args.seconds
    rounds = 1 if args.quick else args.rounds
    counts = sorted(int(n) for n in args.writers.split(","))
    columns = [(arm, n) for n in (0, args.listeners) for arm in ARMS]
    began = time.monotonic()
    # Ctrl-C, and SIGTERM as Ctrl-C (even where the shell started us with SIGINT
    # ignored): the children stopped, the cluster removed.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    load_before = os.getloadavg()
    runs: dict[tuple[str, int], dict[int, list[dict[str, float]]]] = {
        c: {n: [] for n in counts} for c in columns
    }
    pool = min(args.processes or os.cpu_count() or 1, max(counts))  # writer processes
    children = Children(pool + args.listeners)  # forked before any thread or connection
    try:
        with cluster() as server:
            urls, notes = {}, {}
            for arm in ARMS:
                name = arm.replace(" ", "_")
                server.admin(f'CREATE DATABASE "{name}"')
                urls[arm] = server.url(name)
                notes[arm] = prepare_arm(urls[arm], arm)
                print(f"{arm}: {notes[arm]}", file=sys.stderr, flush=True)
            settings = {s: server.pg_setting(s) for s in ("fsync", "synchronous_commit")}
            cell = 0
            for n in counts:
                for r in range(rounds):  # each round starts at another column
                    for arm, listening in (
                        columns[r % len(columns) :] + columns[: r % len(columns)]
                    ):
                        cell += 1
                        print(
                            f"{arm}, {listening} listeners, {n} writers ...",
                            end=" ",
                            file=sys.stderr,
                            flush=True,
                        )
                        row = run_cell(
                            server,
                            children,
                            n,
                            range(pool),
                            range(pool, pool + listening),
                            urls[arm],
                            arm,
                            cell,
                            seconds,
                        )
                        runs[arm, listening][n].append(row)
                        print(
                            f"{row['turns/s']:.0f} turns/s;"
                            f" each listener heard {row['heard/s']:.0f}/s",
                            file=sys.stderr,
                            flush=True,
                        )
            children.close()
            pgbench = run_pgbench(server, [8, 32], seconds, rounds)
    finally:
        children.close()
    table = {
        c: {
            n: {k: statistics.median(r[k] for r in rows) for k in rows[0]}
            for n, rows in by.items()
        }
        for c, by in runs.items()
    }
    took = time.monotonic() - began

    def label(column: tuple[str, int]) -> str:
        return f"{column[0]} {column[1]}"

    print(
        f"{os.cpu_count()} CPUs; PostgreSQL fsync={settings['fsync']}, synchronous_commit="
        f"{settings['synchronous_commit']}; writers as threads of {pool} process(es);"
        f" {seconds:g} s per cell, {rounds} round(s); columns: arm, listeners"
    )
    for arm in ARMS:
        print(f"  {arm}: {notes[arm]}")
    for key, title, form in (
        ("turns/s", "turns/s (all writers)", "{:>14.0f}"),
        ("commit ms", "median commit_turn ms", "{:>14.2f}"),
        ("turn ms", "median turn ms (lock to release)", "{:>14.2f}"),
        ("client cpu", "CPU ms per turn, writers' processes", "{:>14.2f}"),
        ("server cpu", "CPU ms per turn, the server's processes", "{:>14.2f}"),
        ("busy", "writer process busy (its threads' CPU s per s)", "{:>14.2f}"),
        ("waiting", "writers waiting for the notify lock (mean of samples)", "{:>14.1f}"),
        ("heard/s", "notifications or wakes heard per listener per s", "{:>14.0f}"),
        ("listener cpu", "listeners' CPU s per s, all of their processes", "{:>14.3f}"),
    ):
        print(f"\n{title}")
        print(f"{'writers':>7}" + "".join(f"{label(c):>14}" for c in columns))
        for n in counts:
            print(f"{n:>7}" + "".join(form.format(table[c][n][key]) for c in columns))
    if rounds > 1:
        print(f"\nturns/s of each of the {rounds} rounds (the tables above: medians)")
        print(f"{'writers':>7}" + "".join(f"{label(c):>20}" for c in columns))
        for n in counts:
            cells = ("/".join(f"{r['turns/s']:.0f}" for r in runs[c][n]) for c in columns)
            print(f"{n:>7}" + "".join(f"{text:>20}" for text in cells))
    top = max(counts)
    quiet, busy = table["no notify", 0].get(top), table["no notify", args.listeners].get(top)
    if quiet and busy and quiet["turns/s"] > 0:
        print(
            f"\nno notify, {args.listeners} listeners / no listener, at {top} writers: "
            f"{busy['turns/s'] / quiet['turns/s']:.2f} (target >= 0.90)"
        )
    low, high = (8, 32) if {8, 32} <= set(counts) else (counts[0], top)
    if low != high:
        print(f"growth of turns/s from {low} to {high} writers:")
        for column in columns:
            print(f"  {label(column):<14} {growth(table[column], 'turns/s', low, high)}")
    tps = {key: statistics.median(values) for key, values in pgbench.items()}
    print(f"\npgbench (commits/s, median of {rounds}; one LISTEN session open; -M prepared -j 2)")
    print(f"{'clients':>7}{'plain':>10}{'notify':>10}{'notify/plain':>14}  each round")
    for n in (8, 32):
        plain, notify = tps[f"plain {n}"], tps[f"notify {n}"]
        each = " | ".join(
            "/".join(f"{x:.0f}" for x in pgbench[f"{name} {n}"]) for name in PGBENCH_SCRIPTS
        )
        print(f"{n:>7}{plain:>10.0f}{notify:>10.0f}{notify / plain:>14.2f}  {each}")
    print(
        f"{'8 -> 32':>7}{tps['plain 32'] / tps['plain 8']:>9.2f}x"
        f"{tps['notify 32'] / tps['notify 8']:>9.2f}x"
    )
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"\nload average: {load} (before: {', '.join(f'{x:.1f}' for x in load_before)}); "
        f"{took:.0f} s in all"
    )


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit("bench_fleet: interrupted (the cluster was stopped and removed)")
