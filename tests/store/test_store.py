"""Store: reads, rollback, fork, delete, and transactions that commit whole or not at all."""

import pytest
from helpers import Assistant, persisted, persisted_rows, texts

from effectful_durable import AgentInUseError, DurableError, NotFoundError, Store
from effectful_durable.store import versions
from effectful_durable.store.history import ActiveHistory, plan_change
from effectful_durable.testing import FakeCall, FakeLLM


def echo(call: FakeCall) -> str:
    return f"re: {call.last_user_text}"


@pytest.fixture
def three_turns(store_url: str) -> str:
    """A database holding agent 'bot' at version 3, its turns field 1, 2, 3."""
    with persisted(store_url, FakeLLM(respond=echo)):
        bot = Assistant(agent_id="bot")
        for turn in (1, 2, 3):
            bot.turns = turn
            bot.ask(f"q{turn}")
    return store_url


def user_texts(messages: list[dict]) -> list[str]:
    return [t for t in texts(messages) if t.startswith("user:")]


class TestReads:
    def test_agents_lists_versions_and_message_counts(self, three_turns: str) -> None:
        """agents() reports each agent's version and active message count."""
        [record] = Store(three_turns).agents()
        assert (record.agent_id, record.version, record.messages) == ("bot", 3, 7)
        assert record.created_at <= record.updated_at

    def test_unknown_agent_and_version_are_clear_errors(self, three_turns: str) -> None:
        """Reading an unknown agent or version raises NotFoundError saying what exists."""
        store = Store(three_turns)
        with pytest.raises(NotFoundError, match="no agent 'nobody'"):
            store.history("nobody")
        with pytest.raises(NotFoundError, match="versions 1 to 3"):
            store.state("bot", 9)
        with pytest.raises(LookupError):
            store.versions("nobody")

    def test_readonly_store_reads(self, three_turns: str) -> None:
        """A read-only store reads everything and refuses to write."""
        with Store(three_turns, readonly=True) as store:
            assert len(store.history("bot")) == 7
            with pytest.raises(Exception, match="readonly"):
                store.rollback("bot", 1)


class TestRollback:
    def test_rollback_is_a_new_version_equal_to_the_old(self, three_turns: str) -> None:
        """rollback() commits version 4 with version 1's history and state."""
        store = Store(three_turns)
        assert store.rollback("bot", 1) == 4
        assert store.history("bot") == store.history("bot", 1)
        assert store.state("bot") == store.state("bot", 1) == store.state("bot", 4)
        assert len(store.history("bot", 3)) == 7  # nothing deleted
        last = store.versions("bot")[-1]
        assert (last.kind, last.detail, last.removed) == ("rollback", {"to": 1}, 4)

    def test_rollforward_after_rollback(self, three_turns: str) -> None:
        """Rolling back to a version after a rollback restores that later version."""
        store = Store(three_turns)
        store.rollback("bot", 1)
        store.rollback("bot", 3)
        assert store.history("bot") == store.history("bot", 3)
        assert store.state("bot")["turns"] == 3

    def test_live_agent_continues_from_the_rollback(self, three_turns: str) -> None:
        """An agent object that was ahead reloads the rolled-back version at its next turn."""
        with persisted(three_turns, FakeLLM(respond=echo)) as persistence:
            bot = Assistant(agent_id="bot")
            persistence.load(bot)
            persistence.store.rollback("bot", 1)
            bot.ask("after rollback")
        assert bot.turns == 1
        assert user_texts(Store(three_turns).history("bot")) == [
            "user:Answer the question: q1",
            "user:Answer the question: after rollback",
        ]

    def test_rollback_while_a_turn_runs_is_refused(self, three_turns: str) -> None:
        """rollback() takes the agent's lock and fails fast while a turn holds it."""
        store = Store(three_turns)
        with store.agent_lock("bot"), pytest.raises(AgentInUseError):
            Store(three_turns).rollback("bot", 1)


