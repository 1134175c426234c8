"""Benchmark: claims, sends and turns as done alarms and events pile up (issue 39, item 3).

For each backend (an SQLite file at the default ``durability="normal"``; a PostgreSQL
database on a throwaway cluster with ``fsync``, ``full_page_writes`` and
``synchronous_commit`` on, as a production server runs), one database per size holds
1,000 / 10,000 / 100,000 / 1,000,000 *done* alarms and events (half of each), written
in bulk as the library leaves them after delivery: 1,000 agents in ``agents``, each
with the versions that scheduled and delivered its rows, its done alarms
(``status = 'done'``, ``ended_in`` the delivering version, no lease, one delivery)
and done events (topic, JSON payload), spread over the last 30 days in time order;
plus one pending alarm per agent due in 30 days (the same 1,000 at every size:
pending work stays, done work piles up). On SQLite each row carries its checksum
(``crc``), computed as the library computes it; on PostgreSQL the rows come from
``INSERT ... SELECT generate_series``, then ``VACUUM ANALYZE`` as autovacuum
would run it.

Then, round-robin over the sizes of a backend (so that other load on the machine
hits every size alike), ``--samples`` times, on one of the agents that hold done
rows, as a runner and the handler drive the Store:

* ``turn``: ``Store.turns.start`` + ``Store.turns.commit`` of a question and an answer
  with an ``AlarmWrite`` that schedules an alarm due now (lock to release);
* ``claim``: ``Store.alarm_queue.claim`` of that alarm (the runner's claim query,
  ``FOR UPDATE SKIP LOCKED`` on PostgreSQL);
* ``deliver``: the turn that delivers it (the claim's ``AlarmWrite.deliver``: the
  alarm is done in its commit);
* ``next_due``: ``Store.alarm_queue.next_due()`` with nothing due, the idle runner's poll;
* ``send``: ``Store.send_event`` (what ``effectful-durable send-event`` does); the
  event is then claimed and delivered, untimed, so that nothing piles up as pending.

Printed per backend and size: median and p90 in milliseconds, and the median's
growth against the smallest size (target: at most 1.10x at 1,000,000). Then the
query plan of every statement the largest database ran in one such cycle
(SQLite: ``EXPLAIN QUERY PLAN``; PostgreSQL: ``EXPLAIN (ANALYZE, BUFFERS)`` of
each read at the moment it ran, plain ``EXPLAIN`` of each write), with
``counts()`` (the runner's status report) beside them. The load average is printed
with the numbers: the machine may be shared.

Run: ``.venv/bin/python bench/bench_claims.py [--quick] [--samples 400]
[--backends sqlite,postgres] [--sizes 1000,10000] [--no-plans] [--dir DIR]``.
``--quick``: sizes 1,000 and 100,000, 60 samples (under a minute). The full run
(up to 1,000,000; most of it writing the rows) takes 3 minutes on 2 cores at load
5, about 7 at load 15. No assertions.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import apsw

from effectful_durable import Store
from effectful_durable.store.alarm_queue import runner_id
from effectful_durable.store.engine.sqlite import row_checks
from effectful_durable.store.history import HistoryChange
from effectful_durable.store.parts.alarms import AlarmWrite, Claim, make_schedule, new_alarm_id

ROOT = Path(__file__).resolve().parent.parent
SIZES = (1_000, 10_000, 100_000, 1_000_000)
QUICK = (1_000, 100_000)
AGENTS = 1_000
DAY = 86_400.0
LEASE = 300.0
OPS = ("claim", "next_due", "send", "turn", "deliver")
QUESTION = ("please look at the order and tell me when it is paid; " * 6)[:300]
ANSWER = ("The order is not paid yet; I will look again when the alarm fires. " * 11)[:700]


def agent_name(a: int) -> str:
    return f"agent-{a:04d}"


# -- the rows ---------------------------------------------------------------------


class Layout:
    """What a database of ``done`` done rows holds; both backends write the same values.

    Row ``g`` (0 <= g < done) is row ``j = g // agents`` of agent ``a = g % agents``
    (rows in time order, agents interleaved, as a fleet writes them): an alarm when
    ``j`` is even, else an event; scheduled (or sent) in version ``j + 1`` and
    delivered by version ``j + 2``, at ``t0 + g * step``. The agent is at version
    ``per_agent + 1``.
    """

    def __init__(self, done: int, now: float) -> None:
        self.agents = min(AGENTS, done)
        self.per_agent = done // self.agents
        self.done = self.per_agent * self.agents
        self.now = now
        self.t0 = now - 30 * DAY
        self.step = 30 * DAY / self.done
        self.future = now + 30 * DAY

    def agent_rows(self) -> Iterator[dict[str, Any]]:
        last = self.t0 + (self.done - 1) * self.step
        for a in range(self.agents):
            yield {
                "agent_id": agent_name(a),
                "version": self.per_agent + 1,
                "created_at": self.t0,
                "updated_at": last,
                "state_in": 1,
            }

    def version_rows(self) -> Iterator[dict[str, Any]]:
        # In key order: the table is clustered on it (WITHOUT ROWID) whatever the order.
        for a in range(self.agents):
            for v in range(1, self.per_agent + 2):
                template = "ask" if v == 1 else ("on_alarm" if v % 2 == 0 else "on_event")
                yield {
                    "agent_id": agent_name(a),
                    "version": v,
                    "kind": "turn",
                    "conversation": "default",
                    "template": template,
                    "state": "{}" if v == 1 else None,
                    "added": 2,
                    "removed": 0,
                    "detail": None,
                    "committed_at": self.t0 + ((v - 1) * self.agents + a) * self.step,
                }

    def alarm_rows(self) -> Iterator[dict[str, Any]]:
        for g in range(self.done):
            j, a = divmod(g, self.agents)
            digest = hashlib.md5(f"{a}:{j}".encode()).hexdigest()
            t = self.t0 + g * self.step
            alarm = j % 2 == 0
            yield {
                "alarm_id": f"alm_{digest[:12]}" if alarm else f"evt_{digest[:16]}",
                "created_in": j + 1,
                "agent_id": agent_name(a),
                "action": f"follow up on order {j}" if alarm else f'{{"order": {j}}}',
                "fire_at": t,
                "due_at": t + LEASE,  # the claim's lease moved it; delivery leaves it
                "every": None,
                "cron": None,
                "timezone": None,
                "status": "done",
                "ended_in": j + 2,
                "attempts": 0,
                "deliveries": 1,
                "last_error": None,
                "lease_owner": None,
                "lease_token": None,
                "created_at": t - 3600 if alarm else t,
                "updated_at": t + 2,
                "kind": "alarm" if alarm else "event",
                "topic": None if alarm else "order_paid",
            }
        for a in range(self.agents):  # one pending alarm per agent, due in 30 days
            digest = hashlib.md5(f"pending:{a}".encode()).hexdigest()
            yield {
                "alarm_id": f"alm_{digest[:12]}",
                "created_in": self.per_agent + 1,
                "agent_id": agent_name(a),
                "action": "send the monthly report",
                "fire_at": self.future + a,
                "due_at": self.future + a,
                "every": None,
                "cron": None,
                "timezone": None,
                "status": "pending",
                "ended_in": None,
                "attempts": 0,
                "deliveries": 0,
                "last_error": None,
                "lease_owner": None,
                "lease_token": None,
                "created_at": self.now,
                "updated_at": self.now,
                "kind": "alarm",
                "topic": None,
            }

    def postgres_sql(self) -> list[str]:
        """The same rows, made by the server (``INSERT ... SELECT generate_series``)."""
        n, k, step, t0 = self.agents, self.per_agent, self.step, self.t0
        agent = "'agent-' || lpad(a::text, 4, '0')"
        return [
            f"""
            INSERT INTO agents (agent_id, version, created_at, updated_at)
            SELECT {agent}, {k + 1}, {t0!r}, {t0 + (self.done - 1) * step!r}
              FROM generate_series(0, {n - 1}) AS a
            """,
            f"""
            INSERT INTO versions (agent_id, version, kind, conversation, template, state,
                                  added, removed, detail, committed_at)
            SELECT {agent}, v, 'turn', 'default',
                   CASE WHEN v = 1 THEN 'ask' WHEN v % 2 = 0 THEN 'on_alarm' ELSE 'on_event' END,
                   CASE WHEN v = 1 THEN '{{}}' END, 2, 0, NULL,
                   {t0!r} + ((v - 1) * {n} + a) * {step!r}
              FROM generate_series(0, {(k + 1) * n - 1}) AS g,
                   LATERAL (SELECT g / {n} + 1 AS v, g % {n} AS a) AS s
            """,
            f"""
            INSERT INTO alarms (alarm_id, created_in, agent_id, action, fire_at, due_at, every,
                                cron, timezone, status, ended_in, attempts, deliveries,
                                last_error, lease_owner, lease_token, created_at, updated_at,
                                kind, topic)
            SELECT CASE WHEN j % 2 = 0 THEN 'alm_' || left(md5(a || ':' || j), 12)
                        ELSE 'evt_' || left(md5(a || ':' || j), 16) END,
                   j + 1, {agent},
                   CASE WHEN j % 2 = 0 THEN 'follow up on order ' || j
                        ELSE '{{"order": ' || j || '}}' END,
                   t, t + {LEASE!r}, NULL, NULL, NULL, 'done', j + 2, 0, 1, NULL, NULL, NULL,
                   CASE WHEN j % 2 = 0 THEN t - 3600 ELSE t END, t + 2,
                   CASE WHEN j % 2 = 0 THEN 'alarm' ELSE 'event' END,
                   CASE WHEN j % 2 = 1 THEN 'order_paid' END
              FROM generate_series(0, {self.done - 1}) AS g,
                   LATERAL (SELECT g / {n} AS j, g % {n} AS a,
                                   {t0!r} + g * {step!r} AS t) AS s
            """,
            f"""
            INSERT INTO alarms (alarm_id, created_in, agent_id, action, fire_at, due_at,
                                status, created_at, updated_at, kind)
            SELECT 'alm_' || left(md5('pending:' || a), 12), {k + 1}, {agent},
                   'send the monthly report', {self.future!r} + a, {self.future!r} + a,
                   'pending', {self.now!r}, {self.now!r}, 'alarm'
              FROM generate_series(0, {n - 1}) AS a
            """,
        ]


def fill_sqlite(path: str, layout: Layout) -> None:
    """Write ``layout``'s rows into the new database at ``path``, checksummed, in one go."""
    Store(path).close()  # the schema
    conn = apsw.Connection(path)
    conn.pragma("cache_size", -400_000)  # 400 MB: the indexes' random inserts stay in memory
    shapes = row_checks.shapes(conn)
    with conn:
        for table, rows in (
            ("agents", layout.agent_rows()),
            ("versions", layout.version_rows()),
            ("alarms", layout.alarm_rows()),
        ):
            shape = shapes[table]
            conn.executemany(
                shape.insert,
                (shape.checksummed([row[c] for c in shape.columns]) for row in rows),
            )
    conn.close()


