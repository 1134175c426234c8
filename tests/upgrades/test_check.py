"""check_upgrade: each kind of break new code makes, found in a copy of an example agent
edited as a developer would, on both backends, with nothing written and no model called;
and the report read back from the JSON the check keeps."""

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from effectful.ops.semantics import handler
from helpers import persisted
from upgrade_helpers import PLANTS, REFUND_CALL, REFUNDS, RENAME_REFUND, TEAM, edited

from effectful_durable import (
    Break,
    Store,
    TurnSuspended,
    UpgradeReport,
    WorkflowRun,
    check_upgrade,
    migrate_states,
    migrates_state,
)
from effectful_durable.handlers.effectful_hooks import tool_parameters
from effectful_durable.testing import FakeLLM, ToolCall
from effectful_durable.upgrades.agent_checks import Shape


def footprint(db: str) -> tuple[Any, ...]:
    """What the database holds that a write would change: versions, steps, approvals, alarms."""
    with Store(db, readonly=True) as store:
        versions = tuple((a.agent_id, a.version) for a in store.agents())
        steps = tuple(
            (s.key, s.status) for w in store.workflows() for s in store.steps(w.workflow)
        )
        approvals = tuple((a.approval_id, a.tool, a.status) for a in store.approvals(status=None))
        alarms = tuple((a.alarm_id, a.status) for a in store.alarms(include_ended=True))
    return versions, steps, approvals, alarms


def checked(db: str, factory: Callable[[str], Any], **options: Any) -> Any:
    """Run the check under a fake model that counts its calls; assert nothing was written."""
    before = footprint(db)
    model = FakeLLM()
    with handler(model):
        report = check_upgrade(db, agents=factory, **options)
    assert model.calls == []
    assert footprint(db) == before
    return report


def kinds(report: Any) -> list[tuple[str, str | None, str]]:
    return [(b.kind, b.agent_id, b.subject) for b in report.breaks]


# -- approvals: examples/approvals/refunds.py ---------------------------------------------


@pytest.fixture
def refund_waits(store_url: str, tmp_path: Path) -> str:
    """support-ann's turn suspended: its model asked for a 250 EUR refund."""
    shop = edited(REFUNDS, tmp_path)
    model = FakeLLM([REFUND_CALL])
    with persisted(store_url, model), pytest.raises(TurnSuspended):
        shop.SupportAgent(agent_id="support-ann").on_event("refund_request", '{"text": "250"}')
    return store_url


class TestApprovals:
    def test_unchanged_code_carries_the_approval(self, refund_waits: str, tmp_path: Path) -> None:
        """The same code carries a waiting approval: nothing to report, exit status 0."""
        shop = edited(REFUNDS, tmp_path)
        report = checked(refund_waits, lambda i: shop.SupportAgent(agent_id=i))
        assert report.ok and report.exit_status == 0 and report.breaks == ()
        assert report.in_flight["approvals"] == 1 and report.in_flight["agents"] == 1

    def test_renamed_tool(self, refund_waits: str, tmp_path: Path) -> None:
        """A renamed tool strands the approval and the call in the history; both are said."""
        shop = edited(REFUNDS, tmp_path, RENAME_REFUND)
        report = checked(refund_waits, lambda i: shop.SupportAgent(agent_id=i))
        assert report.exit_status == 3
        [approval] = [b for b in report.breaks if b.kind == "approval"]
        assert "no tool 'refund'" in approval.problem and "pay_refund" in approval.problem
        assert "retarget" in approval.way_forward and "deny" in approval.way_forward
        [history] = [b for b in report.breaks if b.kind == "history"]
        assert "refund (1x)" in history.problem

    def test_added_required_argument(self, refund_waits: str, tmp_path: Path) -> None:
        """A new required argument: the waiting call's arguments no longer fit the tool."""
        shop = edited(
            REFUNDS,
            tmp_path,
            (
                "def refund(self, order: str, amount: float)",
                "def refund(self, order: str, amount: float, currency: str)",
            ),
        )
        report = checked(refund_waits, lambda i: shop.SupportAgent(agent_id=i))
        [approval] = report.breaks
        assert approval.kind == "approval" and "currency" in approval.problem
        assert "--arguments" in approval.way_forward

    def test_retarget_then_resume(self, refund_waits: str, tmp_path: Path) -> None:
        """Re-targeted to the renamed tool and approved, the resumed turn runs it once."""
        shop = edited(REFUNDS, tmp_path, RENAME_REFUND)
        shop.PAYMENTS.path = tmp_path / "payments.json"
        with Store(refund_waits) as store:
            [waiting] = store.approvals()
            agent = shop.SupportAgent(agent_id="support-ann")
            key, tool = Shape.of(agent).tool("pay_refund")  # type: ignore[misc]
            store.retarget_approval(
                waiting.approval_id,
                tool="pay_refund",
                arguments=waiting.arguments,
                parameters=tool_parameters(SimpleNamespace(name=key, tool=tool)),
                by="ops",
            )
            store.approve(waiting.approval_id, by="ops")
        report = checked(refund_waits, lambda i: shop.SupportAgent(agent_id=i))
        assert report.ok, report.breaks  # the call is judged as it will run: pay_refund
        with persisted(refund_waits, FakeLLM(["refunded"])) as persistence:
            assert persistence.resume(agent) == "refunded"
        assert [p["order"] for p in shop.PAYMENTS.ledger()] == ["A-1002"]
        with Store(refund_waits, readonly=True) as store:
            calls = [m for m in store.history("support-ann") if m.get("tool_calls")]
        assert calls[-1]["tool_calls"][0]["function"]["name"] == "self__pay_refund"
        assert checked(refund_waits, lambda i: shop.SupportAgent(agent_id=i)).ok


