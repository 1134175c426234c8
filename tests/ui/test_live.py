"""The page live, served for real: another process's commit reaches an open page, and a
writer committing while pages poll never notices them."""

import contextlib
import os
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import TYPE_CHECKING

import httpx
import psycopg
import pytest
from helpers import commit_message
from ui_server import Server, serving, write_turns

from effectful_durable import Store

if TYPE_CHECKING:
    from postgres_server import PostgresServer

pytestmark = pytest.mark.slow


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
            assert write_turns(store_url, 1).returncode == 0
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
            wrote = write_turns(store_url, 1000)
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


# -- PostgreSQL: what the page watches -------------------------------------------------


def commit_events(client: httpx.Client, seconds: float, events: list[float]) -> None:
    """Read the page's live stream for ``seconds``, noting when each commit event came."""
    started = time.monotonic()
    with contextlib.suppress(httpx.ReadTimeout):
        with client.stream("GET", "/-/live", timeout=seconds) as stream:
            for line in stream.iter_lines():
                if line == "event: commit":
                    events.append(time.monotonic() - started)
                if time.monotonic() - started > seconds:
                    return


@pytest.fixture
def no_wal_reader(postgres_server: "PostgresServer", postgres_url: str) -> Iterator[str]:
    """``postgres_url`` (with our tables) as a role that may read them but may not ask
    the WAL position, as on managed servers that refuse the WAL functions."""
    with Store(postgres_url) as store:
        commit_message(store, "w", "first")
    role = f"pager_{os.getpid()}"
    postgres_server.admin(f'CREATE ROLE "{role}" LOGIN')
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{role}"')
        for function in ("pg_current_wal_insert_lsn()", "pg_last_wal_replay_lsn()"):
            conn.execute(f"REVOKE EXECUTE ON FUNCTION {function} FROM PUBLIC")
    name = urllib.parse.urlsplit(postgres_url).path.lstrip("/")
    try:
        yield postgres_server.url(name, user=role)
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f'DROP OWNED BY "{role}"')
        postgres_server.drop_database(postgres_url)
        postgres_server.admin(f'DROP ROLE "{role}"')


def as_owner(url: str) -> str:
    """``url`` as the cluster's superuser (``postgres``)."""
    parts = urllib.parse.urlsplit(url)
    return parts._replace(netloc="postgres@" + parts.netloc.rpartition("@")[2]).geturl()


class TestPostgresWatch:
    """On PostgreSQL the page hears of this database's commits, and of no other's,
    whether or not the server lets it read the WAL position."""

    def test_a_commit_reaches_a_page_that_may_not_read_the_wal(self, no_wal_reader: str) -> None:
        """A page whose role may not ask the WAL position still hears of a commit of
        another process's, and its log says so once, not once a second."""
        with (
            serving(no_wal_reader, "--read-only", logging=True) as server,
            server.client() as client,
        ):
            events: list[float] = []
            reader = threading.Thread(target=commit_events, args=(client, 8.0, events))
            reader.start()
            time.sleep(1.0)
            with Store(as_owner(no_wal_reader)) as store:
                commit_message(store, "w", "while the page is open")
            reader.join(timeout=30)
            assert events, "".join(server.output)
            assert "while the page is open" in client.get("/agent?id=w").text
        said = [line for line in server.output if "WAL" in line or "watch" in line]
        assert len(said) == 1 and "refuses the WAL position" in said[0], server.output

    def test_another_databases_writes_reach_no_page(
        self, postgres_server: "PostgresServer", postgres_url: str
    ) -> None:
        """While another database of the server takes 50 inserts a second, an open
        page's stream stays quiet; a commit to ours still reaches it."""
        with Store(postgres_url) as store:
            commit_message(store, "w", "first")
        with (
            serving(postgres_url) as server,
            server.client() as client,
            postgres_server.another_database_writing(50),
        ):
            events: list[float] = []
            commit_events(client, 4.0, events)
            print(f"commit events in 4 s of another database's writes: {len(events)}")
            assert len(events) == 0, events
            reader = threading.Thread(target=commit_events, args=(client, 8.0, events))
            reader.start()
            time.sleep(1.0)
            with Store(postgres_url) as store:
                commit_message(store, "w", "ours")
            reader.join(timeout=30)
            assert events, "".join(server.output)
