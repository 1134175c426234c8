"""``copy`` carries every table of agent data, approvals included.

A copy that left the approvals behind would hand the target a suspended turn
(its history ending with a tool call no result follows) with nothing to decide.
"""

import dataclasses
from pathlib import Path

import apsw
import pytest
from effectful.handlers.llm import Template, Tool
from effectful.ops.types import NotHandled
from helpers import persisted

from effectful_durable import PersistentAgent, Store, TurnSuspended, requires_approval
from effectful_durable.cli import main
from effectful_durable.store.copy import TABLES
from effectful_durable.testing import FakeLLM, ToolCall

#: Tables a copy rebuilds rather than copies (the full-text index of compacted text, and
#: the snapshots of sealed histories).
REBUILT = ("compacted_text", "history_snapshots")
#: Tables of the file's own, which a copy makes anew: when it last overwrote its free pages.
OWN = {"scrubbed"}


@dataclasses.dataclass
class Till(PersistentAgent):
    """You pay refunds."""

    @Tool.define
    @requires_approval(reason="every refund")
    def refund(self, order: str, amount: float) -> str:
        """Refund ``amount`` on ``order``."""
        return f"refunded {amount} on {order}"

    @Template.define
    def ask(self, request: str) -> str:
        """{request}"""
        raise NotHandled


def test_every_table_of_a_new_database_is_copied(db_path: Path) -> None:
    """Each table of the schema is in copy's TABLES, is what a copy rebuilds (the index,
    or the snapshots of sealed histories, made at the next load), or is the file's own."""
    Store(db_path).close()
    connection = apsw.Connection(str(db_path))
    names = {
        row[0] for row in connection.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")
    }
    connection.close()
    assert {n for n in names - OWN if not n.startswith(REBUILT)} <= set(TABLES)


def test_a_copy_keeps_the_approvals_a_suspended_turn_waits_for(
    db_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The copy lists the same approvals, and its suspended turn still waits for them."""
    with persisted(db_path, FakeLLM([ToolCall("refund", {"order": "A-1", "amount": 9})])):
        with pytest.raises(TurnSuspended):
            Till(agent_id="till").ask("refund A-1")
    twin = tmp_path / "twin.db"
    assert main(["copy", str(db_path), str(twin)]) == 0, capsys.readouterr().err
    with Store(db_path, readonly=True) as original, Store(twin, readonly=True) as copy:
        assert copy.approvals(status=None) == original.approvals(status=None)
        assert copy.suspension("till") == original.suspension("till") is not None
