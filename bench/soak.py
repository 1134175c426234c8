"""Soak: worker processes run agents' turns on one database while a supervisor SIGKILLs them.

``make soak`` runs it for 2 minutes per durability setting; ``tests/processes/test_soak.py`` runs a
short version. What runs (the processes are in ``bench/soak_worker.py``):

* ``--workers`` worker processes (default 4), each driving ``--agents`` agents (16) from
  ``--threads`` threads (4) against one database file, with the offline ``FakeLLM``.
  Agents come in four kinds, by index: ``mem`` agents put keys in their memory
  (``StateTools``), ``sql`` agents write their own table (``SQLTools``), ``alarm`` agents
  schedule alarms (``AlarmTools``), and ``wf`` agents run as workflow steps
  (``PersistenceHandler(..., workflow=...)``, four steps per workflow, which a restarted
  worker resumes). Every kind bumps a persisted field in some turns, and
  ``CompactionHandler(max_messages=16)`` compacts every few turns.
* One ``AgentRunner`` process delivers the alarms as turns of their agents.
* The supervisor (this process) SIGKILLs a random worker or the runner every
  ``--kill-every`` seconds on average and starts it again; at the end it stops the
  workers with SIGTERM, lets the runner deliver what is due, and stops it.

Each turn's question carries a unique marker and its plan (``Q[w1.3.17] bump mem:4``), and
each process keeps a side log outside the database (append-only, fsynced, one per process)
of every turn whose template call returned, with the marker and the version it committed,
and of every model call of a workflow step or an alarm delivery. A checker reads the side
logs, then the database through a fresh read-only connection, every ``--check-every``
seconds and at the end, and verifies:

* lost turns: every logged turn is in the database at the version the worker saw;
* partial turns: every committed turn holds all its plan's writes (the memory key, the
  table's change, the alarm, the field), and no row belongs to a version not committed;
* duplicated steps: no workflow step's model call came after the step was recorded done
  (in the side log, or after its ``finished_at``), no marker is committed twice;
* alarms: each one scheduled by a committed turn is delivered exactly once or pending;
  delivery turns run again after a kill are counted (the docs allow them: a delivery cut
  off commits nothing and is tried again);
* version numbers per agent are 1..v with no gap; ``PRAGMA integrity_check`` is ok.

The turn overhead printed is the handler's own time: a turn's wall time in
``PersistenceHandler`` minus the time below it (a timing handler on each side) and minus
the time it waited for its agent's lock (printed apart), i.e. the handoff commit, loading
when another process moved the agent, and the commit, SQLite's write lock included; then
the same as this thread's CPU time, which the other threads and processes on the cores
do not inflate; and, for comparison, a turn's whole wall time minus the fake model's.

Run: ``.venv/bin/python bench/soak.py [--durability normal|full|both] [--duration 120]
[--workers 4] [--agents 16] [--json FILE]``. Exit status 1 if anything was lost,
duplicated or damaged.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import queue
import random
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, TextIO

import apsw

from effectful_durable import Store
from effectful_durable.store.engine.sqlite.connection import connect

WORKER = Path(__file__).with_name("soak_worker.py")
KINDS = ("mem", "sql", "alarm", "wf")
STEPS = 4  # steps per workflow
SLOTS = 8  # memory keys and table rows an agent cycles through
WAIT = 10.0  # seconds a worker's turn waits for its agent (the runner may hold it)
LOAD_TIMEOUT = 300.0  # the zygote imports litellm, on a machine busy with other work

# The question of a turn: its marker, then its plan; found in the user message's JSON.
QUESTION = re.compile(r"Q\[([\w.\-]+)\]([^\"\\]*)")
# The on_alarm prompt ends with the action, which names the scheduling turn's marker.
ALARM_ACTION = re.compile(r"The alarm's action: alarm ([\w.\-]+)")
STEP_MARKER = re.compile(r"(wf-.+)\.s(\d+)")


def agent_id(worker: int, index: int) -> str:
    """The id of a worker's agent; its kind is the middle part."""
    return f"w{worker}-{KINDS[index % len(KINDS)]}-{index:02d}"


def shared_id(index: int) -> str:
    """The id of an agent every worker drives: memory and SQL agents, alternately."""
    return f"shared-{('mem', 'sql')[index % 2]}-{index:02d}"


def kind_of(agent: str) -> str:
    return agent.split("-")[1]


def workflow_name(agent: str, epoch: int) -> str:
    return f"wf-{agent}-{epoch}"


def step_key(marker: str) -> tuple[str, str] | None:
    """The journal key ``(workflow, "<agent>#<step>")`` of a workflow step's marker."""
    found = STEP_MARKER.fullmatch(marker)
    if found is None:
        return None
    workflow = found[1]
    agent = workflow.removeprefix("wf-").rpartition("-")[0]
    return workflow, f"{agent}#{found[2]}"


