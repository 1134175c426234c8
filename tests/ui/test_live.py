"""The page live, served for real: another process's commit reaches an open page, and a
writer committing while pages poll never notices them."""

import subprocess
import sys
import threading

import httpx
import pytest

from effectful_durable import Store
from tests.helpers import commit_message
from tests.ui.server import ROOT, Server, serving

pytestmark = pytest.mark.slow

#: A child that commits N turns of agent ``w`` through the Store alone (no litellm),
#: each adding one message; any error (a busy database) ends it non-zero.
WRITER = """
import sys, time
from effectful_durable import Store
from effectful_durable.store.history import HistoryChange
db, turns = sys.argv[1], int(sys.argv[2])
started = time.perf_counter()
with Store(db) as store:
    for _ in range(turns):
        start = store.begin_turn("w", template="t", arguments={})
        message = {"id": f"m{start.version}", "role": "user", "content": f"turn {start.version}"}
        change = HistoryChange([(float(start.version), message)], [], 0)
        store.commit_turn("w", base_version=start.version, template="t", change=change, state=None)
print(f"committed {turns} in {time.perf_counter() - started:.2f} s")
"""


def write(db: str, turns: int) -> subprocess.CompletedProcess[str]:
    """Commit ``turns`` turns of agent ``w`` from another process."""
    return subprocess.run(
        [sys.executable, "-c", WRITER, db, str(turns)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )


def next_commit(server: Server, client: httpx.Client, found: threading.Event) -> None:
    """Read the page's live stream until its first commit event, then set ``found``."""
    with client.stream("GET", "/-/live", timeout=30) as events:
        for line in events.iter_lines():
            if line == "event: commit":
                found.set()
                return


class TestLive:
    def test_another_process_commit_reaches_an_open_page(self, store_url: str) -> None:
        """An open page's stream announces a commit made by another process, and the
        page then shows the new version."""
        with Store(store_url) as store:
            commit_message(store, "w", "first")
        with serving(store_url) as server, server.client() as client:
            assert "w" in client.get("/").text
            found = threading.Event()
            reader = threading.Thread(target=next_commit, args=(server, client, found))
            reader.start()
            listening = client.get("/agent?id=w")  # the stream is open by now, or soon
            assert listening.status_code == 200
            assert write(store_url, 1).returncode == 0
            reader.join(timeout=30)
            assert found.is_set()
            assert "turn 1" in client.get("/agent?id=w").text


@pytest.mark.sqlite_only("SQLite's one writer is what a reader could get in the way of")
def test_a_writer_never_notices_the_pages(store_url: str) -> None:
    """1,000 turns committed by another process while pages poll and a stream listens:
    no busy error, every turn there."""
    with Store(store_url) as store:
        commit_message(store, "seed", "so that the file exists")
    stop = threading.Event()
    statuses: list[int] = []

    def poll(client: httpx.Client, path: str) -> None:
        while not stop.is_set():
            statuses.append(client.get(path).status_code)

    with serving(store_url) as server, server.client() as client:
        found = threading.Event()
        pollers = [
            threading.Thread(target=poll, args=(client, path))
            for path in ("/", "/agent?id=seed", "/waiting")
        ]
        listener = threading.Thread(target=next_commit, args=(server, client, found))
        for thread in [*pollers, listener]:
            thread.start()
        try:
            wrote = write(store_url, 1000)
        finally:
            stop.set()
            for thread in pollers:
                thread.join(timeout=30)
            listener.join(timeout=30)
    assert wrote.returncode == 0, wrote.stderr
    assert "committed 1000" in wrote.stdout
    assert statuses and set(statuses) == {200}
    assert found.is_set()
    with Store(store_url, readonly=True) as store:
        (w,) = [a for a in store.agents() if a.agent_id == "w"]
        assert (w.version, w.messages) == (1000, 1000)
        assert [v.version for v in store.versions("w")] == list(range(1, 1001))
