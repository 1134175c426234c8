"""A support agent whose large refunds wait for a person's approval.

Customers' requests arrive as events in the agents' inboxes, and an AgentRunner
delivers each one as a turn of its agent (on_event). The refund tool needs a
person's approval above 100 EUR: a turn that calls it so is suspended, what it
did so far committed, and no process waits for it. Someone approves or denies
the call (in the page, or from the command line); the runner then resumes the
turn where it stopped: the approved refund is paid exactly once, the denied one
is answered with the reason.

    cd examples/approvals
    python refunds.py ask     # two requests: 1 refund paid, 2 wait (out/refunds.db)
    effectful-durable ui out/refunds.db --by alice    # decide in the page, or:
    effectful-durable approve out/refunds.db apr_... --by alice
    effectful-durable deny out/refunds.db apr_... --reason "..."
    python refunds.py run     # the two turns resume and finish
"""

# effectful puts the agent's docstring at the head of its system prompt. It runs
# offline: the model is scripted (FakeLLM) and the runner's clock is fake.

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # stay offline

import argparse
import dataclasses
import json
import logging
import re
import time
from pathlib import Path
from typing import Any

from effectful.handlers.llm import Tool
from effectful.handlers.llm.completions import LiteLLMProvider

from effectful_durable import (
    AgentRunner,
    OnEvent,
    PersistentAgent,
    RunnerConfig,
    Store,
    current_approval,
    requires_approval,
)
from effectful_durable.runner import FakeClock
from effectful_durable.testing import FakeCall, FakeLLM, Reply, ToolCall

# Two customers write in; Ann's message asks for a small and a large refund.
REQUESTS = {
    "support-ann": {
        "customer": "Ann",
        "text": "Please refund 35 EUR on order A-1001 and 250 EUR on order A-1002.",
    },
    "support-ben": {"customer": "Ben", "text": "Please refund 180 EUR on order B-2001."},
}
ORDERS = {  # what lookup_order knows
    "A-1001": "35.00 EUR, a scarf, delivered 2026-05-28",
    "A-1002": "250.00 EUR, a coat, delivered 2026-05-28",
    "B-2001": "180.00 EUR, boots, delivered 2026-04-12",
    "C-3001": "20.00 EUR, socks, delivered 2026-05-30",
}


# -- The payment provider: a stand-in with idempotency keys, as real ones have --------
class Payments:
    """Refunds recorded in a JSON file (the ledger), keyed by idempotency key.

    Like a real provider's API (Stripe's ``Idempotency-Key``), a request repeated
    with a key it has seen pays nothing and returns the first payment.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def ledger(self) -> list[dict[str, Any]]:
        return json.loads(self.path.read_text()) if self.path.exists() else []

    def refund(self, order: str, amount: float, *, idempotency_key: str) -> dict[str, Any]:
        ledger = self.ledger()
        for payment in ledger:
            if payment["key"] == idempotency_key:
                return payment  # a retry: nothing is paid twice
        payment = {
            "payment": f"pay_{len(ledger) + 1:03d}",
            "order": order,
            "amount": amount,
            "key": idempotency_key,
        }
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps([*ledger, payment], indent=2) + "\n")
        temporary.replace(self.path)  # all or nothing
        return payment


OUT = Path(__file__).parent / "out"  # the database and the ledger, by default
PAYMENTS = Payments(OUT / "payments.json")  # main() puts it beside the database


# -- The agent: one durable agent per customer; the runner delivers its events -------
@dataclasses.dataclass
class SupportAgent(PersistentAgent, OnEvent):
    """You are the support desk of a clothing shop. Look orders up before refunding."""

    @Tool.define
    def lookup_order(self, order: str) -> str:
        """Look up an order: its total, what it holds, when it was delivered."""
        return f"Order {order}: {ORDERS[order]}." if order in ORDERS else f"No order {order}."

    @Tool.define
    @requires_approval(
        when=lambda order, amount: amount > 100,
        reason="refunds over 100 EUR need a person's approval",
    )
    def refund(self, order: str, amount: float) -> str:
        """Refund ``amount`` EUR on ``order`` to the customer's card."""
        # An approved call runs once; should the process die after paying and before
        # the turn commits, the resumed turn pays again with the same approval id,
        # which the provider then recognises. A call that needed no approval has no
        # id: key it by what it pays. A real tool passes the key the same way, e.g.
        # stripe.Refund.create(..., idempotency_key=key).
        key = current_approval() or f"{self.agent_id}/{order}/{amount}"
        payment = PAYMENTS.refund(order, amount, idempotency_key=key)
        return f"Refunded {amount:.2f} EUR on {order} (payment {payment['payment']})."