def question(marker: str, plan: Plan) -> str:
    return f"Q[{marker}] {plan.text()}".rstrip()


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a turn does, drawn from its marker so that a re-run step asks the same."""

    bump: bool = False
    mem: int | None = None  # put_state(f"k{mem}", marker)
    sql: int | None = None  # INSERT OR REPLACE INTO notes (slot, marker)
    alarm: float | None = None  # schedule_alarm(delay, "alarm <marker>")
    every: float | None = None  # ... repeating at this interval

    @classmethod
    def draw(cls, marker: str, kind: str) -> Plan:
        rng = random.Random(marker)
        bump = rng.random() < 0.3
        mem = rng.randrange(SLOTS) if kind in ("mem", "wf") and rng.random() < 0.5 else None
        sql = rng.randrange(SLOTS) if kind == "sql" and rng.random() < 0.5 else None
        alarm = every = None
        if kind == "alarm" and rng.random() < 0.3:
            alarm = round(rng.uniform(0, 2), 2)
            every = 60.0 if rng.random() < 0.03 else None
        return cls(bump, mem, sql, alarm, every)

    def text(self) -> str:
        words = ["bump"] if self.bump else []
        words += [f"mem:{self.mem}"] if self.mem is not None else []
        words += [f"sql:{self.sql}"] if self.sql is not None else []
        words += [f"alarm:{self.alarm:g}"] if self.alarm is not None else []
        words += [f"every:{self.every:g}"] if self.every is not None else []
        return " ".join(words)

    @classmethod
    def parse(cls, text: str) -> Plan:
        found: dict[str, Any] = {}
        for word in text.split():
            name, _, value = word.partition(":")
            found[name] = (
                True if name == "bump" else (int if name in ("mem", "sql") else float)(value)
            )
        return cls(**found)


# -- side logs ------------------------------------------------------------------


@dataclasses.dataclass
class Logs:
    """Every process's side log: worker events by worker (in start order), runner events."""

    workers: dict[int, list[dict[str, Any]]]
    runner: list[dict[str, Any]]
    bad_lines: int


def read_logs(logdir: Path) -> Logs:
    """Parse the side logs; a torn last line (a kill mid-write) is skipped, others counted."""
    workers: dict[int, list[dict[str, Any]]] = collections.defaultdict(list)
    runner: list[dict[str, Any]] = []
    bad = 0
    # <role>-<index>-<start number>-<pid>.jsonl: in start order, each in event order.
    for path in sorted(logdir.glob("*.jsonl"), key=_log_order):
        lines = path.read_bytes().split(b"\n")
        events = []
        for n, line in enumerate(lines):
            if not line:
                continue
            try:
                events.append(json.loads(line))
            except ValueError:
                bad += n < len(lines) - 1  # only the last line may be cut
        role, *rest = path.stem.split("-")
        if role == "worker":
            workers[int(rest[0])].extend(events)
        else:
            runner.extend(events)
    return Logs(dict(workers), runner, bad)


def _log_order(path: Path) -> tuple[str, int, int]:
    role, index, start, _ = path.stem.split("-")
    return (role, int(index), int(start))


def workflows_in_progress(logdir: Path, worker: int) -> dict[str, tuple[int, bool]]:
    """Per wf agent of ``worker``: its last workflow epoch and whether it ended."""
    last: dict[str, tuple[int, bool]] = {}
    for event in read_logs(logdir).workers.get(worker, []):
        if event["e"] == "wf-start":
            last[event["a"]] = (event["epoch"], False)
        elif event["e"] == "wf-end":
            last[event["a"]] = (event["epoch"], True)
    return last


# -- the checker ------------------------------------------------------------------


@dataclasses.dataclass
class Findings:
    """What one check of the database against the side logs found."""

    turns: int = 0  # committed versions of kind 'turn'
    asks: int = 0
    steps: int = 0  # workflow steps done
    alarm_turns: int = 0
    compactions: int = 0
    logged_turns: int = 0
    replays: int = 0
    lost_turns: int = 0
    wrong_version: int = 0
    partial_turns: int = 0
    uncommitted_rows: int = 0
    duplicated_turns: int = 0
    duplicated_steps: int = 0
    alarms_scheduled: int = 0
    alarms_recurring: int = 0
    alarms_delivered: int = 0
    alarms_pending: int = 0
    alarms_dead: int = 0
    alarms_lost: int = 0
    duplicated_deliveries: int = 0
    recurring_deliveries: int = 0
    rerun_deliveries: int = 0  # allowed by the alarm docs; known only at the end
    version_gaps: int = 0
    integrity_ok: bool = False
    workspaces_checked: int = 0
    workspaces_bad: int = 0
    bad_log_lines: int = 0
    problems: list[str] = dataclasses.field(default_factory=list)

    def problem(self, text: str) -> None:
        if len(self.problems) < 30:
            self.problems.append(text)

    @property
    def losses(self) -> int:
        """Everything that must be 0."""
        return (
            self.lost_turns
            + self.wrong_version
            + self.partial_turns
            + self.uncommitted_rows
            + self.duplicated_turns
            + self.duplicated_steps
            + self.alarms_lost
            + self.duplicated_deliveries
            + self.version_gaps
            + self.workspaces_bad
            + self.bad_log_lines
            + (not self.integrity_ok)
        )


