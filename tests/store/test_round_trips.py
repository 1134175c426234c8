"""What a turn costs PostgreSQL in round trips and statements, counted on the wire.

The clients talk to a real server through ``tests/support/wire_counter.py``'s proxy, which
counts the messages they send: a count, not a timing, so the same on any machine.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from helpers import Assistant, persisted
from postgres_server import PostgresServer
from wire_counter import Counts, WireCounter

from effectful_durable.testing import FakeCall, FakeLLM, ToolCall

#: The most round trips a plain turn of an agent already loaded may take (issues 25
#: and 43): the hold with the handoff row, the commit, letting go (12 before issue 25).
PLAIN_TURN_ROUND_TRIPS = 3


@pytest.fixture
def counter(postgres_server: PostgresServer) -> Iterator[WireCounter]:
    proxy = WireCounter(os.path.join(postgres_server.directory, ".s.PGSQL.5432"))
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.fixture
def counted_url(postgres_url: str, counter: WireCounter) -> str:
    return counter.url(postgres_url.rsplit("/", 1)[1])


def reply(call: FakeCall) -> str | ToolCall:
    """Answer each question; ask for the ``remember`` tool when the question says so."""
    text = call.last_user_text
    if text.startswith("Answer the question: remember ") and call.messages[-1]["role"] == "user":
        return ToolCall("remember", {"note": text.rsplit(" ", 1)[1]})
    return "an answer of a few words"


def counted_turn(counter: WireCounter, bot: Assistant, question: str) -> Counts:
    counter.reset()
    bot.ask(question)
    return counter.counts()


def warm(bot: Assistant) -> None:
    """Enough turns that every statement a turn runs is prepared on its connection."""
    for i in range(8):
        bot.ask(f"warm-up {i}")
        bot.ask(f"remember warm-{i}")


class TestRoundTrips:
    def test_a_plain_turn(self, counter: WireCounter, counted_url: str) -> None:
        """A plain turn of an agent in memory takes at most three round trips."""
        with persisted(counted_url, FakeLLM(respond=reply)):
            bot = Assistant(agent_id="bot")
            warm(bot)
            counts = counted_turn(counter, bot, "what is new?")
            print(f"plain turn: {counts}")
            assert counts.round_trips <= PLAIN_TURN_ROUND_TRIPS, counts
            again = counted_turn(counter, bot, "and now?")
            assert (again.round_trips, again.statements) == (counts.round_trips, counts.statements)

    def test_a_tool_turn(self, counter: WireCounter, counted_url: str) -> None:
        """A turn that calls a tool (two model requests) takes no more round trips than a
        plain one: the tool's messages commit with the turn."""
        with persisted(counted_url, FakeLLM(respond=reply)):
            bot = Assistant(agent_id="bot")
            warm(bot)
            plain = counted_turn(counter, bot, "what is new?")
            tool = counted_turn(counter, bot, "remember this")
            print(f"tool turn: {tool}")
            assert bot.notes[-1] == "this"
            assert tool.round_trips == plain.round_trips, (plain, tool)
