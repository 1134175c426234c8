"""The approvals example (examples/approvals/refunds.py) runs offline, end to end.

As its README runs it, each step in a process of its own, in a temporary
directory: the script's ``ask``, the command line's ``approve``, ``deny`` and
``send-event``, then the script's ``run``, twice. The ledger of the fake payment
provider shows the approved refund paid exactly once and the denied one never.
"""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from paths import ROOT

from effectful_durable import Store

EXAMPLE = ROOT / "examples" / "approvals" / "refunds.py"
REASON = 'Order B-2001 was delivered 44 days ago; our limit is 30 ("no exceptions") — sorry!'


def run(cwd: Path, *argv: str) -> str:
    """Run a command of the example in ``cwd``; it must succeed. Its standard output."""
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    result = subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def cli(cwd: Path, *argv: str) -> str:
    return run(cwd, "-m", "effectful_durable", *argv)


def ledger(cwd: Path) -> list[tuple[str, float, str]]:
    payments = json.loads((cwd / "payments.json").read_text())
    return [(p["order"], p["amount"], p["key"]) for p in payments]


def text(message: dict[str, Any]) -> str:
    content = message["content"]
    return content if isinstance(content, str) else "".join(b["text"] for b in content)


@pytest.mark.slow
class TestRefundsExample:
    """Two customers ask; the small refund is paid, the large ones wait for a person."""

    def test_approved_refund_paid_once_denied_one_never(self, tmp_path: Path) -> None:
        """ask, approve, deny, send-event, run, run: the ledger, histories and check agree."""
        asked = run(tmp_path, str(EXAMPLE), "ask", "--db", "refunds.db")
        assert "runner: 2 turns, 0 errors" in asked
        assert ledger(tmp_path) == [("A-1001", 35.0, "support-ann/A-1001/35.0")]
        waiting = {
            a["agent_id"]: a
            for a in json.loads(cli(tmp_path, "approvals", "refunds.db", "--json"))
        }
        assert set(waiting) == {"support-ann", "support-ben"}
        ann, ben = waiting["support-ann"], waiting["support-ben"]
        assert (ann["tool"], ann["arguments"]) == ("refund", {"order": "A-1002", "amount": 250.0})
        assert ben["arguments"] == {"order": "B-2001", "amount": 180.0}
        assert f"waiting: {ann['approval_id']} support-ann refund(" in asked

        cli(tmp_path, "approve", "refunds.db", ann["approval_id"], "--by", "alice")
        cli(tmp_path, "deny", "refunds.db", ben["approval_id"], "--reason", REASON, "--by", "bob")
        cleo = {"customer": "Cleo", "text": "Please refund 20 EUR on order C-3001."}
        cli(
            tmp_path,
            "send-event",
            "refunds.db",
            "support-cleo",
            "refund_request",
            json.dumps(cleo),
            "--create",
        )

        ran = run(tmp_path, str(EXAMPLE), "run", "--db", "refunds.db")
        assert "runner: 3 turns, 0 errors" in ran  # two resumed turns, Cleo's request
        paid = [
            ("A-1001", 35.0, "support-ann/A-1001/35.0"),
            ("A-1002", 250.0, ann["approval_id"]),  # the approval id as idempotency key
            ("C-3001", 20.0, "support-cleo/C-3001/20.0"),
        ]
        assert ledger(tmp_path) == paid  # B-2001 never
        again = run(tmp_path, str(EXAMPLE), "run", "--db", "refunds.db")
        assert "runner: 0 turns, 0 errors" in again
        assert ledger(tmp_path) == paid

        with Store(tmp_path / "refunds.db", readonly=True) as store:
            assert store.approvals() == []
            decided = {a.agent_id: a for a in store.approvals(status=None)}
            assert (decided["support-ann"].status, decided["support-ann"].ended_in) == (
                "approved",
                2,
            )
            assert (decided["support-ben"].status, decided["support-ben"].note) == (
                "denied",
                REASON,
            )
            assert text(store.history("support-ann")[-1]) == (
                "Dear Ann, Refunded 35.00 EUR on A-1001. Refunded 250.00 EUR on A-1002."
            )
            assert text(store.history("support-ben")[-1]) == (
                f"Dear Ben, I cannot refund order B-2001: {REASON}"
            )
            assert [v.detail for v in store.versions("support-ann")] == [
                {"suspended": [ann["approval_id"]]},
                {"resumed": 1},
            ]
            assert store.events() == []
        assert "integrity       ok" in cli(tmp_path, "check", "refunds.db")