@dataclasses.dataclass
class _Db:
    """The rows the checker needs, read in one snapshot."""

    agents: dict[str, int]
    versions: dict[str, dict[int, tuple[str, str | None]]]
    questions: dict[str, list[tuple[str, int, str]]]  # marker -> (agent, added_in, plan)
    delivered: collections.Counter[str]  # alarm marker -> committed on_alarm turns
    memory: dict[tuple[str, str, int], str]
    memory_now: dict[tuple[str, str], str]  # (agent, key) -> value at the agent's version
    sql_versions: set[tuple[str, int]]
    alarms: dict[str, list[tuple[Any, ...]]]  # marker -> rows
    steps: dict[tuple[str, str], tuple[str, int | None, float | None]]
    counts: dict[str, int]  # agent -> its persisted count
    uncommitted: int
    integrity: str


def _read(db: Path) -> _Db:
    conn = connect(str(db), readonly=True)
    try:
        conn.execute("BEGIN")
        agents = {a: v for a, v in conn.execute("SELECT agent_id, version FROM agents")}
        versions: dict[str, dict[int, tuple[str, str | None]]] = collections.defaultdict(dict)
        for a, v, kind, template in conn.execute(
            "SELECT agent_id, version, kind, template FROM versions"
        ):
            versions[a][v] = (kind, template)
        questions: dict[str, list[tuple[str, int, str]]] = collections.defaultdict(list)
        delivered: collections.Counter[str] = collections.Counter()
        for a, added_in, body in conn.execute(
            "SELECT agent_id, added_in, body FROM messages WHERE role = 'user'"
        ):
            for found in QUESTION.finditer(body):
                questions[found[1]].append((a, added_in, found[2]))
            for found in ALARM_ACTION.finditer(body):
                delivered[found[1]] += 1
        memory = {
            (a, key, added_in): value
            for a, key, added_in, value in conn.execute(
                "SELECT agent_id, key, added_in, value FROM memory WHERE kind = 'key'"
            )
        }
        memory_now = {
            (a, key): value
            for a, key, value in conn.execute(
                "SELECT agent_id, key, value FROM memory WHERE kind = 'key' AND removed_in IS NULL"
            )
        }
        sql_versions = {
            (a, v) for a, v in conn.execute("SELECT DISTINCT agent_id, version FROM workspace_log")
        }
        alarms: dict[str, list[tuple[Any, ...]]] = collections.defaultdict(list)
        for row in conn.execute(
            "SELECT action, alarm_id, agent_id, created_in, status, deliveries, every,"
            " last_error FROM alarms ORDER BY created_in"
        ):
            alarms[row[0].removeprefix("alarm ")].append(row[1:])
        steps = {
            (w, key): (status, version, finished)
            for w, key, status, version, finished in conn.execute(
                "SELECT workflow, step_key, status, version, finished_at FROM workflow_steps"
            )
        }
        counts = {
            a: json.loads(state).get("count", 0)
            for a, state in conn.execute(
                """
                SELECT agent_id, state FROM versions AS v
                 WHERE state IS NOT NULL AND version = (
                       SELECT max(version) FROM versions AS w
                        WHERE w.agent_id = v.agent_id AND w.state IS NOT NULL)
                """
            )
        }
        # No row may belong to a version its agent has not committed.
        uncommitted = sum(
            conn.execute(
                f"SELECT count(*) FROM {table} AS t JOIN agents AS a USING (agent_id)"
                f" WHERE t.{column} > a.version"
            ).get
            for table, column in (
                ("versions", "version"),
                ("messages", "added_in"),
                ("messages", "removed_in"),
                ("memory", "added_in"),
                ("workspace_log", "version"),
                ("alarms", "created_in"),
                ("compactions", "version"),
            )
        )
        conn.execute("COMMIT")
        integrity = "; ".join(str(r[0]) for r in conn.execute("PRAGMA integrity_check"))
    finally:
        conn.close()
    return _Db(
        agents,
        dict(versions),
        dict(questions),
        delivered,
        memory,
        memory_now,
        sql_versions,
        dict(alarms),
        steps,
        counts,
        uncommitted,
        integrity,
    )


def check(db: Path, logdir: Path, *, final: bool = False) -> Findings:
    """Compare the side logs with the database (read after them, in one snapshot)."""
    logs = read_logs(logdir)  # first: every turn logged here committed before the read
    data = _read(db)
    f = Findings(bad_log_lines=logs.bad_lines, integrity_ok=data.integrity == "ok")
    if not f.integrity_ok:
        f.problem(f"integrity_check: {data.integrity[:500]}")
    f.uncommitted_rows = data.uncommitted
    if data.uncommitted:
        f.problem(f"{data.uncommitted} rows belong to versions not committed")
    _check_versions(f, data)
    expected_tables = _check_committed_turns(f, data)
    _check_logged_turns(f, data, logs)
    _check_alarms(f, data, logs, final=final)
    if final:
        _check_workspaces(f, db, data, expected_tables)
        _check_histories(f, db, data)
    return f


