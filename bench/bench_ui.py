"""Benchmark: the page's server time per page on a large database, and how fast it is live.

Builds one SQLite database (through the Store's turn protocol, no model) with
``--agents`` agents of one turn each and one agent, ``long``, of ``--turns`` turns
(a question, a tool call, its result, an answer; every 50th tool call fails). Then:

* server time per page, through Starlette's TestClient in this process (the page's
  own work: the Store's reads and the template; no network): the agents list, the
  first page of ``long``'s timeline, a history filter on it (a text, a tool, errors:
  each reads back through the history until its page is full), the versions page,
  and the diff of two versions 5,000 turns apart;
* a commit shown on an open page: a real ``effectful-durable ui`` process, a client
  holding its live stream, and a writer process committing one turn at a time; the
  time from the commit's return to the page's event, and to the page fetched again;
* the server's CPU with 10 pages open and idle, over ``--idle`` seconds;
* a writer's 1,000 turns alone, then while three clients poll pages.

Run: ``.venv/bin/python bench/bench_ui.py [--agents 10000] [--turns 10000] [--quick]``.
No assertions: it prints the numbers beside the issue's targets.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from effectful_durable import Store  # noqa: E402
from effectful_durable.store.history import HistoryChange  # noqa: E402
from effectful_durable.ui import make_app  # noqa: E402

WRITER = """
import sys, time
from effectful_durable import Store
from effectful_durable.store.history import HistoryChange
db, turns, pause = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
with Store(db) as store:
    started = time.perf_counter()
    for _ in range(turns):
        start = store.begin_turn("w", template="t", arguments={})
        message = {"id": f"m{start.version}", "role": "user", "content": "x"}
        change = HistoryChange([(float(start.version), message)], [], 0)
        store.commit_turn("w", base_version=start.version, template="t", change=change, state=None)
        print(f"committed {time.time()}", flush=True)
        time.sleep(pause)
    print(f"took {time.perf_counter() - started}", flush=True)
