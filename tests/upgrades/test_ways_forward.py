"""The check's ways forward, followed end to end as a team deploying agents follows them.

In-flight work is made with the old code (a copy of ``examples/approvals/refunds.py``),
one edit is made in another copy, ``effectful-durable check-upgrade`` exits 3, a way
forward the report prints is run exactly as printed, the check exits 0, and the turn
resumed under the new code does what the check said: the tool runs once with the
stored or given arguments, or the model reads a denial's reason. Model calls and tool
runs are counted, on both backends. New code that cannot be loaded is one line.
"""

import importlib
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from effectful.handlers.llm.completions import LiteLLMProvider
from helpers import persisted
from paths import ROOT
from upgrade_helpers import REFUND_CALL, REFUNDS

from effectful_durable import AgentRunner, DurableError, Store, TurnSuspended
from effectful_durable.cli import main
from effectful_durable.runner import FakeClock
from effectful_durable.testing import FakeLLM, ToolCall

EXAMPLES = ROOT / "examples"
COACH = EXAMPLES / "memory_agent.py"
_names = itertools.count()

#: The refund tool renamed, as a developer renames it.
RENAME = (
    "def refund(self, order: str, amount: float)",
    "def pay_refund(self, order: str, amount: float)",
)
#: The refund tool given a required argument, and its result saying it.
CURRENCY = [
    (
        "def refund(self, order: str, amount: float)",
        "def refund(self, order: str, amount: float, currency: str)",
    ),
    ("when=lambda order, amount: amount > 100", "when=lambda order, amount, **_: amount > 100"),
    ('f"Refunded {amount:.2f} EUR on {order}', 'f"Refunded {amount:.2f} {currency} on {order}'),
]
#: The new command's hole for the value a person chooses, and one a person chose.
EUROS = {"<currency: str>": '"EUR"'}


def printed(out: str) -> list[str]:
    """The command lines a report (or a command's output) prints in backticks: those
    that run as printed."""
    return re.findall(r"`(effectful-durable [^`]+)`", out)


def to_fill(out: str) -> list[str]:
    """The command lines a report prints for a person to complete (not in backticks)."""
    return re.findall(r"filled in: (effectful-durable .*?')\)", out)


def pick(lines: list[str], verb: str) -> str:
    """The one line of ``lines`` that runs ``verb``."""
    [line] = [line for line in lines if shlex.split(line)[1] == verb]
    return line


