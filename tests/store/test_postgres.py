"""What only the PostgreSQL backend does: identify its database, lock across processes,
refuse the parts it does not carry yet, and survive a server restart."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psycopg
import pytest
from helpers import (
    Assistant,
    added,
    commit_message,
    free_port,
    in_new_process,
    integrity,
    persisted,
)
from paths import FIXTURES
from postgres_server import PostgresServer

from effectful_durable import (
    AgentInUseError,
    DurableError,
    NotOurDatabaseError,
    SchemaTooNewError,
    Store,
)
from effectful_durable.errors import (
    DatabaseAccessError,
    DatabaseUnavailableError,
    NotSupportedError,
)
from effectful_durable.store.engine.postgres.opening import access_error
from effectful_durable.store.engine.postgres.schema import MIGRATIONS, SCHEMA_VERSION
from effectful_durable.store.engine.seam import APPLICATION_ID
from effectful_durable.testing import FakeLLM


def tables(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"
        ).fetchall()
    return [name for (name,) in rows]


class TestOpening:
    def test_an_empty_database_gets_our_tables(self, postgres_url: str) -> None:
        """Opening an empty database creates the schema and marks it ours (version 11)."""
        with Store(postgres_url) as store:
            assert store.check()["schema"] == SCHEMA_VERSION == 14
        assert {"agents", "messages", "versions", "effectful_durable"} <= set(tables(postgres_url))

    def test_another_programs_database_is_refused_untouched(self, postgres_url: str) -> None:
        """A database whose schema holds other tables is refused, and nothing is created."""
        with psycopg.connect(postgres_url) as conn:
            conn.execute("CREATE TABLE invoices (id int)")
        with pytest.raises(NotOurDatabaseError, match="1 tables of another program"):
            Store(postgres_url)
        assert tables(postgres_url) == ["invoices"]

    def test_a_newer_schema_is_refused_untouched(self, postgres_url: str) -> None:
        """A database a newer version made raises SchemaTooNewError and is left as it was."""
        Store(postgres_url).close()
        with psycopg.connect(postgres_url) as conn:
            conn.execute("UPDATE effectful_durable SET schema_version = 99")
        with pytest.raises(SchemaTooNewError, match="99"):
            Store(postgres_url)
        with psycopg.connect(postgres_url) as conn:
            assert conn.execute("SELECT schema_version FROM effectful_durable").fetchone() == (99,)

    @pytest.mark.parametrize("given_in", ["url", "PGOPTIONS"])
    def test_the_users_search_path_is_kept(
        self, postgres_url: str, given_in: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Options in the URL (or PGOPTIONS) keep effect: our tables go into their schema."""
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute("CREATE SCHEMA agents")
        if given_in == "url":
            url = f"{postgres_url}?options=-csearch_path%3Dagents"
        else:
            url = postgres_url
            monkeypatch.setenv("PGOPTIONS", "-c search_path=agents")
        with Store(url) as store:
            commit_message(store, "a1", "in the agents schema")
            assert store.history("a1")[-1]["content"] == "in the agents schema"
        with psycopg.connect(postgres_url) as conn:
            found = conn.execute(
                "SELECT schemaname FROM pg_tables WHERE tablename = 'messages'"
            ).fetchall()
        assert found == [("agents",)]

    def test_opening_connects_once(
        self, postgres_server: PostgresServer, postgres_url: str
    ) -> None:
        """The connection opening makes to tell a refusal apart is the pool's first one."""
        name = postgres_url.rsplit("/", 1)[1]

        def sessions() -> int:  # the server counts them as backends end (PostgreSQL 14+)
            with psycopg.connect(postgres_server.url(), autocommit=True) as conn:
                row = conn.execute(
                    "SELECT sessions FROM pg_stat_database WHERE datname = %s", (name,)
                ).fetchone()
            return int(row[0]) if row else 0

        before = sessions()
        for _ in range(3):
            Store(postgres_url).close()
        deadline = time.monotonic() + 5
        while sessions() - before < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # a second session per Store would be counted by now
        assert sessions() - before == 3

    def test_a_password_is_not_in_messages(self) -> None:
        """The URL named in an error has its password masked."""
        url = "postgresql://me:secret@127.0.0.1:1/nowhere?connect_timeout=1"
        with pytest.raises(DatabaseUnavailableError) as raised:
            Store(url, busy_timeout=0.5)
        assert "secret" not in str(raised.value) and "***" in str(raised.value)