def _check_versions(f: Findings, data: _Db) -> None:
    for a, version in data.agents.items():
        found = data.versions.get(a, {})
        if sorted(found) != list(range(1, version + 1)):
            f.version_gaps += 1
            f.problem(f"{a}: versions {sorted(found)[:5]}... are not 1..{version}")
        for kind, template in found.values():
            f.turns += kind == "turn"
            f.asks += template == "ask"
            f.alarm_turns += template == "on_alarm"
            f.compactions += kind == "compaction"
    f.steps = sum(status == "done" for status, _, _ in data.steps.values())


def _check_committed_turns(f: Findings, data: _Db) -> dict[str, dict[int, tuple[int, str]]]:
    """Each committed question's turn holds all its plan's writes; returns the tables' rows."""
    bumps: collections.Counter[str] = collections.Counter()
    tables: dict[str, dict[int, tuple[int, str]]] = collections.defaultdict(dict)
    keys: dict[tuple[str, str], tuple[int, str]] = {}  # the last committed put of each key
    for marker, rows in data.questions.items():
        if len(rows) > 1:
            if step_key(marker):
                f.duplicated_steps += 1
            else:
                f.duplicated_turns += 1
            f.problem(f"{marker} is committed {len(rows)} times: {rows}")
        a, v, plan_text = rows[0]
        plan = Plan.parse(plan_text)
        key = step_key(marker)
        if data.versions.get(a, {}).get(v, ("",))[0] != "turn":
            f.partial_turns += 1
            f.problem(f"{marker}: its question is in {a} v{v}, which is not a turn")
        if plan.bump:
            bumps[a] += 1
        if plan.mem is not None:
            if data.memory.get((a, f"k{plan.mem}", v)) != json.dumps(marker):
                f.partial_turns += 1
                f.problem(f"{marker}: {a} v{v} committed without its memory key k{plan.mem}")
            if keys.get((a, f"k{plan.mem}"), (0, ""))[0] < v:
                keys[(a, f"k{plan.mem}")] = (v, json.dumps(marker))
        if plan.sql is not None:
            if (a, v) not in data.sql_versions:
                f.partial_turns += 1
                f.problem(f"{marker}: {a} v{v} committed without its SQL change")
            if tables[a].get(plan.sql, (0, ""))[0] < v:
                tables[a][plan.sql] = (v, marker)
        if plan.alarm is not None:
            found = data.alarms.get(marker, [])
            if not any(row[1] == a and row[2] == v for row in found):
                f.partial_turns += 1
                f.problem(f"{marker}: {a} v{v} committed without its alarm ({found})")
        if key is not None:
            status, version, _ = data.steps.get(key, ("missing", None, None))
            if status != "done" or version != v:
                f.partial_turns += 1
                f.problem(f"{marker}: {a} v{v} committed, its step is {status} at v{version}")
    now = {key: value for key, (_, value) in keys.items()}
    if data.memory_now != now:
        wrong = sorted(set(now.items()) ^ set(data.memory_now.items()))
        f.partial_turns += 1
        f.problem(f"the memory now is not the committed turns' last puts: {wrong[:4]}")
    for a in data.agents:
        if data.counts.get(a, 0) != bumps[a]:
            f.partial_turns += 1
            f.problem(f"{a}: count is {data.counts.get(a, 0)}, committed bumps {bumps[a]}")
    return tables


def _check_logged_turns(f: Findings, data: _Db, logs: Logs) -> None:
    """Every turn a worker saw return is on disk at its version; no step re-ran after done."""
    for events in logs.workers.values():
        done: set[str] = set()
        for event in events:
            if event["e"] in ("turn", "replay"):
                marker = event["m"]
                if event["e"] == "turn":
                    f.logged_turns += 1
                    rows = data.questions.get(marker)
                    if not rows or rows[0][0] != event["a"]:
                        f.lost_turns += 1
                        f.problem(f"lost: {event['a']} {marker}, logged at v{event['v']}")
                    elif not _at_version(data, event["a"], rows[0][1], event["v"]):
                        f.wrong_version += 1
                        f.problem(f"{marker}: committed at v{rows[0][1]}, logged v{event['v']}")
                else:
                    f.replays += 1
                if key := step_key(marker):
                    if data.steps.get(key, ("missing",))[0] != "done":
                        f.lost_turns += 1
                        f.problem(f"step {key} returned ({event['e']}) but is not done")
                    done.add(marker)
            elif event["e"] == "call":
                marker = event["m"]
                key = step_key(marker)
                assert key is not None
                status, _, finished = data.steps.get(key, ("missing", None, None))
                if marker in done or (status == "done" and finished and event["t"] > finished):
                    f.duplicated_steps += 1
                    f.problem(f"step {key} called the model after it was done")


