"""What a check found: the in-flight work new code cannot carry, and each workflow's dry run.

The check writes these types and the page (``ui/pages/check.py``) reads them back from
the JSON the check keeps, so this module imports only the standard library: never
effectful, nor anything of ours.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args, get_type_hints

#: The exit status of ``effectful-durable check-upgrade`` when something would break.
BREAKS_EXIT_STATUS = 3


@dataclass(frozen=True, slots=True)
class Break:
    """One piece of in-flight work that the new code cannot carry.

    ``kind`` says what it is (``"approval"``, ``"alarm"``, ``"event"``,
    ``"state"``, ``"memory"``, ``"history"``, ``"workflow"``, or ``"agent"``
    when the agent cannot even be built); ``subject`` names it (an approval or
    alarm id, a field, a conversation, a step); ``problem`` says what the new
    code would do to it, and ``way_forward`` what to do about it. ``commands``
    are the command lines ``way_forward`` names in backticks, each runnable as
    printed (one that needs a value a person chooses is named without backticks,
    with a ``<name: type>`` hole, and is not among them).

    .. versionadded:: 0.2.0
    """

    kind: Literal["agent", "approval", "alarm", "event", "state", "memory", "history", "workflow"]
    agent_id: str | None
    subject: str
    problem: str
    way_forward: str
    commands: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class WorkflowRun:
    """What a dry run of a workflow's program found.

    ``replayed`` are the numbers of the steps the journal answered; ``live_at``
    the step that would run live first (its number, key and template), None if
    the program ended without one; ``diverged`` the step where the program asked
    for something else than the journal recorded, with both; ``error`` what
    stopped the program otherwise.

    .. versionadded:: 0.2.0
    """

    workflow: str
    replayed: tuple[int, ...]
    live_at: dict[str, Any] | None = None
    diverged: dict[str, Any] | None = None
    error: str | None = None

    @property
    def carries_over(self) -> bool:
        """Whether the new program resumes this workflow (no divergence, no error)."""
        return self.diverged is None and self.error is None

    @property
    def summary(self) -> str:
        """The dry run in one line, such as ``replays steps 1–7, goes live at 8 (...)``."""
        replayed = _steps(self.replayed)
        if self.diverged is not None:
            where = self.diverged
            return (
                f"{replayed}, then diverges at step {where['number']} ({where['key']}): "
                f"the journal recorded {where['recorded']}, the new code asks for "
                f"{where['asked']}"
            )
        if self.error is not None:
            return f"{replayed}, then stops: {self.error}"
        if self.live_at is None:
            return f"{replayed}, and ends: nothing goes live"
        live = self.live_at
        if live["number"] is None:  # the program installed the handler without a workflow
            return f"{replayed}, goes live at once ({live['template']}): no workflow named"
        return f"{replayed}, goes live at {live['number']} ({live['key']} {live['template']})"


#: Every kind of break, in the order the page offers them.
KINDS: tuple[str, ...] = get_args(get_type_hints(Break)["kind"])


def _steps(numbers: tuple[int, ...]) -> str:
    if not numbers:
        return "replays no step"
    if list(numbers) == list(range(numbers[0], numbers[0] + len(numbers))):
        if len(numbers) == 1:
            return f"replays step {numbers[0]}"
        return f"replays steps {numbers[0]}–{numbers[-1]}"
    return f"replays {len(numbers)} steps ({', '.join(map(str, numbers))})"


@dataclass(frozen=True, slots=True)
class UpgradeReport:
    """What ``effectful-durable check-upgrade`` found: whether the new code carries every
    agent's in-flight work, and what it cannot.

    ``in_flight`` counts what was looked at (agents, conversations, approvals,
    alarms, events, workflows); ``code_versions`` how many agents' latest turn
    each code version committed (``"(not recorded)"``: not said); ``code_version``
    the new code's own, if known.

    .. versionadded:: 0.2.0
    """

    database: str
    checked_at: str
    code_version: str | None
    in_flight: Mapping[str, int]
    code_versions: Mapping[str, int]
    breaks: tuple[Break, ...]
    workflows: tuple[WorkflowRun, ...]
    seconds: float

    @property
    def ok(self) -> bool:
        """Whether everything in flight carries over to the new code."""
        return not self.breaks and all(run.carries_over for run in self.workflows)

    @property
    def exit_status(self) -> int:
        """The command's exit status, 0 when everything carries over, else 3."""
        return 0 if self.ok else BREAKS_EXIT_STATUS

    def to_json(self) -> dict[str, Any]:
        """The report as JSON values (what ``--json`` prints and the page reads)."""
        return {
            "database": self.database,
            "checked_at": self.checked_at,
            "ok": self.ok,
            "code_version": self.code_version,
            "in_flight": dict(self.in_flight),
            "code_versions": dict(self.code_versions),
            "breaks": [
                {**dataclasses.asdict(b), "commands": list(b.commands)} for b in self.breaks
            ],
            "workflows": [
                {
                    **dataclasses.asdict(run),
                    "carries_over": run.carries_over,
                    "summary": run.summary,
                }
                for run in self.workflows
            ],
            "seconds": round(self.seconds, 3),
        }

    @classmethod
    def from_json(cls, data: Any) -> UpgradeReport:
        """The report that :meth:`to_json` wrote, read back (as the page reads it).

        Raises:
            ValueError: ``data`` is not such a report.
        """
        try:
            report = cls(
                database=data["database"],
                checked_at=data["checked_at"],
                code_version=data["code_version"],
                in_flight=dict(data["in_flight"]),
                code_versions=dict(data["code_versions"]),
                breaks=tuple(
                    Break(
                        kind=found["kind"],
                        agent_id=found["agent_id"],
                        subject=found["subject"],
                        problem=found["problem"],
                        way_forward=found["way_forward"],
                        commands=tuple(found["commands"]),
                    )
                    for found in data["breaks"]
                ),
                workflows=tuple(
                    WorkflowRun(
                        workflow=run["workflow"],
                        replayed=tuple(run["replayed"]),
                        live_at=run["live_at"],
                        diverged=run["diverged"],
                        error=run["error"],
                    )
                    for run in data["workflows"]
                ),
                seconds=float(data["seconds"]),
            )
            for run in report.workflows:
                _ = run.summary  # a dry run that cannot say what it found is no report
        except (KeyError, TypeError, ValueError) as error:
            what = f"{type(error).__name__}: {error}"
            msg = f"not a report of effectful-durable check-upgrade ({what})"
            raise ValueError(msg) from error
        unknown = sorted({found.kind for found in report.breaks} - set(KINDS))
        if unknown:
            msg = f"not a report of effectful-durable check-upgrade (breaks of kind {unknown})"
            raise ValueError(msg)
        return report
