"""A user's program for tests/processes/test_foreign_programs.py: it runs turns, then simply ends.

Usage: ``python tests/programs/foreign_child.py DB_PATH TURNS [--worker]``

It continues ``crash_child``'s agent (``Counter``, over the same deterministic fake
model) for TURNS turns through ``PersistenceHandler(DB_PATH)``, printing
``committed <version>`` after each, and then ends normally (exit status 0) without
ever calling ``close()``. Without ``--worker`` the turns run in the main thread and the
handler stays referenced by a module global until the interpreter exits, as in a
script that never closes what it opened. With ``--worker`` they run in a daemon worker
thread that then waits for more work (holding the handler, and its connection, to the
end) while the main thread returns, as a server whose workers are never shut down.
"""

import os

# litellm downloads a price list on import unless told to use its bundled copy.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

import sys
import threading

from child import running, say
from crash_child import AGENT_ID, Counter, FakeModel, on_disk_version, question

from effectful_durable import PersistenceHandler
from effectful_durable.testing import FakeLLM


def run_turns(persistence: PersistenceHandler, turns: int) -> None:
    """Run ``turns`` turns of the agent through ``persistence``; never close it."""
    bot = Counter(agent_id=AGENT_ID)
    with running(FakeLLM(respond=FakeModel()), persistence):
        for _ in range(turns):
            bot.ask(question(on_disk_version(persistence.store) + 1))
            say("committed", on_disk_version(persistence.store))


def worker(db_path: str, turns: int, finished: threading.Event) -> None:
    """Run the turns, then wait for work that never comes, holding the handler."""
    persistence = PersistenceHandler(db_path)
    try:
        run_turns(persistence, turns)
    finally:
        finished.set()  # a failed turn shows as missing 'committed' lines
    threading.Event().wait()


if __name__ == "__main__":
    db_path, turns = sys.argv[1], int(sys.argv[2])
    if "--worker" in sys.argv[3:]:
        finished = threading.Event()
        threading.Thread(target=worker, args=(db_path, turns, finished), daemon=True).start()
        finished.wait()
    else:
        persistence = PersistenceHandler(db_path)  # never closed: the exit must do it
        run_turns(persistence, turns)