def _at_version(data: _Db, agent: str, added_in: int, logged: int) -> bool:
    """The turn's question was added in the version the worker saw (or the one before,
    when the turn's commit also holds a compaction)."""
    if added_in == logged:
        return True
    after = data.versions.get(agent, {}).get(logged, ("",))[0]
    return added_in == logged - 1 and after == "compaction"


def _check_alarms(f: Findings, data: _Db, logs: Logs, *, final: bool) -> None:
    scheduled = {
        marker
        for marker, rows in data.questions.items()
        if Plan.parse(rows[0][2]).alarm is not None
    }
    for events in logs.workers.values():
        scheduled.update(e["m"] for e in events if e["e"] == "turn" and "alarm:" in e.get("p", ""))
    calls = collections.Counter(e["m"] for e in logs.runner if e["e"] == "alarm-call")
    f.alarms_scheduled = len(scheduled)
    for marker in sorted(scheduled):
        rows = data.alarms.get(marker)
        delivered = data.delivered[marker]
        if not rows:
            f.alarms_lost += 1
            f.problem(f"alarm of {marker} was scheduled and is not in the database")
            continue
        if len({row[0] for row in rows}) > 1:
            f.duplicated_deliveries += 1
            f.problem(f"alarm of {marker} is in the database under several ids: {rows}")
        _, _, _, status, deliveries, every, error = rows[-1]
        if every is not None:
            f.alarms_recurring += 1
            f.recurring_deliveries += delivered
            if delivered != deliveries:
                f.duplicated_deliveries += delivered > deliveries
                f.alarms_lost += delivered < deliveries
                f.problem(f"recurring alarm of {marker}: {delivered} turns, {deliveries} marked")
        elif status == "done" and delivered == 1 == deliveries:
            f.alarms_delivered += 1
        elif status == "pending" and delivered == 0:
            f.alarms_pending += 1
        elif status == "dead" and delivered == 0:
            f.alarms_dead += 1
            f.problem(f"alarm of {marker} is dead: {error}")
        elif delivered > 1 or (delivered and status != "done"):
            f.duplicated_deliveries += 1
            f.problem(f"alarm of {marker}: {status}, {deliveries} marked, {delivered} turns")
        else:
            f.alarms_lost += 1
            f.problem(f"alarm of {marker}: {status}, {deliveries} marked, {delivered} turns")
        if final:
            f.rerun_deliveries += max(calls[marker] - delivered, 0)
            if calls[marker] < delivered:
                f.problem(f"alarm of {marker}: {delivered} turns but {calls[marker]} calls")


def _check_workspaces(
    f: Findings, db: Path, data: _Db, tables: dict[str, dict[int, tuple[int, str]]]
) -> None:
    """At the end: each sql agent's table, rebuilt from the log and as its file holds it,
    equals its committed turns' last writes; every workspace file passes integrity_check."""
    expected = {a: {slot: m for slot, (_, m) in rows.items()} for a, rows in tables.items()}
    sql_agents = [a for a in data.agents if kind_of(a) == "sql"]
    for readonly in (True, False):
        with Store(db, readonly=readonly) as store:
            for a in sql_agents:
                result = store.sql(a, "SELECT slot, marker FROM notes")
                rows = {slot: marker for slot, marker in result.rows}
                if rows != expected.get(a, {}):
                    f.partial_turns += 1
                    where = "log" if readonly else "file"
                    f.problem(f"{a}: notes ({where}) {rows} != committed {expected.get(a)}")
    for path in sorted(Path(f"{db}-workspaces").glob("*.sqlite")):
        conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
        try:
            result = conn.execute("PRAGMA integrity_check").get
        finally:
            conn.close()
        f.workspaces_checked += 1
        if result != "ok":
            f.workspaces_bad += 1
            f.problem(f"{path.name}: {result}")


def _check_histories(f: Findings, db: Path, data: _Db) -> None:
    """At the end: each agent's history, compacted originals included, holds its committed
    questions in version order, and its active history pairs every tool call and result."""
    order: dict[str, list[tuple[int, str]]] = collections.defaultdict(list)
    for marker, rows in data.questions.items():
        for a, v, _ in rows:
            order[a].append((v, marker))
    with Store(db, readonly=True) as store:
        for a in data.agents:
            everything = store.history(a, include_compacted=True)
            found = [m[1] for m in QUESTION.finditer(json.dumps(everything))]
            if found != [marker for _, marker in sorted(order[a])]:
                f.partial_turns += 1
                f.problem(f"{a}: its history holds {len(found)} questions out of order")
            active = store.history(a)
            calls: set[str] = set()
            answered: set[str] = set()
            for message in active:
                calls.update(c["id"] for c in message.get("tool_calls") or ())
                if message["role"] == "tool":
                    answered.add(message["tool_call_id"])
                    if message["tool_call_id"] not in calls:
                        f.partial_turns += 1
                        f.problem(f"{a}: a tool result precedes its call in the active history")
            if not active or active[0]["role"] != "system" or calls - answered:
                f.partial_turns += 1
                f.problem(f"{a}: its active history is not whole ({len(active)} messages)")


