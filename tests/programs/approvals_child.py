"""Processes for processes/test_approvals_crash.py: a forking server of roles and a racing decider.

``python tests/programs/approvals_child.py serve DB [--agents N]``
    Importing litellm costs seconds, so this process imports everything once,
    prints ``loaded``, and then for each line ``<role> <seed>`` on stdin forks a
    child playing that role on DB until it is killed, and prints ``child <role>
    <pid>``. Children log to stderr at ``$APPROVALS_CHILD_LOG`` (default
    WARNING). SIGCHLD is ignored so that killed children are reaped at once (a
    zombie would look alive to a runner freeing the leases of dead runners on
    this host). A child whose role ends with an error prints ``error ...``.

``python tests/programs/approvals_child.py race DB IDS_FILE``
    Connect, print ``ready``, read an epoch time START_AT from stdin, then decide
    the approvals listed in IDS_FILE (one per line), the n-th at START_AT + n *
    RACE_STEP, as the decider role does: two of these race for each approval at
    the same moment. It imports no litellm (it starts fast).

The roles (agents in ``tests/programs/approvals_app.py``):

``driver``
    Drives the agents ``shop-0`` .. ``shop-{N-1}``: for an agent with no
    suspended turn, a new ``ask(order)``, which suspends at its ``pay`` call;
    for one whose turn is decided, a resumption, by ``PersistenceHandler.resume``,
    by the same call again, or by another call (which resumes the suspended one
    first); for one still pending, now and then the same call again, which
    raises TurnSuspended.
``runner``
    An AgentRunner over the same agents and fake model: it delivers the events
    and the resumptions the deciders queue, one turn at a time or (half of the
    runners) up to four turns of different agents at once.
``decider``
    Approves (80 %) or denies pending approvals, mostly the oldest one, so that
    two deciders often race for it.

Every decision attempt is logged to ``$APPROVALS_DECISIONS_LOG``: before it is
made (``attempt``), and after it returned (``won``, with what the store returned)
or was refused (``lost``); each line is fsynced before the process goes on. The
tool's runs go to ``$APPROVALS_APP_TOOL_LOG`` (see approvals_app.py).
"""

import os
import signal
import sys

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

import json
import logging
import random
import secrets
import time
from pathlib import Path
from typing import Any

from child import running, say

from effectful_durable import InvalidDecisionError, Store

DECISIONS_ENV = "APPROVALS_DECISIONS_LOG"
LEASE_SECONDS = 5.0
RACE_STEP = 0.05


def append_line(path: str, record: dict[str, Any]) -> None:
    """Append one JSON line to ``path`` and fsync it: on disk before this returns."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record, sort_keys=True) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def read_lines(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The JSON lines of a side file (none if it does not exist).

    A process killed inside ``os.write`` could leave a torn last line: it is
    skipped, as what it would record is not known to have happened.
    """
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    records = []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def decide_one(store: Store, approval_id: str, *, approve: bool, by: str, log: str) -> bool:
    """Decide one approval, logging the attempt and its outcome; True if this call won."""
    note = f"note-{secrets.token_hex(6)}"
    status = "approved" if approve else "denied"
    attempt = {"approval": approval_id, "by": by, "note": note, "status": status}
    append_line(log, {**attempt, "result": "attempt"})
    try:
        if approve:
            info = store.approve(approval_id, by=by, note=note)
        else:
            info = store.deny(approval_id, reason=note, by=by)
    except InvalidDecisionError as error:
        append_line(log, {**attempt, "result": "lost", "error": str(error)})
        return False
    returned = {"got_status": info.status, "got_by": info.decided_by, "got_note": info.note}
    append_line(log, {**attempt, "result": "won", **returned})
    return True


def decide(db: str, rng: random.Random) -> None:
    """The decider role (module docstring), until killed."""
    log = os.environ[DECISIONS_ENV]
    by = f"decider-{os.getpid()}"
    with Store(db) as store:
        while True:
            pending = store.approvals(status="pending")
            if not pending:
                time.sleep(0.01)
                continue
            target = pending[0] if rng.random() < 0.7 else rng.choice(pending)
            decide_one(store, target.approval_id, approve=rng.random() < 0.8, by=by, log=log)
            time.sleep(rng.uniform(0, 0.03))


