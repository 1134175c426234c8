"""An agent that decides what to remember about its user, across runs.

    python examples/memory_agent.py                      # offline, scripted model
    python examples/memory_agent.py --model gpt-4o-mini  # any LiteLLM model
    python examples/memory_agent.py --fresh              # forget everything

The developer gives the agent primitive tools and lets it choose what to keep:
``StateTools`` for small facts (JSON values under keys) and ``SQLTools`` for a
table of the user's runs. Each run of this program is one session with the
user; what the agent stored in one session is there in the next, because every
write commits with the agent's turn, in its one SQLite transaction.
"""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # stay offline

import argparse
import dataclasses
import json
from contextlib import nullcontext
from pathlib import Path

from effectful.handlers.llm import Template
from effectful.handlers.llm.completions import LiteLLMProvider, RetryLLMHandler
from effectful.ops.semantics import handler
from effectful.ops.types import NotHandled

from effectful_durable import PersistenceHandler, PersistentAgent, SQLTools, StateTools, Store
from effectful_durable.testing import FakeCall, FakeLLM, ToolCall

DEFAULT_DB = Path(__file__).parent / "out" / "memory_agent.db"

# What the user says in each session: the first run plays session 1, the next
# run session 2, and so on (the last one repeats).
SESSIONS = [
    ["Hi! I'm Alice, and I only drink tea.", "I ran 5.5 km along the river today."],
    ["Did 8 km this morning, legs are tired.", "What do you remember about me?"],
    ["How far have I run in total?"],
]


# -- The agent: memory and a table it decides how to use ---------------------------
@dataclasses.dataclass
class RunningCoach(PersistentAgent, StateTools, SQLTools):
    """You coach one runner. Remember who they are with your state tools
    (keys like user.name, user.drink) and log every run they mention in your
    runs table. Answer in one or two sentences."""

    sessions: int = 0  # a field: persisted too, counted by this program

    __sql_schema__ = """
        CREATE TABLE runs (id INTEGER PRIMARY KEY, session INTEGER NOT NULL, km REAL NOT NULL);
    """

    @Template.define
    def chat(self, message: str) -> str:
        """The runner says: {message}"""
        raise NotHandled


# -- An offline model that uses the tools the way a real one would ------------------
def scripted_model(session: int):
    """Tool calls for what the user says, then an answer from what the tools returned."""

    def respond(call: FakeCall) -> object:
        last = call.messages[-1]
        if last["role"] == "tool":
            return answer(call)
        text = call.last_user_text.lower()
        if "i'm alice" in text:
            return [
                ToolCall("put_state", {"key": "user.name", "value": '"Alice"'}),
                ToolCall("put_state", {"key": "user.drink", "value": '"tea"'}),
            ]
        if " km" in text and "how far" not in text:
            km = float(text.split(" km")[0].split()[-1])
            return ToolCall(
                "sql_insert", {"table": "runs", "values": {"session": session, "km": km}}
            )
        if "remember" in text:
            return [
                ToolCall("get_state", {"key": "user.name"}),
                ToolCall("get_state", {"key": "user.drink"}),
            ]
        if "how far" in text:
            return ToolCall("sql_query", {"query": "SELECT count(*), sum(km) FROM runs"})
        return "Noted."

    return respond


def answer(call: FakeCall) -> str:
    """The reply after tool results: say what was stored or found."""
    results = []
    for message in reversed(call.messages):
        if message["role"] != "tool":
            break
        results.insert(0, "".join(block.get("text", "") for block in message["content"]))
    if results[0].startswith('"'):  # get_state returned the values, as JSON
        name, drink = (json.loads(result) for result in results)
        return f"You are {name}, and you drink {drink}. I keep your runs in my log."
    if results[0].startswith('{"columns"'):  # sql_query returned rows
        count, total = json.loads(results[0])["rows"][0]
        return f"You have run {total:g} km over {count} runs that you told me about."
    return "Got it, I've written that down."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", type=Path, default=DEFAULT_DB, help="the agent's database")
    parser.add_argument("--model", help="a LiteLLM model name (default: offline script)")
    parser.add_argument("--fresh", action="store_true", help="delete the database first")
    args = parser.parse_args()
    if args.fresh:
        for path in args.db.parent.glob(args.db.name + "*"):
            path.unlink() if path.is_file() else None
    args.db.parent.mkdir(parents=True, exist_ok=True)

    coach = RunningCoach(agent_id="coach")
    persistence = PersistenceHandler(args.db)
    persistence.load(coach)
    coach.sessions += 1  # committed with the session's first turn
    session = coach.sessions
    messages = SESSIONS[min(session, len(SESSIONS)) - 1]
    model = nullcontext() if args.model else handler(FakeLLM(respond=scripted_model(session)))
    with (
        handler(LiteLLMProvider(model=args.model or "offline")),
        handler(RetryLLMHandler()),
        model,
        handler(persistence),
    ):
        for message in messages:
            print(f"runner> {message}")
            print(f"coach>  {coach.chat(message)}")
    persistence.close()

    # -- What the agent chose to keep, read back from the database ---------------------
    with Store(args.db, readonly=True) as store:
        print("\nmemory:", store.memory("coach"))
        print("runs:  ", store.sql("coach", "SELECT session, km FROM runs ORDER BY id").rows)


if __name__ == "__main__":
    main()
