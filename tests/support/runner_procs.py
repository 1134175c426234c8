"""The processes the tests start to run turns, and the log of their turns.

A :class:`Runner` is ``effectful-durable run`` of ``heartbeat_app``, and
:func:`worker` is ``partition_worker.py`` running one turn as a web service's
request does; each runs here, on a host of ``netns.py`` (``Host.command([])``) or
in a container (``netns.container``), given that command prefix. The network,
and a PostgreSQL server and a PgBouncer listening on it, are fixtures (``net``,
``listening_server``, ``listening_bouncer`` in conftest.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers import StderrLines
from netns import terminate
from paths import PROGRAMS

from effectful_durable import Store

START_TIMEOUT = 120.0


def environment(**extra: str) -> dict[str, str]:
    """This process's environment (the tests' modules importable: ``paths.install``),
    and ``extra``."""
    return {**os.environ, **extra}


class Runner(StderrLines):
    """``effectful-durable run`` of heartbeat_app, given a command prefix (a host's, a
    container's), once it started; its turns take ``seconds`` unless their payload
    says otherwise."""

    patience = 60.0

    def __init__(
        self, prefix: list[str], url: str, config: Path, starts: Path, *, seconds: float = 0
    ) -> None:
        command = [
            *prefix,
            sys.executable, "-m", "effectful_durable", "run", url,
            "--agents", "heartbeat_app:make_agent",
            "--handlers", "heartbeat_app:make_handlers",
            "--config", str(config),
        ]  # fmt: skip
        env = environment(HEARTBEAT_APP_STARTS=str(starts), HEARTBEAT_APP_SECONDS=str(seconds))
        super().__init__(subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env))
        try:
            self.expect("started", timeout=START_TIMEOUT)
        except AssertionError:
            self.proc.kill()
            self.proc.wait()
            raise

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it is still there 60 s later."""
        if self.proc.poll() is None:
            terminate(self.proc)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.wait(timeout=30)


def worker(prefix: list[str], url: str, agent_id: str, seconds: float) -> subprocess.Popen[str]:
    """``partition_worker.py`` in a turn of ``agent_id`` whose model takes ``seconds``,
    once its model was called; its last line on stdout tells how the turn ended."""
    script = str(PROGRAMS / "partition_worker.py")
    proc = subprocess.Popen(
        [*prefix, sys.executable, script, url, agent_id, f"{seconds:g}"],
        stdout=subprocess.PIPE,
        text=True,
        env=environment(),
    )
    assert proc.stdout is not None
    said = proc.stdout.readline().strip()
    if said != "model":
        proc.kill()
        proc.wait()
        raise AssertionError(f"the worker's model was not called: {said!r}")
    return proc


def write_config(path: Path, **runner: float | int) -> Path:
    lines = ["[runner]", "poll_interval = 0.1", *(f"{k} = {v}" for k, v in runner.items())]
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass(frozen=True)
class Start:
    """An event turn's model call (heartbeat_app): where, when, and the event's payload."""

    host: str
    pid: int
    at: float  # time.time()
    payload: dict[str, Any]


def starts_of(starts: Path) -> list[Start]:
    """Each event turn's model call, in the order they began."""
    if not starts.exists():
        return []
    found = []
    for line in starts.read_text().splitlines():
        host, pid, at, payload = line.split(" ", 3)
        found.append(Start(host, int(pid), float(at), json.loads(payload)))
    return found


def delivered(store: Store, agent_id: str) -> bool:
    """Whether the one event of ``agent_id`` was delivered."""
    (event,) = store.events(agent_id, include_delivered=True)
    return event.status == "done"
