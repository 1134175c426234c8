"""Promise 10: each process holds a known number of server connections, measured from outside.

A process of ours names each of its connections ``effectful-durable <host> <pid>``
(``application_name``): a connection of the test's own, straight to the
cluster, reads ``pg_stat_activity`` every few milliseconds and keeps the most
connections each process held at once, and the most turns running at once (the
handoff rows of turns in flight), which tells that the load was what the
budget is for. The budgets are those documented in docs/source/production.rst
("Connections"): a process running turns in T threads holds at most T + 1, a
runner at concurrency C at most C + 2, the page at most 2.
"""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psycopg
import pytest
from helpers import commit_message
from paths import ROOT
from ui_server import serving

from effectful_durable import Store
from effectful_durable.store.parts.alarms import make_schedule

pytestmark = pytest.mark.slow

SAMPLE_SECONDS = 0.01


class Connections:
    """The most server connections each process of ours held at once, and the most
    turns running at once, in one database, sampled until :meth:`stop`."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.most: dict[int, int] = {}
        self.most_turns = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        if self._error is not None:
            raise self._error

    def of(self, pid: int) -> int:
        """The most connections process ``pid`` held at once."""
        return self.most.get(pid, 0)

    def _sample(self) -> None:
        try:
            # Autocommit: each statement reads pg_stat_activity afresh (a transaction
            # would read one snapshot of it throughout).
            with psycopg.connect(self.url, autocommit=True, application_name="sampler") as conn:
                while not self._stop.is_set():
                    rows = conn.execute(
                        """
                        SELECT application_name, count(*) FROM pg_stat_activity
                         WHERE datname = current_database()
                           AND application_name LIKE 'effectful-durable %'
                         GROUP BY application_name
                        """
                    ).fetchall()
                    for name, count in rows:
                        pid = int(name.split()[-1])
                        self.most[pid] = max(self.most.get(pid, 0), count)
                    [(turns,)] = conn.execute(
                        "SELECT count(*) FROM handoffs WHERE status = 'running'"
                    ).fetchall()
                    self.most_turns = max(self.most_turns, turns)
                    self.samples += 1
                    time.sleep(SAMPLE_SECONDS)
        except BaseException as error:  # raised by stop(), in the test's thread
            self._error = error


@contextmanager
def sampled(url: str) -> Iterator[Connections]:
    """Sample the connections of ``url``'s database during the block."""
    connections = Connections(url)
    connections.start()
    try:
        yield connections
    finally:
        connections.stop()
    assert connections.samples > 10


def report(what: str, held: int, budget: int, turns: int | None = None) -> str:
    line = f"{what}: at most {held} server connections at once (budget {budget})"
    if turns is not None:
        line += f", {turns} turns running at once"
    print(line)
    return line


# -- a process running turns in threads -----------------------------------------------

#: A process whose THREADS threads run TURNS turns each, of an agent of its own each,
#: every model answer taking 0.05 s: the threads' turns run at once.
TURNS_CHILD = textwrap.dedent(
    """
    import os, sys, threading, time
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    from effectful_durable import PersistenceHandler
    from effectful_durable.testing import FakeLLM
    from helpers import Assistant, running

    url, threads, turns = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    persistence = PersistenceHandler(url)

    def slow(call):
        time.sleep(0.05)
        return "answer"

    def work(n):
        with running(FakeLLM(respond=slow), persistence):
            agent = Assistant(agent_id=f"agent-{n}")
            for turn in range(turns):
                agent.ask(f"turn {turn}")

    sys.stdin.readline()
    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    persistence.close()
    print("done", flush=True)
    """
)


