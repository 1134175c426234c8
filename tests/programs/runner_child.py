"""A forking server for processes/test_runner_crash.py: imports once, forks a runner per "go".

Usage: ``python tests/programs/runner_child.py DB_PATH [CONCURRENCY]``

A fork server (fork_server.py): each child runs an AgentRunner on DB_PATH until the
test kills it with SIGKILL.
"""

import os
import sys

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

from alarms_app import make_agent, make_handlers
from fork_server import serve

from effectful_durable import AgentRunner, RunnerConfig


def run(db_path: str, concurrency: int) -> int:
    """Run a runner until killed (or stopped with SIGTERM)."""
    config = RunnerConfig(poll_interval=0.05, lease_seconds=30, concurrency=concurrency)
    with AgentRunner(db_path, agents=make_agent, handlers=make_handlers, config=config) as runner:
        runner.run()
    return 0


def main() -> int:
    db_path = sys.argv[1]
    concurrency = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    return serve(lambda: run(db_path, concurrency))


if __name__ == "__main__":
    sys.exit(main())
