"""DESIGN promises 2 and 6, checked on disk, on SQLite and PostgreSQL (promise 1:
test_crash.py; 4: test_concurrency.py; 5: store/test_migrations.py and
handlers/test_persistence.py)."""

import pytest
from helpers import (
    Assistant,
    indexes_and_scans,
    pad_messages,
    persisted,
    rows_written_from_now,
    running,
    statements_run,
)

from effectful_durable import PersistenceHandler, Store
from effectful_durable.testing import FakeCall, FakeLLM


def echo(call: FakeCall) -> str:
    return f"answer to {call.last_user_text}"


class TestPromise2FailedTurn:
    def test_program_goes_on_after_ctrl_c(self, store_url: str) -> None:
        """After a Ctrl-C mid-turn, the same agent object commits its next turn normally."""
        llm = FakeLLM(["one", KeyboardInterrupt(), "three"])
        with persisted(store_url, llm) as persistence:
            bot = Assistant(agent_id="bot")
            bot.ask("one")
            with pytest.raises(KeyboardInterrupt):
                bot.ask("two")
            [handoff] = persistence.store.handoffs()
            bot.ask("three")
        with Store(store_url) as store:
            assert [v.version for v in store.versions("bot")] == [1, 2]
            contents = [m.get("content") for m in store.history("bot") if m["role"] == "assistant"]
        assert contents == ["one", "three"]
        assert (handoff.status, handoff.arguments) == ("failed", {"question": "two"})
        assert "KeyboardInterrupt" in str(handoff.error)


class TestPromise6CostFollowsTheTurn:
    def test_rows_written_per_turn_do_not_grow_with_history(self, store_url: str) -> None:
        """Turn 120 changes as many rows as turn 3: only what it adds."""
        persistence = PersistenceHandler(store_url)
        try:
            with running(FakeLLM(respond=echo), persistence):
                bot = Assistant(agent_id="bot")
                changes = []
                for turn in range(120):
                    written = rows_written_from_now(persistence.store)
                    bot.ask(f"question {turn}")
                    changes.append(written())
        finally:
            persistence.close()
        assert changes[2] == changes[60] == changes[119]
        with Store(store_url) as store:
            assert store.versions("bot")[-1].added == 2

    def test_turn_after_a_load_among_many_agents_writes_what_any_turn_writes(
        self, store_url: str
    ) -> None:
        """The first turn of an agent loaded afresh, among 30 other agents, changes as many
        rows as its turns before did."""
        with persisted(store_url, FakeLLM(respond=echo)) as persistence:
            bot = Assistant(agent_id="bot")
            for turn in range(40):
                written = rows_written_from_now(persistence.store)
                bot.ask(f"question {turn}")
            before = written()
            for n in range(30):
                Assistant(agent_id=f"other-{n}").ask("hello")
        with persisted(store_url, FakeLLM(respond=echo)) as persistence:
            bot = Assistant(agent_id="bot")
            persistence.load(bot)
            written = rows_written_from_now(persistence.store)
            bot.ask("question 40")
            assert written() == before

    def test_loading_reads_only_active_rows_through_the_index(self, store_url: str) -> None:
        """load_agent's message query is an index range read of one conversation, not a
        table scan, however many other conversations the agent has."""
        with persisted(store_url, FakeLLM(respond=echo)):
            bot = Assistant(agent_id="bot")
            for turn in range(5):
                bot.ask(f"q{turn}")
            for other in ("c-1", "c-2"):
                with bot.conversation(other):
                    bot.ask(f"hello from {other}")
        pad_messages(store_url, "bot", 20_000)
        with Store(store_url) as store:
            for conversation, count in (("default", 11), ("c-1", 3)):
                with statements_run(store) as statements:
                    loaded = store.turns.load("bot", conversation)
                assert len(loaded.history.messages) == count
                [(query, bindings)] = [(s, b) for s, b in statements if "FROM messages" in s]
                indexes, scans = indexes_and_scans(store, query, bindings)
                assert "messages_active" in indexes and "messages" not in scans