def fill_postgres(url: str, layout: Layout) -> None:
    """Have the server write ``layout``'s rows, then vacuum and analyze as autovacuum would."""
    import psycopg

    Store(url).close()  # the schema
    with psycopg.connect(url) as conn:
        for sql in layout.postgres_sql():
            conn.execute(sql.encode())
    with psycopg.connect(url, autocommit=True) as conn:
        for table in ("agents", "versions", "alarms"):
            conn.execute(f"VACUUM ANALYZE {table}".encode())
        conn.execute(b"CHECKPOINT")


# -- one cycle ----------------------------------------------------------------------


def change(version: int) -> HistoryChange:
    question = {"id": f"q{version}", "role": "user", "content": QUESTION}
    answer = {"id": f"a{version}", "role": "assistant", "content": ANSWER}
    return HistoryChange([(2.0 * version, question), (2.0 * version + 1, answer)], [], 0)


def deliver(store: Store, claim: Claim, template: str) -> None:
    """The runner's turn that delivers ``claim``: it is done in the commit."""
    agent = claim.agent_id
    with store.turns.start(agent, template=template, arguments=[claim.alarm_id]) as start:
        write = AlarmWrite()
        write.deliver(claim, None, time.time())
        store.turns.commit(
            agent,
            base_version=start.version,
            template=template,
            change=change(start.version),
            state=None,
            writes=[write],
        )