# -- The scripted model: what a real one would plausibly do with these prompts ------
ASKED = re.compile(r"(\d+(?:\.\d+)?) EUR on order ([A-Z]-\d+)")
PAYLOAD = re.compile(r"Its payload, as JSON: (\{.*\})\. Handle it", re.S)


def model(call: FakeCall) -> Reply:
    """Look the orders up, then refund them, then answer the customer."""
    found = PAYLOAD.search(call.last_user_text)
    if found is None:
        return "I can only help with refund requests."
    request = json.loads(found[1])
    asked = [(order, float(amount)) for amount, order in ASKED.findall(request["text"])]
    last = call.messages[-1]
    if last["role"] != "tool":  # the customer's message: look the orders up
        return [ToolCall("lookup_order", {"order": order}) for order, _ in asked]
    called = next(m for m in reversed(call.messages) if m["role"] == "assistant")
    if "refund" not in called["tool_calls"][0]["function"]["name"]:  # looked up: refund
        return [ToolCall("refund", {"order": order, "amount": amount}) for order, amount in asked]
    results = {m["tool_call_id"]: text(m) for m in call.messages if m["role"] == "tool"}
    lines = []
    for tool_call in called["tool_calls"]:
        result = results[tool_call["id"]]
        order = json.loads(tool_call["function"]["arguments"])["order"]
        if result.startswith("Not run"):  # denied: the reason is the tool's result
            lines.append(f"I cannot refund order {order}: {result.split('reason: ', 1)[1]}")
        else:
            lines.append(result.split(" (payment")[0] + ".")
    return f"Dear {request['customer']}, " + " ".join(lines)


def text(message: dict[str, Any]) -> str:
    content = message["content"]
    if isinstance(content, str):
        return content
    return "".join(block.get("text", "") for block in content)


def handlers(config: RunnerConfig) -> list[Any]:
    """The runner's model stack; a real deployment returns LiteLLMProvider and retries."""
    return [LiteLLMProvider(model=config.model or "fake"), FakeLLM(respond=model)]


# -- The two steps ---------------------------------------------------------------------
def deliver(db: str) -> None:
    """Run a runner until nothing is due: each event or resumption becomes a turn."""
    clock = FakeClock(time.time())
    with AgentRunner(
        db,
        agents=lambda agent_id: SupportAgent(agent_id=agent_id),
        handlers=handlers,
        clock=clock,
    ) as runner:
        runner.run(until=clock.now() + 60)
        print(f"runner: {runner.turns} turns, {runner.errors} errors")


def ask(db: str) -> None:
    """The customers' requests arrive as events; the runner delivers them."""
    with Store(db) as store:
        for agent_id, request in REQUESTS.items():
            # The key makes a retried send (running `ask` again) send nothing new.
            event = store.send_event(
                agent_id, "refund_request", request, key=f"{agent_id}-1", create=True
            )
            print(f"{agent_id} <- {request['text']!r} ({event.event_id}, {event.status})")
    deliver(db)


def run(db: str) -> None:
    """The runner resumes the decided turns (and delivers any new event)."""
    deliver(db)
    with Store(db, readonly=True) as store:
        for record in store.agents():
            last = store.history(record.agent_id)[-1]
            if last["role"] == "assistant":
                print(f"{record.agent_id} -> {text(last)}")


def show(db: str) -> None:
    """The payments made, and what still waits for a person."""
    for payment in PAYMENTS.ledger():
        print(
            f"paid {payment['payment']}: {payment['amount']:.2f} EUR on {payment['order']} "
            f"(key {payment['key']})"
        )
    with Store(db, readonly=True) as store:
        for approval in store.approvals():
            arguments = ", ".join(f"{k}={v!r}" for k, v in approval.arguments.items())
            print(
                f"waiting: {approval.approval_id} {approval.agent_id} "
                f"{approval.tool}({arguments}): {approval.reason}"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["ask", "run"], help="ask: requests arrive; run: resume")
    parser.add_argument(
        "--db",
        default=str(OUT / "refunds.db"),
        help="database file or postgresql:// URL (default: out/refunds.db here)",
    )
    parser.add_argument(
        "--ledger",
        help="the payment provider's ledger, a JSON file (default: payments.json beside "
        "the database file; out/payments.json for a postgresql:// URL)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    on_a_server = args.db.startswith(("postgresql://", "postgres://"))
    if not on_a_server:
        Path(args.db).parent.mkdir(parents=True, exist_ok=True)
    if args.ledger:
        PAYMENTS.path = Path(args.ledger)
    else:
        PAYMENTS.path = (
            OUT / "payments.json" if on_a_server else Path(args.db).with_name("payments.json")
        )
    PAYMENTS.path.parent.mkdir(parents=True, exist_ok=True)
    if args.step == "ask":
        ask(args.db)
    else:
        run(args.db)
    show(args.db)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
