"""A database holding every kind of thing the page shows, with HTML in every field a
person's eye would meet: messages, ids, tool arguments, memory, SQL values.

``build(db)`` runs a help desk agent through a few turns over the fake model (memory,
an SQL row, an alarm, a refund that waits for approval, a compaction, a second
conversation), an agent whose id is HTML, an agent whose turn failed, an event in an
inbox, and a workflow journal; and names subjects: :data:`ANN` is the desk's and the
HTML agent's, and the failed agent's default conversation's, :data:`BOB` (HTML too)
the desk's chat's. Works on an SQLite file and on a PostgreSQL URL.
"""

import contextlib
import dataclasses

from effectful.handlers.llm import Template, Tool
from effectful.handlers.llm.completions import RetryLLMHandler
from effectful.ops.semantics import handler
from effectful.ops.types import NotHandled
from helpers import commit_message, persisted, running

from effectful_durable import (
    AlarmTools,
    CompactionHandler,
    PersistenceHandler,
    PersistentAgent,
    SQLTools,
    StateTools,
    Store,
    TurnSuspended,
    requires_approval,
)
from effectful_durable.testing import FakeLLM, ToolCall

HTML = "<script>alert('x')</script>"
DESK = "desk"
HTML_AGENT = f"bot{HTML}"
BROKEN = "broken"
ANN = "user:ann"
BOB = f"user:bob{HTML}"


@dataclasses.dataclass
class Desk(PersistentAgent, StateTools, SQLTools, AlarmTools):
    """You help the customers of a shop."""

    __sql_schema__ = "CREATE TABLE refunds (id INTEGER PRIMARY KEY, order_id TEXT, note TEXT)"

    tickets: int = 0

    @Tool.define
    def lookup(self, order: str) -> str:
        """Look an order up."""
        if order == "missing":
            raise ValueError(f"no order {order!r}")
        self.tickets += 1
        return f"order {order}: delivered"

    @Tool.define
    @requires_approval(reason="refunds need a person")
    def refund(self, order: str, amount: float) -> str:
        """Refund an order."""
        return f"refunded {amount} on {order}"

    @Template.define
    def ask(self, question: str) -> str:
        """Answer the customer: {question}"""
        raise NotHandled


def build(db: str) -> None:
    """Fill ``db`` (a new database) with the page's test content."""
    desk = Desk(agent_id=DESK)
    script = [
        # v1: a lookup, memory, an SQL row, all with HTML in them
        [
            ToolCall("lookup", {"order": f"A-1{HTML}"}),
            ToolCall("put_state", {"key": "customer", "value": f'"Ann {HTML}"'}),
            ToolCall(
                "sql_execute",
                {
                    "statement": "INSERT INTO refunds (order_id, note) VALUES (?, ?)",
                    "params": ["A-1", f"note {HTML}"],
                },
            ),
        ],
        f"Looked it up. {HTML}",
        # v2: an alarm, a tool call that fails
        ToolCall("schedule_alarm", {"delay_seconds": 3600, "action": "check back on A-1"}),
        ToolCall("lookup", {"order": "missing"}),
        "Scheduled a check.",
        # v3: a refund that waits for a person
        ToolCall("refund", {"order": "A-1", "amount": 250.0}),
    ]
    persistence = PersistenceHandler(db)
    try:
        with running(FakeLLM(script), RetryLLMHandler(), persistence):
            desk.ask("Where is my order A-1?")
            desk.ask("Please check again later.")
            with contextlib.suppress(TurnSuspended):
                desk.ask("Refund it, please.")
    finally:
        persistence.close()
    # v4..: a second conversation, compacted
    with persisted(db, FakeLLM(respond=lambda call: "Noted."), workflow="intake"):
        chat = Desk(agent_id=DESK)
        with chat.conversation("chat"):
            for i in range(4):
                chat.ask(f"chat message {i}")
    compaction = CompactionHandler(max_messages=6, keep_recent=2)
    with persisted(db, FakeLLM(respond=lambda call: "Summary of the chat.")), handler(compaction):
        with chat.conversation("chat"):
            chat.ask("and once more")
    with Store(db) as store:
        commit_message(store, HTML_AGENT, f"hello {HTML}")
        commit_message(store, BROKEN, "first")
        with store.turns.start(BROKEN, template="ask", arguments={"question": HTML}):
            store.turns.fail(BROKEN, f"ValueError: bad {HTML}")
        store.send_event(DESK, "payment_received", {"note": HTML}, key="pay-1")
        store.set_subject(DESK, ANN)
        store.set_subject(DESK, BOB, conversation="chat")
        store.set_subject(HTML_AGENT, ANN)
        store.set_subject(BROKEN, ANN, conversation="default")
