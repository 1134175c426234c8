"""A worker for the PostgreSQL fault tests: agents' turns in threads, every outcome recorded.

Usage: ``python tests/programs/pg_worker_child.py URL AGENTS OUT [STATEMENT_TIMEOUT]``

Each of AGENTS agents (``w0``, ``w1``, ...) runs in a thread of its own, turn after
turn, until a line ``stop`` comes on stdin. Each turn asks the agent to note a new
text (``w1-0007``); a turn that fails is tried again with the same text, as a user
would. Every attempt is one JSON line in OUT: the agent, the note, its start and
end (``time.time()``), whether it succeeded, the error's type, and after a
failure the version the agent in memory says it is at, with its notes and the
texts of its history then (the test compares them with that version on disk). A
CommitUnknownError is followed by a look at the database before the retry. No
logging is configured: what the library prints unasked shows on stderr.
"""

import json
import os
import sys
import threading
import time

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

from effectful.ops.semantics import handler
from pg_faults_app import Noter, handlers

from effectful_durable import CommitUnknownError, DurableError, PersistenceHandler, Store


def texts(messages: list[dict]) -> list[str]:
    """The text of each message: content, or its tool calls' arguments."""
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(b.get("text", "") for b in content)
        calls = [c["function"]["arguments"] for c in message.get("tool_calls") or []]
        out.append(f"{message['role']}:{content or ''}{''.join(calls)}")
    return out


def work(agent_id: str, persistence: PersistenceHandler, url: str, out, lock, stop) -> None:
    stack = [*handlers(), persistence]
    agent = Noter(agent_id=agent_id)
    number = 0
    with handler(stack[0]), handler(stack[1]), handler(stack[2]):
        while not stop.is_set():
            note = f"{agent_id}-{number:04d}"
            start = time.time()
            record: dict = {"agent": agent_id, "note": note, "start": start}
            try:
                agent.ask(f"Note {note}")
                record["ok"] = True
            except Exception as error:  # the test tells which errors may come
                record["ok"] = False
                record["error"] = type(error).__name__
                record["message"] = str(error)
                committed = agent.__dict__.get("__durable__")
                record["version"] = committed.version if committed is not None else 0
                record["notes"] = list(agent.notes)
                record["history"] = texts(list(agent.__history__.values()))
                if isinstance(error, CommitUnknownError):
                    record["landed"] = landed(url, agent_id, note)
                    record["ok"] = record["landed"]
            record["end"] = time.time()
            with lock:
                out.write(json.dumps(record) + "\n")
                out.flush()
            if record["ok"]:
                number += 1
            else:
                time.sleep(0.05)


def landed(url: str, agent_id: str, note: str) -> bool:
    """Whether the note is in the agent's committed notes (looked up until it answers)."""
    while True:
        try:
            with Store(url) as store:
                return note in (store.state(agent_id) or {}).get("notes", [])
        except DurableError:
            time.sleep(0.2)


def main() -> int:
    url, count, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    timeout = float(sys.argv[4]) if len(sys.argv) > 4 else 10.0
    persistence = PersistenceHandler(url, statement_timeout=timeout)
    stop, lock = threading.Event(), threading.Lock()
    with open(path, "a") as out:
        threads = [
            threading.Thread(target=work, args=(f"w{i}", persistence, url, out, lock, stop))
            for i in range(count)
        ]
        for thread in threads:
            thread.start()
        os.write(sys.stdout.fileno(), b"started\n")
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop.set()
        for thread in threads:
            thread.join()
    persistence.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
