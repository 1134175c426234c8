"""Benchmark: do more runner processes on one PostgreSQL deliver proportionally more alarms?

Offline: each model request answers after ``--latency`` seconds (0.5 by default), a
wait, not work (``time.sleep`` under ``FakeLLM`` and effectful's ``LiteLLMProvider``).
For each R in ``--runners`` (1, 2, 4), on a fresh database (on ``--postgres URL``'s
server, else on a throwaway cluster from the installed server binaries, on a Unix
socket, fsync off), R processes ``effectful-durable run URL --agents
bench_runners:make_agent --handlers bench_runners:make_handlers --concurrency C``
deliver the alarms of ``--agents`` agents (200):

* throughput: alarms due now, scheduled before the runners start and topped up
  once every runner has started its first turn (litellm's import, ~4 s per
  process, and the first turns are left out), so that the backlog never runs dry;
  after a 2 s settle, the alarms marked done in a window of ``--window`` seconds
  (counted in the database at its two ends) over its length. ``ideal`` is R x C /
  latency; ``vs 1`` the ratio to one runner's rate.
* delay: once the backlog is delivered, alarms due at a steady rate (half of what
  the fleet delivered, at most half of ideal) over ``--span`` seconds, each
  written 1.5 s before it is due, as another process would. Delay = when its turn
  asks the model minus when it was due; median and p99 in milliseconds.

Each runner runs in a session of its own (``--one-session``: all in this one), as
services of their own would: Linux shares the CPU among sessions first (autogroup),
so that runners in one session would share one session's part of a busy machine.

Where the time goes, over the throughput window: the CPU the runner processes and
the PostgreSQL server used, per alarm; how long their threads waited for a CPU
(run-queue time, ``/proc/PID/task/*/schedstat``), per alarm; how busy the machine
was (others may share it); and what the server's sessions of this database were
doing, sampled every 0.25 s (``pg_stat_activity``: running, idle, or the event they
waited on, such as a lock), so that a lock or the CPU shows if it does not scale.
Each delivery is checked to have asked the model once.

Run: ``.venv/bin/python bench/bench_runners.py [--runners 1,2,4] [--concurrency 8]
[--latency 0.5] [--agents 200] [--window 20] [--span 20] [--rounds 1] [--postgres URL]
[--one-session] [--quick]``.
No assertions.
"""

from __future__ import annotations

import os

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # before litellm is imported

import argparse
import collections
import contextlib
import dataclasses
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from effectful.handlers.llm import Template
from effectful.handlers.llm.completions import LiteLLMProvider
from effectful.ops.types import NotHandled

from effectful_durable import PersistentAgent, RunnerConfig, Store
from effectful_durable.store.alarms import make_schedule
from effectful_durable.testing import FakeCall, FakeLLM

HERE = Path(__file__).parent
ROOT = HERE.parent
ACTION = re.compile(r"The alarm's action: job (\d+)")
SETTLE = 2.0  # seconds between the top-up and the window
LEAD = 1.5  # seconds between writing a stream alarm and its due time (> poll_interval)

# -- the runner processes' side: --agents bench_runners:make_agent --handlers ... ----


@dataclasses.dataclass
class Worker(PersistentAgent):
    """You do jobs."""

    @Template.define
    def on_alarm(self, action: str) -> str:
        """An alarm is due. The alarm's action: {action}"""
        raise NotHandled


class SlowModel:
    """Waits ``latency`` seconds per request; appends ``job asked-at`` to a file per process."""

    def __init__(self, latency: float, log: str | None) -> None:
        self.latency = latency
        self.lock = threading.Lock()
        self.file = open(log, "a", buffering=1) if log else None  # kept for the process's life
        self.fake: FakeLLM | None = None

    def __call__(self, call: FakeCall) -> str:
        asked = time.time()
        found = ACTION.search(call.last_user_text)
        with self.lock:
            if self.fake is not None:
                self.fake.calls.clear()  # else they pile up
            if found and self.file is not None:
                self.file.write(f"{found[1]} {asked!r}\n")
        time.sleep(self.latency)  # a model that waits, as a real one does: no CPU
        return "done"


def make_agent(agent_id: str) -> Worker:
    """The runner's agent factory."""
    return Worker(agent_id=agent_id)


