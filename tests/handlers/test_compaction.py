"""CompactionHandler: budgets, valid cuts, lossless persistence, recall, stacking."""

import dataclasses
import logging
from typing import Any

import pytest
from helpers import Assistant, PlainBot, in_new_process, running, texts
from hypothesis import given, settings
from hypothesis import strategies as st

from effectful_durable import (
    CompactionHandler,
    PersistenceHandler,
    RecallTools,
    Store,
)
from effectful_durable.handlers.compaction import valid_cut
from effectful_durable.testing import FakeCall, FakeLLM, ToolCall


@dataclasses.dataclass
class Rememberer(Assistant, RecallTools):
    """You are an assistant with a long memory."""


class Model:
    """Echoes questions; writes numbered summaries when asked to summarise."""

    def __init__(self) -> None:
        self.summaries = 0
        self.llm = FakeLLM(respond=self.respond)

    def respond(self, call: FakeCall) -> Any:
        text = call.last_user_text
        if "Summarise the conversation below" in text:
            self.summaries += 1
            return f"SUMMARY {self.summaries}: " + " | ".join(
                line for line in text.splitlines() if line.startswith("[user]")
            )
        return f"re: {text}"


def stack(store_url: str, compaction: CompactionHandler, order: str = "in-turn") -> list[Any]:
    """Handlers after the fake model; "in-turn" lists compaction first, so persistence
    sees each call first and commits the compaction with the turn."""
    persistence = PersistenceHandler(store_url)
    return [compaction, persistence] if order == "in-turn" else [persistence, compaction]


def ask_many(bot: Any, count: int, start: int = 0) -> None:
    for n in range(start, start + count):
        bot.ask(f"question {n}")


class TestBudget:
    def test_message_budget_compacts_to_system_summary_recent(self, store_url: str) -> None:
        """Crossing max_messages leaves [system, summary, keep_recent messages]."""
        model = Model()
        with running(
            model.llm, *stack(store_url, CompactionHandler(max_messages=8, keep_recent=3))
        ):
            bot = Assistant(agent_id="bot")
            ask_many(bot, 3)  # 7 messages: under budget
            assert model.summaries == 0
            bot.ask("question 3")  # 9 messages: over
        history = list(bot.__history__.values())
        assert model.summaries == 1
        assert [m["role"] for m in history] == ["system", "user", "assistant", "user", "assistant"]
        assert history[0]["role"] == "system" and "SUMMARY 1" in texts([history[1]])[0]

    def test_token_budget(self, store_url: str) -> None:
        """max_tokens counts with the default estimator and compacts when crossed."""
        model = Model()
        with running(
            model.llm, *stack(store_url, CompactionHandler(max_tokens=60, keep_recent=2))
        ):
            bot = Assistant(agent_id="bot")
            turns = 0
            while model.summaries == 0:
                bot.ask("a fairly long question about the weather in many cities " * 2)
                turns += 1
        history = list(bot.__history__.values())
        # The first turn's 3 messages hold too few to summarise while keeping 2.
        assert turns == 2
        assert [m["role"] for m in history] == ["system", "user", "user", "assistant"]
        assert "SUMMARY 1" in texts([history[1]])[0]

    def test_no_summary_below_budget(self, store_url: str) -> None:
        """Turns under the budget never call the summariser."""
        model = Model()
        with running(model.llm, *stack(store_url, CompactionHandler(max_messages=100))):
            ask_many(Assistant(agent_id="bot"), 10)
        assert model.summaries == 0 and model.llm.call_count == 10

    def test_repeated_compaction_folds_the_previous_summary(self, store_url: str) -> None:
        """The second summary is written from a transcript that holds the first."""
        model = Model()
        with running(
            model.llm, *stack(store_url, CompactionHandler(max_messages=6, keep_recent=2))
        ):
            bot = Assistant(agent_id="bot")
            ask_many(bot, 6)
        assert model.summaries >= 2
        summaries = [c.last_user_text for c in model.llm.calls if "Summarise" in c.last_user_text]
        assert "SUMMARY 1" in summaries[1]
        assert sum("SUMMARY" in t for t in texts(list(bot.__history__.values()))) == 1

    def test_bad_budgets_are_refused(self) -> None:
        """A handler without budget, or one that cannot shorten anything, is refused."""
        with pytest.raises(ValueError, match="needs a budget"):
            CompactionHandler()
        with pytest.raises(ValueError, match="keep_recent"):
            CompactionHandler(max_messages=5, keep_recent=4)

    def test_plain_agent_is_compacted_in_memory(self, store_url: str) -> None:
        """A non-persistent effectful Agent is compacted too, with nothing stored."""
        model = Model()
        with running(model.llm, CompactionHandler(max_messages=5, keep_recent=2)):
            bot = PlainBot()
            for n in range(3):
                bot.ask(f"q{n}")
        assert model.summaries == 1 and len(bot.__history__) <= 5