def schedule_turn(store: Store, agent: str, alarm_id: str) -> None:
    """A turn of ``agent`` that schedules the alarm ``alarm_id``, due now."""
    with store.turns.start(agent, template="ask", arguments={"q": "later"}) as start:
        now = time.time()
        write = AlarmWrite()
        write.schedule(alarm_id, "look at the order again", make_schedule(now, delay=0), now)
        store.turns.commit(
            agent,
            base_version=start.version,
            template="ask",
            change=change(start.version),
            state=None,
            writes=[write],
        )


def cycle(store: Store, agent: str, owner: str, times: dict[str, list[float]]) -> None:
    """Schedule, claim and deliver an alarm due now; poll; send, claim and deliver an event."""
    clock = time.perf_counter
    alarm_id = new_alarm_id()
    t0 = clock()
    schedule_turn(store, agent, alarm_id)
    t1 = clock()
    claim = store.alarm_queue.claim(owner, time.time(), LEASE)
    t2 = clock()
    if claim is None or claim.alarm_id != alarm_id:
        sys.exit(f"bench_claims: claimed {claim!r}, not the alarm {alarm_id} just scheduled")
    deliver(store, claim, "on_alarm")
    t3 = clock()
    due = store.alarm_queue.next_due()
    t4 = clock()
    if due is None or due < time.time():
        sys.exit(f"bench_claims: next_due() = {due!r} with nothing due")
    event = store.send_event(agent, "order_paid", {"order": alarm_id})
    t5 = clock()
    claim = store.alarm_queue.claim(owner, time.time(), LEASE)
    if claim is None or claim.alarm_id != event.event_id:
        sys.exit(f"bench_claims: claimed {claim!r}, not the event {event.event_id} just sent")
    deliver(store, claim, "on_event")
    for op, seconds in zip(OPS, (t2 - t1, t4 - t3, t5 - t4, t1 - t0, t3 - t2), strict=True):
        times[op].append(seconds)


