"""The Store's browsing reads and its diff, on SQLite and PostgreSQL: what the page and
``effectful-durable diff`` show is read here, a page at a time."""

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import commit_message, commit_writes, edit_rows
from paths import ROOT
from sql_helpers import Builder, Tracker, sql_turn
from ui_content import BROKEN, DESK, HTML, HTML_AGENT

from effectful_durable import Store
from effectful_durable.errors import NotFoundError
from effectful_durable.store.browse import HistoryFilter
from effectful_durable.store.history import HistoryChange
from effectful_durable.store.parts.memory import MemoryChanges
from effectful_durable.testing import ToolCall

pytestmark = pytest.mark.slow


class TestAgentPage:
    def test_every_agent_with_what_waits_for_it(self, content: str) -> None:
        """The list holds each agent with its counts: approvals, events, alarms, a failed turn."""
        with Store(content, readonly=True) as store:
            found = store.agent_page()
        by_id = {a.agent_id: a for a in found.agents}
        assert found.total == 3 and found.pages == 1
        assert list(by_id) == sorted(by_id)
        desk = by_id[DESK]
        assert (desk.version, desk.conversations, desk.approvals_pending) == (9, 2, 1)
        assert (desk.events_waiting, desk.alarms_pending, desk.alarms_dead) == (1, 1, 0)
        assert by_id[BROKEN].handoff == "failed"
        assert by_id[HTML_AGENT].needs_attention is False

    def test_filter_sort_and_pages(self, content: str) -> None:
        """Text (any case), needs-attention, sorts and pages choose and order the agents."""
        with Store(content, readonly=True) as store:
            assert [a.agent_id for a in store.agent_page(text="SCRIPT").agents] == [HTML_AGENT]
            assert [a.agent_id for a in store.agent_page(text="%").agents] == []
            attention = store.agent_page(attention=True, sort="-id")
            assert [a.agent_id for a in attention.agents] == [DESK, BROKEN]
            first = store.agent_page(sort="-version", per_page=2)
            second = store.agent_page(sort="-version", per_page=2, page=2)
            beyond = store.agent_page(attention=True, per_page=1, page=3)
            assert (beyond.agents, beyond.total) == ([], 2)  # counted: past its last page
            assert store.agent_page(text="nobody").total == 0
            assert store.agent_page(text="e", attention=True, per_page=1).total == 2
        assert first.agents[0].agent_id == DESK and first.pages == 2
        assert len(second.agents) == 1
        assert {a.agent_id for a in first.agents + second.agents} == {DESK, BROKEN, HTML_AGENT}

    @pytest.mark.parametrize(
        "options",
        [{"sort": "size"}, {"page": 0}, {"per_page": 0}, {"per_page": 501}],
        ids=["sort", "page", "small", "large"],
    )
    def test_bad_values_are_refused(self, content: str, options: dict[str, object]) -> None:
        """An unknown sort or a page out of range is a ValueError naming it."""
        with Store(content, readonly=True) as store, pytest.raises(ValueError):
            store.agent_page(**options)  # type: ignore[arg-type]