def make_handlers(config: RunnerConfig) -> list[Any]:
    """The runner's handler factory: the slow fake model under a LiteLLMProvider."""
    model = SlowModel(
        float(os.environ.get("BENCH_RUNNERS_LATENCY", "0.5")), os.environ.get("BENCH_RUNNERS_LOG")
    )
    fake = FakeLLM(respond=model)
    model.fake = fake
    return [LiteLLMProvider(model="fake"), fake]


# -- the parent: databases, processes, measurements ----------------------------------


@dataclasses.dataclass
class Server:
    """Where the databases are made, and the server's process (None: not on this machine)."""

    new_database: Callable[[], str]
    postmaster: int | None


@contextlib.contextmanager
def postgres(url: str | None) -> Iterator[Server]:
    """Fresh databases on ``url``'s server, or on a throwaway cluster (its pid known)."""
    if url is not None:
        sys.path.insert(0, str(HERE))
        from bench_scale import postgres_databases

        with postgres_databases(url) as new_database:
            yield Server(new_database, None)
        return
    sys.path.insert(0, str(ROOT / "tests" / "support"))
    from postgres_server import PostgresServer, find_bindir, unavailable

    reason = unavailable()
    if reason is not None:
        sys.exit(f"bench_runners: {reason}; or pass --postgres URL")
    bindir = find_bindir()
    assert bindir is not None
    server = PostgresServer(bindir)
    server.start()
    try:
        pid = int(Path(server.data, "postmaster.pid").read_text().split()[0])
        yield Server(server.new_database, pid)
    finally:
        server.stop()


@dataclasses.dataclass
class Usage:
    """Seconds so far: on a CPU, and runnable but waiting for one (all threads)."""

    runners: float
    server: float
    runners_waited: float
    server_waited: float

    def __sub__(self, other: Usage) -> Usage:
        mine, theirs = dataclasses.astuple(self), dataclasses.astuple(other)
        return Usage(*(a - b for a, b in zip(mine, theirs, strict=True)))


def usage(pids: list[int], postmaster: int | None) -> Usage:
    """What the runner processes ``pids`` and the server (its processes) used so far.

    CPU from ``/proc/PID/stat`` (the server's ended children included); the wait
    for a CPU from each live thread's ``schedstat`` (its run-queue time).
    """
    tick = os.sysconf("SC_CLK_TCK")

    def stat(pid: int) -> list[str]:
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return []
        return text.rpartition(")")[2].split()  # fields from the 3rd on

    def waited(pid: int) -> float:
        total = 0
        for task in Path(f"/proc/{pid}/task").glob("*/schedstat"):
            with contextlib.suppress(OSError, IndexError):
                total += int(task.read_text().split()[1])
        return total / 1e9

    runners = sum(int(f[11]) + int(f[12]) for f in map(stat, pids) if f) / tick
    runners_waited = sum(map(waited, pids))
    if postmaster is None:
        return Usage(runners, float("nan"), runners_waited, float("nan"))
    server, server_waited = 0, waited(postmaster)
    own = stat(postmaster)
    if own:
        server += sum(int(x) for x in own[11:15])  # utime stime cutime cstime
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = stat(int(entry))
            if fields and int(fields[1]) == postmaster:
                server += int(fields[11]) + int(fields[12])
                server_waited += waited(int(entry))
    return Usage(runners, server / tick, runners_waited, server_waited)


def machine_times() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine so far."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


class Waits:
    """Samples what the database's server sessions do, in a thread, until stopped."""

    def __init__(self, url: str, every: float = 0.25) -> None:
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)
        self.every = every
        self.seen: collections.Counter[str] = collections.Counter()
        self.samples = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while not self.done.wait(self.every):
            rows = self.conn.execute(
                """
                SELECT state, wait_event_type, wait_event FROM pg_stat_activity
                 WHERE datname = current_database() AND pid <> pg_backend_pid()
                   AND backend_type = 'client backend'
                """
            ).fetchall()
            self.samples += 1
            for state, kind, event in rows:
                if state == "active" and kind is None:
                    self.seen["running"] += 1
                elif state == "active":
                    self.seen[f"waiting: {kind}/{event}"] += 1
                elif state == "idle in transaction":
                    self.seen[f"idle in transaction ({event or '-'})"] += 1
                else:
                    self.seen[str(state)] += 1

    def stop(self) -> dict[str, float]:
        """The mean number of sessions in each state per sample."""
        self.done.set()
        self.thread.join()
        self.conn.close()
        return {k: v / max(self.samples, 1) for k, v in self.seen.most_common()}