def measure(
    stores: dict[int, Store], samples: int, warm: Callable[[], None] = lambda: None
) -> dict[int, dict[str, list[float]]]:
    """``samples`` cycles on each store, round-robin; each op's seconds per size.

    ``warm`` runs after the warm-up cycles, before the timed ones.
    """
    owner = runner_id()
    times = {size: {op: [] for op in OPS} for size in stores}
    sizes = list(stores)
    for size in sizes:  # statements compiled, caches warm
        for w in range(5):
            cycle(stores[size], agent_name(w * 37 % AGENTS), owner, {op: [] for op in OPS})
    warm()
    for i in range(samples):
        agent = agent_name(i * 7919 % AGENTS)  # a different agent each time, spread out
        for size in sizes[i % len(sizes) :] + sizes[: i % len(sizes)]:
            cycle(stores[size], agent, owner, times[size])
    return times


# -- tables ---------------------------------------------------------------------------


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1]


def table(
    title: str,
    times: dict[int, dict[str, list[float]]],
    sizes_on_disk: dict[int, float],
) -> None:
    base = min(times)
    print(f"\n{title}")
    print("median / p90 ms, and the median's growth vs the smallest size")
    head = f"{'done rows':>10} {'MB':>6}" + "".join(f"{op:>22}" for op in OPS)
    print(head)
    print("-" * len(head))
    for size, ops in sorted(times.items()):
        cells = []
        for op in OPS:
            med, high = statistics.median(ops[op]) * 1e3, p90(ops[op]) * 1e3
            ratio = med / (statistics.median(times[base][op]) * 1e3)
            cells.append(f"{med:7.3f} /{high:7.3f} {ratio:4.2f}x")
        print(f"{size:>10,} {sizes_on_disk[size]:6.0f}" + "".join(f"{c:>22}" for c in cells))


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


# -- plans ------------------------------------------------------------------------------

_DML = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|WITH)\b", re.IGNORECASE)
# Ours (plpgsql: keyed reads inside), locks and settings: no plan worth showing.
_SKIP = re.compile(r"effectful_durable_|pg_advisory|set_config|pg_current_wal|^\s*SELECT 1\b")


def one_line(sql: str) -> str:
    return re.sub(r"\s+", " ", sql).strip()


def print_plans(plans: list[tuple[str, str, list[str]]]) -> None:
    seen = set()
    for step, sql, plan in plans:
        if sql in seen:
            continue
        seen.add(sql)
        print(f"\n[{step}] {one_line(sql)}")
        for line in plan:
            print(f"    {line}")


