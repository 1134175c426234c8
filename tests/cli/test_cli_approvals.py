"""The approval and event commands, run as a shell runs them, on real suspended turns.

``approvals``, ``approve``, ``deny``, ``send-event``, ``events`` and ``status`` run
in new processes on a database that real turns wrote (FakeLLM in this process):
two agents whose turns called a refund tool that needs approval, and were
suspended. A decision made on the command line is then used by the suspended
turn, resumed in this process. Bad input is one error line, exit 1 (the store
refused it) or 2 (the command line itself is wrong), and writes nothing: the
database reads the same afterwards, and the file keeps its bytes.
"""

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from effectful.handlers.llm import Template, Tool
from effectful.handlers.llm.completions import LiteLLMProvider
from effectful.ops.types import NotHandled
from helpers import (
    integrity,
    is_postgres,
    persisted,
    persisted_rows,
    run_cli_in_fresh_python,
)

from effectful_durable import (
    AgentRunner,
    OnEvent,
    PersistentAgent,
    RunnerConfig,
    Store,
    TurnSuspended,
    requires_approval,
)
from effectful_durable.runner import FakeClock
from effectful_durable.testing import FakeLLM, ToolCall

pytestmark = pytest.mark.slow  # every command runs in a new process

#: The tool calls that ran, in this process: (order, amount).
RAN: list[tuple[str, float]] = []
REASON = "a refund over 100 EUR"
#: A reason as people write them: quotes, a newline, a tab, accents, an emoji with a
#: joiner, a backslash and what a shell would expand. It is kept exactly.
ODD_REASON = (
    'Policy says "no" - it\'s > 30 days.\nSecond line\twith a tab, ünïcödé, '
    "🙅\u200d♀️, a backslash \\ and $HOME `id`"
)


@dataclasses.dataclass
class Shop(PersistentAgent, OnEvent):
    """You handle refunds for a shop."""

    @Tool.define
    @requires_approval(when=lambda order, amount: amount > 100, reason=REASON)
    def refund(self, order: str, amount: float) -> str:
        """Refund ``amount`` EUR on ``order``."""
        RAN.append((order, amount))
        return f"refunded {amount} EUR on {order}"

    @Template.define
    def ask(self, request: str) -> str:
        """{request}"""
        raise NotHandled


def build(db: str) -> None:
    """Agent 'shop' waits for approval of refund(A-1, 420); agent 'shop2' for refund(B-1,
    150), its refund(B-2, 30) of the same answer having run at once."""
    script = FakeLLM(
        [
            ToolCall("refund", {"order": "A-1", "amount": 420}),
            [
                ToolCall("refund", {"order": "B-1", "amount": 150}),
                ToolCall("refund", {"order": "B-2", "amount": 30}),
            ],
        ]
    )
    with persisted(db, script):
        for agent_id in ("shop", "shop2"):
            with pytest.raises(TurnSuspended):
                Shop(agent_id=agent_id).ask("Refund my orders, please.")


@pytest.fixture(scope="module")
def template_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli-approvals") / "template.db"
    build(str(path))
    return path


