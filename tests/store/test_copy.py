"""``effectful-durable copy``: a whole database from SQLite to PostgreSQL and back.

A database made by real agents (turns with tool calls, a failed turn, two
conversations, memory and notes, SQL tables with a schema change, compaction,
rollback, fork, a workflow journal, pruning, alarms pending, recurring, dead and
cancelled, a runner's status report) goes SQLite -> PostgreSQL -> SQLite. Every
table of the last copy equals the first row for row, the PostgreSQL copy reads
the same through the Store (the SQL tables at every version too), its
compacted text is found by recall, and its agents go on with their next turns.
"""

import time
from pathlib import Path
from typing import Any

import pytest
from helpers import Assistant, Keeper, persisted, persisted_rows, running
from sql_helpers import Builder, sql_turn

from effectful_durable import CompactionHandler, PersistenceHandler, RecallTools, Store
from effectful_durable.cli import main
from effectful_durable.store.alarms import make_schedule
from effectful_durable.store.copy import TABLES
from effectful_durable.testing import FakeCall, FakeLLM, ToolCall

pytestmark = pytest.mark.usefixtures("postgres_server")


class Rememberer(Assistant, RecallTools):
    """You are an assistant with a long memory."""


def respond(call: FakeCall) -> Any:
    """Remember what a question asks to, then answer; summaries when asked for one."""
    text = call.last_user_text
    if call.messages[-1]["role"] == "tool":
        return "done"
    if "remember" in text and call.tools:
        return ToolCall("remember", {"note": text.split("remember ", 1)[1]})
    return f"re: {text[-40:]}"


def build(db: Path) -> None:
    """A database with something in every table of agent data."""
    llm = FakeLLM(respond=respond)
    compaction = CompactionHandler(max_messages=8, keep_recent=2)
    with running(llm, compaction, PersistenceHandler(db)):
        bot = Rememberer(agent_id="bot")
        bot.ask("remember the zebra codeword")
        for n in range(4):
            bot.ask(f"question {n}")
        with bot.conversation("side"):
            bot.ask("remember the side note")
    with persisted(db, FakeLLM([RuntimeError("provider down")])):
        with pytest.raises(RuntimeError):
            Assistant(agent_id="flaky").ask("one")
    keeper_calls = [
        ToolCall("put_state", {"key": "city", "value": '"Lyon"'}),
        ToolCall("add_to_context", {"item": "likes tea"}),
        "kept",
    ]
    with persisted(db, FakeLLM(keeper_calls)):
        Keeper(agent_id="keeper").ask("keep this")
    with persisted(db, FakeLLM(respond=respond), workflow="wf"):
        Assistant(agent_id="step").ask("first step")
        Assistant(agent_id="step").ask("second step")
    builder = Builder(agent_id="builder")
    sql_turn(db, builder, ToolCall("sql_insert", {"table": "notes", "values": {"body": "a"}}))
    create = "CREATE TABLE tags (id INTEGER PRIMARY KEY, tag TEXT, at BLOB)"
    sql_turn(db, builder, ToolCall("sql_execute", {"statement": create}))
    tag = "INSERT INTO tags (tag, at) VALUES ('x', x'00ff')"
    sql_turn(db, builder, ToolCall("sql_execute", {"statement": tag}))
    now = time.time()
    with Store(db) as store:
        dead = store.schedule_alarm("step", "broken", make_schedule(now, delay=0))
        queue = store.alarm_queue
        claim = queue.claim("host:1:x", now, 60)
        assert claim is not None and claim.alarm_id == dead
        queue.fail(claim, "RuntimeError: model down", None)
        queue.record_status("host:1:x", state="stopped", started_at=now, report={"turns": 3})
        store.schedule_alarm("keeper", "check back", make_schedule(now, delay=3600))
        nightly = make_schedule(now, cron="0 3 * * *", timezone="Europe/Paris")
        store.schedule_alarm("keeper", "tidy", nightly)
        store.schedule_alarm("bot", "rolled back", make_schedule(now, every=600))
        store.rollback("bot", 3)
        store.fork("bot", 2, "bot-copy")
        store.prune("bot", keep_versions=2)
        store.rollback("builder", 2)  # across the schema change: a snapshot
        store.fork("builder", 3, "builder-copy")


