"""kill -9 around approvals and events: suspend, decide, resume, the approved tool's run, commit.

A forking server (``tests/programs/approvals_child.py``) imports once and forks the roles: a
driver whose turns suspend at a tool that needs approval (``tests/programs/approvals_app.py``)
and that resumes decided ones, AgentRunners that deliver events and resumptions,
and deciders that approve or deny. While the test sends events to the agents'
inboxes (with idempotency keys, some sent again), it SIGKILLs one of those processes
at a random moment and forks another in its place, at least 20 times; every fourth
kill waits for the approved tool to announce that it ran and kills that process
right away, before its turn commits. Runners and deciders run one or two at a time.
Then a runner and a decider finish the work, and the database is read through
connections of our own:

- ``PRAGMA integrity_check`` is ok and ``effectful-durable check`` exits 0; every
  agent's versions are 1..v;
- every approval is decided and its suspended turn resumed by exactly one
  committed version (``ended_in``; one resumption queued per suspension, done),
  which holds its tool call's one result. For an approved call, that result is
  the last of the tool's runs the side file records (the tool appends a line with
  ``current_approval()`` and a fresh nonce, fsynced, before it returns): the tool
  never runs with no approval, nor after its turn committed. It may have run more
  than once before: each earlier run was in a process SIGKILLed between the run
  and the commit, and its nonce is nowhere in the committed history (a kill test
  sees several such runs; ``current_approval()`` is the key that lets an outside
  system do such an effect once). A denied call never ran, and its result carries
  the denial's reason;
- every decision whose call returned in a decider (logged after it returned) is in
  the database with its ``by`` and note; every refused one (two deciders raced)
  changed nothing; every decision in the database is one a decider attempted;
- every event is done, delivered by one committed ``on_event`` version whose
  history holds its payload once, and events sent again with the same key are
  the same event.

TestDecidersRace has two processes decide the same 30 approvals, each at the same
moment: one wins each, the other gets InvalidDecisionError and changes nothing.

The test prints what it counted (``-s``). ``EFFECTFUL_DURABLE_CRASH=full`` runs a
longer sweep: 120 kills on SQLite and 60 on PostgreSQL, instead of 24 and 10.
"""

import collections
import contextlib
import os
import queue
import random
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from approvals_app import PAID, TOOL_LOG_ENV, Shop, answer, text_of
from approvals_child import DECISIONS_ENV, read_lines
from effectful.handlers.llm.completions import LiteLLMProvider
from effectful.ops.semantics import handler
from helpers import alive, integrity, is_postgres, persisted_rows
from paths import PROGRAMS

from effectful_durable import PersistenceHandler, Store, TurnSuspended
from effectful_durable.testing import FakeLLM

CHILD = PROGRAMS / "approvals_child.py"
FULL = os.environ.get("EFFECTFUL_DURABLE_CRASH") == "full"
KILLS = {"sqlite": 120 if FULL else 24, "postgres": 60 if FULL else 10}
AGENTS = 4
LOAD_TIMEOUT = 120.0
DRAIN_TIMEOUT = 120.0