"""


def commit(store: Store, agent_id: str, messages: list[dict[str, object]]) -> None:
    start = store.begin_turn(agent_id, template="ask", arguments={"q": "?"})
    base = float(start.version * 10)
    added = [(base + i, m) for i, m in enumerate(messages)]
    store.commit_turn(
        agent_id,
        base_version=start.version,
        template="ask",
        change=HistoryChange(added, [], 0),
        state=json.dumps({"turns": start.version + 1}),
    )


def turn_messages(n: int) -> list[dict[str, object]]:
    """A question, a tool call, its result (every 50th an error), an answer."""
    call = f"call_{n}"
    result = (
        f"Tool execution failed: Error executing tool 'self__lookup': no order {n}"
        if n % 50 == 0
        else f"order {n}: delivered on day {n % 28 + 1}"
    )
    return [
        {"id": f"u{n}", "role": "user", "content": f"Where is my order {n}? Please check it."},
        {
            "id": f"a{n}",
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call,
                    "type": "function",
                    "function": {"name": "self__lookup", "arguments": f'{{"order": "{n}"}}'},
                }
            ],
        },
        {"id": f"t{n}", "role": "tool", "tool_call_id": call, "content": result},
        {"id": f"r{n}", "role": "assistant", "content": f"Your order {n} is on its way."},
    ]


def build(db: str, agents: int, turns: int) -> None:
    started = time.perf_counter()
    with Store(db) as store:
        for i in range(agents):
            commit(store, f"agent-{i:05d}", turn_messages(i)[:1])
        for n in range(turns):
            commit(store, "long", turn_messages(n))
    print(
        f"built {agents:,} agents and one of {turns:,} turns in "
        f"{time.perf_counter() - started:.0f} s ({os.path.getsize(db) / 1e6:.0f} MB)"
    )


def timed(get: Callable[[], object], runs: int) -> tuple[float, float]:
    """Median and p90 milliseconds of ``runs`` calls, after one warm-up call."""
    get()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        get()
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.9) - 1 if len(times) > 1 else 0]


def pages(db: str, turns: int, runs: int) -> None:
    half = max(turns // 2, 1)
    rows = [
        ("agents list", "/", 300),
        ("agents list, needs attention, newest first", "/?attention=1&sort=-updated", 300),
        ("agents list, id filter", "/?q=agent-0999", 300),
        ("first page of the long agent", "/agent?id=long", 200),
        ("history filter: text near the start", "/agent?id=long&text=order+3%3F", 300),
        ("history filter: tool", "/agent?id=long&tool=self__lookup", 300),
        ("history filter: its results", "/agent?id=long&role=tool&tool=self__lookup", 300),
        ("history filter: errors", "/agent?id=long&errors=1", 300),
        ("history filter: text found nowhere", "/agent?id=long&text=nowhere", 300),
        ("versions page", "/versions?id=long", 300),
        (f"diff of v{half} and v{turns} ({turns - half:,} turns apart)",
         f"/diff?id=long&from={half}&to={turns}", 500),
    ]  # fmt: skip
    with Store(db, readonly=True) as store:
        app = make_app(store, token="t", port=1)
        with TestClient(app, base_url="http://127.0.0.1:1") as client:
            client.get("/?token=t")
            print(f"\n{'page':<58} {'median ms':>10} {'p90 ms':>8} {'target':>8}")
            for name, path, target in rows:
                status = client.get(path).status_code
                median, p90 = timed(lambda path=path: client.get(path), runs)
                flag = "" if status == 200 else f"  (HTTP {status})"
                print(f"{name:<58} {median:>10.1f} {p90:>8.1f} {f'≤ {target}':>8}{flag}")


class Page:
    """``effectful-durable ui`` in a child process."""

    def __init__(self, db: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "effectful_durable", "ui", db, "--no-browser"],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        assert self.process.stdout is not None
        for line in self.process.stdout:
            found = re.match(r"open (http://\S+)", line)
            if found:
                self.url = found[1]
                break
        self.base = self.url.split("/?")[0]

    def client(self) -> httpx.Client:
        client = httpx.Client(base_url=self.base, timeout=60, follow_redirects=True)
        client.get(self.url)
        return client

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        self.process.wait(timeout=30)


def live(db: str, commits: int, idle: float) -> None:
    page = Page(db)
    try:
        clients = [page.client() for _ in range(10)]
        arrivals: list[float] = []
        streams_open = threading.Barrier(11)

        def listen(client: httpx.Client, record: bool) -> None:
            try:
                with client.stream("GET", "/-/live", timeout=None) as events:
                    streams_open.wait()
                    for line in events.iter_lines():
                        if line == "event: commit" and record:
                            arrivals.append(time.time())
                            client_for_refresh.get("/agent?id=w")
                            refreshed.append(time.time())
            except httpx.HTTPError:
                pass  # the server stopped

        client_for_refresh = page.client()
        refreshed: list[float] = []
        threads = [
            threading.Thread(target=listen, args=(c, i == 0), daemon=True)
            for i, c in enumerate(clients)
        ]
        for thread in threads:
            thread.start()
        streams_open.wait()
        time.sleep(1.0)
        before = page.cpu_seconds()
        time.sleep(idle)
        used = page.cpu_seconds() - before
        print(
            f"\nserver CPU with 10 pages open and idle: {used / idle * 100:.2f}% of a core "
            f"over {idle:.0f} s (target < 1%)"
        )
        writer = subprocess.run(
            [sys.executable, "-c", WRITER, db, str(commits), "1.5"],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        time.sleep(1.0)
        done = [float(x) for x in re.findall(r"committed ([\d.]+)", writer.stdout)]
        shown = [a - c for c, a in zip(done, arrivals, strict=False)]
        fetched = [r - c for c, r in zip(done, refreshed, strict=False)]
        if shown:
            print(
                f"commit shown on an open page ({len(shown)} commits): event after "
                f"{statistics.median(shown) * 1000:.0f} ms median, {max(shown) * 1000:.0f} ms "
                f"max; page fetched again after {statistics.median(fetched) * 1000:.0f} ms "
                f"median, {max(fetched) * 1000:.0f} ms max (target ≤ 1 s)"
            )
        for client in clients:
            client.close()
    finally:
        page.stop()


def writer_alone_and_polled(db: str) -> None:
    def run() -> float:
        done = subprocess.run(
            [sys.executable, "-c", WRITER, db, "1000", "0"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=True,
        )
        return float(re.findall(r"took ([\d.]+)", done.stdout)[0])

    alone = run()
    page = Page(db)
    stop = threading.Event()
    polls = [0]

    def poll(path: str) -> None:
        client = page.client()
        while not stop.is_set():
            client.get(path)
            polls[0] += 1
        client.close()

    threads = [threading.Thread(target=poll, args=(p,)) for p in ("/", "/agent?id=w", "/waiting")]
    for thread in threads:
        thread.start()
    try:
        polled = run()
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        page.stop()
    print(
        f"\na writer's 1,000 turns: {alone:.2f} s alone, {polled:.2f} s while 3 clients "
        f"polled pages ({polls[0]:,} pages served meanwhile)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=10_000)
    parser.add_argument("--turns", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=15, help="timed requests per page")
    parser.add_argument("--idle", type=float, default=20.0, help="seconds of idle CPU measured")
    parser.add_argument("--commits", type=int, default=8, help="commits timed to the page")
    parser.add_argument("--quick", action="store_true", help="1,000 agents and turns, fewer runs")
    args = parser.parse_args()
    if args.quick:
        args.agents, args.turns, args.runs, args.idle, args.commits = 1000, 1000, 5, 5, 3
    print(f"{os.cpu_count()} cores; SQLite through apsw; one process serves the page")
    with tempfile.TemporaryDirectory() as folder:
        db = str(Path(folder) / "bench.db")
        build(db, args.agents, args.turns)
        pages(db, args.turns, args.runs)
        live(db, args.commits, args.idle)
        writer_alone_and_polled(db)


if __name__ == "__main__":
    main()
