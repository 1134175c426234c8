"""The tests' throwaway PostgreSQL server: databases per test, and an immediate restart."""

from __future__ import annotations

import psycopg
import pytest
from postgres_server import PostgresServer


class TestServer:
    def test_each_test_gets_an_empty_database(self, postgres_url: str) -> None:
        """A test's database holds no tables of ours and takes writes."""
        with psycopg.connect(postgres_url) as conn:
            tables = conn.execute(
                "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
            ).fetchone()
            assert tables == (0,)
            conn.execute("CREATE TABLE t (x int)")

    def test_listens_on_a_unix_socket_only(self, postgres_server: PostgresServer) -> None:
        """The server has no TCP listener: listen_addresses is empty."""
        with psycopg.connect(postgres_server.url()) as conn:
            row = conn.execute("SHOW listen_addresses").fetchone()
        assert row == ("",)

    def test_an_immediate_restart_keeps_what_was_committed(
        self, postgres_server: PostgresServer, postgres_url: str
    ) -> None:
        """After pg_ctl restart -m immediate, a committed row is there and an open
        connection is broken (clients must reconnect)."""
        conn = psycopg.connect(postgres_url, autocommit=True)
        conn.execute("CREATE TABLE t (x int)")
        conn.execute("INSERT INTO t VALUES (1)")
        postgres_server.restart()
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
        conn.close()
        with psycopg.connect(postgres_url) as again:
            assert again.execute("SELECT x FROM t").fetchall() == [(1,)]