class Server:
    """The forking server, and the lines its children print."""

    def __init__(self, db: str, tmp_path: Path) -> None:
        self.tool_log = tmp_path / "tool-runs.jsonl"
        self.decisions_log = tmp_path / "decisions.jsonl"
        env = {
            **os.environ,
            TOOL_LOG_ENV: str(self.tool_log),
            DECISIONS_ENV: str(self.decisions_log),
            "APPROVALS_APP_JITTER": "0.02",
            "APPROVALS_APP_ANNOUNCE": "1",
        }
        self._stderr = (tmp_path / "children.stderr").open("w+")
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), "serve", db, "--agents", str(AGENTS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            bufsize=1,
            env=env,
        )
        self.control: queue.Queue[str | None] = queue.Queue()
        self.ran: queue.Queue[tuple[int, str]] = queue.Queue()
        self.errors: list[str] = []
        self.roles: dict[int, str] = {}
        self.killed: set[int] = set()  # the pids SIGKILLed
        self._seeds = iter(range(1, 1_000_000))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.expect("loaded", timeout=LOAD_TIMEOUT)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            words = line.split()
            if not words:
                continue
            if words[0] == "ran":
                self.ran.put((int(words[1]), words[2]))
            elif words[0] == "error":
                self.errors.append(line.strip())
            else:
                self.control.put(line.strip())
        self.control.put(None)

    def expect(self, word: str, *, timeout: float = 30.0) -> list[str]:
        try:
            line = self.control.get(timeout=timeout)
        except queue.Empty:
            line = None
        if line is None or line.split()[0] != word:
            self._stderr.flush()
            self._stderr.seek(0)
            tail = self._stderr.read()[-3000:]
            msg = f"the server printed {line!r}, not {word!r} (exit {self.proc.poll()})\n{tail}"
            raise AssertionError(msg)
        return line.split()[1:]

    def start(self, role: str) -> int:
        """Fork a child playing ``role``; its pid."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{role} {next(self._seeds)}\n")
        self.proc.stdin.flush()
        started, pid = self.expect("child")
        assert started == role
        self.roles[int(pid)] = role
        return int(pid)

    def live(self, role: str) -> list[int]:
        return [pid for pid, r in self.roles.items() if r == role]

    def kill(self, pid: int, sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        del self.roles[pid]
        if sig == signal.SIGKILL:
            self.killed.add(pid)
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.005)  # reaped at once: the server ignores SIGCHLD

    def close(self) -> None:
        for pid in list(self.roles):
            self.kill(pid)
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)
        self._reader.join(timeout=30)
        self._stderr.close()


@dataclass
class Sent:
    """The events the test sent: by event id, and the sends of each key."""

    events: dict[str, dict[str, Any]] = field(default_factory=dict)
    keyed: dict[str, str] = field(default_factory=dict)  # key -> event id
    resends: int = 0

    def send(self, store: Store, rng: random.Random) -> None:
        if self.keyed and rng.random() < 0.3:  # a retried sender
            key = rng.choice(sorted(self.keyed))
            first = self.events[self.keyed[key]]
            again = store.send_event(
                first["agent"], first["name"], first["payload"], key=key, create=True
            )
            assert again.event_id == self.keyed[key], (key, again)
            self.resends += 1
            return
        agent = f"shop-{rng.randrange(AGENTS)}"
        name = rng.choice(["restock", "ping"])
        payload = {"nonce": f"pl{secrets.token_hex(6)}", "n": len(self.events)}
        key = None if rng.random() < 0.2 else f"key-{len(self.events)}"
        event = store.send_event(agent, name, payload, key=key, create=True)
        assert event.event_id not in self.events
        self.events[event.event_id] = {"agent": agent, "name": name, "payload": payload}
        if key is not None:
            self.keyed[key] = event.event_id


@dataclass
class Outcome:
    kills: int = 0
    by_role: collections.Counter[str] = field(default_factory=collections.Counter)
    mid_turn: int = 0
    targeted: int = 0
    seconds: float = 0.0
    drain_seconds: float = 0.0
    stats: collections.Counter[str] = field(default_factory=collections.Counter)


def open_work(db: str) -> tuple[int, int, int]:
    """Suspensions not ended, events and resumptions not ended, dead ones (of those)."""
    row = persisted_rows(
        db,
        """
        SELECT (SELECT count(*) FROM approvals WHERE ended_in IS NULL),
               (SELECT count(*) FROM alarms WHERE ended_in IS NULL AND kind <> 'alarm'),
               (SELECT count(*) FROM alarms WHERE status = 'dead')
        """,
    )[0]
    return int(row[0]), int(row[1]), int(row[2])


def kill_loop(db: str, tmp_path: Path, kills: int, seed: int) -> tuple[Outcome, Sent, Server]:
    """Run the roles, kill them at random ``kills`` times, then let the work finish."""
    rng = random.Random(seed)
    outcome, sent = Outcome(), Sent()
    began = time.monotonic()
    server = Server(db, tmp_path)
    try:
        with Store(db) as store:
            for _ in range(3):
                sent.send(store, rng)
            want = {"driver": 1, "runner": 2, "decider": 2}
            for role, count in want.items():
                for _ in range(count):
                    server.start(role)
            while outcome.kills < kills:
                if outcome.kills % 5 == 4:  # one or two runners and deciders at once
                    want["runner"] = rng.choice([1, 2])
                    want["decider"] = rng.choice([1, 2])
                victim = None
                if outcome.kills % 4 == 3:
                    victim = _after_a_tool_ran(server, store, sent, rng)
                    outcome.targeted += victim is not None
                if victim is None:
                    pause = time.monotonic() + rng.uniform(0.05, 0.5)
                    while time.monotonic() < pause:
                        if rng.random() < 0.3:
                            sent.send(store, rng)
                        time.sleep(rng.uniform(0.0, 0.1))
                    role = rng.choices(["driver", "runner", "decider"], [4, 4, 2])[0]
                    victim = rng.choice(server.live(role))
                role = server.roles[victim]
                server.kill(victim)
                outcome.kills += 1
                outcome.by_role[role] += 1
                cut_off = persisted_rows(
                    db,
                    "SELECT count(*) FROM handoffs WHERE status = 'running' AND pid = ?",
                    victim,
                )
                outcome.mid_turn += int(cut_off[0][0])
                for role, count in want.items():
                    while len(server.live(role)) < count:
                        server.start(role)
                    while len(server.live(role)) > count:
                        server.kill(server.live(role)[0], signal.SIGTERM)
            # The end: no driver; a runner and a decider finish what is open.
            for pid in server.live("driver"):
                server.kill(pid)
            for role in ("runner", "decider"):
                if not server.live(role):
                    server.start(role)
            drain = time.monotonic()
            deadline = drain + DRAIN_TIMEOUT
            while (work := open_work(db))[:2] != (0, 0) and time.monotonic() < deadline:
                assert work[2] == 0, _dead(db)
                time.sleep(0.1)
            assert open_work(db) == (0, 0, 0), f"still open: {open_work(db)}; {_dead(db)}"
            outcome.drain_seconds = time.monotonic() - drain
        for pid in server.live("runner"):
            server.kill(pid, signal.SIGTERM)
    finally:
        server.close()
    outcome.seconds = time.monotonic() - began
    return outcome, sent, server


def _after_a_tool_ran(server: Server, store: Store, sent: Sent, rng: random.Random) -> int | None:
    """The pid of a driver or runner whose approved tool ran just now (not yet committed)."""
    while not server.ran.empty():
        server.ran.get_nowait()
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        with contextlib.suppress(queue.Empty):
            pid, _ = server.ran.get(timeout=0.05)
            if pid in server.roles:
                return pid
        if rng.random() < 0.05:
            sent.send(store, rng)
    return None


def _dead(db: str) -> str:
    rows = persisted_rows(
        db, "SELECT alarm_id, kind, agent_id, last_error FROM alarms WHERE status = 'dead'"
    )
    return f"dead: {rows}"


def verify(db: str, server: Server, sent: Sent) -> collections.Counter[str]:
    """Check what the module docstring promises; return what was counted."""
    stats: collections.Counter[str] = collections.Counter()
    assert integrity(db) == "ok"
    check = subprocess.run(
        [sys.executable, "-m", "effectful_durable", "check", db],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    runs_of: dict[str | None, list[dict[str, Any]]] = collections.defaultdict(list)
    for run in read_lines(server.tool_log):
        runs_of[run["approval"]].append(run)
    assert None not in runs_of, "the tool ran without an approval"
    decisions = read_lines(server.decisions_log)
    with Store(db) as store:
        approvals = {a.approval_id: a for a in store.approvals(status=None)}
        assert set(runs_of) <= set(approvals), "the tool ran with an approval nobody asked"
        agents = sorted({a.agent_id for a in approvals.values()} | _event_agents(sent))
        versions = {agent: store.versions(agent) for agent in agents}
        histories = {agent: store.history(agent) for agent in agents}
        for agent, listed in versions.items():
            assert [v.version for v in listed] == list(range(1, len(listed) + 1)), agent
        at = _HistoryAt(store)
        # -- each approved tool ran once per committed turn ------------------------
        for approval in approvals.values():
            assert approval.status in ("approved", "denied"), approval
            assert approval.ended_in is not None, approval
            history = histories[approval.agent_id]
            ending = versions[approval.agent_id][approval.ended_in - 1]
            assert ending.detail is not None
            assert ending.detail.get("resumed") == approval.suspended_in, (approval, ending)
            suspending = versions[approval.agent_id][approval.suspended_in - 1]
            assert suspending.detail is not None
            assert approval.approval_id in suspending.detail.get("suspended", []), suspending
            results = [
                m
                for m in history
                if m.get("role") == "tool" and m.get("tool_call_id") == approval.tool_call_id
            ]
            assert len(results) == 1, (approval, results)
            result = results[0]
            assert at.added_in(approval.agent_id, result["id"]) == approval.ended_in
            runs = runs_of.get(approval.approval_id, [])
            text = text_of(result)
            if approval.status == "denied":
                assert not runs, (approval, runs)
                assert "Not run" in text and str(approval.note) in text, text
                stats["denied"] += 1
                continue
            paid = PAID.search(text)
            assert paid is not None, text
            nonces = [run["nonce"] for run in runs]
            # The committed result is the tool's last run: no run after the commit.
            assert nonces and nonces[-1] == paid[2], (approval, text, runs)
            assert all(run["order"] == approval.arguments["order"] for run in runs)
            everything = "\n".join(text_of(m) for m in history)
            for run in runs[:-1]:  # runs whose turn did not commit:
                assert run["nonce"] not in everything, (approval, run)
                assert run["pid"] in server.killed, (approval, run)  # cut off by a kill
            stats["approved"] += 1
            stats["tool runs"] += len(runs)
            stats["runs not committed"] += len(runs) - 1
            stats["approvals run more than once"] += len(runs) > 1
        resumptions = persisted_rows(
            db, "SELECT agent_id, status, ended_in FROM alarms WHERE kind = 'resume'"
        )
        assert all(status == "done" and ended for _, status, ended in resumptions), resumptions
        for agent, listed in versions.items():
            resumed = [v.detail["resumed"] for v in listed if v.detail and "resumed" in v.detail]
            assert len(resumed) == len(set(resumed)), f"{agent}: a suspension resumed twice"
            suspended = [v.version for v in listed if v.detail and "suspended" in v.detail]
            assert sorted(resumed) == suspended, agent
            stats["suspended turns"] += len(suspended)
            queued = sum(row[0] == agent for row in resumptions)
            assert queued == len(suspended), f"{agent}: one resumption queued per suspension"
        # -- no decision lost ----------------------------------------------------------
        attempts = {(d["approval"], d["note"]): d for d in decisions if d["result"] == "attempt"}
        won = collections.Counter(d["approval"] for d in decisions if d["result"] == "won")
        assert max(won.values(), default=0) <= 1, "two deciders won one approval"
        for line in decisions:
            approval = approvals[line["approval"]]
            if line["result"] == "won":
                expected = (line["status"], line["by"], line["note"])
                assert (approval.status, approval.decided_by, approval.note) == expected, line
                returned = (line["got_status"], line["got_by"], line["got_note"])
                assert returned == expected, line
                stats["decisions returned"] += 1
            elif line["result"] == "lost":
                assert approval.note != line["note"], line  # the refused call changed nothing
                assert "already" in line["error"] or "just now" in line["error"], line
                stats["decisions refused"] += 1
        ended = {(d["approval"], d["note"]) for d in decisions if d["result"] != "attempt"}
        for key in attempts:
            if key not in ended:  # the decider was killed before it logged how it went
                committed = approvals[key[0]].note == key[1]
                stats["decisions cut off, committed" if committed else "decisions cut off"] += 1
        for approval in approvals.values():
            attempt = attempts.get((approval.approval_id, approval.note))
            assert attempt is not None, f"a decision nobody attempted: {approval}"
            assert (attempt["by"], attempt["status"]) == (approval.decided_by, approval.status)
        # -- each event delivered as one committed turn --------------------------------
        events = {e.event_id: e for e in store.events(include_delivered=True)}
        assert set(events) == set(sent.events), "events lost or duplicated"
        delivered: collections.Counter[str] = collections.Counter()
        for event_id, event in events.items():
            what = sent.events[event_id]
            assert (event.agent_id, event.name, event.payload) == (
                what["agent"],
                what["name"],
                what["payload"],
            )
            assert event.status == "done" and event.delivered_in is not None, event
            assert event.taken_by is None, event
            turn = versions[event.agent_id][event.delivered_in - 1]
            assert turn.template == "on_event", (event, turn)
            nonce = what["payload"]["nonce"]
            holding = [m for m in histories[event.agent_id] if nonce in text_of(m)]
            assert len(holding) == 1, (event, holding)
            assert holding[0]["role"] == "user"
            assert at.added_in(event.agent_id, holding[0]["id"]) == event.delivered_in, event
            delivered[event.agent_id] += 1
        for agent, listed in versions.items():
            assert sum(v.template == "on_event" for v in listed) == delivered[agent], agent
        stats["events"] = len(events)
        stats["events re-sent"] = sent.resends
    return stats


def _event_agents(sent: Sent) -> set[str]:
    return {what["agent"] for what in sent.events.values()}


class _HistoryAt:
    """The version that added a message to an agent's history (by reading versions)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._ids: dict[tuple[str, int], set[str]] = {}

    def _at(self, agent: str, version: int) -> set[str]:
        key = (agent, version)
        if key not in self._ids:
            history = self._store.history(agent, version) if version > 0 else []
            self._ids[key] = {m["id"] for m in history}
        return self._ids[key]

    def added_in(self, agent: str, message_id: str) -> int | None:
        last = len(self._store.versions(agent))
        low, high = 1, last  # messages are only added: binary search the first holder
        if message_id not in self._at(agent, last):
            return None
        while low < high:
            middle = (low + high) // 2
            if message_id in self._at(agent, middle):
                high = middle
            else:
                low = middle + 1
        return low


