"""What the partition tests share: runners and their turns' log on the tests' hosts.

The network, and a PostgreSQL server and a PgBouncer listening on it, are fixtures
(``net``, ``listening_server``, ``listening_bouncer`` in conftest.py); the hosts
and how they are cut are ``netns.py``'s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers import StderrLines
from netns import terminate

from effectful_durable import Store

TESTS = Path(__file__).parent
START_TIMEOUT = 120.0


def environment(**extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        **extra,
    }


class Runner(StderrLines):
    """``effectful-durable run`` of heartbeat_app, given a command prefix (a host's),
    whose turns take ``seconds`` unless their payload says otherwise."""

    patience = 90.0

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
        self.expect("started", timeout=START_TIMEOUT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            terminate(self.proc)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.wait(timeout=30)


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


def wait_until(
    condition: Callable[[], bool], timeout: float, what: str, poll: float = 0.1
) -> float:
    """Wait for ``condition()``; the seconds it took."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, f"{what} within {timeout:g} s"
        time.sleep(poll)
    return time.monotonic() - started


def delivered(store: Store, agent_id: str) -> bool:
    return all(event.status == "done" for event in store.events(agent_id, include_delivered=True))