@pytest.fixture(scope="module")
def role(postgres_server: PostgresServer) -> str:
    """A role the server lets in with the password 'right horse' only."""
    return postgres_server.new_password_role("right horse")


class TestRefusals:
    """A server that answers and refuses the URL: DatabaseAccessError at once, in its words."""

    @pytest.fixture(autouse=True)
    def _no_stored_password(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        monkeypatch.delenv("PGPASSWORD", raising=False)
        monkeypatch.setenv("PGPASSFILE", str(tmp_path / "no-pgpass"))

    def refused(self, url: str) -> DatabaseAccessError:
        started = time.monotonic()
        with pytest.raises(DatabaseAccessError) as raised:
            Store(url, busy_timeout=10.0)
        print(f"refused after {time.monotonic() - started:.2f} s: {raised.value}")
        assert not isinstance(raised.value, DatabaseUnavailableError)  # retrying cannot help
        return raised.value

    def test_a_missing_database(self, postgres_server: PostgresServer) -> None:
        """A database the server does not have is named, with the createdb that makes it."""
        error = self.refused(postgres_server.url("no_such_db"))
        assert error.problem == "missing-database"
        assert error.reason == 'database "no_such_db" does not exist'
        assert f"`createdb -h {postgres_server.directory} -U postgres no_such_db`" in str(error)
        assert isinstance(error.__cause__, psycopg.OperationalError)
        assert error.location == postgres_server.url("no_such_db")

    def test_a_missing_role(self, postgres_server: PostgresServer) -> None:
        """A role the server does not have is named, with the statement that makes it."""
        error = self.refused(postgres_server.url(user="nobody_here"))
        assert error.problem == "missing-role"
        assert error.reason == 'role "nobody_here" does not exist'
        assert "Correct the user name in the URL, or create the role" in str(error)
        assert 'CREATE ROLE "nobody_here" LOGIN' in str(error)

    def test_a_wrong_password(self, postgres_server: PostgresServer, role: str) -> None:
        """A refused password says so, and the password is not in the message."""
        error = self.refused(postgres_server.url(user=role, password="wrong horse"))
        assert error.problem == "authentication"
        assert error.reason == f'password authentication failed for user "{role}"'
        assert "Check the user name and password in the URL" in str(error)
        assert "wrong" not in str(error) and ":***@" in str(error)

    def test_no_password(self, postgres_server: PostgresServer, role: str) -> None:
        """A server that asks for a password, given none, is told one."""
        error = self.refused(postgres_server.url(user=role))
        assert error.problem == "authentication"
        assert "asks for a password and none was given" in str(error)

    def test_the_right_password_opens(self, postgres_server: PostgresServer, role: str) -> None:
        """The password in the URL reaches the first connection and the pool's."""
        url = postgres_server.new_database()
        name = url.rsplit("/", 1)[1]
        postgres_server.admin(f'ALTER DATABASE "{name}" OWNER TO "{role}"')
        postgres_server.admin(f'GRANT ALL ON SCHEMA public TO "{role}"')  # (it is per database)
        try:
            with Store(postgres_server.url(name, user=role, password="right horse")) as store:
                assert store.agents() == []
        finally:
            postgres_server.drop_database(url)

    def test_an_invalid_url_never_shows_its_password(self) -> None:
        """libpq's complaint about a URL it cannot parse quotes it: the password is masked."""
        with pytest.raises(DatabaseAccessError) as raised:
            Store("postgresql://me:se%zzcret@127.0.0.1:1/agents")
        assert raised.value.problem == "settings"
        assert "se%zzcret" not in str(raised.value) and "***" in str(raised.value)

    def test_a_server_that_does_not_answer_is_still_unavailable(self) -> None:
        """No server on the port: the wait, then DatabaseUnavailableError with libpq's reason."""
        url = f"postgresql://postgres@127.0.0.1:{free_port()}/agents"
        started = time.monotonic()
        with pytest.raises(DatabaseUnavailableError) as raised:
            Store(url, busy_timeout=0.5)
        print(f"unavailable after {time.monotonic() - started:.2f} s: {raised.value}")
        assert "Connection refused" in raised.value.reason
        assert "Check that the server is up" in str(raised.value)

    def test_a_server_coming_up_within_the_wait_is_waited_for(
        self, postgres_server: PostgresServer, postgres_url: str
    ) -> None:
        """Opening while the server restarts retries until it answers, then opens."""
        Store(postgres_url).close()
        restart = threading.Thread(target=postgres_server.restart, kwargs={"down": 1.0})
        restart.start()
        try:
            time.sleep(0.3)  # the server is down now (an immediate stop takes ~0.1 s)
            started = time.monotonic()
            with Store(postgres_url) as store:
                print(f"opened after {time.monotonic() - started:.2f} s")
                assert store.agents() == []
        finally:
            restart.join()

    @pytest.mark.parametrize(
        ("message", "problem"),
        [
            ('FATAL:  database "x" does not exist', "missing-database"),
            ('FATAL:  permission denied for database "x"', "not-permitted"),
            ('FATAL:  role "x" is not permitted to log in', "not-permitted"),
            ('FATAL:  no pg_hba.conf entry for host "[local]", user "x", database "y"',
             "not-permitted"),
            ('FATAL:  Peer authentication failed for user "x"', "authentication"),
            ("FATAL:  la base de données « x » n'existe pas", None),
            ("FATAL:  the database system is starting up", None),
            ("FATAL:  sorry, too many clients already", None),
        ],
    )  # fmt: skip
    def test_which_words_are_lasting_refusals(self, message: str, problem: str | None) -> None:
        """Only PostgreSQL's (English) words for a lasting refusal are one; any other
        failure may pass (a server starting up, out of slots, or speaking French)."""
        line = f'connection failed: connection to server on socket "/s" failed: {message}'
        found = access_error(psycopg.OperationalError(line), "postgresql:///y", "db")
        assert (found and found.problem) == problem
        if found is not None:
            assert found.reason == message.removeprefix("FATAL:  ")


def catalog(url: str) -> dict[str, list[tuple[object, ...]]]:
    """The database's tables, columns, storage options, constraints, indexes, triggers
    and functions, in a comparable form."""
    queries = {
        "storage": """
            SELECT cl.relname, cl.relkind, cl.reloptions FROM pg_class AS cl
              JOIN pg_namespace AS n ON n.oid = cl.relnamespace
             WHERE n.nspname = 'public' ORDER BY 1""",
        "columns": """
            SELECT table_name, column_name, data_type, is_nullable, column_default,
                   collation_name
              FROM information_schema.columns WHERE table_schema = 'public'
             ORDER BY 1, 2""",
        "constraints": """
            SELECT cl.relname, pg_get_constraintdef(co.oid) FROM pg_constraint AS co
              JOIN pg_class AS cl ON cl.oid = co.conrelid
              JOIN pg_namespace AS n ON n.oid = cl.relnamespace
             WHERE n.nspname = 'public' ORDER BY 1, 2""",
        "indexes": """
            SELECT tablename, indexname, indexdef FROM pg_indexes
             WHERE schemaname = 'public' ORDER BY 1, 2""",
        "triggers": """
            SELECT tgname, pg_get_triggerdef(t.oid) FROM pg_trigger AS t
              JOIN pg_class AS cl ON cl.oid = t.tgrelid
              JOIN pg_namespace AS n ON n.oid = cl.relnamespace
             WHERE n.nspname = 'public' AND NOT t.tgisinternal ORDER BY 1""",
        "functions": """
            SELECT proname, pg_get_functiondef(p.oid) FROM pg_proc AS p
              JOIN pg_namespace AS n ON n.oid = p.pronamespace
             WHERE n.nspname = 'public' ORDER BY 1""",
    }
    with psycopg.connect(url) as conn:
        return {name: conn.execute(sql).fetchall() for name, sql in queries.items()}


class TestMigrations:
    def schema3(self, url: str) -> None:
        """Make ``url`` a database as the first PostgreSQL release (schema 3) left it."""
        ddl = (FIXTURES / "schema3_postgres.sql").read_text()
        with psycopg.connect(url) as conn:
            conn.execute(ddl)
            conn.execute("INSERT INTO effectful_durable VALUES (%s, 3, 0)", (APPLICATION_ID,))
            conn.execute("INSERT INTO agents VALUES ('bot', 1, 0, 0)")

    def test_migrated_equals_fresh(self, postgres_server: PostgresServer) -> None:
        """A schema-3 database migrated forward has exactly the tables of a fresh one."""
        fresh, old = postgres_server.new_database(), postgres_server.new_database()
        try:
            Store(fresh).close()
            self.schema3(old)
            with Store(old) as store:
                assert store.check()["schema"] == SCHEMA_VERSION
                assert [a.agent_id for a in store.agents()] == ["bot"]  # rows kept
            assert catalog(old) == catalog(fresh)
            # Schema 10: nothing notifies; schema 12: a turn's commit fences its hold.
            assert [name for name, _ in catalog(fresh)["triggers"]] == ["agents_fenced"]
        finally:
            postgres_server.drop_database(fresh)
            postgres_server.drop_database(old)

    def test_schema_5_gains_the_turn_functions(self, postgres_url: str) -> None:
        """A schema-5 database (before the turn's functions) migrates to the current
        schema when opened, and its agents' turns go on from the versions they had;
        the new commits carry their ids, the versions before none."""
        self.schema3(postgres_url)
        with psycopg.connect(postgres_url) as conn:
            for version in (3, 4):
                conn.execute(MIGRATIONS[version])
            conn.execute("UPDATE effectful_durable SET schema_version = 5")
        with Store(postgres_url) as store:
            assert store.check()["schema"] == SCHEMA_VERSION
            assert commit_message(store, "bot") == 2  # bot was at version 1
            with store.turns.start("new", template="t", arguments={}) as start:
                assert start.version == 0
        functions = [name for name, _ in catalog(postgres_url)["functions"]]
        assert {"effectful_durable_take", "effectful_durable_advance"} <= set(functions)
        assert "effectful_durable_lock" not in functions  # schema 6's, dropped by schema 7
        assert "effectful_durable_start" not in functions  # schema 7's, dropped by schema 11
        with psycopg.connect(postgres_url) as conn:
            ids = conn.execute(
                "SELECT version, commit_id FROM versions WHERE agent_id = 'bot' ORDER BY version"
            ).fetchall()
        assert all(commit_id is None for version, commit_id in ids if version < 2)
        assert ids[-1][0] == 2 and len(ids[-1][1]) == 16

    def test_a_read_only_store_does_not_migrate(self, postgres_url: str) -> None:
        """readonly=True refuses an older schema, saying to open it read-write once."""
        self.schema3(postgres_url)
        with pytest.raises(DurableError, match="open it read-write once"):
            Store(postgres_url, readonly=True)
        with psycopg.connect(postgres_url) as conn:
            assert conn.execute("SELECT schema_version FROM effectful_durable").fetchone() == (3,)


class TestNotYetOnPostgres:
    def test_parts_not_carried_are_refused_clearly(self, postgres_url: str) -> None:
        """Vacuum raises NotSupportedError (the SQL workspace and alarms are carried)."""
        with Store(postgres_url) as store:
            for call in (lambda: store.vacuum(),):
                with pytest.raises(NotSupportedError, match="not supported on PostgreSQL"):
                    call()


class TestBackup:
    def test_backup_is_an_sqlite_file_of_every_agent(
        self, postgres_url: str, tmp_path: Path
    ) -> None:
        """Store.backup on PostgreSQL writes a new SQLite file holding the same agents."""
        with Store(postgres_url) as store:
            commit_message(store, "bot", "hello")
            commit_message(store, "bot", "again")
            store.backup(tmp_path / "backup.db")
            with pytest.raises(DurableError, match="that file exists"):
                store.backup(tmp_path / "backup.db")
            expected = store.history("bot")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["backup.db"]
        assert integrity(tmp_path / "backup.db") == "ok"
        with Store(tmp_path / "backup.db", readonly=True) as copy:
            assert copy.history("bot") == expected
            assert [v.version for v in copy.versions("bot")] == [1, 2]


class TestSingleWriter:
    def test_a_waiting_turn_starts_when_the_holder_lets_go(self, postgres_url: str) -> None:
        """A turn's start (the lock and its handoff row in one round trip) on an agent
        another session holds writes nothing; waiting, it starts once that lets go."""
        with Store(postgres_url) as holder, Store(postgres_url) as waiter:
            held, go = threading.Event(), threading.Event()

            def hold() -> None:
                with holder.agent_lock("bot"):
                    held.set()
                    go.wait(10)
                    time.sleep(0.2)

            thread = threading.Thread(target=hold)
            thread.start()
            try:
                held.wait(10)
                with (
                    pytest.raises(AgentInUseError, match="process"),
                    waiter.turns.start("bot", template="t", arguments={}),
                ):
                    pass
                assert waiter.handoffs() == []
                go.set()
                with waiter.turns.start("bot", wait=10, template="t", arguments={"a": 1}) as start:
                    assert start.version == 0
                    assert [h.arguments for h in waiter.handoffs()] == [{"a": 1}]
            finally:
                go.set()
                thread.join()

    def test_refused_starts_leave_the_lock_connection_working(self, postgres_url: str) -> None:
        """Refusals mixed with turns, past psycopg's prepare threshold (5), leave the
        lock's connection working: psycopg prepares the start's statement there, and
        never takes a statement the server skipped for prepared."""
        with Store(postgres_url) as holder, Store(postgres_url) as waiter:
            for version in range(10):
                with holder.agent_lock("bot"):
                    with (
                        pytest.raises(AgentInUseError),
                        waiter.turns.start("bot", template="t", arguments={}),
                    ):
                        pass
                with waiter.turns.start("bot", template="t", arguments={}) as start:
                    assert start.version == version
                    waiter.turns.commit(
                        "bot",
                        base_version=version,
                        template="t",
                        change=added(version),
                        state=None,
                    )
            assert len(waiter.history("bot")) == 10

    def test_a_busy_agent_is_no_error_in_the_server_log(
        self, postgres_server: PostgresServer, postgres_url: str
    ) -> None:
        """A turn refused because another session holds its agent, at once or after
        polling, leaves no ERROR line in the server's log (operators alert on them)."""
        log = Path(postgres_server.log)
        with Store(postgres_url) as holder, Store(postgres_url) as waiter:
            with holder.agent_lock("bot"):
                before = len(log.read_bytes())
                for wait in (0.0, 0.0, 0.05):
                    with (
                        pytest.raises(AgentInUseError),
                        waiter.turns.start("bot", template="t", arguments={}, wait=wait),
                    ):
                        pass
                logged = log.read_bytes()[before:].decode()
            with waiter.turns.start("bot", template="t", arguments={}) as start:
                assert start.version == 0
        assert "ERROR" not in logged, logged

    def test_refused_commits_leave_the_pool_working(self, postgres_url: str) -> None:
        """Commits refused by the version fence, mixed with commits, past psycopg's
        prepare threshold, leave no connection naming statements the server never
        prepared."""
        with Store(postgres_url) as store:
            for version in range(10):
                with pytest.raises(AgentInUseError, match="committed version"):
                    store.turns.commit(
                        "bot", base_version=version + 1, template="t", change=added(99), state=None
                    )
                store.turns.commit(
                    "bot", base_version=version, template="t", change=added(version), state=None
                )
            assert len(store.history("bot")) == 10

    def test_a_second_process_gets_agent_in_use_naming_the_holder(self, postgres_url: str) -> None:
        """While this process holds an agent, another process's turn on it is refused,
        and the error names this process's pid and host."""
        import os
        import socket

        store = Store(postgres_url)
        script = f"""
            from effectful_durable import Store, AgentInUseError
            try:
                with Store({postgres_url!r}).agent_lock("bot"):
                    print("got it")
            except AgentInUseError as e:
                print("refused:", e.holder)
        """
        with store.agent_lock("bot"):
            out = in_new_process(script)
        assert f"refused: process {os.getpid()} on {socket.gethostname()}" in out
        assert "got it" in in_new_process(script)  # released
        store.close()

    def test_the_lock_goes_with_a_killed_process(self, postgres_url: str) -> None:
        """A process killed while holding an agent frees it (the server drops its session)."""
        import subprocess
        import sys
        import textwrap
        import time

        code = textwrap.dedent(f"""
            import sys, time
            from effectful_durable import Store
            with Store({postgres_url!r}).agent_lock("bot"):
                print("held", flush=True)
                time.sleep(60)
        """)
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        with Store(postgres_url) as store:
            with pytest.raises(AgentInUseError):
                with store.agent_lock("bot"):
                    pass
            child.kill()
            child.wait()
            deadline = time.monotonic() + 10
            with store.agent_lock("bot", wait=max(0.0, deadline - time.monotonic())):
                pass


class TestServerRestart:
    def test_an_immediate_restart_loses_no_commit_and_clients_recover(
        self, postgres_server: PostgresServer, postgres_url: str
    ) -> None:
        """pg_ctl restart -m immediate between turns: every committed turn is there, the
        turn in flight fails cleanly if it meets the restart, and the next turn works."""
        llm = FakeLLM(respond=lambda call: "ok")
        with persisted(postgres_url, llm) as persistence:
            bot = Assistant(agent_id="bot")
            bot.ask("one")
            bot.ask("two")
            postgres_server.restart()
            try:
                bot.ask("three")  # may meet a connection the restart broke
            except DurableError:
                pass
            bot.ask("four")
            version = persistence.store.versions("bot")[-1].version
        with Store(postgres_url) as store:
            users = [m for m in store.history("bot") if m["role"] == "user"]
            assert len(users) == version  # one user message per committed turn
            assert version >= 3