# -- fields, memory and alarms: examples/alarms/checkback.py ----------------------------


@pytest.fixture
def plants(store_url: str, tmp_path: Path) -> str:
    """basil-carer: one turn that sent a note, and a daily alarm it keeps."""
    carer_code = edited(PLANTS, tmp_path)
    carer = carer_code.PlantCarer(agent_id="basil-carer")
    model = FakeLLM([ToolCall("notify", {"message": "Water the basil."}), "Done."])
    with persisted(store_url, model):
        carer.ask("Please look after my basil.")
        carer.schedule("tidy your notes", cron="0 7 * * *")
    return store_url


class TestFieldsAndAlarms:
    def test_unchanged(self, plants: str, tmp_path: Path) -> None:
        """The same code carries the fields and the alarm."""
        code = edited(PLANTS, tmp_path)
        report = checked(plants, lambda i: code.PlantCarer(agent_id=i))
        assert report.ok and report.in_flight["alarms"] == 1

    def test_dropped_field(self, plants: str, tmp_path: Path) -> None:
        """A field dropped from the class: its stored value would be lost at the next commit."""
        code = edited(
            PLANTS,
            tmp_path,
            (
                "    notes_sent: list[str] = dataclasses.field(default_factory=list)",
                "",
            ),
            ("self.notes_sent.append(message)", "pass"),
        )
        report = checked(plants, lambda i: code.PlantCarer(agent_id=i))
        [dropped] = report.breaks
        assert (dropped.kind, dropped.subject) == ("state", "notes_sent")
        assert "Water the basil." in dropped.problem and "@migrates_state" in dropped.way_forward

    def test_changed_field_type(self, plants: str, tmp_path: Path) -> None:
        """A field whose stored value no longer fits its new type is said, with the value."""
        code = edited(PLANTS, tmp_path, ("notes_sent: list[str]", "notes_sent: list[int]"))
        report = checked(plants, lambda i: code.PlantCarer(agent_id=i))
        [problem] = report.breaks
        assert problem.kind == "state" and "no longer fits" in problem.problem

    def test_removed_alarm_callback(self, plants: str, tmp_path: Path) -> None:
        """Without AlarmTools the agent has no on_alarm: its pending alarm is stranded."""
        code = edited(
            PLANTS,
            tmp_path,
            (
                "class PlantCarer(PersistentAgent, AlarmTools):",
                "class PlantCarer(PersistentAgent):",
            ),
        )
        report = checked(plants, lambda i: code.PlantCarer(agent_id=i))
        [alarm] = report.breaks
        assert alarm.kind == "alarm" and "no template on_alarm" in alarm.problem

    def test_migration_carries_a_renamed_field(self, plants: str, tmp_path: Path) -> None:
        """A registered migration carries a renamed field; migrate-state commits it as a
        version of its own, which a rollback undoes."""
        code = notes_renamed(tmp_path)
        factory = lambda i: code.PlantCarer(agent_id=i)  # noqa: E731
        assert checked(plants, factory).ok
        [migrated] = migrate_states(plants, agents=factory)
        assert (migrated.from_version, migrated.to_version) == (1, 2)
        with Store(plants) as store:
            assert store.state("basil-carer") == {
                "__state_version__": 2,
                "notes": ["Water the basil."],
            }
            assert store.versions("basil-carer")[-1].template == "migrate_state"
            store.rollback("basil-carer", migrated.version - 1)  # type: ignore[operator]
            assert store.state("basil-carer") == {"notes_sent": ["Water the basil."]}


