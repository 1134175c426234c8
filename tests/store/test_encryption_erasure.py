"""Erasure that reaches copies made before it (issue 52, item 4).

With encryption on, each agent and each conversation has data keys of its own, kept
outside the database, and an erasure destroys the keys of what it erases. A copy
made before the erasure (``Store.backup``, a file copy, ``pg_dump``) then says
"erased" for that subject, and reads back every other subject exactly.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import keeper
import pytest
from postgres_server import PostgresServer
from sealed import fill, new_keys, reads

from effectful_durable import ContentErasedError, Keys, Store

pytestmark = pytest.mark.slow


def people(url: str, keys: Keys) -> None:
    """ann and bob, each with an agent of their own and a conversation of a shared one."""
    with Store(url, keys=keys) as store:
        store.set_subject("ann", "user:ann")
        store.set_subject("bob", "user:bob")
        store.set_subject("shared", "user:ann", conversation="with-ann")
        store.set_subject("shared", "user:bob", conversation="with-bob")
    fill(url, keys, "ann", "AnnSecret4711")
    fill(url, keys, "bob", "BobKept0815")
    from helpers import running
    from sealed import Diary, reply

    from effectful_durable import PersistenceHandler
    from effectful_durable.testing import FakeLLM

    persistence = PersistenceHandler(url, keys=keys)
    try:
        with running(FakeLLM(respond=reply), persistence):
            shared = Diary(agent_id="shared")
            for who in ("ann", "bob"):
                with shared.conversation(f"with-{who}"):
                    shared.ask(f"remember {who}")
    finally:
        persistence.close()


def copy_before(url: str, keys: Keys, tmp_path: Path, server: PostgresServer | None) -> list[str]:
    """Copies of the database as it is now, every way a user makes one."""
    if server is None:
        with Store(url, readonly=True, keys=keys) as store:
            store.backup(tmp_path / "backup.db")
        shutil.copyfile(url, tmp_path / "filecopy.db")
        return [str(tmp_path / "backup.db"), str(tmp_path / "filecopy.db")]
    dumped = subprocess.run(
        [os.path.join(server.bindir, "pg_dump"), "--no-owner", url],
        capture_output=True,
        check=True,
    ).stdout
    restored = server.new_database()
    subprocess.run(
        [os.path.join(server.bindir, "psql"), "-q", "-v", "ON_ERROR_STOP=1", restored],
        input=dumped,
        capture_output=True,
        check=True,
    )
    return [restored]


class TestErasureReachesCopies:
    def test_a_copy_from_before_says_erased_and_keeps_the_others(
        self, store_url: str, tmp_path: Path, store_server: PostgresServer | None
    ) -> None:
        """After erasing ann, every earlier copy refuses ann's content as erased (her
        agent, and her conversation of the shared agent) and reads bob's exactly."""
        keys = new_keys(tmp_path)
        people(store_url, keys)
        with Store(store_url, keys=keys) as store:
            kept: dict[str, Any] = {"bob": reads(store, "bob")}
            kept_talk = store.history("shared", conversation="with-bob")
        copies = copy_before(store_url, keys, tmp_path, store_server)
        with Store(store_url, keys=keys) as store:
            receipt = store.erase(subject="user:ann")
            assert receipt.counts["data keys"] >= 2
        for copy in copies:
            with Store(copy, keys=keys) as old:
                assert {"bob": reads(old, "bob")} == kept
                assert old.history("shared", conversation="with-bob") == kept_talk
                with pytest.raises(ContentErasedError, match="erased"):
                    old.history("ann")
                with pytest.raises(ContentErasedError):
                    old.state("ann")
                with pytest.raises(ContentErasedError):
                    old.history("shared", conversation="with-ann")
                # ann's failed turn left a handoff: a list leaves out what was erased
                assert [h.agent_id for h in old.handoffs()] == ["bob"]
                assert old.state("shared") is not None  # the shared fields stay

    def test_every_kind_of_content_in_a_copy_from_before(
        self, store_url: str, tmp_path: Path, store_server: PostgresServer | None
    ) -> None:
        """Memory, the SQL workspace, alarms, events, approvals and the journal of the
        erased person are gone from an earlier copy too (refused as erased, or left out
        of lists), while the other person's read back exactly."""
        keys = new_keys(tmp_path)
        for who in ("ann", "bob"):
            keeper.fill(store_url, who, keys)
        with Store(store_url, keys=keys) as store:
            kept = {a: keeper.what_reads_back(store, a) for a in ("bob", "bob-copy")}
        copies = copy_before(store_url, keys, tmp_path, store_server)
        with Store(store_url, keys=keys) as store:
            store.erase(subject="user:ann")
        for copy in copies:
            with Store(copy, keys=keys) as old:
                assert {a: keeper.what_reads_back(old, a) for a in kept} == kept
                for agent in ("ann", "ann-copy"):
                    with pytest.raises(ContentErasedError):
                        old.memory(agent)
                    with pytest.raises(ContentErasedError):
                        old.sql(agent, "SELECT name FROM items")
                    assert old.alarms(agent) == [] and old.events(agent) == []
                    assert old.approvals(agent_id=agent) == []
                steps = [s for w in old.workflows() for s in old.steps(w.workflow)]
                assert steps and {s.agent_id for s in steps} == {"bob"}

    def test_erasing_one_conversation_alone(
        self, store_url: str, tmp_path: Path, store_server: PostgresServer | None
    ) -> None:
        """Erasing one conversation destroys its keys only: in an earlier copy the
        agent's other conversations and its fields read as before."""
        keys = new_keys(tmp_path)
        people(store_url, keys)
        with Store(store_url, keys=keys) as store:
            other = store.history("shared", conversation="with-bob")
            fields = store.state("shared")
        (copy,) = copy_before(store_url, keys, tmp_path, store_server)[:1]
        with Store(store_url, keys=keys) as store:
            store.erase(agent="shared", conversation="with-ann")
        with Store(copy, keys=keys) as old:
            assert old.history("shared", conversation="with-bob") == other
            assert old.state("shared") == fields
            with pytest.raises(ContentErasedError):
                old.history("shared", conversation="with-ann")

    def test_a_process_that_held_the_key_stops_using_it(
        self, store_url: str, tmp_path: Path, store_server: PostgresServer | None
    ) -> None:
        """A Store opened before the erasure, elsewhere, no longer opens the erased rows
        of an earlier copy, and a new agent of the same id gets a new key."""
        keys = new_keys(tmp_path)
        people(store_url, keys)
        (copy,) = copy_before(store_url, keys, tmp_path, store_server)[:1]
        with Store(copy, keys=keys) as old:
            assert old.history("ann")  # its keys are in memory now
            with Store(store_url, keys=keys) as store:
                store.erase(subject="user:ann")
            with pytest.raises(ContentErasedError):
                old.history("ann")
        fill(store_url, keys, "ann", "AnnAgain")
        with Store(store_url, keys=keys) as store:
            assert store.state("ann")["notes"] == ["AnnAgain", "AnnAgain"]
