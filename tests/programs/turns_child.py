"""A child that commits turns of agent ``w`` through the Store alone (no litellm), each
adding one user message, ``turn N``; any error (a busy database) ends it non-zero.

Usage: ``python tests/programs/turns_child.py DB N`` commits N turns, then prints ``committed N
in S s``; ``python tests/programs/turns_child.py DB`` prints ``ready``, then commits one turn per
line it reads, printing the ``time.monotonic()`` of each commit.
"""

import sys
import time

from effectful_durable import Store
from effectful_durable.store.history import HistoryChange


def commit(store: Store) -> None:
    with store.turns.start("w", template="t", arguments={}) as start:
        message = {"id": f"m{start.version}", "role": "user", "content": f"turn {start.version}"}
        change = HistoryChange([(float(start.version), message)], [], 0)
        store.turns.commit(
            "w", base_version=start.version, template="t", change=change, state=None
        )


def main() -> None:
    with Store(sys.argv[1]) as store:
        if len(sys.argv) > 2:
            turns, started = int(sys.argv[2]), time.perf_counter()
            for _ in range(turns):
                commit(store)
            print(f"committed {turns} in {time.perf_counter() - started:.2f} s")
            return
        print("ready", flush=True)
        for _ in sys.stdin:
            commit(store)
            print(time.monotonic(), flush=True)


if __name__ == "__main__":
    main()
