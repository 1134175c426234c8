"""Injected I/O faults: every I/O call of an operation fails in turn, and nothing is lost.

Each operation (a turn, a compaction, memory writes, SQL writes, an alarm
delivered by the runner, a workflow step) first runs once to count its I/O
calls (tests/support/faultvfs.py). Then, for each fault (ENOSPC and EIO on write, a
short write, EIO and ENOSPC on fsync, EIO on read) and each call number N, a
copy of the same database runs it again with the Nth call failing, and:

- the operation either succeeds in full or raises StorageError (DiskFullError
  for a full disk), naming the database file;
- the agents in memory equal the last committed version on disk;
- a failed operation committed nothing, and a later turn learns of it from its
  handoff when one was left;
- once the fault clears, the same operation succeeds, ``integrity_check`` is
  ok, and every version committed before is read back unchanged (history with
  compacted messages, fields, memory, notes, SQL tables, journal).

By default each fault is tried at up to SAMPLE call numbers (the first and last
ones and an even spread between); EFFECTFUL_DURABLE_FAULT_SWEEP=full tries them
all (``make faults``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Self

import pytest
from alarms_app import delivered, make_agent, make_handlers
from faultvfs import (
    FAULTS,
    FULL,
    READ_EIO,
    WRITE_ENOSPC,
    Fault,
    FaultVFS,
    report,
    sample,
)
from helpers import Assistant, Keeper, integrity, running
from sql_helpers import Tracker, workspace_path

from effectful_durable import (
    AgentRunner,
    CompactionHandler,
    DiskFullError,
    PersistenceHandler,
    StorageError,
    Store,
)
from effectful_durable.agents.history import history_messages
from effectful_durable.agents.state import dump_state
from effectful_durable.runner import FakeClock
from effectful_durable.store import Durability
from effectful_durable.store.alarms import make_schedule
from effectful_durable.testing import FakeCall, FakeLLM, Reply, ToolCall

SAMPLE = 6  # call numbers per fault and operation in the default run

START = 1_800_000_000.0  # the runner's fake clock


def storage_error(error: BaseException) -> StorageError | None:
    """The StorageError that caused ``error`` (a tool's error wraps it), if any."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, StorageError):
            return seen
        seen = getattr(seen, "original_error", None) or seen.__cause__
    return None


# -- what a database holds -------------------------------------------------------


def snapshot(db: Path, sql: str | None = None) -> dict[Any, Any]:
    """Every committed version of every agent, read back through a fresh read-only Store."""
    out: dict[Any, Any] = {}
    with Store(db, readonly=True) as store:
        for agent in store.agents():
            aid = agent.agent_id
            for info in store.versions(aid):
                v = info.version
                out[aid, v] = (
                    info,
                    store.history(aid, v),
                    [  # a later compaction marks the originals it replaced: not a change
                        {k: m[k] for k in m if k != "durable"}
                        for m in store.history(aid, v, include_compacted=True)
                    ],
                    store.state(aid, v),
                    store.memory(aid, v),
                    store.memory_notes(aid, v),
                    store.sql(aid, sql, version=v).rows if sql else None,
                )
        for workflow in store.workflows():
            for step in store.steps(workflow.workflow):
                if step.status == "done":
                    out["step", workflow.workflow, step.key] = (step.number, step.result)
    return out


def in_memory(agent: Any) -> tuple[list[Any], Any] | None:
    """An agent's history and persisted fields as held in memory; None if never loaded."""
    if "__durable__" not in agent.__dict__:
        return None  # a replayed workflow step, or a failed first turn: loaded at its next
    return history_messages(agent.__history__), json.loads(dump_state(agent))


def on_disk(db: Path, agent_id: str) -> tuple[list[Any], Any]:
    """The agent's latest committed history and fields, in the shape of in_memory()."""
    with Store(db, readonly=True) as store:
        if not store.agents():
            return [], None
        return store.history(agent_id), store.state(agent_id)


def same_history(memory: tuple[list[Any], Any] | None, disk: tuple[list[Any], Any]) -> bool:
    """Equal messages (by id and content; memory may add prompt-cache hints) and fields."""
    if memory is None:
        return True

    def plain(messages: list[Any]) -> list[Any]:
        return [(m.get("id"), m.get("role"), _text(m.get("content"))) for m in messages]

    return plain(memory[0]) == plain(disk[0]) and (disk[1] is None or memory[1] == disk[1])


def _text(content: Any) -> Any:
    if isinstance(content, list):
        return "".join(str(block.get("text", "")) for block in content)
    return content


# -- the operations ----------------------------------------------------------------


def answer_with(tools: Callable[[str], list[ToolCall]]) -> Callable[[FakeCall], Reply]:
    """A model that calls ``tools(question)`` once per turn, then answers."""

    def respond(call: FakeCall) -> Reply:
        if call.messages[-1]["role"] == "tool":
            return f"done: {call.last_user_text}"
        return tools(call.last_user_text)

    return respond


class Operation:
    """One kind of operation to fail, on an open handler stack with its agent in memory.

    A subclass builds the base database (``build``), and in a session runs the
    operation (``run``) and, once the fault cleared, the same kind again
    (``again``), which must succeed.
    """

    name = ""
    agent_id = "bot"
    sql: str | None = None  # a query snapshot() reads at every version
    atomic = True  # one commit: a failure commits nothing and leaves memory as it was

    def __init__(self, db: Path, durability: Durability = "normal") -> None:
        self.db = db
        self.durability = durability
        self.llm = FakeLLM(respond=self.respond)
        self.persistence = PersistenceHandler(db, durability=durability)
        self.agent: Any = None
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Self:
        self._stack.enter_context(running(self.llm, *self.handlers()))
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stack.close()
        self.persistence.close()

    def handlers(self) -> list[Any]:
        return [self.persistence]

    def respond(self, call: FakeCall) -> Reply:
        return f"a: {call.last_user_text}"

    @classmethod
    def build(cls, db: Path) -> None:
        """Commit the versions every trial starts from."""
        with cls(db) as operation:
            operation.agent.ask("q0")
            operation.agent.ask("q1")

    def load(self) -> None:
        """Bring the agent in memory to its committed version, writing nothing."""
        self.persistence.load(self.agent)

    def run(self) -> None:
        self.agent.ask("the question")

    def again(self) -> None:
        self.agent.ask("once more")

    def memory(self) -> tuple[list[Any], Any] | None:
        """The agent's history and fields as held in memory."""
        return in_memory(self.agent)

    def told_of_failure(self, since: int) -> bool:
        """Whether a model request after the first ``since`` was told a turn did not complete."""
        return any("did not complete" in str(c.messages[0]) for c in self.llm.calls[since:])

    def check(self) -> None:
        """What else must hold once ``again`` ran."""


class Turn(Operation):
    """A turn whose tool changes a field: messages, state, the handoff, one commit."""

    name = "turn"

    def __init__(self, db: Path, durability: Durability = "normal") -> None:
        super().__init__(db, durability)
        self.agent = Assistant(agent_id=self.agent_id)

    def respond(self, call: FakeCall) -> Reply:
        return answer_with(lambda q: [ToolCall("remember", {"note": q})])(call)


class Compaction(Operation):
    """A turn that crosses the budget, and its compaction committed as its own version."""

    name = "compaction"
    atomic = False  # the turn commits, then the compaction
    in_turn = False

    def __init__(self, db: Path, durability: Durability = "normal") -> None:
        super().__init__(db, durability)
        self.agent = Assistant(agent_id=self.agent_id)

    def handlers(self) -> list[Any]:
        compaction = CompactionHandler(max_messages=6, keep_recent=2)
        # Listed before PersistenceHandler, the compaction commits in the turn.
        if self.in_turn:
            return [compaction, self.persistence]
        return [self.persistence, compaction]

    def respond(self, call: FakeCall) -> Reply:
        if "Summarise the conversation" in call.last_user_text:
            return "the summary"
        return f"a: {call.last_user_text}"


class CompactionInTurn(Compaction):
    """A turn whose compaction commits with it, as the next version, in its transaction."""

    name = "compaction-in-turn"
    atomic = True
    in_turn = True


class MemoryWrites(Operation):
    """A turn whose tools put a new key, replace one and add a context note."""

    name = "memory"

    def __init__(self, db: Path, durability: Durability = "normal") -> None:
        super().__init__(db, durability)
        self.agent = Keeper(agent_id=self.agent_id)

    def respond(self, call: FakeCall) -> Reply:
        def tools(question: str) -> list[ToolCall]:
            return [
                ToolCall("put_state", {"key": f"k-{question}"[:40], "value": '"v"'}),
                ToolCall("put_state", {"key": "shared", "value": json.dumps(question)}),
                ToolCall("add_to_context", {"item": f"note {question}"}),
            ]

        return answer_with(tools)(call)


class SQLWrites(Operation):
    """A turn whose tools insert and update rows of the agent's SQL workspace."""

    name = "sql"
    sql = "SELECT id, km, day FROM runs ORDER BY id"

    def __init__(self, db: Path, durability: Durability = "normal") -> None:
        super().__init__(db, durability)
        self.agent = Tracker(agent_id=self.agent_id)

    def respond(self, call: FakeCall) -> Reply:
        def tools(question: str) -> list[ToolCall]:
            return [
                ToolCall("sql_insert", {"table": "runs", "values": {"km": 5, "day": question}}),
                ToolCall("sql_execute", {"statement": "UPDATE runs SET km = km + 1"}),
            ]

        return answer_with(tools)(call)


class SQLCatchUp(SQLWrites):
    """The same, when the workspace file is a version behind the log: caught up first."""

    name = "sql-catch-up"

    @classmethod
    def build(cls, db: Path) -> None:
        with cls(db) as operation:
            operation.agent.ask("q0")
        workspace = Path(workspace_path(str(db), cls.agent_id))
        behind = workspace.read_bytes()  # closed: no -wal
        with cls(db) as operation:
            operation.agent.ask("q1")
        workspace.write_bytes(behind)


class Vacuum(Turn):
    """Store.vacuum: the file rebuilt through the WAL, then a checkpoint that empties it."""

    name = "vacuum"

    def run(self) -> None:
        self.persistence.store.vacuum()

    def again(self) -> None:
        self.persistence.store.vacuum()
        self.agent.ask("once more")


class AlarmDelivery(Operation):
    """The runner claims a due alarm and delivers it as a turn that marks it done."""

    name = "alarm"
    agent_id = "k"
    atomic = False  # the claim commits before the turn

    def __init__(self, db: Path, durability: Durability = "normal") -> None:
        super().__init__(db, durability)
        self.clock = FakeClock(START + 61)
        self.runner = AgentRunner(
            self.persistence.store, agents=make_agent, handlers=self.runner_handlers,
            clock=self.clock,
        )  # fmt: skip

    def runner_handlers(self, config: Any) -> list[Any]:
        return [*make_handlers(config), self.persistence]

    def __enter__(self) -> Self:
        return self

    @classmethod
    def build(cls, db: Path) -> None:
        with Store(db) as store:
            for i in range(2):
                when = make_schedule(START, delay=60 * (i + 1))
                store.schedule_alarm(cls.agent_id, f"chore {i}", when, now=START)
        with cls(db) as operation:
            operation.runner.run(until=START + 61)  # delivers "chore 0"

    def load(self) -> None:
        pass

    def run(self) -> None:
        self.runner.run(until=START + 121)  # "chore 1" is due at START + 120

    def again(self) -> None:
        self.clock.advance(3600)  # past any lease and retry delay
        self.runner.run(until=self.clock.now() + 1)

    def memory(self) -> tuple[list[Any], Any] | None:
        agent = self.runner.agents.get(self.agent_id)
        return in_memory(agent) if agent is not None else None

    def told_of_failure(self, since: int) -> bool:
        return True  # the runner's own model; the handoff is checked by the others

    def check(self) -> None:
        with Store(self.db, readonly=True) as store:
            assert delivered(store.history(self.agent_id)) == ["chore 0", "chore 1"]
            assert [a.status for a in store.alarms(include_ended=True)] == ["done", "done"]


class WorkflowStep(Operation):
    """A two-step workflow run again after its first step committed: a replay, a live step."""

    name = "workflow"
    atomic = True

    def __init__(self, db: Path, durability: Durability = "normal") -> None:
        super().__init__(db, durability)
        self.results: list[list[str]] = []

    def __enter__(self) -> Self:
        return self

    def program(self, steps: int) -> list[str]:
        persistence = PersistenceHandler(self.db, durability=self.durability, workflow="wf")
        try:
            with running(self.llm, persistence):
                self.agent = Assistant(agent_id=self.agent_id)
                return [self.agent.ask(f"step {i}") for i in range(steps)]
        finally:
            persistence.close()

    @classmethod
    def build(cls, db: Path) -> None:
        with cls(db) as operation:
            operation.program(1)

    def load(self) -> None:
        self.agent = Assistant(agent_id=self.agent_id)
        self.persistence.load(self.agent)

    def run(self) -> None:
        self.results.append(self.program(2))

    def again(self) -> None:
        self.results.append(self.program(2))

    def told_of_failure(self, since: int) -> bool:
        return True  # a failed step is told to its retry: tests/handlers/test_journal.py

    def check(self) -> None:
        assert self.results[-1] == [f"a: Answer the question: step {i}" for i in range(2)]
        asked = [call.last_user_text for call in self.llm.calls]
        assert "step 0" not in " ".join(asked), "a committed step went to the model again"
        assert asked.count(asked[-1]) <= 2  # the live step: at most once more after a failure


OPERATIONS: tuple[type[Operation], ...] = (
    Turn,
    Compaction,
    CompactionInTurn,
    MemoryWrites,
    SQLWrites,
    SQLCatchUp,
    Vacuum,
    AlarmDelivery,
    WorkflowStep,
)


# -- the sweep ----------------------------------------------------------------------


@pytest.fixture
def vfs() -> Iterator[FaultVFS]:
    with FaultVFS() as installed:
        yield installed


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """One base database per operation, built once for the module (through the VFS too)."""
    built: dict[str, Path] = {}
    root = tmp_path_factory.mktemp("bases")
    with FaultVFS():
        for operation in OPERATIONS:
            (root / operation.name).mkdir()
            operation.build(root / operation.name / "state.db")
            built[operation.name] = root / operation.name
    yield built


def copy_of(base: Path, to: Path) -> Path:
    shutil.copytree(base, to)
    return to / "state.db"


def count_calls(
    operation: type[Operation], base: Path, work: Path, vfs: FaultVFS, durability: Durability
) -> dict[str, int]:
    """How many I/O calls of each kind the operation makes on a copy of ``base``."""
    with operation(copy_of(base, work), durability) as session:
        session.load()
        with vfs.counting() as calls:
            session.run()
    return dict(calls)


def trial(
    operation: type[Operation],
    base: Path,
    work: Path,
    vfs: FaultVFS,
    fault: Fault,
    nth: int,
    durability: Durability,
) -> tuple[bool, bool]:
    """Fail call ``nth`` of ``fault.kind`` in the operation on a copy of ``base``; check it all.

    Returns:
        Whether the fault fired, and whether the operation raised (it may absorb a
        fault: the runner retries).
    """
    db = copy_of(base, work)
    before = snapshot(db, operation.sql)
    with operation(db, durability) as session:
        session.load()
        held = session.memory()
        met = len(vfs.errors)
        vfs.fail(fault, nth)
        try:
            session.run()
            error: Exception | None = None
        except Exception as raised:
            error = raised
        finally:
            fired = vfs.fired
            vfs.clear()
        where = f"{operation.name}, {fault.label} at call {nth}"
        if error is not None:
            ours = storage_error(error)
            assert ours is not None, f"{where} raised {error!r}, not StorageError"
            if fault.kind == "write" and fault.errno == errno.ENOSPC:
                assert isinstance(ours, DiskFullError), f"{where}: {ours!r}"
            failed_files = [os.path.realpath(path) for _, path, _ in vfs.errors[met:]]
            named = os.path.realpath(ours.path)
            assert any(f.startswith(named) for f in failed_files), f"{where}: names {named}"
            assert ours.path in str(ours)
        assert same_history(session.memory(), on_disk(db, operation.agent_id)), (
            f"{where}: the agent in memory is not its last commit"
        )
        if error is not None and operation.atomic:
            assert snapshot(db, operation.sql) == before, f"{where}: a failed operation committed"
            assert same_history(session.memory(), held), f"{where}: memory moved"
        with Store(db, readonly=True) as store:
            left = [h for h in store.handoffs() if h.agent_id == operation.agent_id]
        if error is not None and left and not fault.sticky:
            # A transient fault: recording the failure after it succeeds.
            assert left[0].status == "failed", f"{where}: {left[0]}"
            assert type(storage_error(error)).__name__ in str(left[0].error), where
        since = len(session.llm.calls)
        session.again()
        assert same_history(session.memory(), on_disk(db, operation.agent_id)), where
        assert not left or session.told_of_failure(since), f"{where}: the next turn was not told"
        session.check()
    after = snapshot(db, operation.sql)
    assert {k: v for k, v in after.items() if k in before} == before, (
        f"{where}: a committed version changed or was lost"
    )
    assert len(after) > len(before), f"{where}: the operation run again committed nothing"
    assert integrity(db) == "ok", where
    with Store(db, readonly=True) as store:
        assert [h for h in store.handoffs() if h.agent_id == operation.agent_id] == [], where
    return fired, error is not None


def durabilities(fault: Fault) -> list[Durability]:
    """Sync faults need ``"full"``: with ``"normal"`` a commit syncs nothing."""
    if FULL:
        return ["normal", "full"]
    return ["full"] if fault.kind == "sync" else ["normal"]


@pytest.mark.parametrize("fault", FAULTS, ids=[f.label for f in FAULTS])
@pytest.mark.parametrize("operation", OPERATIONS, ids=[o.name for o in OPERATIONS])
def test_fault_at_every_call(
    operation: type[Operation],
    fault: Fault,
    bases: dict[str, Path],
    tmp_path: Path,
    vfs: FaultVFS,
) -> None:
    """Each sampled call of the kind fails in turn: a clear error or success, and nothing lost."""
    base = bases[operation.name]
    for durability in durabilities(fault):
        calls = count_calls(operation, base, tmp_path / f"count-{durability}", vfs, durability)
        total = calls.get(fault.kind, 0)
        assert total > 0, f"{operation.name} made no {fault.kind} call: {calls}"
        tried = sample(total, SAMPLE)
        outcomes = [
            trial(operation, base, tmp_path / f"{durability}-{nth}", vfs, fault, nth, durability)
            for nth in tried
        ]
        assert any(fired for fired, _ in outcomes), f"no {fault.label} fired in {operation.name}"
        report(
            sweep="faults",
            operation=operation.name,
            fault=fault.label,
            durability=durability,
            calls=total,
            tried=len(tried),
            raised=sum(raised for _, raised in outcomes),
        )


# -- what the sweeps found ----------------------------------------------------------


def test_read_errors_in_a_compaction_commit(
    bases: dict[str, Path], tmp_path: Path, vfs: FaultVFS
) -> None:
    """A compaction commit failing at any read leaves the full-text index sound for the next.

    FTS5 kept in-memory state from the rolled-back transaction and damaged its
    index at the next insert on the same connection; the Store now replaces a
    connection that met an I/O error.
    """
    base = bases[CompactionInTurn.name]
    calls = count_calls(CompactionInTurn, base, tmp_path / "count", vfs, "normal")
    for nth in range(1, calls["read"] + 1):
        trial(CompactionInTurn, base, tmp_path / f"{nth}", vfs, READ_EIO, nth, "normal")


def test_the_runner_outlives_a_full_disk(
    bases: dict[str, Path], tmp_path: Path, vfs: FaultVFS, caplog: pytest.LogCaptureFixture
) -> None:
    """A disk that stays full while alarms are due: the runner logs, retries, delivers later."""
    db = copy_of(bases[AlarmDelivery.name], tmp_path / "db")
    with AlarmDelivery(db) as session:
        vfs.fail(WRITE_ENOSPC, nth=1)
        session.run()  # returns at its time, though nothing could be written
        vfs.clear()
        assert session.runner.errors > 0 and session.runner.turns == 0
        assert "the database failed; waiting for it, trying again every 0.5 s: cannot write" in (
            caplog.text
        )
        session.again()
        session.check()
    assert integrity(db) == "ok"