@pytest.mark.slow
class TestApprovalsCrash:
    """Drivers, runners and deciders killed at random lose no decision and repeat no turn."""

    def test_random_kills(self, store_url: str, tmp_path: Path) -> None:
        """After the kills and a last runner, each approved tool ran once per committed turn."""
        backend = "postgres" if is_postgres(store_url) else "sqlite"
        outcome, sent, server = kill_loop(store_url, tmp_path, KILLS[backend], seed=11)
        assert not server.errors, server.errors
        outcome.stats = verify(store_url, server, sent)
        print(f"\n{backend}: {outcome}")  # shown with -s
        assert outcome.kills >= KILLS[backend]
        decided = outcome.stats["approved"] + outcome.stats["denied"]
        assert decided >= outcome.kills // 4, outcome.stats
        assert outcome.mid_turn + outcome.targeted >= 3, "too few kills landed inside a turn"


def _suspended_shops(db: str, count: int) -> list[str]:
    """``count`` agents with a turn suspended at ``pay``; their approvals' ids."""
    ids = []
    persistence = PersistenceHandler(db)
    with (
        handler(LiteLLMProvider(model="fake")),
        handler(FakeLLM(respond=answer)),
        handler(persistence),
    ):
        for n in range(count):
            with pytest.raises(TurnSuspended) as suspended:
                Shop(agent_id=f"shop-{n}").ask(f"o{n}")
            ids += [a.approval_id for a in suspended.value.approvals]
    persistence.close()
    return ids