def notes_renamed(folder: Path) -> ModuleType:
    """The plant carer at state version 2: ``notes_sent`` renamed ``notes``, migrated."""
    code = edited(
        PLANTS,
        folder,
        ("    notes_sent: list[str]", "    __state_version__ = 2\n    notes: list[str]"),
        ("self.notes_sent.append", "self.notes.append"),
    )

    @migrates_state(code.PlantCarer, from_version=1)
    def rename(fields: dict[str, Any]) -> dict[str, Any]:
        fields["notes"] = fields.pop("notes_sent")
        return fields

    return code


# -- workflows: examples/multi_agent/workflow.py -----------------------------------------


@pytest.fixture
def team_stopped(store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """The team's workflow stopped (as by Ctrl-C) after 8 model calls: steps 1-4 done."""
    team = edited(TEAM, tmp_path)
    assert team.main(["--db", store_url, "--out", str(tmp_path / "p"), "--stop-after", "8"]) == 130
    capsys.readouterr()
    return store_url


class TestWorkflows:
    def test_unchanged_program_goes_live_where_it_stopped(
        self, team_stopped: str, tmp_path: Path
    ) -> None:
        """The same program replays the steps done and goes live at the next one."""
        team = edited(TEAM, tmp_path)
        report = checked(team_stopped, team.agent, workflow=team.program)
        assert report.ok, report.breaks
        [run] = report.workflows
        assert run.carries_over and run.live_at is not None
        assert run.replayed == tuple(range(1, run.live_at["number"]))
        assert run.summary.startswith(f"replays steps 1–{run.live_at['number'] - 1}, goes live")
        assert report.code_versions == {"textkit-demo-1": 3}

    def test_reordered_steps(self, team_stopped: str, tmp_path: Path) -> None:
        """Two of a coder's steps swapped: the divergence names the step, recorded vs asked."""
        team = edited(
            TEAM,
            tmp_path,
            (
                "    for module in modules:\n        say(coder.agent_id, coder.write_module",
                "    for module in reversed(modules):\n        say(coder.agent_id, "
                "coder.write_module",
            ),
        )
        report = checked(team_stopped, team.agent, workflow=team.program)
        assert report.exit_status == 3
        [run] = report.workflows
        assert run.diverged is not None and run.diverged["key"] == "coder-1#0"
        assert '"slugify"' in run.diverged["recorded"] and '"redact"' in run.diverged["asked"]
        assert "diverges at step" in run.summary


# -- the store's reads for a check -------------------------------------------------------


class TestInFlight:
    def test_long_results_and_unanswered_calls(self, store_url: str) -> None:
        """Tool results are matched to their calls however long they are, and wherever
        they name the call; a call left without a result is found."""
        from helpers import commit_message

        from effectful_durable.store.history import HistoryChange

        def call(call_id: str) -> dict[str, Any]:
            function = {"name": "self__lookup", "arguments": "{}"}
            return {"id": f"m-{call_id}", "role": "assistant", "tool_calls": [
                {"id": call_id, "type": "function", "function": function}
            ]}  # fmt: skip

        long = "x" * 5000
        messages = [
            call("c1"),
            {"role": "tool", "content": long, "tool_call_id": "c1", "id": "r1"},
            call("c2"),
            {"role": "tool", "content": long, "id": "r2", "tool_call_id": "c2", "more": long},
            call("c3"),
            {"role": "tool", "tool_call_id": "c3", "content": "short", "id": "r3"},
            call("c4"),
        ]
        with Store(store_url) as store:
            commit_message(store, "bot")
            with store.turns.start("bot", template="t", arguments={}) as start:
                change = HistoryChange([(10.0 + i, m) for i, m in enumerate(messages)], [], 0)
                store.turns.commit(
                    "bot", base_version=start.version, template="t", change=change, state="{}"
                )
            [held] = store.in_flight(["bot", "nobody"])
        [conversation] = held.conversations
        assert [c for c, _ in conversation.calls] == ["c1", "c2", "c3", "c4"]
        assert conversation.answered == {"c1", "c2", "c3"}
        assert (held.version, held.state) == (2, "{}")


class TestMigrationOnLoad:
    def test_next_turn_commits_migrated_fields(self, plants: str, tmp_path: Path) -> None:
        """Loaded by the new code, older fields are migrated in memory, and the agent's next
        turn commits them with their state version."""
        code = notes_renamed(tmp_path)
        carer = code.PlantCarer(agent_id="basil-carer")
        with persisted(plants, FakeLLM(["fine"])):
            carer.ask("How is the basil?")
        assert carer.notes == ["Water the basil."]
        with Store(plants, readonly=True) as store:
            assert store.state("basil-carer") == {
                "__state_version__": 2,
                "notes": ["Water the basil."],
            }

    def test_missing_migration_is_said(self, plants: str, tmp_path: Path) -> None:
        """A class a version ahead without a migration for it: the check names the step
        to register, and the agent's turn refuses to load rather than lose the fields."""
        from effectful_durable import StateMigrationError

        code = edited(
            PLANTS,
            tmp_path,
            ("    notes_sent: list[str]", "    __state_version__ = 2\n    notes_sent: list[str]"),
        )
        report = checked(plants, lambda i: code.PlantCarer(agent_id=i))
        [problem] = report.breaks
        assert problem.kind == "state" and "from_version=1" in problem.problem
        with persisted(plants, FakeLLM(["fine"])), pytest.raises(StateMigrationError):
            code.PlantCarer(agent_id="basil-carer").ask("How is the basil?")


class TestPages:
    def test_every_page_is_read_and_checked(self, plants: str, tmp_path: Path) -> None:
        """Read two agents a page, the check sees every agent once, in order, and says
        how far it got after each page."""
        from helpers import commit_message

        with Store(plants) as store:
            for n in range(4):
                commit_message(store, f"plant-{n}")
        code = edited(PLANTS, tmp_path, ("class PlantCarer(PersistentAgent, AlarmTools):",
                                         "class PlantCarer(PersistentAgent):"))  # fmt: skip
        seen: list[tuple[int, int]] = []
        report = checked(
            plants,
            lambda i: code.PlantCarer(agent_id=i),
            page=2,
            progress=lambda done, total: seen.append((done, total)),
        )
        assert seen == [(2, 5), (4, 5), (5, 5)]
        assert report.in_flight["agents"] == 5
        assert [(b.kind, b.agent_id) for b in report.breaks] == [("alarm", "basil-carer")]


# -- the report as the check keeps it and the page reads it --------------------------------


class TestReportJson:
    """The JSON the check keeps reads back as the same report: the page reads it so."""

    REPORT = UpgradeReport(
        database="state.db",
        checked_at="2026-11-25T20:35:06+00:00",
        code_version="v2",
        in_flight={"agents": 2, "conversations": 2, "approvals": 1, "alarms": 0, "events": 0,
                   "workflows": 2},
        code_versions={"v1": 1, "(not recorded)": 1},
        breaks=(
            Break("approval", "ann", "apr_1", "its tool is gone", "deny it (`x`)", ("x",)),
            Break("workflow", None, "nightly", "diverges", "reset it"),
        ),
        workflows=(
            WorkflowRun("nightly", (1, 2), live_at={"number": 3, "key": "a#2", "template": "t"}),
            WorkflowRun(
                "weekly",
                (1,),
                diverged={"number": 2, "key": "b#0", "recorded": "f(1)", "asked": "f(2)"},
            ),
        ),
        seconds=1.23456,
    )  # fmt: skip

    def test_round_trip(self) -> None:
        """from_json(to_json()) is the report, its seconds rounded as they are kept."""
        back = UpgradeReport.from_json(json.loads(json.dumps(self.REPORT.to_json())))
        assert back == dataclasses.replace(self.REPORT, seconds=1.235)
        assert back.to_json() == self.REPORT.to_json()
        assert [run.summary for run in back.workflows] == [
            run.summary for run in self.REPORT.workflows
        ]

    @pytest.mark.parametrize(
        "edit",
        [
            lambda kept: [],
            lambda kept: {**kept, "breaks": None},
            lambda kept: {k: v for k, v in kept.items() if k != "database"},
            lambda kept: {**kept, "breaks": [{**kept["breaks"][0], "kind": "mood"}]},
            lambda kept: {**kept, "breaks": [{"kind": "approval", "agent_id": "ann"}]},
            lambda kept: {**kept, "workflows": [{**kept["workflows"][0], "live_at": {}}]},
            lambda kept: {**kept, "seconds": "soon"},
        ],
        ids=["a-list", "no-breaks", "no-database", "unknown-kind", "half-a-break",
             "broken-dry-run", "seconds"],
    )  # fmt: skip
    def test_not_a_report(self, edit: Callable[[dict[str, Any]], Any]) -> None:
        """JSON that is not a report the check wrote is refused with a ValueError."""
        kept = json.loads(json.dumps(self.REPORT.to_json()))
        with pytest.raises(ValueError, match="not a report of effectful-durable check-upgrade"):
            UpgradeReport.from_json(edit(kept))