@pytest.fixture
def db(template_db: Path, tmp_path: Path) -> str:
    """A fresh copy of the template database for one test."""
    copy = tmp_path / "state.db"
    shutil.copy(template_db, copy)
    RAN.clear()
    return str(copy)


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    """``effectful-durable ARGV`` in a new process (``python -m effectful_durable``)."""
    return subprocess.run(
        [sys.executable, "-m", "effectful_durable", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        timeout=120,
    )


def ok(*argv: str) -> str:
    """Run a command that must succeed, silently; its standard output."""
    result = cli(*argv)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    return result.stdout


def waiting(db: str, agent_id: str) -> str:
    """The id of the approval that ``agent_id``'s suspended turn waits for."""
    with Store(db, readonly=True) as store:
        (approval,) = store.approvals(agent_id)
    return approval.approval_id


def on_disk(db: str) -> dict[str, Any]:
    """What the database holds, read through a connection of our own, and the file's
    bytes (SQLite): a refused command must change neither."""
    tables = ("agents", "versions", "messages", "handoffs", "approvals", "alarms")
    rows: dict[str, Any] = {
        t: sorted(persisted_rows(db, f"SELECT * FROM {t}"), key=repr) for t in tables
    }
    if not is_postgres(db):
        rows["sha256"] = hashlib.sha256(Path(db).read_bytes()).hexdigest()
    return rows


def resume(db: str, agent_id: str, reply: str) -> tuple[Any, FakeLLM]:
    """Resume the agent's suspended turn in this process, the model answering ``reply``."""
    model = FakeLLM([reply])
    with persisted(db, model) as persistence:
        return persistence.resume(Shop(agent_id=agent_id)), model


def text_of(message: dict[str, Any]) -> str:
    """A message's text, whether its content is a string or a list of blocks."""
    content = message["content"]
    if isinstance(content, str):
        return content
    return "".join(block.get("text", "") for block in content)


class TestListing:
    """``approvals`` lists the calls that wait; ``events`` the events that wait."""

    def test_pending_approvals_as_a_table(self, db: str) -> None:
        """One line per waiting call: id, agent, conversation, tool, time, reason, arguments."""
        lines = ok("approvals", db).splitlines()
        assert lines[0].split() == [
            "approval_id",
            "agent_id",
            "conversation",
            "tool",
            "asked_at",
            "reason",
            "arguments",
        ]
        assert len(lines) == 3
        assert lines[1].startswith(waiting(db, "shop"))
        assert lines[1].split()[1:4] == ["shop", "default", "refund"]
        assert lines[1].endswith(f"{REASON}  order=A-1 amount=420.0")
        assert lines[2].endswith("order=B-1 amount=150.0")  # not B-2: that one ran

    def test_json_of_one_agent(self, db: str) -> None:
        """--agent keeps one agent's approvals; --json prints each record whole."""
        (record,) = json.loads(ok("approvals", db, "--agent", "shop2", "--json"))
        assert record["approval_id"] == waiting(db, "shop2")
        assert record["arguments"] == {"order": "B-1", "amount": 150.0}
        assert (record["status"], record["reason"], record["decided_by"]) == (
            "pending",
            REASON,
            None,
        )
        assert record["asked_at"].endswith("+00:00")
        assert json.loads(ok("approvals", db, "--agent", "nobody", "--json")) == []

    @pytest.mark.parametrize("command", ["approvals", "events"])
    def test_no_litellm(self, db: str, command: str) -> None:
        """The new reads run without loading litellm or effectful's LLM layer."""
        result = run_cli_in_fresh_python(command, db)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[-1] == "loaded: []"


class TestDecisions:
    """A decision on the command line is what the resumed turn does."""

    def test_approve_with_edited_arguments_runs_the_tool_once(self, db: str) -> None:
        """The approved call runs once, with the arguments given on the command line."""
        approval = waiting(db, "shop")
        out = ok(
            "approve",
            db,
            approval,
            "--by",
            "alice",
            "--arguments",
            '{"order": "A-1", "amount": 400}',
            "--note",
            "capped at 400",
        )
        assert out.splitlines() == [
            f"{approval}: refund of agent 'shop' approved by alice, with arguments "
            "order=A-1 amount=400",
            "the turn resumes when a runner delivers it (`effectful-durable run`), or when "
            "the agent is called again",
        ]
        (record,) = json.loads(ok("approvals", db, "--all", "--json", "--agent", "shop"))
        assert record["status"] == "approved"
        assert (record["decided_by"], record["note"]) == ("alice", "capped at 400")
        assert record["decided_arguments"] == {"order": "A-1", "amount": 400}
        all_lines = ok("approvals", db, "--all").splitlines()
        assert all_lines[0].split()[3] == "status"
        assert "  order=A-1 amount=400 (asked amount=420" in all_lines[1]  # cut at 40
        assert [line.split()[1] for line in ok("approvals", db).splitlines()[1:]] == ["shop2"]

        result, _ = resume(db, "shop", "Refunded 400 EUR on A-1.")
        assert result == "Refunded 400 EUR on A-1."
        assert RAN == [("A-1", 400.0)]
        assert (
            json.loads(ok("approvals", db, "--all", "--json", "--agent", "shop"))[0]["ended_in"]
            == 2
        )
        assert cli("check", db).returncode == 0

    def test_deny_keeps_an_odd_reason_exactly_and_the_model_reads_it(self, db: str) -> None:
        """Quotes, newlines, unicode and emoji reach the database and the model unchanged."""
        approval = waiting(db, "shop2")
        out = ok("deny", db, approval, "--reason", ODD_REASON, "--by", "bob")
        assert out.splitlines()[0] == f"{approval}: refund of agent 'shop2' denied by bob"
        with Store(db, readonly=True) as store:
            assert store.approval(approval).note == ODD_REASON
        (record,) = json.loads(ok("approvals", db, "--all", "--json", "--agent", "shop2"))
        assert (record["status"], record["note"]) == ("denied", ODD_REASON)

        result, model = resume(db, "shop2", "Sorry, no refund on B-1.")
        assert result == "Sorry, no refund on B-1."
        assert RAN == []  # B-1 never ran; B-2 ran in the first turn, not again
        told = [text_of(m) for m in model.calls[0].messages if m["role"] == "tool"]
        assert any(f"Their reason: {ODD_REASON}" in text for text in told), told
        assert integrity(db) == "ok"

    def test_json_of_a_decision(self, db: str) -> None:
        """approve --json prints the decided record."""
        record = json.loads(ok("approve", db, waiting(db, "shop"), "--json", "--by", "carol"))
        assert (record["status"], record["decided_by"]) == ("approved", "carol")
        assert record["decided_arguments"] == {"order": "A-1", "amount": 420.0}


class TestRefusals:
    """Bad input: one clear line, the exit code, and nothing written."""

    @pytest.mark.parametrize(
        ("argv", "code", "says"),
        [
            (["approve", "DB", "apr_000000000000"], 1, "no approval 'apr_000000000000'; "),
            (["deny", "DB", "apr_nope", "--reason", "x"], 1, "`effectful-durable approvals "),
            (
                ["approve", "DB", "SHOP", "--arguments", '{"order": "A-1", "amount": "lots"}'],
                1,
                "arguments for refund do not fit its parameters: amount: 'lots' is not of "
                "type 'number'; nothing was changed",
            ),
            (
                ["approve", "DB", "SHOP", "--arguments", '{"order": "A-1"}'],
                1,
                "'amount' is a required property",
            ),
            (
                [
                    "approve",
                    "DB",
                    "SHOP",
                    "--arguments",
                    '{"order": "A-1", "amount": 1, "x": 2}',
                ],
                1,
                "Additional properties are not allowed",
            ),
            (["approve", "DB", "SHOP", "--arguments", "[400]"], 1, "must be a JSON object"),
            (
                ["approve", "DB", "SHOP", "--arguments", '{"order": "A-1",'],
                2,
                "--arguments is not valid JSON (Expecting property name enclosed in double "
                "quotes at line 1 column 17)",
            ),
            (
                ["approve", "DB", "SHOP", "--arguments", '{"amount": NaN}'],
                2,
                "NaN is not a JSON value",
            ),
            (["deny", "DB", "SHOP", "--reason", ""], 1, "reason must be a non-empty text"),
            (["deny", "DB", "SHOP", "--reason", " \n\t"], 1, "reason must be a non-empty"),
            (["deny", "DB", "SHOP", "--reason", "x" * 2001], 1, "at most 2000 characters"),
            (["approve", "DB", "SHOP", "--by", ""], 1, "by must be a non-empty text"),
            (
                ["send-event", "DB", "nobody", "paid"],
                1,
                "no agent 'nobody' in this database; check the id (`effectful-durable agents",
            ),
            (
                ["send-event", "DB", "shop", "paid", json.dumps("x" * 65535)],
                1,
                "the payload must be at most 65536 bytes as JSON",
            ),
            (
                ["send-event", "DB", "shop", "paid", "{oops"],
                2,
                "PAYLOAD_JSON is not valid JSON (",
            ),
            (["send-event", "DB", "shop", ""], 1, "the name must be a non-empty text"),
            (["send-event", "DB", "shop", "a\nb"], 1, "must be printable text"),
            (["send-event", "DB", "", "paid"], 1, "such as 'support-bot-42'. Nothing was sent."),
        ],
        ids=[
            "approve-unknown-id",
            "deny-unknown-id",
            "arguments-wrong-type",
            "arguments-missing",
            "arguments-extra",
            "arguments-not-an-object",
            "arguments-malformed",
            "arguments-nan",
            "reason-empty",
            "reason-blank",
            "reason-too-long",
            "by-empty",
            "event-unknown-agent",
            "payload-oversized",
            "payload-malformed",
            "name-empty",
            "name-control",
            "agent-id-empty",
        ],
    )
    def test_refused_in_one_line_and_nothing_written(
        self, db: str, argv: list[str], code: int, says: str
    ) -> None:
        """Each refusal prints one error line, exits 1 or 2, and leaves the database as it was."""
        shop = waiting(db, "shop")
        before = on_disk(db)
        result = cli(*({"DB": db, "SHOP": shop}.get(arg, arg) for arg in argv))
        assert (result.returncode, result.stdout) == (code, "")
        assert result.stderr.startswith("effectful-durable: error: ")
        assert len(result.stderr.splitlines()) == 1, result.stderr
        assert says in result.stderr
        assert on_disk(db) == before

    def test_the_payload_limit_is_64_kib(self, db: str) -> None:
        """A payload of 64 KiB as JSON is sent; one byte more is refused."""
        largest = json.dumps("x" * (65536 - 2))
        assert cli("send-event", db, "shop", "paid", largest).returncode == 0
        assert cli("send-event", db, "shop", "paid", json.dumps("x" * (65536 - 1))).returncode == 1

    def test_deciding_twice(self, db: str) -> None:
        """A decided approval cannot be decided again, either way; nothing changes."""
        approval = waiting(db, "shop")
        ok("approve", db, approval, "--by", "alice")
        before = on_disk(db)
        for argv in (["approve", approval, "--by", "bob"], ["deny", approval, "--reason", "no"]):
            result = cli(argv[0], db, *argv[1:])
            assert result.returncode == 1
            assert f"approval {approval} is approved already by alice at " in result.stderr
            assert result.stderr.rstrip().endswith("nothing was changed")
        assert on_disk(db) == before

    def test_deny_without_a_reason_is_a_usage_error(self, db: str) -> None:
        """--reason is required: argparse's usage, exit 2, nothing written."""
        before = on_disk(db)
        result = cli("deny", db, waiting(db, "shop"))
        assert result.returncode == 2
        assert "the following arguments are required: --reason" in result.stderr
        assert on_disk(db) == before

    def test_an_idempotency_key(self, db: str) -> None:
        """The same key and event again sends nothing; the same key for another is refused."""
        first = ok("send-event", db, "shop", "paid", '{"amount": 12.5}', "--key", "pay-1")
        event_id = first.split(":")[0]
        before = on_disk(db)
        again = ok("send-event", db, "shop", "paid", '{"amount": 12.5}', "--key", "pay-1")
        assert again.startswith(f"{event_id}: sent before with key 'pay-1', at ")
        assert again.rstrip().endswith("(pending); nothing was sent again")
        other = cli("send-event", db, "shop", "paid", '{"amount": 13}', "--key", "pay-1")
        assert other.returncode == 1
        assert "key 'pay-1' was used for another event of 'shop': paid" in other.stderr
        assert on_disk(db) == before


class TestEvents:
    """``send-event`` puts an event in an agent's inbox; a runner delivers it."""

    def test_send_list_and_deliver(self, db: str) -> None:
        """An event for a new agent (--create) waits, is delivered, then listed with --all."""
        payload = {"text": "Où est ma commande ? 📦", "order": "C-7"}
        out = ok("send-event", db, "desk", "question", json.dumps(payload), "--create")
        event_id = out.split(":")[0]
        assert out == (
            f"{event_id}: 'question' to agent 'desk' pending; a runner delivers it "
            "(`effectful-durable run`)\n"
        )
        lines = ok("events", db).splitlines()
        assert lines[0].split()[:4] == ["event_id", "agent_id", "name", "status"]
        assert lines[1].split()[:4] == [event_id, "desk", "question", "pending"]
        (record,) = json.loads(ok("events", db, "--json"))
        assert record["payload"] == payload

        def handlers(config: RunnerConfig) -> list[Any]:
            return [LiteLLMProvider(model="fake"), FakeLLM(["It ships tomorrow."])]

        clock = FakeClock(time.time())
        with AgentRunner(
            db, agents=lambda agent_id: Shop(agent_id=agent_id), handlers=handlers, clock=clock
        ) as runner:
            runner.run(until=clock.now() + 60)
            assert (runner.turns, runner.errors) == (1, 0)
        assert ok("events", db).splitlines()[1:] == []
        (done,) = json.loads(ok("events", db, "--all", "--json"))
        assert (done["status"], done["delivered_in"]) == ("done", 1)
        assert ok("events", db, "--all").splitlines()[0].split()[-2:] == ["taken_by", "payload"]


class TestStatus:
    """``status`` counts what waits, whether or not a runner ever reported."""

    def test_counts(self, db: str) -> None:
        """Approvals, resumptions and events waiting are counted, as text and as JSON."""
        ok("approve", db, waiting(db, "shop2"), "--by", "alice")
        ok("send-event", db, "shop", "paid", "7")
        text = ok("status", db).splitlines()
        assert text[0] == f"no runner has reported on {db} yet"
        assert text[1] == f"waiting in {db} now"
        assert "  approvals_pending: 1" in text
        assert "  resumptions_pending: 1" in text
        assert "  events_pending: 1" in text
        report = json.loads(ok("status", db, "--json"))
        assert report["runners"] == []
        assert report["waiting"] == {
            "approvals_pending": 1,
            "resumptions_pending": 1,
            "resumptions_dead": 0,
            "events_pending": 1,
            "events_dead": 0,
            "alarms_pending": 0,
            "alarms_due": 0,
            "alarms_dead": 0,
        }


class TestOnPostgres:
    def test_the_commands_on_postgres(self, postgres_url: str) -> None:
        """The same suspended turns on PostgreSQL: listed, decided, refused, resumed."""
        build(postgres_url)
        RAN.clear()
        shop, shop2 = waiting(postgres_url, "shop"), waiting(postgres_url, "shop2")
        assert len(ok("approvals", postgres_url).splitlines()) == 3
        before = on_disk(postgres_url)
        for argv, code in (
            (["approve", postgres_url, "apr_000000000000"], 1),
            (["approve", postgres_url, shop, "--arguments", '{"amount": "x"}'], 1),
            (["approve", postgres_url, shop, "--arguments", "{"], 2),
            (["deny", postgres_url, shop, "--reason", ""], 1),
            (["send-event", postgres_url, "nobody", "paid"], 1),
            (["send-event", postgres_url, "shop", "paid", json.dumps("x" * 65535)], 1),
        ):
            result = cli(*argv)
            assert result.returncode == code, result.stderr
            assert len(result.stderr.splitlines()) == 1
        assert on_disk(postgres_url) == before

        ok(
            "approve",
            postgres_url,
            shop,
            "--by",
            "alice",
            "--arguments",
            '{"order": "A-1", "amount": 400}',
        )
        ok("deny", postgres_url, shop2, "--reason", ODD_REASON, "--by", "bob")
        assert cli("deny", postgres_url, shop2, "--reason", "again").returncode == 1
        with Store(postgres_url, readonly=True) as store:
            assert store.approval(shop2).note == ODD_REASON
        ok("send-event", postgres_url, "shop", "paid", '{"amount": 1}', "--key", "k")
        assert len(json.loads(ok("events", postgres_url, "--json"))) == 1
        waits = json.loads(ok("status", postgres_url, "--json"))["waiting"]
        assert (waits["approvals_pending"], waits["resumptions_pending"]) == (0, 2)

        result, _ = resume(postgres_url, "shop", "Refunded 400 EUR.")
        assert (result, RAN) == ("Refunded 400 EUR.", [("A-1", 400.0)])