@contextlib.contextmanager
def _racers(
    db: str, ids_file: Path, log: Path, count: int
) -> Iterator[list[subprocess.Popen[str]]]:
    """``count`` racing deciders, connected, then given one start time."""
    env = {**os.environ, DECISIONS_ENV: str(log)}
    procs = [
        subprocess.Popen(
            [sys.executable, str(CHILD), "race", db, str(ids_file)],
            env=env,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for _ in range(count)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready", proc.poll()
        start_at = time.time() + 0.5
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(f"{start_at}\n")
            proc.stdin.flush()
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)


@pytest.mark.slow
class TestDecidersRace:
    """Two deciders of the same approvals, at the same moment: one wins each."""

    def test_one_winner_each(self, store_url: str, tmp_path: Path) -> None:
        """Each approval is decided once; the loser gets InvalidDecisionError, changes nothing."""
        ids = _suspended_shops(store_url, 30)
        ids_file, log = tmp_path / "ids.txt", tmp_path / "decisions.jsonl"
        ids_file.write_text("\n".join(ids))
        with _racers(store_url, ids_file, log, 2) as procs:
            for proc in procs:
                out, _ = proc.communicate(timeout=120)
                assert proc.returncode == 0, out
        lines = read_lines(log)
        with Store(store_url) as store:
            for approval_id in ids:
                mine = [line for line in lines if line["approval"] == approval_id]
                outcomes = sorted(line["result"] for line in mine)
                assert outcomes == ["attempt", "attempt", "lost", "won"], mine
                (winner,) = [line for line in mine if line["result"] == "won"]
                (loser,) = [line for line in mine if line["result"] == "lost"]
                assert winner["by"] != loser["by"]
                decided = store.approval(approval_id)
                assert (decided.status, decided.decided_by, decided.note) == (
                    winner["status"],
                    winner["by"],
                    winner["note"],
                )
            queued = persisted_rows(
                store_url,
                "SELECT agent_id, count(*) FROM alarms WHERE kind = 'resume' GROUP BY agent_id",
            )
            assert sorted(queued) == sorted((f"shop-{n}", 1) for n in range(30))
        wins = collections.Counter(line["by"] for line in lines if line["result"] == "won")
        print(f"\nwins per decider: {dict(wins)}")  # shown with -s