class TestTimeline:
    def test_pages_of_versions_newest_first(self, content: str) -> None:
        """Each block is one version of the conversation with the messages it added."""
        with Store(content, readonly=True) as store:
            first = store.timeline(DESK, limit=2)
            rest = store.timeline(DESK, before=first.next_before, limit=2)
        assert [b.info.version for b in first.blocks] == [3, 2]
        assert [b.info.version for b in rest.blocks] == [1] and rest.next_before is None
        assert [m["role"] for m in rest.blocks[0].messages][:2] == ["system", "user"]
        assert first.latest == 9

    def test_compaction_and_its_originals(self, content: str) -> None:
        """A compaction's block counts the originals; they read back, marked removed."""
        with Store(content, readonly=True) as store:
            chat = store.timeline(DESK, conversation="chat", limit=1)
            originals = store.compacted(DESK, 9, conversation="chat")
            older = store.timeline(DESK, conversation="chat", before=9, limit=5)
        assert chat.blocks[0].info.kind == "compaction" and chat.blocks[0].compacted == 8
        assert len(originals) == 8
        marks = [m.get("durable", {}).get("removed_in") for b in older.blocks for m in b.messages]
        assert 9 in marks

    @pytest.mark.parametrize(
        ("wanted", "versions"),
        [
            (HistoryFilter(errors=True), [2]),
            (HistoryFilter(tool="self__refund"), [3]),
            (HistoryFilter(role="tool", tool="self__lookup"), [2, 1]),
            (HistoryFilter(role="tool", tool="self__lookup", text="DELIVERED"), [1]),
            (HistoryFilter(tool="self__lookup", errors=True), [2]),
            (HistoryFilter(text="ALERT('X')"), [1]),
            (HistoryFilter(text="where is my ORDER"), [1]),
            (HistoryFilter(text="no such words"), []),
        ],
        ids=[
            "errors",
            "tool",
            "tool-results",
            "tool-results-text",
            "tool-errors",
            "text-case",
            "text-spaces",
            "none",
        ],
    )
    def test_filter(self, content: str, wanted: HistoryFilter, versions: list[int]) -> None:
        """A filter keeps the versions with a matching message, and only those messages."""
        with Store(content, readonly=True) as store:
            found = store.timeline(DESK, filter=wanted)
        assert [b.info.version for b in found.blocks] == versions
        for block in found.blocks:
            assert block.messages and len(block.messages) <= block.total

    def test_filter_pages(self, content: str) -> None:
        """A filtered page ends where the next begins: no version twice, none lost."""
        wanted = HistoryFilter(role="user")
        with Store(content, readonly=True) as store:
            pages, before = [], None
            while True:
                page = store.timeline(DESK, filter=wanted, before=before, limit=1)
                pages += [b.info.version for b in page.blocks]
                before = page.next_before
                if before is None:
                    break
        assert pages == [3, 2, 1]

    def test_unknown_agent(self, content: str) -> None:
        """An agent the database does not hold is a NotFoundError."""
        with Store(content, readonly=True) as store, pytest.raises(NotFoundError):
            store.timeline("nobody")

    def test_messages_behind_rolled_back_ones(self, store_url: str) -> None:
        """Each block holds exactly its version's messages, in order, wherever they sit:
        after a rollback, a turn's messages take positions below those it removed."""

        def turn(store: Store, messages: int, first: float) -> int:
            with store.turns.start("bot", template="t", arguments={}) as start:
                added = [
                    (
                        first + i,
                        {"id": f"v{start.version + 1}-{i}", "role": "user", "content": "x"},
                    )
                    for i in range(messages)
                ]
                return store.turns.commit(
                    "bot",
                    base_version=start.version,
                    template="t",
                    change=HistoryChange(added, [], 0),
                    state=None,
                )

        with Store(store_url) as store:
            turn(store, 2, 0)  # v1: positions 0, 1
            turn(store, 30, 2)  # v2: 2..31
            turn(store, 30, 32)  # v3: 32..61
            store.rollback("bot", 1)  # v4 removes v2's and v3's
            turn(store, 3, 2)  # v5: 2..4, below 58 removed rows
            turn(store, 1, 5)  # v6: 5
            latest = store.timeline("bot", limit=2)
            rest = store.timeline("bot", before=latest.next_before, limit=10)
        blocks = latest.blocks + rest.blocks
        assert [b.info.version for b in blocks] == [6, 5, 4, 3, 2, 1]
        ids = {b.info.version: [m["id"] for m in b.messages] for b in blocks}
        assert ids[6] == ["v6-0"] and ids[5] == ["v5-0", "v5-1", "v5-2"] and ids[4] == []
        assert ids[3] == [f"v3-{i}" for i in range(30)]
        assert ids[1] == ["v1-0", "v1-1"]
        removed = {m.get("durable", {}).get("removed_in") for m in blocks[3].messages}
        assert removed == {4}


