"""One agent's events are delivered in the order they were sent, whatever holds it back.

A runner that claims an event of an agent another process is running a turn of
gives the claim back due when it was, and leaves that agent alone for a moment:
due later instead, the agent's later events would overtake it.
"""

import json
import subprocess
import sys
import time

import pytest
from alarms_app import in_threads
from pg_faults_app import make_agent, make_handlers

from effectful_durable import AgentRunner, Store

#: A child holding agent ``k``'s lock for ``seconds``, as a turn in another process does.
HOLDER = """
import sys, time
from effectful_durable import Store
with Store(sys.argv[1]) as store, store.agent_lock("k"):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def noted(store: Store, agent_id: str) -> list[str]:
    """The notes the agent's committed state holds, in order."""
    state = store.turns.load(agent_id).state
    return [] if state is None else list(json.loads(state).get("notes", []))


class TestOrder:
    @pytest.mark.processes
    def test_events_held_back_by_another_process_keep_their_order(self, store_url: str) -> None:
        """While another process holds the agent, two runners claim its first event
        again and again; once it lets go, the five events are noted in the order sent."""
        sent = [f"e{i}" for i in range(5)]
        with Store(store_url) as store:
            for payload in sent:
                store.send_event("k", "ping", payload, create=True)
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, store_url, "4"], stdout=subprocess.PIPE, text=True
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            runners = [
                AgentRunner(store_url, agents=make_agent, handlers=make_handlers) for _ in range(2)
            ]
            with in_threads(*runners), Store(store_url) as store:
                deadline = time.monotonic() + 90
                while len(noted(store, "k")) < len(sent) and time.monotonic() < deadline:
                    time.sleep(0.1)
                assert noted(store, "k") == sent
        finally:
            holder.wait(timeout=30)