def sqlite_plans(path: str, store: Store) -> None:
    """Trace the statements of one cycle on the store's connection, and plan each."""
    explain = apsw.Connection(path)
    row_checks.register(explain)
    row_checks.install(explain, path)
    statements: list[tuple[str, Any]] = []

    def tracer(cursor: apsw.Cursor, sql: str, bindings: Any) -> bool:
        if _DML.match(sql):
            statements.append((sql, bindings))
        return True

    plans: list[tuple[str, str, list[str]]] = []
    conn = store.engine.connection()
    for step, run in steps(store):
        statements.clear()
        conn.exec_trace = tracer
        try:
            run()
        finally:
            conn.exec_trace = None
        for sql, bindings in statements:
            rows = explain.execute(f"EXPLAIN QUERY PLAN {sql}", bindings).fetchall()
            depth: dict[int, int] = {0: -1}
            lines = []
            for node, parent, _, detail in rows:
                depth[node] = depth.get(parent, -1) + 1
                lines.append("  " * depth[node] + str(detail))
            plans.append((step, sql, lines or ["(no plan: a plain insert)"]))
    explain.close()
    print_plans(plans)


@contextmanager
def postgres_capture(url: str) -> Iterator[Callable[[str], list[tuple[str, str, list[str]]]]]:
    """Plan every statement the Store's connections run, while asked, on a side connection.

    A read is explained with ANALYZE at the moment it runs (the side connection
    sees what is committed then, and skips the rows others lock); a write is
    planned only, never run.
    """
    import psycopg

    side = psycopg.connect(url)
    state: dict[str, Any] = {"into": None}
    execute, executemany = psycopg.Cursor.execute, psycopg.Cursor.executemany

    def explain(cursor: Any, query: Any, params: Any) -> None:
        into = state["into"]
        if cursor.connection is side or into is None or not isinstance(query, str):
            return
        if _DML.match(query) and not _SKIP.search(query):
            read = query.lstrip().upper().startswith(("SELECT", "WITH"))
            how = "ANALYZE, BUFFERS, COSTS OFF, TIMING OFF, SUMMARY OFF" if read else "COSTS OFF"
            rows = execute(side.cursor(), f"EXPLAIN ({how}) {query}", params).fetchall()
            side.rollback()
            into.append((state["step"], query, [str(r[0]) for r in rows]))

    def traced(self: Any, query: Any, params: Any = None, *args: Any, **kwargs: Any) -> Any:
        explain(self, query, params)
        return execute(self, query, params, *args, **kwargs)

    def traced_many(self: Any, query: Any, params_seq: Any, *args: Any, **kwargs: Any) -> Any:
        params_seq = list(params_seq)
        if params_seq:
            explain(self, query, params_seq[0])
        return executemany(self, query, params_seq, *args, **kwargs)

    psycopg.Cursor.execute = traced  # type: ignore[method-assign]
    psycopg.Cursor.executemany = traced_many  # type: ignore[method-assign]

    def start(step: str) -> list[tuple[str, str, list[str]]]:
        state["into"] = []
        state["step"] = step
        return state["into"]  # type: ignore[no-any-return]

    try:
        yield start
    finally:
        psycopg.Cursor.execute = execute  # type: ignore[method-assign]
        psycopg.Cursor.executemany = executemany  # type: ignore[method-assign]
        side.close()


def postgres_plans(store: Store, capture: Callable[[str], list[Any]]) -> None:
    plans: list[tuple[str, str, list[str]]] = []
    for step, run in steps(store):
        statements = capture(step)
        run()
        plans.extend(statements)
    print_plans(plans)


def steps(store: Store) -> list[tuple[str, Callable[[], None]]]:
    """One cycle, a step at a time, for the plans; then the status report's counts."""
    owner, agent = runner_id(), agent_name(500)
    held: dict[str, Any] = {}

    def claim() -> None:
        held["claim"] = store.alarm_queue.claim(owner, time.time(), LEASE)

    def send() -> None:
        store.send_event(agent, "order_paid", {"order": 1})

    return [
        ("turn", lambda: schedule_turn(store, agent, new_alarm_id())),
        ("next_due", lambda: store.alarm_queue.next_due()),
        ("claim", claim),
        ("deliver", lambda: deliver(store, held["claim"], "on_alarm")),
        ("send", send),
        ("claim", claim),
        ("deliver", lambda: deliver(store, held["claim"], "on_event")),
        ("counts", lambda: store.alarm_queue.counts(time.time())),
    ]


