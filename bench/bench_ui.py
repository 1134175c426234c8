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

With ``--postgres [URL]`` (issue 39, item 4: many agents cost nothing), on
PostgreSQL instead: a database of ``--agents`` (100,000) agents and ``--messages``
(5,000,000) messages written in bulk with COPY (bench/many_agents.py; kept and
reused on URL's server, on a throwaway one with fsync on otherwise), and an empty
database beside it on the same server; then

* a turn in each, interleaved turn by turn: the Store's own calls of a turn (as
  bench_store_turn.py plays them: ``turns.start``, the hold and the handoff;
  ``turns.commit`` of two messages; the release) of a new agent, and whole turns through
  PersistenceHandler with FakeLLM (as bench_persistence.py plays them) of a new
  agent and of an agent of the bulk (a fork of one, copied row for row into the
  empty database; the agents a run makes in the big one are deleted at its end);
* a real ``effectful-durable ui`` process over the big database (tests/support/ui_server.py's
  ``serving``), each page fetched ``--runs`` (20) times with httpx after one
  warm-up: the agents list (first page, default sort; needs attention; a name
  filter; ...) and agents' first pages.

Run: ``.venv/bin/python bench/bench_ui.py [--agents 10000] [--turns 10000] [--quick]``,
or ``.venv/bin/python bench/bench_ui.py --postgres [URL] [--agents 100000]
[--messages 5000000] [--quick]``. No assertions: it prints the numbers beside the
issue's targets.
"""

from __future__ import annotations

import argparse
import dataclasses
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
sys.path.insert(0, str(ROOT / "tests" / "support"))

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
        with store.turns.start("w", template="t", arguments={}) as start:
            message = {"id": f"m{start.version}", "role": "user", "content": "x"}
            change = HistoryChange([(float(start.version), message)], [], 0)
            base = start.version
            store.turns.commit("w", base_version=base, template="t", change=change, state=None)
        print(f"committed {time.time()}", flush=True)
        time.sleep(pause)
    print(f"took {time.perf_counter() - started}", flush=True)
"""


