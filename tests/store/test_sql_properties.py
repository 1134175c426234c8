"""Hypothesis: random SQL turns, schema changes, failed turns, rollbacks, forks into new
and once-used ids, and the agent deleted and made anew, checked at every step against an
in-memory model of every version. On PostgreSQL each step runs on one of two machines,
each with a workspace cache of its own, and every machine reads every version."""

import gc
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import persisted
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from sql_helpers import Builder, sql_turn

from effectful_durable import Store
from effectful_durable.testing import FakeLLM, ToolCall


class Keeper(Builder):
    """You keep values."""

    __sql_schema__ = "CREATE TABLE notes (id INTEGER PRIMARY KEY, v)"


type Tables = dict[str, list[tuple[Any, ...]]]

ROW_IDS = st.integers(min_value=1, max_value=6)
VALUES = st.one_of(st.integers(-5, 5), st.text(max_size=3), st.none(), st.floats(-2, 2))
WRITE = st.one_of(
    st.tuples(st.just("upsert"), ROW_IDS, VALUES),
    st.tuples(st.just("delete"), ROW_IDS, st.none()),
)


def read_all(store: Store, agent_id: str, version: int | None = None) -> Tables:
    names = store.sql(
        agent_id,
        "SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name",
        version=version,
    ).rows
    return {
        name: store.sql(agent_id, f'SELECT * FROM "{name}" ORDER BY id', version=version).rows
        for (name,) in names
    }


def _calls(table: str, writes: list[tuple[str, int, Any]]) -> list[ToolCall]:
    calls = []
    for op, row_id, value in writes:
        if op == "upsert":
            statement = (
                f"INSERT INTO {table} (id, v) VALUES (?, ?) "
                "ON CONFLICT (id) DO UPDATE SET v = excluded.v"
            )
            calls.append(
                ToolCall("sql_execute", {"statement": statement, "params": [row_id, value]})
            )
        else:
            statement = f"DELETE FROM {table} WHERE id = ?"
            calls.append(ToolCall("sql_execute", {"statement": statement, "params": [row_id]}))
    return calls


def _apply(tables: Tables, table: str, writes: list[tuple[str, int, Any]]) -> Tables:
    rows = dict((r[0], r) for r in tables[table])
    for op, row_id, value in writes:
        if op == "upsert":
            rows[row_id] = (row_id, value)
        else:
            rows.pop(row_id, None)
    return {**tables, table: sorted(rows.values())}


#: Makes a new, empty database: its path or URL, and what removes it.
type NewDatabase = Callable[[], tuple[str, Callable[[], None]]]

MACHINE = st.integers(min_value=0, max_value=1)


class WorkspaceMachine(RuleBasedStateMachine):
    """The workspace of agent 'a' (and its forks) against a model of every version."""

    def __init__(self, new_database: NewDatabase, machines: int) -> None:
        super().__init__()
        self.new_database = new_database
        self.machines = machines

    @initialize()
    def start(self) -> None:
        self.db, self.remove = self.new_database()
        self.caches = tempfile.TemporaryDirectory()
        self.bot = Keeper(agent_id="a")
        sql_turn(self.store(0), self.bot)  # version 1: the declared, empty notes table
        self.model: dict[int, Tables] = {1: {"notes": []}}
        self.forks: dict[str, Tables] = {}

    def teardown(self) -> None:
        self.remove()
        self.caches.cleanup()

    def store(self, machine: int) -> Store:
        """The database as ``machine`` opens it (on PostgreSQL, with its own cache)."""
        if self.machines == 1:
            return Store(self.db)
        return Store(self.db, workspace_dir=Path(self.caches.name, str(machine)))

    @property
    def current(self) -> Tables:
        return self.model[max(self.model)]

    def _commit(self, tables: Tables) -> None:
        self.model[max(self.model) + 1] = tables

    @rule(writes=st.lists(WRITE, max_size=4), into_extra=st.booleans(), machine=MACHINE)
    def turn(self, writes: list[tuple[str, int, Any]], into_extra: bool, machine: int) -> None:
        table = "extra" if into_extra and "extra" in self.current else "notes"
        results = sql_turn(self.store(machine), self.bot, *_calls(table, writes))
        assert not any(r.startswith("error") for r in results), results
        self._commit(_apply(self.current, table, writes))

    @rule(machine=MACHINE)
    def create_or_drop_extra(self, machine: int) -> None:
        if "extra" in self.current:
            statement = "DROP TABLE extra"
            tables = {k: v for k, v in self.current.items() if k != "extra"}
        else:
            statement = "CREATE TABLE extra (id INTEGER PRIMARY KEY, v)"
            tables = {**self.current, "extra": []}
        sql_turn(self.store(machine), self.bot, ToolCall("sql_execute", {"statement": statement}))
        self._commit(tables)

    @rule(writes=st.lists(WRITE, min_size=1, max_size=3), machine=MACHINE)
    def failed_turn(self, writes: list[tuple[str, int, Any]], machine: int) -> None:
        llm = FakeLLM([*_calls("notes", writes), RuntimeError("model down")])
        with persisted(self.store(machine), llm), pytest.raises(RuntimeError):
            self.bot.ask("go")

    @rule(data=st.data(), machine=MACHINE)
    def rollback(self, data: st.DataObject, machine: int) -> None:
        version = data.draw(st.integers(1, max(self.model)))
        with self.store(machine) as store:
            new = store.rollback("a", version)
        assert new == max(self.model) + 1
        self._commit(self.model[version])

    @rule(data=st.data(), machine=MACHINE)
    def fork(self, data: st.DataObject, machine: int) -> None:
        version = data.draw(st.integers(1, max(self.model)))
        new_id = data.draw(st.sampled_from(["fork-0", "fork-1"]))
        with self.store(machine) as store:
            if new_id in self.forks:
                store.delete(new_id)  # a fork into an id the caches held
            store.fork("a", version, new_id)
        self.forks[new_id] = self.model[version]

    @rule(machine=MACHINE)
    def recreate(self, machine: int) -> None:
        with self.store(machine) as store:
            store.delete("a")
        self.bot = Keeper(agent_id="a")
        sql_turn(self.store(machine), self.bot)
        self.model = {1: {"notes": []}}

    @invariant()
    def every_version_reads_back(self) -> None:
        for machine in range(self.machines):
            with self.store(machine) as store:
                for version, tables in self.model.items():
                    assert read_all(store, "a", version) == tables, (machine, version)
                assert read_all(store, "a") == self.current
                for agent_id, tables in self.forks.items():
                    assert read_all(store, agent_id) == tables, (machine, agent_id)


class TestWorkspaceVersions:
    """Hypothesis drives the machine above on an SQLite file and a PostgreSQL database."""

    @pytest.mark.parametrize("backend", ["sqlite", "postgres"])
    def test_every_version_reads_back(self, backend: str, request: pytest.FixtureRequest) -> None:
        """Every version of the tables reads back after any sequence of changes."""

        def new_database() -> tuple[str, Callable[[], None]]:
            if backend == "sqlite":
                directory = tempfile.TemporaryDirectory()
                return str(Path(directory.name) / "state.db"), directory.cleanup
            server = request.getfixturevalue("postgres_server")
            url = server.new_database()

            def drop() -> None:
                gc.collect()  # Stores the failing example left open let go of their pools
                server.drop_database(url)

            return url, drop

        run_state_machine_as_test(
            lambda: WorkspaceMachine(new_database, machines=1 if backend == "sqlite" else 2),
            settings=settings(max_examples=8, stateful_step_count=10, deadline=None),
        )
