"""DESIGN promises 2 and 6, checked on disk (promise 1: test_crash.py; 4: test_concurrency.py;
5: store/test_migrations.py and handlers/test_persistence.py)."""

from pathlib import Path

import apsw
import pytest

from effectful_durable import PersistenceHandler, Store
from effectful_durable.testing import FakeCall, FakeLLM
from tests.helpers import Assistant, persisted, running


def echo(call: FakeCall) -> str:
    return f"answer to {call.last_user_text}"


class TestPromise2FailedTurn:
    def test_program_goes_on_after_ctrl_c(self, db_path: Path) -> None:
        """After a Ctrl-C mid-turn, the same agent object commits its next turn normally."""
        llm = FakeLLM(["one", KeyboardInterrupt(), "three"])
        with persisted(db_path, llm):
            bot = Assistant(agent_id="bot")
            bot.ask("one")
            with pytest.raises(KeyboardInterrupt):
                bot.ask("two")
            bot.ask("three")
        store = Store(db_path)
        assert [v.version for v in store.versions("bot")] == [1, 2]
        contents = [m.get("content") for m in store.history("bot") if m["role"] == "assistant"]
        assert contents == ["one", "three"]


class TestPromise6CostFollowsTheTurn:
    def test_rows_written_per_turn_do_not_grow_with_history(self, db_path: Path) -> None:
        """Turn 120 changes as many rows as turn 3: only what it adds."""
        persistence = PersistenceHandler(db_path)
        with running(FakeLLM(respond=echo), persistence):
            bot = Assistant(agent_id="bot")
            changes = []
            for turn in range(120):
                conn = persistence.store._connection()
                before = conn.total_changes()
                bot.ask(f"question {turn}")
                changes.append(conn.total_changes() - before)
        assert changes[2] == changes[60] == changes[119]
        assert Store(db_path).versions("bot")[-1].added == 2

    def test_loading_reads_only_active_rows_through_the_index(self, db_path: Path) -> None:
        """load_agent's message query is an index range read of one conversation, not a
        table scan, however many other conversations the agent has."""
        with persisted(db_path, FakeLLM(respond=echo)):
            bot = Assistant(agent_id="bot")
            for turn in range(5):
                bot.ask(f"q{turn}")
            for other in ("c-1", "c-2"):
                with bot.conversation(other):
                    bot.ask(f"hello from {other}")
        store = Store(db_path)
        statements: list[tuple[str, object]] = []

        def tracer(cursor: apsw.Cursor, sql: str, bindings: object) -> bool:
            statements.append((sql, bindings))
            return True

        conn = store._connection()
        for conversation, count in (("default", 11), ("c-1", 3)):
            statements.clear()
            conn.exec_trace = tracer
            loaded = store.load_agent("bot", conversation)
            conn.exec_trace = None
            assert len(loaded.history.messages) == count
            [(query, bindings)] = [(s, b) for s, b in statements if "FROM messages" in s]
            plan = " ".join(
                row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {query}", bindings)
            )
            assert "USING INDEX messages_active" in plan and "SCAN" not in plan
