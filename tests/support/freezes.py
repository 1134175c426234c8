"""The freeze loop's parts (tests/processes/test_hold_freezes.py, bench/bench_freezes.py):
the holder, a child (programs/freeze_child.py) driven one command at a time, and one
case: a write of the holder's stopped at one point, while this process takes the agent.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import Any

from paths import PROGRAMS

from effectful_durable import NotFoundError, Store
from effectful_durable.store.history import HistoryChange

CHILD = PROGRAMS / "freeze_child.py"
#: How long the holder's holds last in the tests (``holds.TTL``; the bench uses the real one).
LEASE = 2.0


class Holder:
    """The child process, driven one command at a time."""

    def __init__(self, url: str, lease: float = LEASE) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(CHILD), url, str(lease)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def send(self, command: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()

    def answer(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, f"the child ended (status {self.process.wait()})"
        answer: dict[str, Any] = json.loads(line)
        return answer

    def stopped_or_answered(self, timeout: float) -> bool:
        """Wait until the child stops itself (True) or has answered (False)."""
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(f"/proc/{self.process.pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "T":
                    return True
            if select.select([self.process.stdout], [], [], 0.01)[0]:
                return False
        raise AssertionError(f"the child neither stopped nor answered within {timeout} s")

    def close(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=30)


def versions(store: Store, agent_id: str) -> list[tuple[int, str, str | None]]:
    try:
        return [(v.version, v.kind, v.template) for v in store.versions(agent_id)]
    except NotFoundError:
        return []


def commit(store: Store, agent_id: str, conversation: str, base: int, text: str) -> int:
    """Commit a turn of this process's that adds one message, ``text``."""
    loaded = store.turns.load(agent_id, conversation)
    position = max(loaded.history.positions, default=-1) + 1
    message = {"id": f"other-{text}", "role": "user", "content": text}
    change = HistoryChange(added=[(position, message)], removed=[], removed_count=0)
    return store.turns.commit(
        agent_id, base_version=base, template="other", change=change, state=None,
        conversation=conversation,
    )  # fmt: skip


def case(holder: Holder, other: Store, kind: str, agent_id: str, stop: int) -> float | None:
    """One point of one write: the seconds until the agent was usable here (None: the
    write ended before reaching the point)."""
    holder.send({"setup": kind, "agent": agent_id})
    assert holder.answer()["ok"]
    held = f"{agent_id}-fork" if kind == "fork" else agent_id
    conversation = "other" if kind == "approval" else "default"
    before = versions(other, held)
    holder.send({"act": kind, "agent": agent_id, "stop": stop})
    if not holder.stopped_or_answered(60):
        answered = holder.answer()
        assert answered["ok"] or kind == "failed", answered
        return None
    started = time.monotonic()
    with other.turns.start(
        held, wait=60, template="other", arguments={}, conversation=conversation
    ) as start:
        usable = time.monotonic() - started
        first = commit(other, held, conversation, start.version, f"{held}-1")
    with other.turns.start(
        held, wait=60, template="other", arguments={}, conversation=conversation
    ) as start:
        os.kill(holder.process.pid, signal.SIGCONT)
        answered = holder.answer()
        (running,) = [
            h for h in other.handoffs() if (h.agent_id, h.conversation) == (held, conversation)
        ]
        assert (running.status, running.pid) == ("running", os.getpid()), (kind, stop, running)
        second = commit(other, held, conversation, start.version, f"{held}-2")
    where = f"{kind}, stopped after event {stop} of {answered.get('events')}"
    assert not answered["ok"], f"the stopped write succeeded after its hold lapsed ({where})"
    mine = [(first, "turn", "other"), (second, "turn", "other")]
    assert versions(other, held) == before + mine, f"a commit was lost or added ({where})"
    texts = [m.get("content") for m in other.history(held, conversation=conversation)]
    assert texts[-2:] == [f"{held}-1", f"{held}-2"], where
    return usable