class TestDiff:
    def test_every_part(self, content: str) -> None:
        """From v1 to v9: messages per conversation, fields, an alarm, an approval; back
        from v9 to v1 the same changes the other way."""
        with Store(content, readonly=True) as store:
            forward = store.diff(DESK, 1, 9)
            backward = store.diff(DESK, 9, 1)
        assert {
            c.conversation: (c.added_count, c.removed_count) for c in forward.conversations
        } == {
            "chat": (4, 0),
            "default": (8, 0),
        }
        assert [a.op for a in forward.alarms] == ["added"]
        assert [a.tool for a in forward.approvals] == ["refund"]
        assert {
            c.conversation: (c.added_count, c.removed_count) for c in backward.conversations
        } == {
            "chat": (0, 4),
            "default": (0, 8),
        }
        assert [a.op for a in backward.alarms] == ["removed"]

    def test_memory_and_fields(self, store_url: str) -> None:
        """Memory keys and fields that changed between two versions are listed; a version
        compared with itself is no change."""
        with Store(store_url) as store:
            memory = MemoryChanges()
            memory.changes[("key", "customer")] = '"Ann"'
            first = commit_writes(store, "bot", memory)
            memory = MemoryChanges()
            memory.changes[("key", "customer")] = '"Ben"'
            memory.changes[("key", "plan")] = '"gold"'
            commit_writes(store, "bot", memory)
            last = store.turns.commit(
                "bot",
                base_version=2,
                template="t",
                change=HistoryChange([], [], 0),
                state='{"tickets": 2}',
            )
            found = store.diff("bot", first, last)
            same = store.diff("bot", last, last)
        assert [(c.name, c.op, c.before, c.after) for c in found.memory] == [
            ("customer", "changed", "Ann", "Ben"),
            ("plan", "added", None, "gold"),
        ]
        assert [(c.name, c.op, c.after) for c in found.fields] == [("tickets", "added", 2)]
        assert same.empty

    def test_sql_rows(self, tmp_path: Path) -> None:
        """Rows inserted, updated and deleted show with their values, both ways, with the
        changesets alone or across a schema change."""
        db = str(tmp_path / "sql.db")
        tracker = Tracker(agent_id="t")
        insert = "INSERT INTO runs (km, day) VALUES (?, ?)"
        sql_turn(db, tracker, ToolCall("sql_execute", {"statement": insert, "params": [5, HTML]}))
        sql_turn(db, tracker, ToolCall("sql_execute", {"statement": "UPDATE runs SET km = 7"}))
        sql_turn(db, tracker, ToolCall("sql_execute", {"statement": insert, "params": [1, "x"]}))
        with Store(db, readonly=True) as store:
            forward = store.diff("t", 1, 3)
            back = store.diff("t", 3, 1)
        (runs,) = forward.tables
        assert (runs.table, runs.added, runs.changed) == ("runs", 1, 1)
        changed = next(r for r in runs.rows if r.op == "changed")
        assert changed.before == {"id": 1, "km": 5.0} and changed.after == {"id": 1, "km": 7.0}
        assert (back.tables[0].removed, back.tables[0].changed) == (1, 1)

    def test_sql_rows_across_a_schema_change(self, tmp_path: Path) -> None:
        """A table created in between shows as created, with its rows; the others compare
        row by row."""
        db = str(tmp_path / "ddl.db")
        builder = Builder(agent_id="b")
        insert = "INSERT INTO notes (body) VALUES (?)"
        sql_turn(db, builder, ToolCall("sql_execute", {"statement": insert, "params": ["a"]}))
        create = "CREATE TABLE extra (id INTEGER PRIMARY KEY, v TEXT)"
        sql_turn(
            db,
            builder,
            ToolCall("sql_execute", {"statement": create}),
            ToolCall("sql_execute", {"statement": "INSERT INTO extra (v) VALUES ('x')"}),
            ToolCall("sql_execute", {"statement": "DELETE FROM notes"}),
        )
        with Store(db, readonly=True) as store:
            found = {t.table: t for t in store.diff("b", 1, 2).tables}
        assert (found["extra"].schema, found["extra"].added) == ("created", 1)
        assert found["extra"].rows[0].after == {"id": 1, "v": "x"}
        assert (found["notes"].schema, found["notes"].removed) == (None, 1)

    def test_a_rollback_cancels_out(self, store_url: str) -> None:
        """Messages a rollback restored (new rows, same messages) are no change."""
        with Store(store_url) as store:
            for text in ("a", "b", "c"):
                commit_message(store, "bot", text)
            back = store.rollback("bot", 1)
            found = store.diff("bot", 1, back)
            undone = store.diff("bot", 3, back)
        assert found.empty
        assert [(c.added_count, c.removed_count) for c in undone.conversations] == [(0, 2)]

    def test_unknown_version(self, store_url: str) -> None:
        """A version the agent never had is a NotFoundError."""
        with Store(store_url) as store:
            commit_message(store, "bot", "a")
            with pytest.raises(NotFoundError, match="no version 5"):
                store.diff("bot", 1, 5)


class TestDamage:
    @pytest.mark.sqlite_only("row checksums are SQLite's")
    def test_a_damaged_row_names_its_agent_alone(self, store_url: str) -> None:
        """An agent whose row fails its checksum is listed as damaged; the others read."""
        with Store(store_url) as store:
            commit_message(store, "good", "fine")
            commit_message(store, "bad", "fine")
        edit_rows(
            store_url, "UPDATE agents SET updated_at = 1 WHERE agent_id = 'bad'", foreign=True
        )
        with Store(store_url, readonly=True) as store:
            found = {a.agent_id: a for a in store.agent_page().agents}
            assert "fails its checksum" in (found["bad"].damaged or "")
            assert found["good"].damaged is None and found["good"].messages == 1


#: A child's commit of one turn of agent ``bot`` through the Store alone.
COMMIT_ONE = """
import sys
from effectful_durable import Store
from effectful_durable.store.history import HistoryChange
with Store(sys.argv[1]) as store:
    with store.turns.start("bot", template="t", arguments={}) as start:
        message = {"id": f"m{start.version}", "role": "user", "content": "second"}
        change = HistoryChange([(start.version + 1.0, message)], [], 0)
        base = start.version
        store.turns.commit("bot", base_version=base, template="t", change=change, state=None)
"""


class TestWatchCommits:
    def test_another_process_commit_is_noticed(self, store_url: str) -> None:
        """watch_commits calls back once another process has committed, and not before."""
        with Store(store_url) as store:
            commit_message(store, "bot", "first")
        woken = threading.Event()
        with Store(store_url, readonly=True) as reader:
            watch = reader.watch_commits(woken.set)
            try:
                time.sleep(0.6)  # let it take its first look (and LISTEN)
                woken.clear()
                assert not woken.wait(0.6)
                script = COMMIT_ONE  # no litellm: a process that starts in a blink
                subprocess.run(
                    [sys.executable, "-c", script, store_url],
                    check=True,
                    cwd=ROOT,
                    timeout=60,
                )
                assert woken.wait(5)
            finally:
                watch.close()