# -- the backends -----------------------------------------------------------------------


def run_sqlite(sizes: list[int], samples: int, directory: str, plans: bool) -> None:
    paths = {}
    for size in sizes:
        paths[size] = os.path.join(directory, f"done-{size}.db")
        began = time.perf_counter()
        fill_sqlite(paths[size], Layout(size, time.time()))
        print(f"sqlite: {size:,} done rows written in {time.perf_counter() - began:.1f} s",
              file=sys.stderr, flush=True)  # fmt: skip
    stores = {size: Store(path) for size, path in paths.items()}
    print(f"sqlite: measuring ({load()})", file=sys.stderr, flush=True)
    before = load()
    times = measure(stores, samples)
    after = load()
    mb = {
        size: sum(os.path.getsize(p) for p in (path, f"{path}-wal") if os.path.exists(p)) / 1e6
        for size, path in paths.items()
    }
    table(
        f"SQLite file (durability normal), {samples} cycles per size; "
        f"{before} before, {after} after",
        times,
        mb,
    )
    if plans:
        largest = max(sizes)
        print(f"\nSQLite: EXPLAIN QUERY PLAN at {largest:,} done rows")
        sqlite_plans(paths[largest], stores[largest])
    for store in stores.values():
        store.close()


def durable_server() -> Any:
    """tests/support/postgres_server.py's throwaway cluster, with fsync on as in production."""
    sys.path.insert(0, str(ROOT / "tests" / "support"))
    from postgres_server import PostgresServer, find_bindir, unavailable

    class Durable(PostgresServer):
        def _pg_ctl(self, action: str) -> None:
            options = (
                f"-c listen_addresses='' -c unix_socket_directories='{self.directory}' "
                "-c fsync=on -c full_page_writes=on -c synchronous_commit=on "
                "-c max_connections=100 -c shared_buffers=128MB "
                "-c logging_collector=on -c log_destination=csvlog"
            )
            self._run("pg_ctl", "-D", self.data, "-o", options, "-l", self.log, "-w", action)

    reason = unavailable()
    if reason is not None:
        sys.exit(f"bench_claims: {reason}")
    bindir = find_bindir()
    assert bindir is not None
    return Durable(bindir)


# The statements whose time on the server is shown, by what they do: a pattern of
# their text in the server's log (whitespace made single spaces).
STATEMENTS = {
    "claim: select": r"FOR UPDATE SKIP LOCKED",
    "claim: lease": r"^UPDATE alarms SET lease_owner = \$\d+, lease_token",
    "next_due": r"^SELECT due_at FROM alarms AS a WHERE status = 'pending'",
    "send: insert": r"^INSERT INTO alarms .*'event'",
    "send: read": r"FROM alarms WHERE alarm_id = \$\d+ AND kind = 'event'",
    "turn: start": r"effectful_durable_take\(",
    "turn: alarm": r"^INSERT INTO alarms \(alarm_id, [\w, ]*, every, cron",
    "deliver: done": r"^UPDATE alarms SET status = 'done', ended_in = ",
    "COMMIT": r"^COMMIT$",
}
_DURATION = re.compile(r"duration: ([0-9.]+) ms  (?:execute [^:]*|statement): (.*)", re.DOTALL)


def server_log(server: Any, on: bool) -> None:
    """Have the server log every statement's duration (csvlog), or none."""
    server.admin(f"ALTER SYSTEM SET log_min_duration_statement = {0 if on else -1}")
    server.admin("SELECT pg_reload_conf()")
    time.sleep(0.5)  # backends apply it at their next command; the collector writes