def commit(store: Store, agent_id: str, messages: list[dict[str, object]]) -> None:
    with store.turns.start(agent_id, template="ask", arguments={"q": "?"}) as start:
        base = float(start.version * 10)
        added = [(base + i, m) for i, m in enumerate(messages)]
        store.turns.commit(
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
    parser.add_argument("--agents", type=int, help="10,000 (SQLite); 100,000 (PostgreSQL)")
    parser.add_argument("--turns", type=int, default=10_000, help="turns of the long agent")
    parser.add_argument(
        "--runs", type=int, help="timed requests per page: 15; 20 on PostgreSQL (0: none)"
    )
    parser.add_argument("--idle", type=float, default=20.0, help="seconds of idle CPU measured")
    parser.add_argument("--commits", type=int, default=8, help="commits timed to the page")
    parser.add_argument("--quick", action="store_true", help="1,000 agents and turns, fewer runs")
    parser.add_argument(
        "--postgres",
        nargs="?",
        const="",
        metavar="URL",
        help="on PostgreSQL: a server URL to keep the databases on, or none for a throwaway one",
    )
    parser.add_argument("--messages", type=int, default=5_000_000, help="PostgreSQL: in all")
    parser.add_argument(
        "--turn-runs", type=int, default=1000, help="PostgreSQL: turns per arm (0: none)"
    )
    args = parser.parse_args()
    if args.postgres is not None:
        postgres(args)
        return
    args.agents = 10_000 if args.agents is None else args.agents
    args.runs = 15 if args.runs is None else args.runs
    if args.quick:
        args.agents, args.turns, args.runs, args.idle, args.commits = 1000, 1000, 5, 5, 3
    print(f"{os.cpu_count()} cores; SQLite through apsw; one process serves the page")
    with tempfile.TemporaryDirectory() as folder:
        db = str(Path(folder) / "bench.db")
        build(db, args.agents, args.turns)
        pages(db, args.turns, args.runs)
        live(db, args.commits, args.idle)
        writer_alone_and_polled(db)


# -- PostgreSQL: many agents (issue 39, item 4) ------------------------------------


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def postgres(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    import many_agents

    agents = 100_000 if args.agents is None else args.agents
    messages, turns, turn_runs = args.messages, args.turns, args.turn_runs
    runs = 20 if args.runs is None else args.runs
    if args.quick:
        agents, messages, turns, runs, turn_runs = 10_000, 500_000, 1000, 5, 200
    print(f"{os.cpu_count()} cores; PostgreSQL; {load()}")
    with many_agents.databases(args.postgres or None) as database:
        big = database(f"bench_ui_{agents}_{messages}_{turns}")
        found = many_agents.built(big)
        if found == 0:
            print(f"writing {agents:,} agents and {messages:,} messages with COPY ...")
            done = many_agents.build(big, agents=agents, messages=messages, long_turns=turns)
            print(
                f"wrote {done.agents:,} agents, {done.versions:,} versions, "
                f"{done.messages:,} messages, {done.alarms:,} alarms and events, "
                f"{done.approvals:,} approvals, {done.handoffs:,} handoffs in "
                f"{done.seconds:.0f} s ({done.bytes / 1e9:.1f} GB); {load()}"
            )
        elif found != agents + 1:
            sys.exit(f"bench_ui: {big} holds {found} agents, not {agents + 1}: drop it first")
        else:
            print(f"reusing {big}: {found:,} agents")
        if turn_runs:
            empty = database(f"bench_ui_empty_{os.getpid()}")
            try:
                turns_compared(big, empty, turn_runs, many_agents.agent_id(agents // 2))
            finally:
                if args.postgres:  # a throwaway server goes with its databases
                    drop(args.postgres, empty)
        if runs:
            served_pages(big, runs, many_agents.agent_id(agents // 2))
    print(load())


def drop(server: str, url: str) -> None:
    import psycopg

    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE "{url.rpartition("/")[2]}" WITH (FORCE)'.encode())


def copy_agent(source: str, target: str, agent_id: str) -> None:
    """The agent's rows of ``source`` written to ``target`` (an agent of the bulk, into
    the empty database: the same agent in both arms)."""
    import psycopg

    with psycopg.connect(source) as src, psycopg.connect(target) as dst:
        for table in ("agents", "versions", "conversations", "messages"):
            rows = src.execute(
                f"SELECT * FROM {table} WHERE agent_id = %s".encode(), (agent_id,)
            ).fetchall()
            marks = ", ".join(["%s"] * len(rows[0]))
            with dst.cursor() as cursor:
                cursor.executemany(f"INSERT INTO {table} VALUES ({marks})".encode(), rows)


def turns_compared(big: str, empty: str, n: int, middle: str) -> None:
    """Turns in the big and the empty database, interleaved; the table of medians.

    The agents it makes in the big database (among them a fork of one of the bulk's,
    for the turns of an agent with a history) are deleted at the end: the bulk stays
    as it was built, for the next run.
    """
    tag = f"{os.getpid()}-{int(time.time())}"
    existing = f"bulk-{tag}"
    with Store(big) as store:
        store.fork(middle, None, existing)
    Store(empty).close()  # its schema
    copy_agent(big, empty, existing)  # the same agent, row for row, in both
    try:
        times = turns_played({"empty": empty, "many": big}, tag, existing, n, middle)
    finally:
        with Store(big) as store:
            for agent_id in store.agent_page(text=tag).agents:
                store.delete(agent_id.agent_id)
    with Store(empty, readonly=True) as store:
        messages = len(store.history(existing))
    print(
        f"\na turn in an empty database and among the bulk's agents, interleaved "
        f"({n:,} store turns, {n // 2:,} handler turns per arm; a fork of {middle} "
        f"had {messages:,} messages at the end); {load()}"
    )
    print(f"{'arm':<46} {'median ms':>10} {'p90 ms':>8} {'/ empty':>8}")
    for key, values in times.items():
        base = times[key.replace("many", "empty")]
        ratio = statistics.median(values) / statistics.median(base)
        print(
            f"{key:<46} {statistics.median(values) * 1000:>10.3f} "
            f"{statistics.quantiles(values, n=10)[-1] * 1000:>8.3f} {ratio:>8.3f}"
        )


def turns_played(
    dbs: dict[str, str], tag: str, existing: str, n: int, middle: str
) -> dict[str, list[float]]:
    """Seconds of each turn of each arm: ``n`` of the Store's calls of a turn of a new
    agent in each database, then ``n // 2`` whole turns under PersistenceHandler of a
    new agent and of ``existing`` in each; the databases' turns interleaved."""
    from bench_persistence import Below, fake_llm, question
    from bench_store_turn import turn as store_turn
    from effectful.handlers.llm import Template
    from effectful.handlers.llm.completions import LiteLLMProvider
    from effectful.ops.semantics import handler
    from effectful.ops.types import NotHandled

    import effectful_durable
    from effectful_durable import PersistenceHandler, PersistentAgent

    @dataclasses.dataclass
    class Support(PersistentAgent):
        """You are the support agent of an online shop."""

        customer: str = ""
        topic: str = "orders"  # the bulk's agents hold these two fields

        @Template.define
        def ask(self, question: str) -> str:
            """Answer the customer: {question}"""
            raise NotHandled

    times: dict[str, list[float]] = {}
    stores = {name: Store(db) for name, db in dbs.items()}
    parts = {name: {k: [] for k in ("lock", "begin", "commit", "turn")} for name in dbs}
    for name, store in stores.items():  # warm: connections, prepared statements
        for i in range(20):
            store_turn(effectful_durable, store, f"warm-{tag}", i, {k: [] for k in parts[name]})
    order = list(dbs)
    for i in range(n):
        for name in order[i % 2 :] + order[: i % 2]:
            store_turn(effectful_durable, stores[name], f"store-{tag}", i, parts[name])
    for name, store in stores.items():
        times[f"store, new agent, {name}"] = parts[name]["turn"]
        times[f"  of which turns.start, {name}"] = parts[name]["begin"]
        times[f"  of which turns.commit, {name}"] = parts[name]["commit"]
        store.close()
    fake, below = fake_llm(), Below()
    handlers = {name: PersistenceHandler(db) for name, db in dbs.items()}
    arms = [(name, who) for who in ("new", "bulk") for name in dbs]
    bots = {(name, who): Support(agent_id=f"turn-{tag}" if who == "new" else existing)
            for name, who in arms}  # fmt: skip
    walls: dict[tuple[str, str], list[float]] = {arm: [] for arm in arms}
    own: dict[tuple[str, str], list[float]] = {arm: [] for arm in arms}
    with handler(LiteLLMProvider(model="fake")), handler(fake), handler(below):
        for name in dbs:  # warm
            with handler(handlers[name]):
                for i in range(10):
                    Support(agent_id=f"warm-turn-{tag}").ask(question(i))
        for i in range(n // 2):
            for arm in arms[i % len(arms) :] + arms[: i % len(arms)]:
                with handler(handlers[arm[0]]):
                    start = time.perf_counter()
                    bots[arm].ask(question(i))
                    wall = time.perf_counter() - start
                walls[arm].append(wall)
                own[arm].append(wall - below.seconds)
            fake.calls.clear()
    for persistence in handlers.values():
        persistence.close()
    for name, who in arms:
        label = "a new agent" if who == "new" else f"a fork of {middle}"
        times[f"handler, {label}, {name}"] = own[name, who]
        times[f"whole turn, {label}, {name}"] = walls[name, who]
    return times


def served_pages(db: str, runs: int, middle: str) -> None:
    """The agents list and agents' pages from a real ``effectful-durable ui`` process over
    ``db``: the median and p90 of ``runs`` requests each, after one."""
    import psycopg
    from ui_server import serving

    with psycopg.connect(db) as conn:
        row = conn.execute(
            "SELECT agent_id, version FROM agents WHERE agent_id LIKE 'agent-%' "
            "ORDER BY version DESC LIMIT 1"
        ).fetchone()
        largest, versions = (str(row[0]), int(row[1])) if row else ("long", 0)
    rows = [
        ("agents list, first page", "/", 300),
        ("agents list, needs attention", "/?attention=1", 300),
        ("agents list, needs attention, newest first", "/?attention=1&sort=-updated", 300),
        ("agents list, name filter", "/?q=agent-0999", 300),
        ("agents list, newest first", "/?sort=-updated", 300),
        ("agents list, last page", f"/?page={many_pages(db)}", 300),
        (f"first page of {middle}", f"/agent?id={middle}", 200),
        (f"first page of the largest, {largest} ({versions:,} turns)",
         f"/agent?id={largest}", 200),
        ("first page of long", "/agent?id=long", 200),
        ("long: history filter, errors", "/agent?id=long&errors=1", 300),
        ("long: history filter, text found nowhere", "/agent?id=long&text=nowhere", 300),
        ("long: versions page", "/versions?id=long", 300),
    ]  # fmt: skip
    with serving(db) as server, server.client() as client:
        print(f"\npages served by effectful-durable ui, {runs} requests each; {load()}")
        print(f"{'page':<58} {'median ms':>10} {'p90 ms':>8} {'target':>8}")
        for name, path, target in rows:
            status = client.get(path).status_code
            median, p90 = timed(lambda path=path: client.get(path), runs)
            flag = "" if status == 200 else f"  (HTTP {status})"
            print(f"{name:<58} {median:>10.1f} {p90:>8.1f} {f'≤ {target}':>8}{flag}", flush=True)


def many_pages(db: str) -> int:
    """The agents list's last page number."""
    import psycopg

    from effectful_durable.ui.pages.agents import PER_PAGE

    with psycopg.connect(db) as conn:
        row = conn.execute("SELECT count(*) FROM agents").fetchone()
    return max(1, -(-int(row[0] if row else 0) // PER_PAGE))


if __name__ == "__main__":
    main()