class TestForkAndDelete:
    def test_fork_copies_history_and_state(self, three_turns: str) -> None:
        """fork() makes a new agent at version 1 equal to the source version."""
        store = Store(three_turns)
        record = store.fork("bot", 2, "bot-copy")
        assert (record.agent_id, record.version, record.messages) == ("bot-copy", 1, 5)
        assert store.history("bot-copy") == store.history("bot", 2)
        assert store.state("bot-copy")["turns"] == 2
        assert store.versions("bot-copy")[0].detail == {"from": "bot", "version": 2}

    def test_forked_agent_runs_independently(self, three_turns: str) -> None:
        """A turn of the fork leaves the source untouched."""
        Store(three_turns).fork("bot", None, "twin")
        with persisted(three_turns, FakeLLM(respond=echo)):
            Assistant(agent_id="twin").ask("only the twin")
        store = Store(three_turns)
        assert len(store.history("twin")) == 9 and len(store.history("bot")) == 7

    def test_fork_refuses_an_existing_or_invalid_id(self, three_turns: str) -> None:
        """Forking onto an existing agent or an invalid id is refused."""
        store = Store(three_turns)
        with pytest.raises(DurableError, match="already exists"):
            store.fork("bot", 1, "bot")
        with pytest.raises(ValueError, match="invalid agent_id"):
            store.fork("bot", 1, "")

    def test_delete_removes_everything_of_one_agent(self, three_turns: str) -> None:
        """delete() removes the agent's rows and leaves other agents alone."""
        store = Store(three_turns)
        store.fork("bot", None, "keep")
        store.delete("bot")
        assert [a.agent_id for a in store.agents()] == ["keep"]
        assert persisted_rows(
            three_turns, "SELECT count(*) FROM messages WHERE agent_id='bot'"
        ) == [(0,)]
        with pytest.raises(NotFoundError):
            store.delete("bot")


class TestTransactions:
    @pytest.mark.parametrize(
        "error", [RuntimeError, KeyboardInterrupt], ids=["exception", "ctrl-c"]
    )
    def test_failed_commit_writes_nothing(
        self, store_url: str, error: type[BaseException], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An error inside the commit transaction rolls every row of it back."""
        store = Store(store_url)
        change, _ = plan_change(ActiveHistory(), [{"id": "a", "role": "user", "content": "x"}])
        calls = {"n": 0}
        original = versions.insert_version

        def failing(*args: object, **kwargs: object) -> None:
            calls["n"] += 1
            original(*args, **kwargs)  # type: ignore[arg-type]
            raise error("mid-commit")

        monkeypatch.setattr(versions, "insert_version", failing)
        with pytest.raises(error):
            store.turns.commit("a", base_version=0, template="t", change=change, state="{}")
        assert calls["n"] == 1
        for table in ("agents", "messages", "versions"):
            assert persisted_rows(store_url, f"SELECT count(*) FROM {table}") == [(0,)]
        monkeypatch.undo()
        assert (
            store.turns.commit("a", base_version=0, template="t", change=change, state="{}") == 1
        )

    def test_stale_base_version_is_refused(self, store_url: str) -> None:
        """A commit based on an outdated version raises instead of overwriting."""
        store = Store(store_url)
        first = {"id": "a", "role": "user"}
        change, after = plan_change(ActiveHistory(), [first])
        store.turns.commit("a", base_version=0, template="t", change=change, state=None)
        with pytest.raises(AgentInUseError, match="committed version 1"):
            store.turns.commit("a", base_version=0, template="t", change=change, state=None)
        later, _ = plan_change(after, [first, {"id": "b", "role": "user"}])
        store.turns.commit("a", base_version=1, template="t", change=later, state=None)
        with pytest.raises(AgentInUseError, match="committed version 2"):
            store.turns.commit("a", base_version=1, template="t", change=later, state=None)
        reopened = Store(store_url)
        assert [v.version for v in reopened.versions("a")] == [1, 2]
        loaded = reopened.turns.load("a")
        assert loaded.version == 2
        assert loaded.history.messages == [first, {"id": "b", "role": "user"}]

    def test_closed_store_says_so(self, store_url: str) -> None:
        """Using a closed store raises a DurableError naming the file."""
        store = Store(store_url)
        store.close()
        with pytest.raises(DurableError, match="is closed"):
            store.agents()
