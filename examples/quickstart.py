"""Quickstart: an agent whose memory survives the process. Run it twice.

    make demo                                   # offline, scripted model, no API key
    python examples/quickstart.py --model gpt-4o-mini    # any LiteLLM model
    python examples/quickstart.py --fresh       # forget everything and start over

Each run asks the agent one question. The agent's messages and its ``visits``
field live in a SQLite file; the next run restores them, so the model sees the
whole conversation again and the count goes on.
"""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # stay offline

import argparse
import dataclasses
from contextlib import nullcontext
from pathlib import Path

from effectful.handlers.llm import Template
from effectful.handlers.llm.completions import LiteLLMProvider, RetryLLMHandler
from effectful.ops.semantics import handler
from effectful.ops.types import NotHandled

from effectful_durable import PersistenceHandler, PersistentAgent, Store
from effectful_durable.testing import FakeCall, FakeLLM

DEFAULT_DB = Path(__file__).parent / "out" / "quickstart.db"


# -- The agent: an ordinary effectful Agent with a stable id -----------------------
@dataclasses.dataclass
class Concierge(PersistentAgent):
    """You are a concierge with a good memory. Answer in one or two sentences."""

    visits: int = 0

    @Template.define
    def greet(self, visit: int) -> str:
        """This is my visit number {visit}. Welcome me, and remind me what we
        talked about on my earlier visits, if any."""
        raise NotHandled


# -- An offline model that answers from what it is shown ---------------------------
def scripted_answer(call: FakeCall) -> str:
    """Answer like a model would, using only the messages the request carries."""
    earlier = [m for m in call.messages if m["role"] == "assistant"]
    visit = sum(m["role"] == "user" for m in call.messages)
    if not earlier:
        return "Welcome! This is your first visit; I will remember it."
    first = call.messages[1]["content"][0]["text"].split(".")[0]
    return (
        f"Welcome back for visit {visit}! We have spoken {len(earlier)} time(s) "
        f"before; it began with you saying {first!r}."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, default=DEFAULT_DB, help="database file")
    parser.add_argument("--model", help="a LiteLLM model name; default: offline script")
    parser.add_argument("--fresh", action="store_true", help="delete the database first")
    args = parser.parse_args()

    args.db.parent.mkdir(parents=True, exist_ok=True)
    if args.fresh:
        for suffix in ("", "-wal", "-shm", "-lock"):
            Path(f"{args.db}{suffix}").unlink(missing_ok=True)

    # Offline, a scripted model stands in for the provider's network call.
    model = handler(FakeLLM(respond=scripted_answer)) if args.model is None else nullcontext()

    # -- The durable part: a stable id, and the handler inside the provider -------
    concierge = Concierge(agent_id="concierge")
    persistence = PersistenceHandler(args.db)
    persistence.load(concierge)  # restore now, to read `visits` before the first turn
    with (
        handler(LiteLLMProvider(model=args.model or "offline")),
        model,
        handler(RetryLLMHandler()),
        handler(persistence),
    ):
        concierge.visits += 1
        answer = concierge.greet(concierge.visits)  # one turn: one atomic commit

    print(f"visit {concierge.visits}: {answer}\n")
    with Store(args.db, readonly=True) as store:
        record = next(a for a in store.agents() if a.agent_id == "concierge")
        print(
            f"{args.db} holds agent {record.agent_id!r} at version {record.version} "
            f"with {record.messages} messages; its state is {store.state('concierge')}."
        )
    print("Run it again: the concierge remembers. --fresh starts over.")
    persistence.close()


if __name__ == "__main__":
    main()