def drive(db: str, agents: int, rng: random.Random) -> None:
    """The driver role (module docstring), until killed."""
    from approvals_app import Shop, answer

    from effectful_durable import (
        AgentInUseError,
        NotFoundError,
        PersistenceHandler,
        TurnSuspended,
    )
    from effectful_durable.testing import FakeLLM

    persistence = PersistenceHandler(db, wait=0.2)
    store = persistence.store
    shops = [Shop(agent_id=f"shop-{n}") for n in range(agents)]
    orders = 0

    def new_order() -> str:
        nonlocal orders
        orders += 1
        return f"o{os.getpid()}x{orders}"

    with running(FakeLLM(respond=answer), persistence):
        while True:
            shop = rng.choice(shops)
            found = store.suspension(shop.agent_id)
            try:
                if found is None:
                    shop.ask(new_order())
                elif found.pending:
                    if rng.random() < 0.3:
                        # TurnSuspended, with no model call and nothing written; or,
                        # if a decision came in meanwhile, it resumes the turn.
                        shop.ask(found.arguments["order"])
                    else:
                        time.sleep(0.01)
                else:
                    roll = rng.random()
                    if roll < 0.4:
                        persistence.resume(shop)
                    elif roll < 0.8:
                        shop.ask(found.arguments["order"])
                    else:
                        shop.ask(new_order())
            except TurnSuspended:
                pass
            except (AgentInUseError, NotFoundError):
                time.sleep(0.01)  # a runner (or another resumption) has it


def run_runner(db: str, rng: random.Random) -> None:
    """The runner role, until killed (or stopped with SIGTERM)."""
    from approvals_app import make_agent, make_handlers

    from effectful_durable import AgentRunner, RunnerConfig

    config = RunnerConfig(
        poll_interval=0.05, lease_seconds=LEASE_SECONDS, concurrency=rng.choice([1, 4])
    )
    with AgentRunner(db, agents=make_agent, handlers=make_handlers, config=config) as runner:
        runner.run()


def serve(db: str, agents: int) -> int:
    """The forking server (module docstring)."""
    import approvals_app  # noqa: F401  # litellm and the rest, once, before forking

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    say("loaded")
    for line in sys.stdin:
        words = line.split()
        if len(words) != 2:
            continue
        role, seed = words[0], int(words[1])
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            logging.basicConfig(
                level=os.environ.get("APPROVALS_CHILD_LOG", "WARNING"),
                format=f"%(asctime)s {role} %(process)d %(name)s %(levelname)s %(message)s",
            )
            code = 0
            try:
                rng = random.Random(seed)
                if role == "driver":
                    drive(db, agents, rng)
                elif role == "decider":
                    decide(db, rng)
                else:
                    run_runner(db, rng)
            except BaseException as error:
                say("error", role, os.getpid(), f"{type(error).__name__}: {error}"[:400])
                code = 1
            os._exit(code)
        say("child", role, pid)
    return 0


def race(db: str, ids_file: str) -> int:
    """Decide every approval of ``ids_file``, each at its moment (module docstring)."""
    ids = Path(ids_file).read_text().split()
    log = os.environ[DECISIONS_ENV]
    by = f"racer-{os.getpid()}"
    rng = random.Random(os.getpid())
    with Store(db) as store:
        store.approvals()  # connected before the start
        say("ready")
        start_at = float(sys.stdin.readline())
        for n, approval_id in enumerate(ids):
            time.sleep(max(start_at + n * RACE_STEP - time.time(), 0))
            decide_one(store, approval_id, approve=rng.random() < 0.5, by=by, log=log)
    return 0


def main() -> int:
    command, db, *rest = sys.argv[1:]
    if command == "serve":
        agents = int(rest[1]) if rest[:1] == ["--agents"] else 4
        return serve(db, agents)
    if command == "race":
        return race(db, rest[0])
    say(f"unknown command {command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
