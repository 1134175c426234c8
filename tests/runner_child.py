"""A forking server for tests/test_runner_crash.py: imports once, forks a runner per "go".

Usage: ``python tests/runner_child.py DB_PATH [CONCURRENCY]``

Importing litellm costs seconds, so this process imports everything once, prints
``loaded``, and then for each ``go`` line on stdin forks a child that runs an
AgentRunner on DB_PATH until it is killed, and prints ``child <pid>``. The parent
test kills those children with SIGKILL. SIGCHLD is ignored so that killed children
are reaped at once: a zombie would look alive to the next runner, which frees the
leases of dead runners on its host at start.
"""

import os
import signal
import sys

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from alarms_app import make_agent, make_handlers

from effectful_durable import AgentRunner, RunnerConfig


def say(*words: object) -> None:
    """One line to the parent, in one write."""
    os.write(sys.stdout.fileno(), (" ".join(map(str, words)) + "\n").encode())


def run(db_path: str, concurrency: int) -> None:
    """Run a runner until killed (or stopped with SIGTERM)."""
    config = RunnerConfig(poll_interval=0.05, lease_seconds=30, concurrency=concurrency)
    with AgentRunner(db_path, agents=make_agent, handlers=make_handlers, config=config) as runner:
        runner.run()


def main() -> int:
    db_path = sys.argv[1]
    concurrency = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    say("loaded")
    for line in sys.stdin:
        if line.strip() != "go":
            continue
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            code = 0
            try:
                run(db_path, concurrency)
            except BaseException:
                code = 1
            os._exit(code)
        say("child", pid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