def statement_times(server: Any, urls: dict[int, str]) -> dict[int, dict[str, list[float]]]:
    """Each of STATEMENTS' server times (ms) per size, from the server's csvlog; and
    ``all``: every statement's."""
    import csv

    names = {url.rpartition("/")[2]: size for size, url in urls.items()}
    found: dict[int, dict[str, list[float]]] = {size: {} for size in urls}
    for path in sorted(Path(server.data, "log").glob("*.csv")):
        with open(path, newline="") as log:
            for row in csv.reader(log):
                if len(row) < 14 or row[2] not in names:
                    continue
                matched = _DURATION.match(row[13])
                if matched is None:
                    continue
                ms, text = float(matched[1]), one_line(matched[2])
                times = found[names[row[2]]]
                times.setdefault("all", []).append(ms)
                for what, pattern in STATEMENTS.items():
                    if re.search(pattern, text):
                        times.setdefault(what, []).append(ms)
    return found


def server_table(found: dict[int, dict[str, list[float]]], samples: int) -> None:
    base = min(found)
    print(
        "\nPostgreSQL server time (log_min_duration_statement = 0): median / p90 ms of "
        "each statement's execution, its count,\nand its median's growth vs the smallest "
        f"size; 'all': the server's time per cycle (every statement, / {samples})"
    )
    print(f"{'statement':<16}" + "".join(f"{size:>28,}" for size in sorted(found)))
    for name in [*STATEMENTS, "all"]:
        cells = []
        for size in sorted(found):
            values = found[size].get(name) or [float("nan")]
            first = found[base].get(name) or [float("nan")]
            if name == "all":
                cells.append(f"{sum(values) / samples:10.3f} {sum(values) / sum(first):5.2f}x")
                continue
            med = statistics.median(values)
            cells.append(
                f"{med:7.3f} /{p90(values) if len(values) > 1 else med:7.3f} "
                f"{len(values):5} {med / statistics.median(first):4.2f}x"
            )
        print(f"{name:<16}" + "".join(f"{c:>28}" for c in cells))


def run_postgres(sizes: list[int], samples: int, plans: bool) -> None:
    import psycopg

    server = durable_server()
    server.start()
    try:
        urls = {}
        for size in sizes:
            urls[size] = server.new_database()
            began = time.perf_counter()
            fill_postgres(urls[size], Layout(size, time.time()))
            print(f"postgres: {size:,} done rows written in {time.perf_counter() - began:.1f} s",
                  file=sys.stderr, flush=True)  # fmt: skip
        stores = {size: Store(url) for size, url in urls.items()}
        print(f"postgres: measuring ({load()})", file=sys.stderr, flush=True)
        before = load()
        times = measure(stores, samples, lambda: server_log(server, True))
        after = load()
        server_log(server, False)
        server_times = statement_times(server, urls)
        mb = {}
        for size, url in urls.items():
            with psycopg.connect(url) as conn:
                found = conn.execute("SELECT pg_database_size(current_database())").fetchone()
                mb[size] = found[0] / 1e6 if found else 0.0
        table(
            f"PostgreSQL 15, fsync on, Unix socket, {samples} cycles per size; "
            f"{before} before, {after} after",
            times,
            mb,
        )
        server_table(server_times, samples)
        if plans:
            largest = max(sizes)
            print(f"\nPostgreSQL: plans at {largest:,} done rows")
            with postgres_capture(urls[largest]) as capture:
                postgres_plans(stores[largest], capture)
        for store in stores.values():
            store.close()
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="sizes 1,000 and 100,000")
    parser.add_argument("--sizes", help="comma-separated numbers of done rows")
    parser.add_argument("--samples", type=int, help="cycles per size (400; 60 with --quick)")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--no-plans", action="store_true", help="skip the query plans")
    parser.add_argument("--dir", help="parent directory of the SQLite files")
    args = parser.parse_args()
    sizes = list(QUICK if args.quick else SIZES)
    if args.sizes:
        sizes = [int(s.replace("_", "")) for s in args.sizes.split(",")]
    samples = args.samples or (60 if args.quick else 400)
    backends = args.backends.split(",")
    print(f"bench_claims: sizes {sizes}, {samples} cycles each; {load()}")
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        if "sqlite" in backends:
            run_sqlite(sizes, samples, directory, not args.no_plans)
        if "postgres" in backends:
            run_postgres(sizes, samples, not args.no_plans)
    print(f"\n{load()}; {time.perf_counter() - began:.0f} s in all")


if __name__ == "__main__":
    main()
