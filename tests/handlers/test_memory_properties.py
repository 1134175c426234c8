"""Hypothesis: random memory writes, failed turns, rollbacks, forks and prunes vs a model dict.

The machine drives real turns of StateTools agents (FakeLLM tool calls through
PersistenceHandler on a real SQLite file, then on a PostgreSQL database) and
keeps, per agent, the memory every committed version must hold. After every step
it reads EVERY version of every agent back through ``Store.memory(agent, v)`` and
compares.
"""

import collections
import contextlib
import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import hypothesis.strategies as st
from helpers import Keeper, NewDatabases, integrity, persisted
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from effectful_durable.store.parts.memory import MemoryPart
from effectful_durable.testing import FakeCall, FakeLLM, Reply, ToolCall

KEYS = st.sampled_from(["a", "b", "c", "d"])
# Mostly small ints, so that keys often get back a value they held (an unchanged put
# writes no row), sometimes any JSON value.
JSON = st.integers(0, 3) | st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)
OPS = st.lists(
    st.tuples(st.just("put"), KEYS, JSON) | st.tuples(st.just("delete"), KEYS, st.none()),
    min_size=1,
    max_size=4,
)


class MemoryMachine(RuleBasedStateMachine):
    """Agents whose memory on disk must always equal the model, at every version."""

    names = Bundle("names")

    def __init__(self, new_database: Callable[[], AbstractContextManager[str]]) -> None:
        super().__init__()
        self.replies: collections.deque[Reply] = collections.deque()
        self.stack = contextlib.ExitStack()
        self.db = self.stack.enter_context(new_database())
        self.persistence = self.stack.enter_context(
            persisted(self.db, FakeLLM(respond=self._respond))
        )
        self.store = self.persistence.store
        self.agents: dict[str, Keeper] = {}
        self.versions: dict[str, list[dict[str, Any]]] = {}  # [v - 1] -> memory at v
        self.pruned: dict[str, int] = {}  # versions before this are no longer checked
        self.forks = 0

    def _respond(self, call: FakeCall) -> Reply:
        return self.replies.popleft()

    def teardown(self) -> None:
        self.stack.close()

    @initialize(target=names)
    def first_agent(self) -> str:
        """Agent a0, with one committed turn, so that rollback and fork apply at once."""
        self.agents["a0"] = Keeper(agent_id="a0")
        self.versions["a0"] = []
        self.turn("a0", [("put", "a", 0)])
        return "a0"

    def _calls(self, ops: list[tuple[str, str, Any]]) -> list[ToolCall]:
        return [
            ToolCall("put_state", {"key": key, "value": json.dumps(value)})
            if op == "put"
            else ToolCall("delete_state_key", {"key": key})
            for op, key, value in ops
        ]

    @rule(name=names, ops=OPS)
    def turn(self, name: str, ops: list[tuple[str, str, Any]]) -> None:
        """A turn whose tool calls put and delete keys (deleting a missing key is refused)."""
        history = self.versions[name]
        memory = dict(history[-1]) if history else {}
        for op, key, value in ops:
            if op == "put":
                memory[key] = value
            else:
                memory.pop(key, None)
        self.replies.extend([self._calls(ops), "done"])
        assert self.agents[name].ask("q") == "done"
        history.append(memory)

    @rule(name=names, ops=OPS)
    def failed_turn(self, name: str, ops: list[tuple[str, str, Any]]) -> None:
        """A turn that stages writes and then fails changes nothing."""
        self.replies.extend([self._calls(ops), RuntimeError("model down")])
        try:
            self.agents[name].ask("q")
        except RuntimeError:
            pass
        else:
            raise AssertionError("the turn should have failed")

    @precondition(lambda self: any(self.versions.values()))
    @rule(data=st.data())
    def rollback(self, data: st.DataObject) -> None:
        """Roll an agent back to one of its versions not pruned away."""
        name = data.draw(st.sampled_from(sorted(n for n, v in self.versions.items() if v)))
        history = self.versions[name]
        to = data.draw(st.integers(self.pruned.get(name, 1), len(history)))
        new = self.store.rollback(name, to)
        history.append(dict(history[to - 1]))
        assert new == len(history)

    @precondition(lambda self: any(self.versions.values()))
    @rule(target=names, data=st.data())
    def fork(self, data: st.DataObject) -> Any:
        """Fork an agent at one of its versions into a new agent."""
        name = data.draw(st.sampled_from(sorted(n for n, v in self.versions.items() if v)))
        history = self.versions[name]
        at = data.draw(st.integers(self.pruned.get(name, 1), len(history)))
        self.forks += 1
        new = f"f{self.forks}"
        self.store.fork(name, at, new)
        self.agents[new] = Keeper(agent_id=new)
        self.versions[new] = [dict(history[at - 1])]
        return multiple(new)

    @precondition(lambda self: any(len(v) > 1 for v in self.versions.values()))
    @rule(data=st.data())
    def prune(self, data: st.DataObject) -> None:
        """Prune an agent's memory rows that only versions before keep_from hold."""
        name = data.draw(
            st.sampled_from(sorted(n for n, v in self.versions.items() if len(v) > 1))
        )
        keep_from = data.draw(st.integers(self.pruned.get(name, 1), len(self.versions[name])))
        with self.store.engine.writing() as conn:
            MemoryPart().prune(conn, name, keep_from)
        self.pruned[name] = keep_from

    @rule(name=names)
    def reload(self, name: str) -> None:
        """A new instance of the agent (as in a new process) sees the same memory."""
        self.agents[name] = Keeper(agent_id=name)

    @invariant()
    def every_version_reads_back(self) -> None:
        for name, history in self.versions.items():
            for version in range(self.pruned.get(name, 1), len(history) + 1):
                assert self.store.memory(name, version) == history[version - 1], (name, version)
            if history:
                assert dict(self.agents[name].__memory__) == history[-1]

    @invariant()
    def no_stray_replies(self) -> None:
        assert not self.replies


class TestMemoryMachine:
    def test_every_version_reads_back(self, new_databases: NewDatabases) -> None:
        """Random turns, failed turns, rollbacks, forks and prunes leave every version's
        memory as the model says."""
        run_state_machine_as_test(
            lambda: MemoryMachine(new_databases),
            settings=settings(
                max_examples=new_databases.examples(20),
                stateful_step_count=12,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )

    def test_machine_database_is_sound(self, new_databases: NewDatabases) -> None:
        """One long run of the machine leaves a database that passes integrity_check."""
        machine = MemoryMachine(new_databases)
        try:
            machine.first_agent()
            for n in range(12):
                machine.turn("a0", [("put", "abcde"[n % 5], n), ("delete", "abcde"[n % 3], None)])
            assert integrity(machine.db) == "ok"
        finally:
            machine.teardown()