class TestTurnsInThreads:
    def test_four_threads_hold_at_most_five(self, postgres_url: str) -> None:
        """A process whose 4 threads run turns of 4 agents at once holds at most 5 server
        connections (one per thread, one for the agents' locks)."""
        Store(postgres_url).close()  # our tables, for the sampler
        threads = 4
        child = subprocess.Popen(
            [sys.executable, "-c", TURNS_CHILD, postgres_url, str(threads), "10"],
            cwd=ROOT,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        try:
            with sampled(postgres_url) as connections:
                assert child.stdin is not None
                child.stdin.write("go\n")
                child.stdin.flush()
                output, _ = child.communicate(timeout=300)
        finally:
            if child.poll() is None:
                child.kill()
            child.wait(30)
        assert child.returncode == 0 and "done" in output
        held = connections.of(child.pid)
        line = report("4 threads", held, threads + 1, connections.most_turns)
        assert connections.most_turns == threads, line  # the threads' turns overlapped
        assert 0 < held <= threads + 1, line


# -- a runner -------------------------------------------------------------------------


class TestRunner:
    @pytest.mark.parametrize("concurrency", [1, 4])
    def test_a_runner_holds_at_most_concurrency_plus_two(
        self, postgres_url: str, tmp_path: Path, concurrency: int
    ) -> None:
        """A runner at concurrency C delivering alarms of 6C agents holds at most
        C + 2 server connections (one per turn, its loop's, the agents' locks)."""
        agents = 6 * concurrency
        with Store(postgres_url) as store:
            for n in range(agents):
                store.schedule_alarm(f"k{n}", f"slow-{n}", make_schedule(time.time(), delay=0))
        config = tmp_path / "runner.toml"
        config.write_text("[runner]\npoll_interval = 0.2\n")
        with sampled(postgres_url) as connections:
            runner = subprocess.Popen(
                [
                    sys.executable, "-m", "effectful_durable", "run", postgres_url,
                    "--agents", "alarms_app:make_agent",
                    "--handlers", "alarms_app:make_handlers",
                    "--config", str(config), "--concurrency", str(concurrency),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env={**os.environ, "ALARMS_APP_SLOW": "0.1"},
            )  # fmt: skip
            try:
                deadline = time.monotonic() + 120
                with Store(postgres_url, readonly=True) as store:
                    while store.alarms():  # each delivered
                        assert time.monotonic() < deadline and runner.poll() is None
                        time.sleep(0.1)
                runner.send_signal(signal.SIGTERM)
                output, _ = runner.communicate(timeout=60)
            finally:
                if runner.poll() is None:
                    runner.kill()
                runner.wait(30)
        assert runner.returncode == 0, output
        held = connections.of(runner.pid)
        budget = concurrency + 2
        line = report(f"runner at concurrency {concurrency}", held, budget, connections.most_turns)
        assert connections.most_turns == concurrency, line  # its turns overlapped
        assert 0 < held <= budget, line


# -- the page ---------------------------------------------------------------------------


class TestPage:
    def test_the_page_holds_at_most_two(self, postgres_url: str) -> None:
        """The page, serving pages to four clients at once while a live stream is open
        and commits come in, holds at most 2 server connections (its read-only
        Store's and its read-write Store's)."""
        with Store(postgres_url) as store:
            for n in range(4):
                commit_message(store, f"w{n}", "first")
        stop = threading.Event()
        statuses: list[int] = []
        events: list[str] = []

        def browse(client: httpx.Client, n: int) -> None:
            paths = ["/", f"/agent?id=w{n}", f"/versions?id=w{n}", "/waiting"]
            while not stop.is_set():
                statuses.extend(client.get(path).status_code for path in paths)

        def listen(client: httpx.Client) -> None:
            with client.stream("GET", "/-/live", timeout=60) as stream:
                for line in stream.iter_lines():
                    if line.startswith("event:"):
                        events.append(line)
                    if stop.is_set():
                        return

        with serving(postgres_url) as server, server.client() as client:
            with sampled(postgres_url) as connections:
                readers = [threading.Thread(target=browse, args=(client, n)) for n in range(4)]
                readers.append(threading.Thread(target=listen, args=(client,)))
                for reader in readers:
                    reader.start()
                try:
                    with Store(postgres_url) as store:
                        for turn in range(20):
                            commit_message(store, "w-live", f"turn {turn}")
                            time.sleep(0.1)
                    time.sleep(2)
                finally:
                    stop.set()
                    with Store(postgres_url) as store:  # the stream's next event ends it
                        commit_message(store, "w-last", "last")
                    for reader in readers:
                        reader.join(60)
            held = connections.of(server.process.pid)
        line = report("the page", held, 2)
        assert statuses and set(statuses) == {200}
        assert events, "the live stream announced no commit"
        assert 0 < held <= 2, line