class Deploy:
    """A deploy of the refunds example: the database, the folder the code lives in
    (the current directory, as for the command), and the payment provider's ledger."""

    def __init__(self, db: str, folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.db, self.folder, self.capsys = db, folder, capsys
        (folder / "out").mkdir(exist_ok=True)  # the example's ledger lives there

    def code(self, *edits: tuple[str, str], source: Path = REFUNDS, cls: str = "") -> str:
        """A copy of the example with each (old, new) edit and a factory ``make``: its
        ``MODULE:FUNC``, as ``--agents`` takes it."""
        name = f"deployed_{source.stem}_{next(_names)}"
        text = source.read_text()
        for old, new in edits:
            assert old in text, f"the example no longer holds {old!r}"
            text = text.replace(old, new)
        text += f"\n\ndef make(agent_id):\n    return {cls or 'SupportAgent'}(agent_id=agent_id)\n"
        (self.folder / f"{name}.py").write_text(text)
        return f"{name}:make"

    def module(self, spec: str) -> ModuleType:
        return importlib.import_module(spec.partition(":")[0])

    def suspend(self, spec: str, *, before: bool = False, calls: Any = REFUND_CALL) -> str:
        """support-ann's refund of 250 EUR waits for approval, asked under the code
        ``spec`` (after a first turn that committed, if ``before``); its approval id."""
        agent = self.module(spec).make("support-ann")
        if before:
            with persisted(self.db, FakeLLM(["Hello, Ann."])):
                agent.on_event("hello", "{}")
        with persisted(self.db, FakeLLM([calls])), pytest.raises(TurnSuspended) as suspended:
            agent.on_event("refund_request", '{"text": "250"}')
        return suspended.value.approvals[-1].approval_id

    def check(self, spec: str) -> tuple[int, str]:
        """``effectful-durable check-upgrade DB --agents spec``: its exit status and its words."""
        status = main(["check-upgrade", self.db, "--agents", spec])
        return status, self.capsys.readouterr().out

    def ways(self, spec: str) -> list[str]:
        """The commands the check of ``spec`` prints, once it said that something breaks."""
        status, out = self.check(spec)
        assert status == 3, out
        return printed(out)

    def run(self, line: str, holes: dict[str, str] | None = None) -> str:
        """Run a printed command line as printed (its holes filled): its output."""
        for hole, value in (holes or {}).items():
            line = line.replace(hole, value)
        argv = shlex.split(line)
        assert argv[0] == "effectful-durable" and not re.search(r"<\w+: ", line), line
        status = main(argv[1:])
        out, err = self.capsys.readouterr()
        assert status == 0, err
        return out

    def resume(self, spec: str, *replies: Any) -> tuple[FakeLLM, Any]:
        """Resume support-ann's suspended turn with the code ``spec``: the model and
        the turn's result."""
        model = FakeLLM(replies)
        agent = self.module(spec).make("support-ann")
        with persisted(self.db, model) as persistence:
            result = persistence.resume(agent)
        return model, result

    def payments(self) -> list[tuple[str, float]]:
        """The refunds the payment provider made: (order, amount) each."""
        ledger = self.folder / "out" / "payments.json"
        found = json.loads(ledger.read_text()) if ledger.exists() else []
        return [(payment["order"], payment["amount"]) for payment in found]

    def history(self) -> list[dict[str, Any]]:
        with Store(self.db, readonly=True) as store:
            return store.history("support-ann")


@pytest.fixture
def deploy(
    store_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> Deploy:
    """A deploy in ``tmp_path``, the current directory, on either backend."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return Deploy(store_url, tmp_path, capsys)


def tool_texts(model: FakeLLM) -> list[str]:
    """The tool results the model read at its last request."""
    texts = []
    for message in model.calls[-1].messages:
        if message["role"] == "tool":
            content = message["content"]
            blocks = content if isinstance(content, list) else [{"text": content}]
            texts.append("".join(block.get("text", "") for block in blocks))
    return texts


def called_tools(history: list[dict[str, Any]]) -> list[str]:
    return [c["function"]["name"] for m in history for c in m.get("tool_calls") or []]


# -- a renamed tool ----------------------------------------------------------------------


class TestRenamedTool:
    def test_retarget(self, deploy: Deploy) -> None:
        """Re-targeted as printed, the check passes before the deploy (the history's
        view of the call follows the retarget); approved, the resumed turn runs the
        renamed tool once, and the check still passes after it."""
        approval = deploy.suspend(deploy.code())
        new = deploy.code(RENAME)
        status, out = deploy.check(new)
        assert status == 3 and "calls tools SupportAgent no longer has: refund (1x)" in out
        retarget = pick(printed(out), "retarget")
        assert shlex.split(retarget)[2:] == [deploy.db, approval, "pay_refund", "--agents", new]
        said = deploy.run(retarget)
        assert "now asks to run pay_refund" in said
        assert deploy.check(new)[0] == 0
        deploy.run(pick(printed(said), "approve"))
        assert deploy.check(new)[0] == 0
        model, result = deploy.resume(new, "Refunded, Ann.")
        assert (result, len(model.calls)) == ("Refunded, Ann.", 1)
        assert deploy.payments() == [("A-1002", 250.0)]
        assert called_tools(deploy.history())[-1] == "self__pay_refund"
        assert deploy.check(new)[0] == 0

    def test_a_call_that_ran_stays_in_the_history(self, deploy: Deploy) -> None:
        """A call of the old name that ran beside the one that waits stays in the
        history: the retarget settles the waiting call, and the check still names the
        other, with the history's own way forward."""
        small = ToolCall("refund", {"order": "A-1001", "amount": 35})
        deploy.suspend(deploy.code(), calls=[small, REFUND_CALL])
        new = deploy.code(RENAME)
        status, out = deploy.check(new)
        assert status == 3 and "no longer has: refund (2x)" in out
        assert "for the call that waits, re-target or deny its approval; for the others" in out
        deploy.run(pick(printed(out), "retarget"))
        status, out = deploy.check(new)
        assert status == 3 and "no longer has: refund (1x)" in out
        assert "-> keep the old tools" in out and "re-target or deny" not in out

    def test_deny(self, deploy: Deploy) -> None:
        """Denied as printed, the check passes; the resumed turn never looks the gone
        tool up, the model reads the reason, nothing is paid, and the check still passes."""
        deploy.suspend(deploy.code())
        new = deploy.code(RENAME)
        deny = pick(deploy.ways(new), "deny")
        deploy.run(deny)
        assert deploy.check(new)[0] == 0
        model, result = deploy.resume(new, "Sorry, Ann.")
        assert (result, len(model.calls)) == ("Sorry, Ann.", 1)
        [denial] = tool_texts(model)
        assert denial.endswith("Their reason: refund is no longer available")
        assert deploy.payments() == []
        assert deploy.check(new)[0] == 0

    def test_rollback(self, deploy: Deploy) -> None:
        """Rolled back as printed to the version before the suspended turn: the check
        passes, the approval is cancelled, and the agent's next turn runs no tool."""
        old = deploy.code()
        approval = deploy.suspend(old, before=True)
        new = deploy.code(RENAME)
        rollback = pick(deploy.ways(new), "rollback")
        assert shlex.split(rollback)[2:] == [deploy.db, "support-ann", "1"]
        deploy.run(rollback)
        assert deploy.check(new)[0] == 0
        with Store(deploy.db, readonly=True) as store:
            assert store.approval(approval).status == "cancelled"
            assert store.suspension("support-ann") is None
        model = FakeLLM(["Hello again, Ann."])
        with persisted(deploy.db, model):
            deploy.module(new).make("support-ann").on_event("hello", "{}")
        assert len(model.calls) == 1 and deploy.payments() == []

    def test_no_version_before_the_first_turn(self, deploy: Deploy) -> None:
        """An agent whose first turn suspended has no version to roll back to: the
        report offers none, before or after a decision."""
        approval = deploy.suspend(deploy.code())
        new = deploy.code(RENAME)
        status, out = deploy.check(new)
        assert status == 3 and "rollback" not in out and "version 0" not in out
        deploy.run(f"effectful-durable approve {shlex.quote(deploy.db)} {approval}")
        status, out = deploy.check(new)
        assert status == 3 and "rollback" not in out and "version 0" not in out


# -- an added argument -------------------------------------------------------------------


class TestAddedArgument:
    def test_approve_with_arguments(self, deploy: Deploy) -> None:
        """approve --agents, as printed with the currency filled in, checks the arguments
        against the new signature (and says so); the resumed turn pays once, in EUR."""
        approval = deploy.suspend(deploy.code())
        new = deploy.code(*CURRENCY)
        status, out = deploy.check(new)
        assert status == 3 and not [line for line in printed(out) if "<" in line]
        approve = pick(to_fill(out), "approve")
        assert "<currency: str>" in approve and f"--agents {new}" in approve
        said = deploy.run(approve, EUROS)
        assert "checked against the new code's signature of refund" in said
        assert "not the schema stored with the approval" in said
        assert deploy.check(new)[0] == 0
        model, result = deploy.resume(new, "Refunded, Ann.")
        assert (result, len(model.calls)) == ("Refunded, Ann.", 1)
        assert deploy.payments() == [("A-1002", 250.0)]
        [paid] = tool_texts(model)
        assert paid.startswith("Refunded 250.00 EUR on A-1002")
        with Store(deploy.db, readonly=True) as store:
            assert store.approval(approval).decided_arguments == {
                "order": "A-1002",
                "amount": 250.0,
                "currency": "EUR",
            }
        assert deploy.check(new)[0] == 0

    def test_retarget_with_arguments(self, deploy: Deploy) -> None:
        """Re-targeted to the same tool with the new argument, the check passes and the
        resumed turn runs the tool with it: the check and the resume agree."""
        approval = deploy.suspend(deploy.code())
        new = deploy.code(*CURRENCY)
        deploy.ways(new)
        arguments = '{"order": "A-1002", "amount": 250, "currency": "EUR"}'
        said = deploy.run(
            f"effectful-durable retarget {shlex.quote(deploy.db)} {approval} refund "
            f"--agents {new} --arguments '{arguments}'"
        )
        assert deploy.check(new)[0] == 0
        deploy.run(pick(printed(said), "approve"))
        model, _ = deploy.resume(new, "Refunded, Ann.")
        assert len(model.calls) == 1 and deploy.payments() == [("A-1002", 250.0)]
        assert tool_texts(model)[0].startswith("Refunded 250.00 EUR on A-1002")
        [call] = [m for m in deploy.history() if m.get("tool_calls")][-1]["tool_calls"]
        assert json.loads(call["function"]["arguments"])["currency"] == "EUR"

    def test_deny(self, deploy: Deploy) -> None:
        """Denied as printed: the check passes and the model reads the reason."""
        deploy.suspend(deploy.code())
        new = deploy.code(*CURRENCY)
        deploy.run(pick(deploy.ways(new), "deny"))
        assert deploy.check(new)[0] == 0
        model, _ = deploy.resume(new, "Sorry, Ann.")
        assert tool_texts(model)[0].endswith("Their reason: refund takes other arguments now")
        assert len(model.calls) == 1 and deploy.payments() == []

    def test_stored_schema_is_said(self, deploy: Deploy) -> None:
        """approve without --agents checks against the schema stored with the approval,
        and its refusal says so and how to check against the new code; nothing changes."""
        approval = deploy.suspend(deploy.code())
        arguments = '{"order": "A-1002", "amount": 250, "currency": "EUR"}'
        assert main(["approve", deploy.db, approval, "--arguments", arguments]) == 1
        err = deploy.capsys.readouterr().err
        assert "checked against the schema stored with the approval" in err
        assert "pass --agents MODULE:FUNC" in err
        assert len(err.strip().splitlines()) == 1, err
        with Store(deploy.db, readonly=True) as store:
            assert store.approval(approval).status == "pending"


class TestDroppedArgument:
    def test_approve_as_printed(self, deploy: Deploy) -> None:
        """An argument the tool no longer takes: the printed approve, cut to what it
        takes, runs as printed, and the resumed turn pays once with it."""
        deploy.suspend(deploy.code())
        new = deploy.code(
            ("def refund(self, order: str, amount: float)", "def refund(self, order: str)"),
            ("when=lambda order, amount: amount > 100", "when=lambda order: True"),
            (
                '"""Refund ``amount`` EUR on ``order`` to the customer\'s card."""',
                '"""Refund ``order`` in full to the customer\'s card."""\n        amount = 99.0',
            ),
        )
        status, out = deploy.check(new)
        assert status == 3 and "it has no parameter 'amount'" in out
        approve = pick(printed(out), "approve")
        assert shlex.split(approve)[-2:] == ["--arguments", '{"order": "A-1002"}']
        deploy.run(approve)
        assert deploy.check(new)[0] == 0
        model, _ = deploy.resume(new, "Refunded, Ann.")
        assert len(model.calls) == 1 and deploy.payments() == [("A-1002", 99.0)]

    def test_a_value_that_no_longer_fits(self, deploy: Deploy) -> None:
        """A value of a type the tool no longer takes: the printed approve asks for it
        to be corrected, and is not among the commands that run as printed."""
        deploy.suspend(deploy.code())
        new = deploy.code(
            (
                "def refund(self, order: str, amount: float)",
                "def refund(self, order: int, amount: float)",
            )
        )
        assert main(["check-upgrade", deploy.db, "--agents", new, "--json"]) == 3
        [problem] = json.loads(deploy.capsys.readouterr().out)["breaks"]
        assert "with the values that do not fit corrected" in problem["way_forward"]
        assert [shlex.split(line)[1] for line in problem["commands"]] == ["deny"]


# -- approved before the deploy ------------------------------------------------------------


class TestApprovedBeforeTheDeploy:
    def test_retarget_and_approve_again(self, deploy: Deploy) -> None:
        """A call approved under the old code, its tool renamed since: re-targeted as
        printed it waits again, approved again as printed, and a runner resumes it once."""
        old = deploy.code()
        approval = deploy.suspend(old)
        deploy.run(f"effectful-durable approve {shlex.quote(deploy.db)} {approval}")
        new = deploy.code(RENAME)
        ways = deploy.ways(new)
        retarget, approve = pick(ways, "retarget"), pick(ways, "approve")
        said = deploy.run(retarget)
        assert "it waits for a decision again" in said
        with Store(deploy.db, readonly=True) as store:
            assert store.approval(approval).status == "pending"
            assert not [a for a in store.alarms(include_ended=True) if a.kind == "resume"]
        deploy.run(approve)
        assert deploy.check(new)[0] == 0
        model = FakeLLM(["Refunded, Ann."])
        clock = FakeClock(time.time())
        shop = deploy.module(new)
        with AgentRunner(
            deploy.db,
            agents=shop.make,
            handlers=lambda config: [LiteLLMProvider(model="fake"), model],
            clock=clock,
        ) as runner:
            runner.run(until=clock.now() + 60)
        assert (runner.turns, runner.errors, len(model.calls)) == (1, 0, 1)
        assert deploy.payments() == [("A-1002", 250.0)]
        assert deploy.check(new)[0] == 0


# -- resuming with the new code -------------------------------------------------------------


class TestResume:
    def test_a_gone_approved_tool_is_our_error(self, deploy: Deploy) -> None:
        """An approved call whose tool is gone stops the resumed turn with a DurableError
        that names the way forward, not a KeyError; nothing runs or commits."""
        approval = deploy.suspend(deploy.code())
        deploy.run(f"effectful-durable approve {shlex.quote(deploy.db)} {approval}")
        new = deploy.code(RENAME)
        with Store(deploy.db, readonly=True) as store:
            before = store.versions("support-ann")[-1].version
        with pytest.raises(DurableError, match=f"effectful-durable retarget DB {approval}"):
            deploy.resume(new, "never asked")
        with Store(deploy.db, readonly=True) as store:
            assert store.versions("support-ann")[-1].version == before
        assert deploy.payments() == []

    def test_recorded_result_of_a_renamed_tool(self, deploy: Deploy) -> None:
        """A call that ran before the suspension replays its recorded result even though
        its tool was renamed since: the tool is not looked up, nor run again."""
        looked_up = ToolCall("lookup_order", {"order": "A-1002"})
        approval = deploy.suspend(deploy.code(), calls=[looked_up, REFUND_CALL])
        deploy.run(f"effectful-durable deny {shlex.quote(deploy.db)} {approval} --reason no")
        new = deploy.code(("def lookup_order(self", "def find_order(self"))
        model, result = deploy.resume(new, "Sorry, Ann.")
        assert result == "Sorry, Ann." and len(model.calls) == 1
        looked, denied = tool_texts(model)
        assert looked.startswith("Order A-1002: 250.00 EUR") and denied.endswith("reason: no")


# -- memory ------------------------------------------------------------------------------


@pytest.fixture
def coach(deploy: Deploy) -> Deploy:
    """The memory example's coach kept two keys (StateTools) under the old code."""
    old = deploy.code(source=COACH, cls="RunningCoach")
    model = FakeLLM(
        [
            [
                ToolCall("put_state", {"key": "user.name", "value": '"Alice"'}),
                ToolCall("put_state", {"key": "user.drink", "value": '"tea"'}),
            ],
            "Noted.",
        ]
    )
    with persisted(deploy.db, model):
        deploy.module(old).make("coach").chat("Hi! I'm Alice, and I only drink tea.")
    return deploy


class TestMemory:
    def test_state_tools_agents_are_checked(self, coach: Deploy) -> None:
        """An agent with StateTools is checked (no store needed to build its shape): the
        same code carries its memory, and lower limits are reported."""
        same = coach.code(source=COACH, cls="RunningCoach")
        status, out = coach.check(same)
        assert status == 0, out
        tighter = coach.code(
            (
                "    sessions: int = 0",
                "    __memory_limits__ = MemoryLimits(keys=1)\n    sessions: int = 0",
            ),
            ("StateTools, Store\n", "StateTools, Store, MemoryLimits\n"),
            source=COACH,
            cls="RunningCoach",
        )
        status, out = coach.check(tighter)
        assert (
            status == 3
            and "the memory holds 2 keys, more than RunningCoach's new limit of 1" in out
        )

    def test_dropped_state_tools(self, coach: Deploy) -> None:
        """Without StateTools the memory is stranded; the printed command reads it."""
        without = coach.code(
            ("class RunningCoach(PersistentAgent, StateTools, SQLTools):",
             "class RunningCoach(PersistentAgent, SQLTools):"),
            source=COACH,
            cls="RunningCoach",
        )  # fmt: skip
        [memory] = coach.ways(without)
        assert "user.name" in coach.run(memory)


# -- new code that cannot be loaded --------------------------------------------------------


class TestNewCodeThatFails:
    @pytest.mark.parametrize(
        ("text", "says"),
        [
            ("def make(agent_id:\n    pass\n", "SyntaxError: "),
            ("import os\n\nraise RuntimeError('half deployed')\n", "RuntimeError: half deployed"),
            ("import not_installed_anywhere\n", "No module named 'not_installed_anywhere'"),
        ],
        ids=["syntax", "raises", "missing-import"],
    )
    def test_import(self, deploy: Deploy, text: str, says: str) -> None:
        """A module that does not parse or raises at import: one line naming the module,
        its file and the line, exit 1, for check, approve and retarget alike."""
        approval = deploy.suspend(deploy.code())
        name = f"broken_{next(_names)}"
        (deploy.folder / f"{name}.py").write_text(text)
        line = 3 if "raise" in text else 1
        for argv in (
            ["check-upgrade", deploy.db, "--agents", f"{name}:make"],
            ["approve", deploy.db, approval, "--agents", f"{name}:make"],
            ["retarget", deploy.db, approval, "refund", "--agents", f"{name}:make"],
        ):
            assert main(argv) == 1
            out, err = deploy.capsys.readouterr()
            assert out == "" and len(err.splitlines()) == 1, err
            assert f"importing {name} failed" in err and says in err
            assert f"{deploy.folder / name}.py, line {line})" in err
        with Store(deploy.db, readonly=True) as store:
            assert store.approval(approval).status == "pending"

    @pytest.mark.processes
    def test_factory_raises(self, deploy: Deploy) -> None:
        """A factory that raises: one line naming where, exit 1, for check and retarget."""
        approval = deploy.suspend(deploy.code())
        name = f"factory_{next(_names)}"
        (deploy.folder / f"{name}.py").write_text(
            REFUNDS.read_text() + "\n\ndef make(agent_id):\n    raise KeyError(agent_id)\n"
        )
        spec = f"{name}:make"
        for argv in (
            ["check-upgrade", deploy.db, "--agents", spec],
            ["retarget", deploy.db, approval, "refund", "--agents", spec],
        ):
            assert main(argv) == 1
            out, err = deploy.capsys.readouterr()
            assert len(err.splitlines()) == 1, err
            assert "KeyError: 'support-ann'" in err and f"{name}.py, line" in err

    @pytest.mark.processes
    def test_in_a_process_of_its_own(self, deploy: Deploy) -> None:
        """From the shell, a module with a syntax error prints one line and no traceback."""
        deploy.suspend(deploy.code())
        (deploy.folder / "half.py").write_text("def make(agent_id)\n")
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "effectful_durable",
                "check-upgrade",
                deploy.db,
                "--agents",
                "half:make",
            ],
            cwd=deploy.folder,
            env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 1 and "Traceback" not in done.stderr
        assert done.stderr.splitlines() == [
            f"effectful-durable: error: cannot load --agents 'half:make': importing half "
            f"failed: SyntaxError: expected ':' (at {deploy.folder / 'half.py'}, line 1)"
        ]


# -- every printed command runs as printed ---------------------------------------------------


def shell(line: str, folder: Path) -> subprocess.CompletedProcess[str]:
    """Run ``line`` through /bin/sh in ``folder``, as a person pastes it."""
    bin_dir = os.path.dirname(sys.executable)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    return subprocess.run(
        line, shell=True, cwd=folder, env=env, capture_output=True, text=True, timeout=120
    )


class TestEveryPrintedCommand:
    @pytest.mark.slow
    @pytest.mark.parametrize("edit", ["renamed", "currency"])
    def test_each_runs_as_printed(
        self,
        new_databases: Any,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
        edit: str,
    ) -> None:
        """Each command a report prints in backticks runs from the shell as printed, and
        one printed for a person to complete runs once completed, each on in-flight work
        made afresh for it, and the check then passes; the JSON report lists exactly
        those in backticks."""
        monkeypatch.chdir(tmp_path)
        monkeypatch.syspath_prepend(str(tmp_path))
        edits = [RENAME] if edit == "renamed" else CURRENCY

        @contextmanager
        def in_flight() -> Iterator[tuple[Deploy, str]]:
            with new_databases() as db:
                deploy = Deploy(db, tmp_path, capsys)
                deploy.suspend(deploy.code(), before=True)
                yield deploy, deploy.code(*edits)

        with in_flight() as (deploy, new):
            assert main(["check-upgrade", deploy.db, "--agents", new, "--json"]) == 3
            breaks = json.loads(capsys.readouterr().out)["breaks"]
            status, out = deploy.check(new)
        listed = [line for b in breaks for line in b["commands"]]
        assert sorted(listed) == sorted(printed(out))
        ways = [(shlex.split(line)[1], False) for line in printed(out)]
        ways += [(shlex.split(line)[1], True) for line in to_fill(out)]
        if edit == "renamed":
            assert sorted(ways) == [("deny", False), ("retarget", False), ("rollback", False)]
        else:
            assert sorted(ways) == [("approve", True), ("deny", False), ("rollback", False)]
        for verb, filled in ways:
            with in_flight() as (deploy, new):
                status, out = deploy.check(new)
                line = pick(to_fill(out) if filled else printed(out), verb)
                for hole, value in EUROS.items():
                    line = line.replace(hole, value)
                done = shell(line, tmp_path)
                assert done.returncode == 0, (line, done.stderr)
                assert deploy.check(new)[0] == 0, line