@dataclasses.dataclass
class Row:
    runners: int
    per_second: float
    ideal: float
    runner_cpu: float  # share of one core, all runner processes
    server_cpu: float
    runner_waited: float  # threads runnable but waiting for a CPU, on average
    server_waited: float
    machine_busy: float  # share of all cores
    per_process: list[float]
    load: float
    stream_rate: float = 0.0
    delays: list[float] = dataclasses.field(default_factory=list)
    waits: dict[str, float] = dataclasses.field(default_factory=dict)
    ran_dry: bool = False
    repeats: int = 0
    problems: list[str] = dataclasses.field(default_factory=list)


class Fleet:
    """R runner processes on one database, each logging its model requests to a file."""

    def __init__(
        self,
        url: str,
        runners: int,
        concurrency: int,
        latency: float,
        tmp: Path,
        *,
        one_session: bool = False,
    ) -> None:
        self.logs = [tmp / f"asked-{n}.log" for n in range(runners)]
        self.errs = [tmp / f"stderr-{n}.log" for n in range(runners)]
        self.procs = []
        for log, err in zip(self.logs, self.errs, strict=True):
            env = {
                **os.environ,
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "BENCH_RUNNERS_LATENCY": str(latency),
                "BENCH_RUNNERS_LOG": str(log),
            }
            command = [
                sys.executable, "-m", "effectful_durable", "run", url,
                "--agents", "bench_runners:make_agent",
                "--handlers", "bench_runners:make_handlers",
                "--concurrency", str(concurrency), "--log-level", "WARNING",
            ]  # fmt: skip
            with err.open("w") as stderr:
                self.procs.append(subprocess.Popen(command, cwd=HERE, env=env, stderr=stderr))

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self.procs]

    def asked(self) -> list[list[tuple[int, float]]]:
        """Each process's model requests so far: (job, when)."""
        out = []
        for log in self.logs:
            lines = log.read_text().splitlines() if log.exists() else []
            pairs = [line.split() for line in lines]
            out.append([(int(job), float(at)) for job, at in pairs if at])
        return out

    def wait_warm(self, timeout: float) -> None:
        """Until each process has asked the model once."""
        deadline = time.monotonic() + timeout
        while not all(self.asked()):
            for proc, err in zip(self.procs, self.errs, strict=True):
                if proc.poll() is not None:
                    sys.exit(f"bench_runners: a runner exited:\n{err.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                sys.exit("bench_runners: the runners did not start within the timeout")
            time.sleep(0.2)

    def stop(self) -> list[str]:
        """SIGTERM each, wait; the warnings and errors they logged."""
        for proc in self.procs:
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return [
            line
            for err in self.errs
            for line in err.read_text().splitlines()
            if " WARNING " in line or " ERROR " in line or "Traceback" in line
        ]


def count(url: str, sql: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(sql.encode()).fetchone()
    assert row is not None
    return int(row[0])


def done(url: str) -> int:
    return count(url, "SELECT count(*) FROM alarms WHERE status = 'done'")


def pending(url: str) -> int:
    return count(url, "SELECT count(*) FROM alarms WHERE status = 'pending'")


class Jobs:
    """Schedules numbered alarms round-robin over the agents; remembers when each is due."""

    def __init__(self, store: Store, agents: int) -> None:
        self.store = store
        self.agents = agents
        self.due: dict[int, float] = {}

    def add(self, at: float | None = None) -> None:
        n = len(self.due)
        now = time.time()
        self.due[n] = now if at is None else at
        self.store.schedule_alarm(
            f"agent-{n % self.agents}",
            f"job {n}",
            make_schedule(now, at=max(self.due[n], now)),
            now=now,
        )


def wait_pending(url: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while pending(url):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.25)
    return True


def measure(server: Server, tmp: Path, runners: int, args: argparse.Namespace) -> Row:
    url = server.new_database()
    ideal = runners * args.concurrency / args.latency
    directory = tmp / f"r{runners}"
    directory.mkdir(parents=True)
    with Store(url) as store:
        jobs = Jobs(store, args.agents)
        for _ in range(max(args.agents, int(ideal * 8))):  # the warm-up's alarms
            jobs.add()
        fleet = Fleet(
            url, runners, args.concurrency, args.latency, directory, one_session=args.one_session
        )
        problems: list[str] = []
        try:
            fleet.wait_warm(timeout=180)
            # Enough for the settle and the window at the ideal rate, and some more.
            for _ in range(max(0, int(ideal * (SETTLE + args.window + 3)) - pending(url))):
                jobs.add()
            time.sleep(SETTLE)
            waits = Waits(url)
            load = os.getloadavg()[0]
            cpu0, busy0, t0, done0 = (
                usage(fleet.pids, server.postmaster),
                machine_times(),
                time.time(),
                done(url),
            )
            time.sleep(args.window)
            cpu1, busy1, t1, done1 = (
                usage(fleet.pids, server.postmaster),
                machine_times(),
                time.time(),
                done(url),
            )
            waited = waits.stop()
            ran_dry = pending(url) == 0
            elapsed = t1 - t0
            asked = fleet.asked()
            row = Row(
                runners=runners,
                per_second=(done1 - done0) / elapsed,
                ideal=ideal,
                runner_cpu=(cpu1 - cpu0).runners / elapsed,
                server_cpu=(cpu1 - cpu0).server / elapsed,
                runner_waited=(cpu1 - cpu0).runners_waited / elapsed,
                server_waited=(cpu1 - cpu0).server_waited / elapsed,
                machine_busy=(busy1[0] - busy0[0]) / max(busy1[1] - busy0[1], 1),
                per_process=[sum(t0 <= at < t1 for _, at in mine) / elapsed for mine in asked],
                load=load,
                waits=waited,
                ran_dry=ran_dry,
            )
            if not wait_pending(url, timeout=120):
                problems.append("the backlog was not delivered within 120 s after the window")
            # The stream: due at a steady rate, each written LEAD s before it is due.
            rate = min(ideal, row.per_second) / 2
            row.stream_rate = rate
            first = len(jobs.due)
            start = time.time() + LEAD + 0.5
            total = int(rate * args.span)
            for k in range(total):
                due_at = start + k / rate
                with contextlib.suppress(ValueError):
                    time.sleep(max(0.0, due_at - LEAD - time.time()))
                jobs.add(at=due_at)
            if not wait_pending(url, timeout=60):
                problems.append("the stream was not delivered within 60 s after its end")
        finally:
            problems += fleet.stop()
    asked_all = [pair for mine in fleet.asked() for pair in mine]
    times: dict[int, float] = {}
    for job, at in asked_all:
        if job in times:
            row.repeats += 1  # asked twice: a turn retried
        times.setdefault(job, at)
    row.delays = [
        (times[n] - jobs.due[n]) * 1000 for n in range(first, len(jobs.due)) if n in times
    ]
    missing = [n for n in jobs.due if n not in times]
    if missing:
        problems.append(f"{len(missing)} job(s) never asked the model")
    row.problems = problems
    return row


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runners", default="1,2,4", help="comma-separated process counts")
    parser.add_argument("--concurrency", type=int, default=8, help="each runner's --concurrency")
    parser.add_argument("--latency", type=float, default=0.5, help="seconds per model answer")
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--window", type=float, default=20.0, help="seconds of throughput window")
    parser.add_argument("--span", type=float, default=20.0, help="seconds of the delay stream")
    parser.add_argument("--rounds", type=int, default=1, help="times through --runners")
    parser.add_argument("--postgres", help="a PostgreSQL server URL to create databases on")
    parser.add_argument(
        "--one-session",
        action="store_true",
        help="run the runners in this process's session (one CPU share for all of them)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run (~3 min)")
    parser.add_argument("--dir", help="parent directory of the runners' logs")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the runners and the server
    levels = [int(n) for n in args.runners.split(",")]
    if args.quick:
        levels, args.window, args.span, args.rounds = [1, 2], 5.0, 5.0, 1
    print(
        f"postgres, {args.agents} agents, model latency {args.latency:g} s, concurrency "
        f"{args.concurrency} per runner, {os.cpu_count()} cores (load average "
        f"{os.getloadavg()[0]:.2f} at start)",
        flush=True,
    )
    rows: dict[int, list[Row]] = {runners: [] for runners in levels}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp, postgres(args.postgres) as server:
        for round_ in range(args.rounds):
            for runners in levels:
                row = measure(server, Path(tmp) / f"{round_}", runners, args)
                rows[runners].append(row)
                report(row, rows[levels[0]][-1])
    table(rows, levels[0])
    print(f"load average: {os.getloadavg()[0]:.2f} at the end (the machine may be shared)")
    return 0


def table(rows: dict[int, list[Row]], base: int) -> None:
    """The median of each column over the rounds (with the range of alarms/s if several)."""
    print()
    header = (
        "runners", "alarms/s", "ideal", "vs 1", "per process", "CPU ms/alarm",
        "CPU wait ms/alarm", "machine busy", "load", "stream/s", "delay med ms", "p99 ms",
    )  # fmt: skip
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    first = statistics.median(r.per_second for r in rows[base])
    for runners, runs in rows.items():

        def mid(value: Callable[[Row], float], runs: list[Row] = runs) -> float:
            return statistics.median(value(r) for r in runs)

        rate = mid(lambda r: r.per_second)
        spread = (
            f" ({min(r.per_second for r in runs):.1f}-{max(r.per_second for r in runs):.1f})"
            if len(runs) > 1
            else ""
        )
        middle = sorted(runs, key=lambda r: r.per_second)[len(runs) // 2]
        cells = (
            str(runners),
            f"{rate:.1f}{spread}",
            f"{runs[0].ideal:.0f}",
            f"{rate / first:.2f}x",
            " / ".join(f"{x:.1f}" for x in middle.per_process),
            f"{mid(lambda r: r.runner_cpu / r.per_second * 1000):.0f} + "
            f"{mid(lambda r: r.server_cpu / r.per_second * 1000):.0f}",
            f"{mid(lambda r: r.runner_waited / r.per_second * 1000):.0f} + "
            f"{mid(lambda r: r.server_waited / r.per_second * 1000):.0f}",
            f"{mid(lambda r: r.machine_busy):.0%}",
            f"{mid(lambda r: r.load):.1f}",
            f"{mid(lambda r: r.stream_rate):.1f}",
            f"{mid(lambda r: statistics.median(r.delays) if r.delays else float('nan')):.0f}",
            f"{mid(lambda r: p(r.delays, 0.99)):.0f}",
        )
        print("| " + " | ".join(cells) + " |")


def report(row: Row, first: Row) -> None:
    """One run's details, as it ends."""
    print(
        f"{row.runners} runner(s): {row.per_second:.1f} alarms/s (ideal {row.ideal:.0f}, "
        f"{row.per_second / first.per_second:.2f}x one runner); per process "
        f"{', '.join(f'{x:.1f}' for x in row.per_process)}/s; CPU: runners "
        f"{row.runner_cpu:.0%} of a core, server {row.server_cpu:.0%} "
        f"({row.runner_cpu / row.per_second * 1000:.0f} + "
        f"{row.server_cpu / row.per_second * 1000:.0f} ms per alarm); waiting for a CPU: "
        f"runners {row.runner_waited * 1000 / row.per_second:.0f} ms per alarm, server "
        f"{row.server_waited * 1000 / row.per_second:.0f}; machine "
        f"{row.machine_busy:.0%} busy, load {row.load:.1f}",
        flush=True,
    )
    sessions = ", ".join(f"{k} {v:.1f}" for k, v in row.waits.items())
    print(f"  server sessions of the database, mean per sample: {sessions}", flush=True)
    print(
        f"  stream {row.stream_rate:.1f}/s: delay median {statistics.median(row.delays):.0f} ms, "
        f"p99 {p(row.delays, 0.99):.0f} ms ({len(row.delays)} alarms)"
        if row.delays
        else "  stream: no delays",
        flush=True,
    )
    if row.ran_dry:
        print("  the backlog ran dry in the window: the rate is a lower bound", flush=True)
    if row.repeats:
        print(f"  {row.repeats} model request(s) repeated a job (a turn retried)", flush=True)
    for problem in row.problems[:10]:
        print(f"  ! {problem}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
