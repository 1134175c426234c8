"""Encrypting a database in place and rotating its keys (``Store.reseal``), online.

A plain database gets its rows sealed in place, and afterwards no file holds the
marker; a rotation seals every row again with new keys while turns of the same
agents run, and loses nothing: every turn committed reads back, and every row
then carries a key of the rotation.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import keeper
import pytest
from helpers import edit_rows, persisted_rows, running
from postgres_server import PostgresServer
from sealed import Diary, file_bytes, fill, marks, new_keys, reads, reply

from effectful_durable import (
    AgentInUseError,
    CompactionHandler,
    DamagedRowError,
    Keys,
    LocalMasterKey,
    PersistenceHandler,
    Store,
)
from effectful_durable.store.sealing import key_id_of
from effectful_durable.testing import FakeLLM

pytestmark = pytest.mark.slow


def key_ids(url: str) -> set[str]:
    rows = persisted_rows(url, "SELECT body FROM messages")
    rows += persisted_rows(url, "SELECT state FROM versions WHERE state IS NOT NULL")
    return {key_id_of(str(value)) for (value,) in rows}


class TestEncryptInPlace:
    def test_a_plain_database_is_sealed_in_place(
        self, store_url: str, tmp_path: Path, store_server: PostgresServer | None
    ) -> None:
        """Rows written plain are sealed; reads are unchanged; no file holds the marker;
        the database is complete: a plain value put back by hand is damage."""
        persistence = PersistenceHandler(store_url)
        try:
            compaction = CompactionHandler(max_messages=8, keep_recent=3)
            with running(FakeLLM(respond=reply), compaction, persistence):
                for verb in ("hello", "remember", "tell", "remember", "more", "again", "once"):
                    Diary(agent_id="old").ask(f"{verb} AnnSecret4711")
        finally:
            persistence.close()
        with Store(store_url) as store:
            before = reads(store, "old")
            assert store.search_compacted("old", "annsecret4711")
        keys = new_keys(tmp_path)
        with Store(store_url, keys=keys) as store:
            report = store.reseal(batch=3)
            assert report.complete and report.sealed["messages"] > 10 and report.scrubbed
            assert report.unindexed > 0
            assert reads(store, "old") == before
            assert store.search_compacted("old", "annsecret4711")
        assert marks(file_bytes(store_url, tmp_path, store_server), "AnnSecret4711") == 0
        assert "" not in key_ids(store_url)
        edit_rows(
            store_url,
            "UPDATE messages SET body = ? WHERE agent_id = 'old' AND removed_in IS NULL"
            " AND position = (SELECT max(position) FROM messages WHERE agent_id = 'old')",
            '{"role": "assistant", "content": "forged"}',
        )
        with Store(store_url, keys=keys) as store, pytest.raises(DamagedRowError):
            store.history("old")

    def test_every_kind_of_content_is_sealed_in_place(
        self, store_url: str, tmp_path: Path, store_server: PostgresServer | None
    ) -> None:
        """Memory, the SQL workspace (its log; its files of the plain days shredded),
        fields, approvals, events, alarms and the journal are sealed in place too, and
        read back as before; a rotation after it seals them all again."""
        keeper.fill(store_url, "ann")
        mark = keeper.MARKERS["ann"]
        with Store(store_url) as store:
            before = {a: keeper.what_reads_back(store, a) for a in ("ann", "ann-copy")}
        keys = new_keys(tmp_path)
        with Store(store_url, keys=keys) as store:
            report = store.reseal(batch=4)
            assert report.complete and not report.busy, report
            for table in ("memory", "workspace_log", "approvals", "alarms", "workflow_steps"):
                assert report.sealed.get(table, 0) > 0, (table, report.sealed)
            assert report.shredded > 0
            assert {a: keeper.what_reads_back(store, a) for a in before} == before
        assert marks(file_bytes(store_url, tmp_path, store_server), mark) == 0
        with Store(store_url, keys=keys) as store:
            rotated = store.reseal(rotate=True)
            assert rotated.complete and rotated.sealed["workspace_log"] > 0
            assert {a: keeper.what_reads_back(store, a) for a in before} == before


class TestRotation:
    def test_rotation_under_load_loses_nothing(self, store_url: str, tmp_path: Path) -> None:
        """Turns of the agents run while every row is sealed again with new keys: each
        committed turn reads back, and every row carries a key of the rotation."""
        keys = new_keys(tmp_path)
        for who in ("ann", "bob"):
            fill(store_url, keys, who, f"{who}-secret")
        old = key_ids(store_url)
        stop = threading.Event()
        asked: dict[str, int] = {"ann": 0, "bob": 0}
        errors: list[BaseException] = []

        def turns(who: str) -> None:
            persistence = PersistenceHandler(store_url, keys=keys, wait=30.0)
            try:
                with running(FakeLLM(respond=reply), persistence):
                    diary = Diary(agent_id=who)
                    while not stop.is_set():
                        diary.ask(f"remember {who}-{asked[who]}")
                        asked[who] += 1
                        time.sleep(0.005)  # a person's next message: not back to back
            except BaseException as error:
                errors.append(error)
            finally:
                persistence.close()

        workers = [threading.Thread(target=turns, args=(who,)) for who in asked]
        for worker in workers:
            worker.start()
        try:
            with Store(store_url, keys=keys) as store:
                report = store.reseal(rotate=True, batch=2, wait=30.0)
                assert not report.busy and report.keys >= 4
        finally:
            stop.set()
            for worker in workers:
                worker.join()
        assert not errors, errors
        assert min(asked.values()) > 0
        with Store(store_url, keys=keys) as store:
            for who in asked:
                notes = store.state(who)["notes"]
                assert notes[-asked[who] :] == [f"{who}-{n}" for n in range(asked[who])]
            # A second pass, with nothing running, leaves no row on a key from before.
            store.reseal(rotate=True)
        assert not (key_ids(store_url) & old)

    def test_a_new_master_key_wraps_the_data_keys(self, store_url: str, tmp_path: Path) -> None:
        """After rewrap_keys, the new master key opens the database and the old one does not."""
        keys = new_keys(tmp_path)
        fill(store_url, keys)
        new = LocalMasterKey(os.urandom(32))
        with Store(store_url, keys=keys) as store:
            before = reads(store, "ann")
            assert store.rewrap_keys(new) >= 2
        with Store(store_url, keys=Keys(new, store=keys.store)) as store:
            assert reads(store, "ann") == before
        with pytest.raises(Exception, match="not the ones"):
            Store(store_url, keys=keys)

    def test_a_busy_agent_is_named(self, store_url: str, tmp_path: Path) -> None:
        """An agent whose turn runs longer than ``wait`` is skipped and named, not half done."""
        keys = new_keys(tmp_path)
        fill(store_url, keys)
        with Store(store_url, keys=keys) as store, Store(store_url, keys=keys) as other:
            with other.agent_lock("ann"):
                report = store.reseal(rotate=True, wait=0.0)
            assert report.busy == ["ann"] and not report.complete
            with pytest.raises(AgentInUseError), other.agent_lock("ann"), store.agent_lock("ann"):
                pass