class TestLossless:
    @pytest.mark.parametrize("order", ["in-turn", "after-turn"])
    def test_compaction_survives_a_new_handler_without_resummarising(
        self, store_url: str, order: str
    ) -> None:
        """A new handler loads the compacted context and does not summarise again."""
        model = Model()
        compaction = CompactionHandler(max_messages=8, keep_recent=3)
        with running(model.llm, *stack(store_url, compaction, order)):
            ask_many(Assistant(agent_id="bot"), 4)
        assert model.summaries == 1
        later = Model()
        with running(
            later.llm, *stack(store_url, CompactionHandler(max_messages=8, keep_recent=3), order)
        ):
            bot = Assistant(agent_id="bot")
            bot.ask("question 4")
        assert later.summaries == 0
        sent = texts(later.llm.calls[0].messages)
        assert "SUMMARY 1" in sent[1] and "question 0" not in " ".join(sent[2:])
        kinds = [v.kind for v in Store(store_url).versions("bot")]
        assert kinds == ["turn"] * 4 + ["compaction", "turn"]

    def test_originals_stay_readable_and_marked(self, store_url: str) -> None:
        """include_compacted returns every message in order, originals and summary marked."""
        model = Model()
        with running(
            model.llm, *stack(store_url, CompactionHandler(max_messages=8, keep_recent=3))
        ):
            ask_many(Assistant(agent_id="bot"), 4)
        store = Store(store_url)
        everything = store.history("bot", include_compacted=True)
        users = [t for t in texts(everything) if t.startswith("user:Answer")]
        assert users == [f"user:Answer the question: question {n}" for n in range(4)]
        compacted = [m for m in everything if "compacted_in" in m.get("durable", {})]
        [summary] = [m for m in everything if "summary_of" in m.get("durable", {})]
        assert len(compacted) == summary["durable"]["summary_of"] == 5  # u0 a0 u1 a1 u2
        assert everything.index(summary) == len(compacted) + 1  # right after the originals
        assert len(store.history("bot")) == 5

    def test_rollback_before_compaction_restores_originals(self, store_url: str) -> None:
        """Rolling back past a compaction makes the originals the active context again."""
        model = Model()
        with running(
            model.llm, *stack(store_url, CompactionHandler(max_messages=8, keep_recent=3))
        ):
            ask_many(Assistant(agent_id="bot"), 4)
        store = Store(store_url)
        store.rollback("bot", 4)
        active = texts(store.history("bot"))
        assert len(active) == 9 and not any("SUMMARY" in t for t in active)

    def test_summariser_failure_changes_nothing(
        self, store_url: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        """If the summariser raises, history and database stay as the turn left them."""

        def respond(call: FakeCall) -> str:
            if "Summarise" in call.last_user_text:
                raise RuntimeError("summariser down")
            return "fine"

        with running(
            FakeLLM(respond=respond),
            *stack(store_url, CompactionHandler(max_messages=4, keep_recent=1)),
        ):
            bot = Assistant(agent_id="bot")
            bot.ask("q0")
            bot.ask("q1")
        assert len(bot.__history__) == 5
        assert Store(store_url).history("bot") == list(bot.__history__.values())
        assert [v.kind for v in Store(store_url).versions("bot")] == ["turn", "turn"]
        assert "summariser down" in caplog.text

    def test_recall_tool_finds_compacted_messages(self, store_url: str) -> None:
        """RecallTools lets the model search messages that were compacted away."""
        model = Model()

        def respond(call: FakeCall) -> Any:
            if "the secret" in call.last_user_text and call.messages[-1]["role"] == "user":
                return ToolCall("recall", {"query": "zebra codeword"})
            if call.messages[-1]["role"] == "tool":
                return "found: " + texts([call.messages[-1]])[0]
            return model.respond(call)

        with running(
            FakeLLM(respond=respond),
            *stack(store_url, CompactionHandler(max_messages=8, keep_recent=2)),
        ):
            bot = Rememberer(agent_id="bot")
            bot.ask("remember the codeword zebra")
            ask_many(bot, 3)
            assert "zebra" not in " ".join(texts(list(bot.__history__.values()))[2:])
            answer = bot.ask("what was the secret?")
        assert "remember the codeword zebra" in answer

    def test_text_holding_a_nul_is_kept_compacted_and_found(self, store_url: str) -> None:
        """A NUL in a message (PostgreSQL's text cannot hold one) survives the commit,
        compaction and recall on both backends."""
        model = Model()
        with running(
            model.llm, *stack(store_url, CompactionHandler(max_messages=8, keep_recent=2))
        ):
            bot = Rememberer(agent_id="bot")
            bot.ask("remember the code\x00word zebra")
            ask_many(bot, 3)
        with Store(store_url, readonly=True) as store:
            everything = texts(store.history("bot", include_compacted=True))
            found = texts(store.search_compacted("bot", "zebra"))
        assert any("remember the code\x00word zebra" in text for text in everything)
        assert any("code\x00word zebra" in text for text in found), found


class TestValidCuts:
    def test_cut_never_splits_a_tool_exchange(self) -> None:
        """The kept part never starts inside a tool call's results."""
        messages = [
            {"id": "s", "role": "system"},
            {"id": "u", "role": "user"},
            {"id": "a", "role": "assistant", "tool_calls": [{"id": "c1"}, {"id": "c2"}]},
            {"id": "t1", "role": "tool", "tool_call_id": "c1"},
            {"id": "t2", "role": "tool", "tool_call_id": "c2"},
            {"id": "f", "role": "assistant"},
        ]
        assert valid_cut(messages, 1, 5) == 5
        # 3 and 4 would part c1/c2 from their results, and 2 summarises one message.
        assert valid_cut(messages, 1, 4) is None

    def test_cut_moves_earlier_to_keep_at_least_keep_recent(self) -> None:
        """When the cut at keep_recent parts a tool exchange, more are kept, never fewer."""
        messages = [
            {"id": "s", "role": "system"},
            {"id": "u1", "role": "user"},
            {"id": "a1", "role": "assistant"},
            {"id": "u2", "role": "user"},
            {"id": "a", "role": "assistant", "tool_calls": [{"id": "c1"}]},
            {"id": "t1", "role": "tool", "tool_call_id": "c1"},
            {"id": "f", "role": "assistant"},
        ]
        # keep_recent=2 would cut at 5, between the call and its result: keep 3 instead.
        assert valid_cut(messages, 1, len(messages) - 2) == 4
        # keep_recent=3 from index 4 leaves only u1, a1, u2 to summarise: still valid.
        assert valid_cut(messages, 1, 4) == 4

    def test_too_little_left_to_summarise_is_not_compacted(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        """If keeping keep_recent leaves under two messages to summarise, nothing changes."""
        caplog.set_level(logging.WARNING, logger="effectful_durable.compaction")
        agent = PlainBot()
        for message in [
            {"id": "s", "role": "system", "content": "sys"},
            {"id": "u", "role": "user", "content": "go " * 50},
            {"id": "a", "role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
            {"id": "t1", "role": "tool", "tool_call_id": "c1", "content": "r " * 50},
            {"id": "f", "role": "assistant", "content": "done " * 50},
        ]:
            agent.__history__[message["id"]] = message
        before = dict(agent.__history__)
        # keep_recent=2 cuts at 3 (call | result): the old code moved it to 4 and kept
        # one message; now it moves to 2, which leaves only "u" to summarise.
        handler = CompactionHandler(max_tokens=10, keep_recent=2, summarizer=lambda text: "S")
        assert handler.compact(agent) is False
        assert dict(agent.__history__) == before
        assert "keep_recent=2" in caplog.text

    def test_nothing_to_summarise_is_logged_and_changes_nothing(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        """If no cut can shorten the history, the agent is left as it was and a warning says so."""
        caplog.set_level(logging.WARNING, logger="effectful_durable.compaction")
        agent = PlainBot()
        for message in [
            {"id": "s", "role": "system", "content": "sys"},
            {"id": "u", "role": "user", "content": "a very long question " * 50},
        ]:
            agent.__history__[message["id"]] = message
        before = dict(agent.__history__)
        handler = CompactionHandler(max_tokens=10, keep_recent=0, summarizer=lambda text: "S")
        assert handler.compact(agent) is False
        assert dict(agent.__history__) == before
        assert "not compacting" in caplog.text


def conversations() -> st.SearchStrategy[list[dict[str, Any]]]:
    """Random valid conversations: user turns, answers, and multi-call tool exchanges."""
    exchange = st.one_of(
        st.just("user"),
        st.just("assistant"),
        st.integers(min_value=1, max_value=3),  # an assistant asking for n tool calls
    )

    def build(parts: list[Any]) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = [{"id": "sys", "role": "system", "content": "s"}]
        for i, part in enumerate(parts):
            if isinstance(part, int):
                calls = [
                    {"id": f"c{i}-{j}", "function": {"name": "f", "arguments": "{}"}}
                    for j in range(part)
                ]
                messages.append(
                    {"id": f"a{i}", "role": "assistant", "content": None, "tool_calls": calls}
                )
                messages += [
                    {
                        "id": f"t{i}-{j}",
                        "role": "tool",
                        "tool_call_id": f"c{i}-{j}",
                        "content": "r",
                    }
                    for j in range(part)
                ]
            else:
                messages.append({"id": f"m{i}", "role": part, "content": f"text {i}"})
        return messages

    return st.lists(exchange, min_size=0, max_size=25).map(build)


def is_valid_conversation(messages: list[dict[str, Any]]) -> bool:
    requested: dict[str, int] = {}
    answered: set[str] = set()
    for index, message in enumerate(messages):
        for call in message.get("tool_calls") or []:
            requested[call["id"]] = index
        if message["role"] == "tool":
            if message["tool_call_id"] not in requested:
                return False
            answered.add(message["tool_call_id"])
    return set(requested) <= answered and messages[0]["role"] == "system"


@settings(max_examples=300, deadline=None)
@given(conversation=conversations(), keep_recent=st.integers(min_value=0, max_value=8))
def test_compaction_keeps_any_conversation_valid(
    conversation: list[dict[str, Any]], keep_recent: int
) -> None:
    """After compaction every tool result follows its request, every request is answered,
    and the history is never longer than before."""
    agent = PlainBot()
    for message in conversation:
        agent.__history__[message["id"]] = message
    handler = CompactionHandler(
        max_messages=keep_recent + 3, keep_recent=keep_recent, summarizer=lambda text: "S"
    )
    handler.compact(agent)
    after = list(agent.__history__.values())
    assert is_valid_conversation(after)
    assert len(after) <= len(conversation)
    assert after[0] == conversation[0]
    if len(after) < len(conversation):  # compacted: the keep_recent latest are intact
        assert after[len(after) - keep_recent :] == conversation[len(conversation) - keep_recent :]


@pytest.mark.processes
def test_compacted_context_loads_in_a_new_process(store_url: str) -> None:
    """A fresh interpreter loads [system, summary, recent] and never calls the summariser."""
    model = Model()
    with running(model.llm, *stack(store_url, CompactionHandler(max_messages=8, keep_recent=3))):
        ask_many(Assistant(agent_id="bot"), 4)
    script = f"""
        from effectful_durable import CompactionHandler, PersistenceHandler
        from effectful_durable.testing import FakeLLM
        from helpers import Assistant, running, texts
        llm = FakeLLM(["fresh answer"])
        compaction = CompactionHandler(max_messages=8, keep_recent=3)
        with running(llm, PersistenceHandler({str(store_url)!r}), compaction):
            Assistant(agent_id="bot").ask("question 4")
        sent = texts(llm.calls[0].messages)
        print(llm.call_count, len(sent), "SUMMARY 1" in sent[1])
        """
    out = in_new_process(script)
    assert out.split() == ["1", "6", "True"]  # system, summary, 3 kept, the new question
