"""A runner fleet's host for processes/test_fleet_crash.py: imports once, forks a runner per "go".

Usage: ``python tests/programs/fleet_app.py URL CONFIG``

A fork server (fork_server.py): each child runs ``effectful-durable run URL
--agents fleet_app:make_agent ... --concurrency 4`` (``cli.main``, so the real
command: logging, signals) until it is killed. Each child leads a process group of
its own (the test kills the group) and dies with this process.

Run it under ``unshare -u`` with another host name, and its runners are "on
another machine". The agents are ``pg_faults_app``'s Noters, whose model takes
``FLEET_APP_SECONDS`` per call, so that a kill finds turns in flight.
"""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import ctypes
import signal
import sys
import time
from typing import Any

from child import model_stack
from fork_server import serve
from pg_faults_app import Noter, answer

from effectful_durable import RunnerConfig
from effectful_durable.cli import main as cli_main
from effectful_durable.testing import FakeCall, FakeLLM, Reply

SECONDS = float(os.environ.get("FLEET_APP_SECONDS", "0"))
CONCURRENCY = 4
PR_SET_PDEATHSIG = 1


def slow_answer(call: FakeCall) -> Reply:
    """``pg_faults_app``'s answer (note the alarm's action or the event's payload), late."""
    time.sleep(SECONDS)
    return answer(call)


def make_agent(agent_id: str) -> Noter:
    """The runner's agent factory."""
    return Noter(agent_id=agent_id)


def make_handlers(config: RunnerConfig) -> list[Any]:
    """The runner's handler factory: the slow fake model under a LiteLLMProvider."""
    return model_stack(FakeLLM(respond=slow_answer))


def run(url: str, config: str) -> int:
    """``effectful-durable run``, in this already loaded process."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    spec = "fleet_app:make_"
    args = ["run", url, "--agents", f"{spec}agent", "--handlers", f"{spec}handlers"]
    return cli_main([*args, "--config", config, "--concurrency", str(CONCURRENCY)])


def main() -> int:
    url, config = sys.argv[1:3]
    return serve(lambda: run(url, config), own_group=True)


if __name__ == "__main__":
    sys.exit(main())
