"""A worker that runs one turn, as a web service's request does (processes/test_partitions.py).

Usage: ``python tests/programs/partition_worker.py URL AGENT SECONDS``

It runs one turn of ``AGENT`` (``helpers.Assistant``) through a PersistenceHandler
on URL, with a fake model that prints ``model`` on stdout as it is called, then
takes SECONDS to answer. When the turn ends it prints one JSON line: ``{"ok":
true}``, or the error's type and message and how long the call took past the
model's answer, and exits.
"""

import json
import os
import sys
import time

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

from helpers import Assistant, running

from effectful_durable import PersistenceHandler
from effectful_durable.testing import FakeCall, FakeLLM


def main() -> int:
    url, agent_id, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    answered: list[float] = []

    def slow(call: FakeCall) -> str:
        print("model", flush=True)
        time.sleep(seconds)
        answered.append(time.monotonic())
        return "done"

    persistence = PersistenceHandler(url)
    outcome: dict[str, object]
    try:
        with running(FakeLLM(respond=slow), persistence):
            bot = Assistant(agent_id=agent_id)
            bot.ask("a long question")
        outcome = {"ok": True}
    except Exception as error:  # the test reads which
        after = time.monotonic() - answered[-1] if answered else None
        outcome = {"ok": False, "error": type(error).__name__, "message": str(error)}
        outcome["seconds_after_answer"] = after
    print(json.dumps(outcome), flush=True)
    persistence.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