# -- processes ----------------------------------------------------------------------


@dataclasses.dataclass
class Child:
    """A worker or the runner, forked by the zygote; signalled through a pidfd."""

    role: str
    index: int
    pid: int
    pidfd: int
    killed: bool = False

    def exited(self, timeout: float = 0.0) -> bool:
        readable, _, _ = select.select([self.pidfd], [], [], timeout)
        return bool(readable)

    def signal(self, signum: int) -> None:
        try:
            signal.pidfd_send_signal(self.pidfd, signum)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        os.close(self.pidfd)


class Zygote:
    """``soak_worker.py``: imports once, forks a worker or the runner per command."""

    def __init__(self, db: Path, logdir: Path, args: argparse.Namespace, durability: str):
        self._stderr = (logdir / "zygote.stderr").open("w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                str(db),
                str(logdir),
                f"--durability={durability}",
                f"--agents={args.agents}",
                f"--shared={args.shared}",
                f"--threads={args.threads}",
                f"--model-ms={args.model_ms}",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            bufsize=1,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()
        self.starts = 0
        self._expect("loaded", LOAD_TIMEOUT)

    def _read(self, stream: TextIO) -> None:
        for line in stream:
            self._lines.put(line.strip())
        self._lines.put(None)

    def _expect(self, word: str, timeout: float) -> list[str]:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            line = None
        if line is None or line.split()[0] != word:
            msg = f"soak_worker.py printed {line!r}, not {word!r}; see {self._stderr.name}"
            raise RuntimeError(msg)
        return line.split()[1:]

    def start(self, role: str, index: int) -> Child:
        """Fork a child; its pidfd is taken while it is known to be the zygote's child."""
        assert self.proc.stdin is not None
        self.starts += 1
        self.proc.stdin.write(f"{role} {index} {self.starts}\n")
        self.proc.stdin.flush()
        pid = int(self._expect("started", 30)[0])
        pidfd = os.pidfd_open(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            parent = int(stat.rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            parent = -1  # it died already: the pidfd then refers to no live process
        if parent != self.proc.pid and not _pidfd_exited(pidfd):
            os.close(pidfd)
            msg = f"process {pid} is not a child of the zygote {self.proc.pid}"
            raise RuntimeError(msg)
        return Child(role, index, pid, pidfd)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._stderr.close()


def _pidfd_exited(pidfd: int) -> bool:
    readable, _, _ = select.select([pidfd], [], [], 0)
    return bool(readable)


# -- the run --------------------------------------------------------------------------


@dataclasses.dataclass
class Result:
    """One soak run: its settings, what the supervisor did, and the final check."""

    durability: str
    workers: int
    agents: int
    duration: float
    kills: int = 0
    worker_kills: int = 0
    runner_kills: int = 0
    cut_off: int = 0  # turns in flight when a kill came (handoffs left running)
    restarts: int = 0
    unexpected_exits: int = 0
    checks: int = 0
    integrity_passed: int = 0
    failed_turns: dict[str, int] = dataclasses.field(default_factory=dict)
    overhead_ms: dict[str, float] = dataclasses.field(default_factory=dict)
    final: Findings = dataclasses.field(default_factory=Findings)
    seconds: float = 0.0
    load: str = ""

    @property
    def ok(self) -> bool:
        return (
            self.final.losses == 0
            and self.unexpected_exits == 0
            and self.integrity_passed == self.checks
        )

    def report(self) -> str:
        f = self.final
        overhead = self.overhead_ms
        failed = ", ".join(f"{n} {name}" for name, n in sorted(self.failed_turns.items()))
        lines = [
            f"soak: durability={self.durability}, {self.workers} workers x {self.agents}"
            f" agents, {self.duration:g} s of kills ({self.seconds:.0f} s in all),"
            f" load average {self.load}",
            f"  turns committed          {f.turns} ({f.asks - f.steps} asks, {f.steps}"
            f" workflow steps, {f.alarm_turns} alarm deliveries), {f.compactions} compactions",
            f"  turns logged by workers  {f.logged_turns} (+{f.replays} steps replayed)",
            f"  kills                    {self.kills} ({self.worker_kills} workers,"
            f" {self.runner_kills} runner; {self.cut_off} turns cut off)",
            f"  restarts                 {self.restarts}",
            f"  lost turns               {f.lost_turns}",
            f"  wrong versions           {f.wrong_version}",
            f"  partial turns            {f.partial_turns} (+{f.uncommitted_rows} rows of"
            " uncommitted versions)",
            f"  duplicated steps         {f.duplicated_steps}",
            f"  duplicated turns         {f.duplicated_turns}",
            f"  alarms                   {f.alarms_scheduled} scheduled, {f.alarms_recurring}"
            f" of them recurring ({f.recurring_deliveries} deliveries); one-shots:"
            f" {f.alarms_delivered} delivered, {f.alarms_pending} pending, {f.alarms_dead} dead,"
            f" {f.alarms_lost} lost; {f.duplicated_deliveries} delivered twice;"
            f" {f.rerun_deliveries} delivery turns run again after a kill (allowed)",
            f"  version gaps             {f.version_gaps}",
            f"  integrity checks passed  {self.integrity_passed} of {self.checks}"
            f" (+{f.workspaces_checked - f.workspaces_bad} of {f.workspaces_checked}"
            " workspace files)",
            f"  turn overhead            handler's own time (less waits for the agent's lock)"
            f" p50 {overhead.get('own_p50', 0):.2f} ms, p99 {overhead.get('own_p99', 0):.2f} ms"
            f" (its CPU time p50"
            f" {overhead.get('cpu_p50', 0):.2f} ms, p99 {overhead.get('cpu_p99', 0):.2f} ms);"
            f" whole turn minus model p50 {overhead.get('rest_p50', 0):.1f} ms, p99"
            f" {overhead.get('rest_p99', 0):.1f} ms ({overhead.get('n', 0):.0f} turns)",
            f"  waits for the agent lock p50 {overhead.get('lock_p50', 0):.2f} ms, p99"
            f" {overhead.get('lock_p99', 0):.1f} ms",
            f"  failed turns             {sum(self.failed_turns.values())} ({failed or 'none'})",
            f"  unexpected exits         {self.unexpected_exits}",
        ]
        lines += [f"  PROBLEM: {p}" for p in f.problems]
        lines.append(f"  result: {'OK' if self.ok else 'FAILED'}")
        return "\n".join(lines)


class Soak:
    """One run on one durability setting."""

    def __init__(self, args: argparse.Namespace, durability: str, directory: Path) -> None:
        self.args = args
        self.durability = durability
        self.db = directory / f"soak-{durability}.db"
        self.logdir = directory / f"logs-{durability}"
        self.logdir.mkdir(parents=True)
        self.rng = random.Random(f"{args.seed}-{durability}")
        self.result = Result(durability, args.workers, args.agents, args.duration)
        self.children: dict[tuple[str, int], Child] = {}
        self.zygote: Zygote | None = None

    def run(self) -> Result:
        started = time.monotonic()
        Store(self.db, durability=self.durability).close()  # the schema, before the race
        try:
            self.zygote = Zygote(self.db, self.logdir, self.args, self.durability)
            for index in range(self.args.workers):
                self._start("worker", index)
            self._start("runner", 0)
            self._kill_at_random(time.monotonic() + self.args.duration)
            self._stop()
        finally:
            for child in self.children.values():
                child.signal(signal.SIGKILL)
                child.close()
            if self.zygote is not None:
                self.zygote.close()
        self._progress("final check")
        final = check(self.db, self.logdir, final=True)
        self._count_check(final)
        self.result.final = final
        self._summarize_logs()
        self.result.seconds = time.monotonic() - started
        self.result.load = " ".join(f"{x:.1f}" for x in os.getloadavg())
        return self.result

    def _start(self, role: str, index: int) -> None:
        assert self.zygote is not None
        old = self.children.pop((role, index), None)
        if old is not None:
            old.close()
        self.children[(role, index)] = self.zygote.start(role, index)

    def _kill_at_random(self, deadline: float) -> None:
        next_kill = time.monotonic() + self._kill_delay()
        next_check = time.monotonic() + self.args.check_every
        while (now := time.monotonic()) < deadline:
            time.sleep(max(min(next_kill, next_check, deadline, now + 0.5) - now, 0))
            self._restart_exited()
            now = time.monotonic()
            if now >= next_kill and now < deadline:
                self._kill_one()
                next_kill = time.monotonic() + self._kill_delay()
            if now >= next_check and now < deadline:
                findings = check(self.db, self.logdir)
                self._count_check(findings)
                self._progress(
                    f"check: {findings.turns} turns, {self.result.kills} kills,"
                    f" {findings.losses} problems"
                )
                for problem in findings.problems:
                    self._progress(f"  PROBLEM: {problem}")
                next_check = time.monotonic() + self.args.check_every

    def _kill_delay(self) -> float:
        return max(self.rng.expovariate(1 / self.args.kill_every), 0.1)

    def _kill_one(self) -> None:
        role, index = self.rng.choice(sorted(self.children))
        child = self.children[(role, index)]
        child.killed = True
        child.signal(signal.SIGKILL)
        if not child.exited(timeout=30):
            msg = f"{role} {index} (pid {child.pid}) did not die within 30 s of SIGKILL"
            raise RuntimeError(msg)
        self.result.kills += 1
        if role == "worker":
            self.result.worker_kills += 1
        else:
            self.result.runner_kills += 1
        self.result.cut_off += self._running_handoffs(child.pid)
        time.sleep(self.rng.uniform(0, 0.3))
        self._start(role, index)
        self.result.restarts += 1

    def _running_handoffs(self, pid: int) -> int:
        conn = connect(str(self.db), readonly=True)
        try:
            return int(
                conn.execute(
                    "SELECT count(*) FROM handoffs WHERE status = 'running' AND pid = ?", (pid,)
                ).get
            )
        finally:
            conn.close()

    def _restart_exited(self) -> None:
        for (role, index), child in list(self.children.items()):
            if not child.killed and child.exited():
                self.result.unexpected_exits += 1
                self._progress(
                    f"{role} {index} (pid {child.pid}) exited unasked; see {self.logdir}"
                )
                self._start(role, index)

    def _stop(self) -> None:
        """SIGTERM the workers; let the runner deliver what is due; SIGTERM it."""
        self._progress("stopping the workers")
        workers = [c for c in self.children.values() if c.role == "worker"]
        for child in workers:
            child.killed = True
            child.signal(signal.SIGTERM)
        for child in workers:
            if not child.exited(timeout=120):
                self._progress(f"worker {child.index} ignored SIGTERM for 120 s; killing it")
                self.result.unexpected_exits += 1
                child.signal(signal.SIGKILL)
                child.exited(timeout=30)
        self._progress("letting the runner deliver the alarms due")
        deadline = time.monotonic() + self.args.drain
        while time.monotonic() < deadline and self._due_one_shots():
            self._restart_exited()
            time.sleep(0.2)
        runner = self.children[("runner", 0)]
        runner.killed = True
        runner.signal(signal.SIGTERM)
        if not runner.exited(timeout=60):
            self.result.unexpected_exits += 1
            runner.signal(signal.SIGKILL)
            runner.exited(timeout=30)

    def _due_one_shots(self) -> int:
        conn = connect(str(self.db), readonly=True)
        try:
            return int(
                conn.execute(
                    "SELECT count(*) FROM alarms WHERE status = 'pending' AND every IS NULL"
                ).get
            )
        finally:
            conn.close()

    def _count_check(self, findings: Findings) -> None:
        self.result.checks += 1
        self.result.integrity_passed += findings.integrity_ok

    def _summarize_logs(self) -> None:
        failed: collections.Counter[str] = collections.Counter()
        own: list[float] = []
        lock: list[float] = []
        cpu: list[float] = []
        rest: list[float] = []
        for events in read_logs(self.logdir).workers.values():
            for event in events:
                if event["e"] == "fail":
                    failed[event["err"].split(":")[0]] += 1
                elif event["e"] == "turn":
                    own.append(event["own"] - event["lock"])
                    lock.append(event["lock"])
                    cpu.append(event["cpu"])
                    rest.append(event["wall"] - event["model"])
        self.result.failed_turns = dict(failed)
        if len(own) >= 2:
            self.result.overhead_ms = {
                "n": len(own),
                "own_p50": statistics.median(own),
                "own_p99": _percentile(own, 99),
                "lock_p50": statistics.median(lock),
                "lock_p99": _percentile(lock, 99),
                "cpu_p50": statistics.median(cpu),
                "cpu_p99": _percentile(cpu, 99),
                "rest_p50": statistics.median(rest),
                "rest_p99": _percentile(rest, 99),
            }

    def _progress(self, text: str) -> None:
        print(f"[{self.durability} {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr)


def _percentile(values: list[float], p: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--durability", choices=["normal", "full", "both"], default="both")
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of kills")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--agents", type=int, default=16, help="per worker")
    parser.add_argument("--shared", type=int, default=4, help="agents all workers drive")
    parser.add_argument("--threads", type=int, default=4, help="per worker")
    parser.add_argument("--kill-every", type=float, default=2.0, help="mean seconds")
    parser.add_argument("--check-every", type=float, default=20.0, help="seconds")
    parser.add_argument("--drain", type=float, default=60.0, help="seconds for due alarms")
    parser.add_argument("--model-ms", type=float, default=5.0, help="mean fake model delay")
    parser.add_argument("--seed", default="1")
    parser.add_argument("--dir", help="keep the databases and logs under this directory")
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args(argv)
    settings = ["normal", "full"] if args.durability == "both" else [args.durability]
    if args.dir is not None:
        Path(args.dir).mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix="soak-", dir=args.dir))
    results = []
    for durability in settings:
        result = Soak(args, durability, directory).run()
        print(result.report(), flush=True)
        results.append(result)
    if args.dir is None and all(r.ok for r in results):
        shutil.rmtree(directory)
    else:  # kept: asked for, or the evidence of a failure
        print(f"databases and logs kept in {directory}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                [dataclasses.asdict(r) | {"ok": r.ok, "losses": r.final.losses} for r in results],
                indent=2,
            )
        )
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