def dump(db: str | Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every table of agent data, rows sorted, through a connection of our own."""
    out = {}
    for table in TABLES:
        try:
            rows = persisted_rows(db, f"SELECT * FROM {table}")
        except Exception:  # a table this backend does not have
            continue
        out[table] = sorted((tuple(_plain(v) for v in row) for row in rows), key=repr)
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def readable(db: str | Path) -> dict[str, Any]:
    """What the Store reads of every agent: histories of each conversation, state, memory,
    and each version of the SQL tables."""
    with Store(db, readonly=True) as store:
        tables = {
            agent: [sql_tables(store, agent, v.version) for v in store.versions(agent)]
            for agent in ("builder", "builder-copy")
        }
        agents = sorted(a.agent_id for a in store.agents())
        return {
            agent: (
                [v.version for v in store.versions(agent)],
                {
                    c.conversation: store.history(
                        agent, conversation=c.conversation, include_compacted=True
                    )
                    for c in store.conversations(agent)
                },
                store.state(agent),
                store.memory(agent),
                [n.text for n in store.memory_notes(agent)],
            )
            for agent in agents
        } | {
            "steps": [(s.key, s.status, s.result) for s in store.steps("wf")],
            "sql": tables,
            "alarms": store.alarms(include_ended=True),
            "runners": store.runner_statuses(),
        }


def sql_tables(store: Store, agent_id: str, version: int) -> dict[str, list[tuple[Any, ...]]]:
    """Each of the agent's SQL tables at ``version``, with its rows."""
    names = store.sql(agent_id, "SELECT name FROM sqlite_schema WHERE type = 'table'", (), version)
    return {
        name: store.sql(agent_id, f"SELECT * FROM {name} ORDER BY id", (), version).rows
        for (name,) in names.rows
    }


@pytest.fixture
def original(tmp_path: Path) -> Path:
    db = tmp_path / "original.db"
    build(db)
    return db


def test_round_trip_through_postgres_keeps_every_row(
    original: Path, postgres_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SQLite -> PostgreSQL -> SQLite gives back every row of every table."""
    back = tmp_path / "back.db"
    assert main(["copy", str(original), postgres_url]) == 0
    assert "copied to postgresql://" in capsys.readouterr().out
    assert main(["copy", postgres_url, str(back)]) == 0
    before, after = dump(original), dump(back)
    assert {table: len(rows) for table, rows in before.items() if rows} == {
        table: len(rows) for table, rows in after.items() if rows
    }
    assert set(before) >= {
        "agents",
        "versions",
        "messages",
        "compactions",
        "memory",
        "workspace_log",
    }
    filled = ("handoffs", "workflow_steps", "retention", "conversations", "alarms")
    assert all(before[t] for t in (*filled, "runner_status"))
    assert before == after
    assert readable(original) == readable(postgres_url) == readable(back)
    statuses = {(a.action, a.status) for a in readable(postgres_url)["alarms"]}
    assert statuses == {
        ("broken", "dead"),
        ("check back", "pending"),
        ("tidy", "pending"),
        ("rolled back", "cancelled"),
    }


def test_copied_agents_recall_and_go_on(original: Path, postgres_url: str) -> None:
    """On the PostgreSQL copy, recall finds the compacted text, the next turns commit,
    SQL tables included, and a copied dead alarm is re-armed and claimed."""
    assert main(["copy", str(original), postgres_url]) == 0
    with Store(postgres_url) as copy, Store(original, readonly=True) as source:
        found = copy.search_compacted("bot", "zebra")
        assert len(found) == 3  # the question, the tool call and its result
        assert sorted(map(repr, found)) == sorted(
            map(repr, source.search_compacted("bot", "zebra"))
        )
        [version] = [a.version for a in copy.agents() if a.agent_id == "bot"]
    with persisted(postgres_url, FakeLLM(["onwards"])):
        bot = Rememberer(agent_id="bot")
        assert bot.ask("and now?") == "onwards"
    with Store(postgres_url) as store:
        assert [a.version for a in store.agents() if a.agent_id == "bot"] == [version + 1]
        (dead,) = [a for a in store.alarms() if a.status == "dead"]
        store.rearm_alarm(dead.alarm_id)
        claim = store.alarm_queue.claim("r", time.time() + 1, 60)
        assert claim is not None and (claim.alarm_id, claim.action) == (dead.alarm_id, "broken")
    tag = ToolCall("sql_insert", {"table": "tags", "values": {"tag": "y"}})
    results = sql_turn(postgres_url, Builder(agent_id="builder-copy"), tag)
    assert results == ['{"changes": 1}']
    with Store(postgres_url, readonly=True) as store:
        rows = store.sql("builder-copy", "SELECT tag FROM tags ORDER BY id").rows
    assert rows == [("x",), ("y",)]


def test_a_database_that_holds_agents_is_not_copied_into(
    original: Path, postgres_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A target with agents is refused, and neither database changes."""
    assert main(["copy", str(original), postgres_url]) == 0
    before = dump(postgres_url)
    assert main(["copy", str(original), postgres_url]) == 1
    error = capsys.readouterr().err
    assert "already holds 6 agents" in error and "nothing was written" in error
    assert dump(postgres_url) == before


def test_a_copy_between_files_keeps_every_row(original: Path, tmp_path: Path) -> None:
    """A file copied to another file is equal to it, table for table."""
    twin = tmp_path / "twin.db"
    assert main(["copy", str(original), str(twin)]) == 0
    assert dump(twin) == dump(original)


def test_a_failed_copy_leaves_no_new_file(
    original: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A copy onto its own source is refused; a new target is removed when the copy fails."""
    assert main(["copy", str(original), str(original)]) == 1
    assert "same file" in capsys.readouterr().err
    assert main(["copy", str(tmp_path / "missing.db"), str(tmp_path / "new.db")]) == 1
    assert not (tmp_path / "new.db").exists()
