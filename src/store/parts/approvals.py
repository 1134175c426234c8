"""Approvals: tool calls that wait for a person's decision, and the turns they suspend.

When the model calls a tool that needs approval, its turn is suspended: the
turn's messages so far commit as a version of the agent (``suspended_in``), with
one ``approvals`` row per call waiting (see ``engine/sqlite/schema.sql``). Each
row is decided once, approved (with the arguments to run the tool with) or
denied (with the reason the model reads). When the last one of a suspension is
decided, a ``resume`` row joins the runners' queue (``parts/alarms.py``), unless
the suspended turn is a workflow step, which the workflow's next run resumes.
The resumed turn's commit ends the suspension (``ended_in``).

How approvals follow the agent's versions:

- rollback to ``v`` cancels the suspensions that began after ``v``; a suspension
  that ``v`` holds (begun at or before it, ended after it) waits again: its
  approvals are pending, their decisions cleared, since the turn that used them
  was rolled back (a tool that ran stays run: see the docs' approvals page);
- fork refuses a version that holds a suspension (its history ends with a tool
  call no result follows): fork one before it or after it;
- prune deletes the rows of suspensions that ended at or before ``keep_from``.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import AgentInUseError, DurableError, InvalidDecisionError, NotFoundError
from ..engine.seam import Conn
from ..records import ApprovalInfo, ApprovalStatus, Suspension
from ..rows import dumps, legible, like_pattern, storable, utc
from ..sealing import APPROVAL, PLAIN, Sealer
from .alarms import current_version

#: Longest reason or note a decision may carry.
MAX_NOTE = 2000
#: Largest JSON text of a tool call's arguments that a decision may set.
MAX_ARGUMENTS = 64 * 1024

#: What the model reads for a call a person denied (the tool's result, the call not run).
DENIAL = "Not run: a person ({by}) denied this call. Their reason: {reason}"
#: How a denial's text opens, whoever denied it.
DENIAL_OPENS = DENIAL[: DENIAL.index("{")]


@dataclass(frozen=True, slots=True)
class Asked:
    """A tool call a running turn asks approval for (staged until the turn suspends)."""

    approval_id: str
    tool: str
    tool_call_id: str
    arguments: Mapping[str, Any]
    parameters: Mapping[str, Any]
    reason: str | None


def new_approval_id() -> str:
    """A new approval id: random, so that a turn can name it before it commits."""
    return "apr_" + secrets.token_hex(6)


def resume_id(agent_id: str, conversation: str, suspended_in: int) -> str:
    """The id of the runners' ``resume`` row of a suspension: one per suspension."""
    digest = hashlib.blake2b(
        f"{agent_id}\0{conversation}\0{suspended_in}".encode(), digest_size=8
    ).hexdigest()
    return f"res_{digest}"


@dataclass
class ApprovalWrite:
    """What a turn does to its conversation's approvals, in the turn's transaction.

    A TurnWrite (``engine/seam.py``): ``asked`` suspends the turn (its rows are
    written as part of the version); ``resumed`` is the suspension the turn
    resumed, ended by this version.
    """

    conversation: str
    template: str
    arguments: Any
    step: tuple[str, str] | None = None
    asked: list[Asked] = field(default_factory=list)
    resumed: Suspension | None = None

    def write(self, conn: Conn, agent_id: str, version: int, sealer: Sealer) -> None:
        """End the resumed suspension and record the approvals asked, as ``version``.

        Raises:
            AgentInUseError: The resumed suspension was ended or rolled back meanwhile.
        """
        now = time.time()
        if self.resumed is not None:
            _end(conn, agent_id, self.resumed, version, now)
        workflow, step_key = self.step if self.step is not None else (None, None)
        for order, asked in enumerate(self.asked):

            def sealed(column: str, text: str, approval_id: str = asked.approval_id) -> str:
                where = _place(agent_id, self.conversation, approval_id, column)
                return sealer.seal(text, *where)

            conn.execute(
                """
                INSERT INTO approvals (approval_id, agent_id, conversation, suspended_in,
                    template, turn_arguments, workflow, step_key, tool, tool_call_id,
                    arguments, parameters, reason, status, asked_at, asked_by)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?)
                """,
                (
                    asked.approval_id,
                    agent_id,
                    self.conversation,
                    version,
                    self.template,
                    sealed("turn_arguments", dumps(self.arguments)),
                    workflow,
                    step_key,
                    asked.tool,
                    asked.tool_call_id,
                    sealed("arguments", dumps(asked.arguments)),
                    dumps(asked.parameters),
                    asked.reason,
                    now + order * 1e-6,  # listed in the order the model made the calls
                    _ASKED_BY,
                ),
            )


def _end(conn: Conn, agent_id: str, suspension: Suspension, version: int, now: float) -> None:
    conn.execute(
        """
        UPDATE approvals SET ended_in = ?4
         WHERE agent_id = ?1 AND conversation = ?2 AND suspended_in = ?3
           AND ended_in IS NULL AND status IN ('approved', 'denied')
        """,
        (agent_id, suspension.conversation, suspension.suspended_in, version),
    )
    if conn.changes() != len(suspension.approvals):
        holder = "a rollback or another resumption of the same suspended turn"
        raise AgentInUseError(agent_id, holder)
    # The runners' resume row, unless a runner holds it: then it is that runner's
    # turn (which marks it delivered), or the runner finds nothing left to resume.
    conn.execute(
        """
        UPDATE alarms SET status = 'done', ended_in = ?2, deliveries = deliveries + 1,
               updated_at = ?3
         WHERE alarm_id = ?1 AND ended_in IS NULL AND lease_token IS NULL
        """,
        (resume_id(agent_id, suspension.conversation, suspension.suspended_in), version, now),
    )


_ASKED_BY = f"{socket.gethostname()}:{os.getpid()}"

# -- reads ----------------------------------------------------------------------

_SELECT = """
    SELECT approval_id, agent_id, conversation, tool, arguments, status, reason, asked_at,
           asked_by, decided_at, decided_by, note, decided_arguments, suspended_in, ended_in,
           template, workflow, step_key, tool_call_id, turn_arguments
      FROM checked_approvals
"""


def _info(row: Sequence[Any], sealer: Sealer) -> ApprovalInfo:
    (
        approval_id,
        agent_id,
        conversation,
        tool,
        arguments,
        status,
        reason,
        asked_at,
        asked_by,
        decided_at,
        decided_by,
        note,
        decided_arguments,
        suspended_in,
        ended_in,
        template,
        workflow,
        step_key,
        tool_call_id,
        _,
    ) = row

    def opened(column: str, value: str) -> str:
        return sealer.open(
            value, *_place(agent_id, conversation, approval_id, column), table="approvals"
        )

    arguments = opened("arguments", arguments)
    if decided_arguments is not None:
        decided_arguments = opened("decided_arguments", decided_arguments)
    return ApprovalInfo(
        approval_id,
        agent_id,
        conversation,
        tool,
        json.loads(arguments),
        status,
        reason,
        utc(asked_at),
        asked_by,
        utc(decided_at) if decided_at is not None else None,
        decided_by,
        note,
        json.loads(decided_arguments) if decided_arguments is not None else None,
        suspended_in,
        ended_in,
        template,
        workflow,
        step_key,
        tool_call_id,
    )


def open_suspension(
    conn: Conn, agent_id: str, conversation: str, sealer: Sealer = PLAIN
) -> Suspension | None:
    """The conversation's suspended turn, if one waits (decided or not)."""
    rows: list[tuple[Any, ...]] = conn.execute(
        f"""{_SELECT}
         WHERE agent_id = ? AND conversation = ? AND ended_in IS NULL
         ORDER BY asked_at, approval_id
        """,
        (agent_id, conversation),
    ).fetchall()
    if not rows:
        return None
    first = rows[0]
    return Suspension(
        agent_id,
        conversation,
        first[13],
        first[15],
        json.loads(
            sealer.open(
                first[19],
                *_place(agent_id, conversation, first[0], "turn_arguments"),
                table="approvals",
            )
        ),
        first[16],
        first[17],
        tuple(_info(row, sealer) for row in rows),
    )


def listed(
    conn: Conn,
    *,
    agent_id: str | None,
    status: ApprovalStatus | None,
    sealer: Sealer = PLAIN,
) -> list[ApprovalInfo]:
    """The approvals (of one agent, with one status), oldest first."""
    where, params = [], []
    if agent_id is not None:
        where.append("agent_id = ?")
        params.append(agent_id)
    if status is not None:
        where.append("status = ?")
        params.append(status)
    sql = _SELECT + (" WHERE " + " AND ".join(where) if where else "")
    rows = conn.execute(sql + " ORDER BY asked_at, approval_id", params).fetchall()
    return sealer.listed(rows, lambda row: _info(row, sealer))


def unresumed(conn: Conn, sealer: Sealer = PLAIN) -> list[ApprovalInfo]:
    """Every approval whose suspended turn has not resumed: pending, or decided and
    waiting for the resumption (``ended_in`` NULL), oldest first."""
    rows = conn.execute(f"{_SELECT} WHERE ended_in IS NULL ORDER BY asked_at, approval_id")
    return sealer.listed(rows.fetchall(), lambda row: _info(row, sealer))


def between(
    conn: Conn, agent_id: str, low: int, high: int, sealer: Sealer = PLAIN
) -> list[ApprovalInfo]:
    """The approvals of ``agent_id`` asked or resumed by a version after ``low`` up to
    ``high``, oldest first."""
    rows = conn.execute(
        f"""{_SELECT}
         WHERE agent_id = ?1 AND (suspended_in > ?2 AND suspended_in <= ?3
                                  OR ended_in > ?2 AND ended_in <= ?3)
         ORDER BY asked_at, approval_id
        """,
        (agent_id, low, high),
    ).fetchall()
    return sealer.listed(rows, lambda row: _info(row, sealer))


def one(conn: Conn, approval_id: str, sealer: Sealer = PLAIN) -> ApprovalInfo | None:
    """The approval ``approval_id``, or None."""
    if not isinstance(approval_id, str) or "\0" in approval_id or not storable(approval_id):
        return None
    row = conn.execute(f"{_SELECT} WHERE approval_id = ?", (approval_id,)).fetchone()
    return None if row is None else _info(row, sealer)


def parameters(conn: Conn, approval_id: str) -> dict[str, Any] | None:
    """The JSON schema of the tool's parameters an approval was asked with, or None."""
    if not isinstance(approval_id, str) or "\0" in approval_id or not storable(approval_id):
        return None
    row = conn.execute(
        "SELECT parameters FROM checked_approvals WHERE approval_id = ?", (approval_id,)
    ).fetchone()
    return None if row is None else dict(json.loads(row[0]))


# When a decided approval was decided; a cancelled one may never have been (its turn
# was rolled back while it waited): then when it was asked.
_DECIDED_AT = "coalesce(decided_at, asked_at)"
_MICROSECOND = 1e-6


def decided(
    conn: Conn,
    *,
    status: ApprovalStatus | None,
    by: str | None,
    agent_text: str | None,
    since: float | None,
    until: float | None,
    limit: int,
    offset: int,
    sealer: Sealer = PLAIN,
) -> tuple[list[ApprovalInfo], int]:
    """One page of the approvals no longer pending, newest decision first, and their count.

    ``by`` is the decider's name in any case; ``agent_text`` a text the agent id
    holds, in any case; ``since`` and ``until`` bound the decision's time (until
    excluded).
    """
    where: list[str] = ["status <> 'pending'"]
    params: list[Any] = []
    if status is not None:
        where.append("status = ?")
        params.append(status)
    if by is not None:
        where.append("lower(decided_by) = ?")
        params.append(by.lower())
    if agent_text:
        where.append("lower(agent_id) LIKE ? ESCAPE '\\'")
        params.append(f"%{like_pattern(agent_text.lower())}%")
    # Times are stored as float seconds and read back rounded to the microsecond
    # (utc()), which a double holds to within a quarter of one: a bound given as a
    # time read back is met by the decision it was read from, so compare a
    # microsecond short of it.
    if since is not None:
        where.append(f"{_DECIDED_AT} >= ?")
        params.append(since - _MICROSECOND)
    if until is not None:
        where.append(f"{_DECIDED_AT} < ?")
        params.append(until - _MICROSECOND)
    condition = " AND ".join(where)
    total = int(conn.execute(f"SELECT count(*) FROM approvals WHERE {condition}", params).get)
    rows = conn.execute(
        f"{_SELECT} WHERE {condition} ORDER BY {_DECIDED_AT} DESC, approval_id LIMIT ? OFFSET ?",
        [*params, limit, offset],
    ).fetchall()
    return sealer.listed(rows, lambda row: _info(row, sealer)), total


def pending_count(conn: Conn) -> int:
    """How many approvals wait for a decision, in the whole database."""
    return int(conn.execute("SELECT count(*) FROM approvals WHERE status = 'pending'").get)


# -- decisions --------------------------------------------------------------------


def decide(
    conn: Conn,
    approval_id: str,
    *,
    approve: bool,
    by: str,
    note: str | None,
    arguments: Mapping[str, Any] | None,
    now: float,
    parameters: Mapping[str, Any] | None = None,
    sealer: Sealer = PLAIN,
) -> ApprovalInfo:
    """Record one decision; queue the turn's resumption once its last approval is decided.

    An approval's arguments must fit ``parameters`` (the tool's JSON schema in the
    code that will resume the turn), which then replace the stored ones; without
    it, the schema stored when the turn suspended.

    Raises:
        NotFoundError: No approval has that id.
        InvalidDecisionError: It is decided already (or cancelled), or the edited
            arguments do not fit the tool's parameters, or ``by``/``note`` are not
            text of a sensible length. Nothing is written.
    """
    decider = _text(by, "by", 200, required=True)
    note = _text(note, "reason" if not approve else "note", MAX_NOTE, required=not approve)
    found = one(conn, approval_id, sealer)
    if found is None:
        raise _no_approval(approval_id)
    if found.status != "pending":
        when = f" at {found.decided_at:%Y-%m-%d %H:%M:%S} UTC" if found.decided_at else ""
        who = f" by {found.decided_by}" if found.decided_by else ""
        msg = f"approval {approval_id} is {found.status} already{who}{when}; nothing was changed"
        raise InvalidDecisionError(msg)
    decided: str | None = None
    schema_text: str | None = None
    if approve:
        chosen = found.arguments if arguments is None else arguments
        if parameters is None:
            schema = json.loads(
                conn.execute(
                    "SELECT parameters FROM checked_approvals WHERE approval_id = ?",
                    (approval_id,),
                ).get
            )
        else:
            schema, schema_text = dict(parameters), dumps(dict(parameters))
        decided = sealer.seal(
            _checked_arguments(found, chosen, schema),
            *_place(found.agent_id, found.conversation, approval_id, "decided_arguments"),
        )
    conn.execute(
        """
        UPDATE approvals SET status = ?2, decided_at = ?3, decided_by = ?4, note = ?5,
               decided_arguments = ?6, parameters = coalesce(?7, parameters)
         WHERE approval_id = ?1 AND status = 'pending'
        """,
        (
            approval_id,
            "approved" if approve else "denied",
            now,
            decider,
            note,
            decided,
            schema_text,
        ),
    )
    if conn.changes() != 1:  # another decider got there first (PostgreSQL's read committed)
        msg = f"approval {approval_id} was decided by someone else just now; nothing was changed"
        raise InvalidDecisionError(msg)
    suspension = open_suspension(conn, found.agent_id, found.conversation, sealer)
    if suspension is not None and suspension.decided and suspension.workflow is None:
        _queue_resume(conn, suspension, now)
    decided_now = one(conn, approval_id, sealer)
    assert decided_now is not None
    return decided_now


def retarget(
    conn: Conn,
    approval_id: str,
    *,
    tool: str,
    arguments: Mapping[str, Any],
    parameters: Mapping[str, Any],
    by: str,
    sealer: Sealer = PLAIN,
) -> ApprovalInfo:
    """Make an approval name another tool (one renamed in new code), with ``arguments``.

    The suspended turn, resumed, runs ``tool`` in place of the one the model
    called; ``parameters`` is the new tool's JSON schema, which ``arguments``
    (and later edited ones) must fit. The reason says who re-targeted it, from
    what. A pending approval stays pending; an approved one whose turn has not
    resumed waits for a decision again (its decision was about another call), and
    its resumption is taken off the runners' queue. The caller holds the agent
    for an approved one.

    Raises:
        NotFoundError: No approval has that id.
        InvalidDecisionError: It is denied, cancelled or used, or ``tool`` is not
            a sensible name, or the arguments do not fit. Nothing is written.
        AgentInUseError: A runner is resuming its turn now.
    """
    decider = _text(by, "by", 200, required=True)
    name = _text(tool, "tool", 200, required=True)
    found = one(conn, approval_id, sealer)
    if found is None:
        raise _no_approval(approval_id)
    if found.status not in ("pending", "approved") or found.ended_in is not None:
        used = " and its turn has resumed" if found.ended_in is not None else ""
        msg = (
            f"approval {approval_id} is {found.status}{used}; only a pending one, or an "
            "approved one whose turn has not resumed, can be re-targeted; nothing was changed"
        )
        raise InvalidDecisionError(msg)
    checked = sealer.seal(
        _checked_arguments(found, arguments, parameters),
        *_place(found.agent_id, found.conversation, approval_id, "arguments"),
    )
    if name == found.tool:
        what = f"re-targeted to {name} with other arguments by {decider}"
    else:
        what = f"re-targeted from {found.tool} to {name} by {decider}"
    note = found.note
    if found.status == "approved":
        _unqueue_resume(conn, found)
        what += f"; asked again, as {found.decided_by} approved the call before"
        note = f"asked again: {what}"
    reason = f"{found.reason or ''} ({what})"
    conn.execute(
        """
        UPDATE approvals SET tool = ?2, arguments = ?3, parameters = ?4, reason = ?5,
               status = 'pending', decided_at = NULL, decided_by = NULL,
               decided_arguments = NULL, note = ?7
         WHERE approval_id = ?1 AND status = ?6 AND ended_in IS NULL
        """,
        (approval_id, name, checked, dumps(dict(parameters)), reason.strip(), found.status, note),
    )
    if conn.changes() != 1:
        msg = f"approval {approval_id} was decided by someone else just now; nothing was changed"
        raise InvalidDecisionError(msg)
    changed = one(conn, approval_id, sealer)
    assert changed is not None
    return changed


def _unqueue_resume(conn: Conn, approval: ApprovalInfo) -> None:
    """Take the runners' resumption of ``approval``'s turn off the queue, if queued.

    Raises:
        AgentInUseError: A runner holds it: it is resuming the turn now.
    """
    alarm_id = resume_id(approval.agent_id, approval.conversation, approval.suspended_in)
    conn.execute(
        """
        DELETE FROM alarms
         WHERE alarm_id = ? AND kind = 'resume' AND ended_in IS NULL AND lease_owner IS NULL
        """,
        (alarm_id,),
    )
    leased = conn.execute(
        "SELECT 1 FROM alarms WHERE alarm_id = ? AND ended_in IS NULL", (alarm_id,)
    ).fetchone()
    if leased is not None:
        raise AgentInUseError(approval.agent_id, "a runner resuming its suspended turn")


def _place(
    agent_id: str, conversation: str, approval_id: str, column: str
) -> tuple[str, str, str, str]:
    """What an approval's ``column`` is sealed for: its agent, conversation and row."""
    return APPROVAL, agent_id, conversation, f"{approval_id}:{column}"


def _no_approval(approval_id: str) -> NotFoundError:
    msg = (
        f"no approval {approval_id!r}; `effectful-durable approvals` (Store.approvals()) "
        "lists them"
    )
    return NotFoundError(msg)


def _queue_resume(conn: Conn, suspension: Suspension, now: float) -> None:
    alarm_id = resume_id(suspension.agent_id, suspension.conversation, suspension.suspended_in)
    exists = conn.execute(
        "SELECT 1 FROM alarms WHERE alarm_id = ? AND ended_in IS NULL", (alarm_id,)
    ).fetchone()
    if exists is not None:
        return
    conn.execute(
        """
        INSERT INTO alarms (alarm_id, created_in, agent_id, action, fire_at, due_at,
                            status, created_at, updated_at, kind, topic)
        VALUES (?1, ?2, ?3, ?4, ?5, ?5, 'pending', ?5, ?5, 'resume', ?6)
        """,
        (
            alarm_id,
            current_version(conn, suspension.agent_id),
            suspension.agent_id,
            dumps({"suspended_in": suspension.suspended_in}),
            now,
            suspension.conversation,
        ),
    )


def _checked_arguments(found: ApprovalInfo, arguments: object, schema: Mapping[str, Any]) -> str:
    """``arguments`` as JSON text, if they fit the tool's parameters (``schema``)."""
    if not isinstance(arguments, Mapping):
        msg = f"arguments must be a JSON object of the tool's parameters; got {arguments!r}"
        raise InvalidDecisionError(msg)
    try:
        text = dumps(dict(arguments))
    except (TypeError, ValueError) as e:
        msg = f"arguments must be JSON values: {e}"
        raise InvalidDecisionError(msg) from e
    if len(text) > MAX_ARGUMENTS:
        msg = f"arguments must be at most {MAX_ARGUMENTS} bytes of JSON; got {len(text)}"
        raise InvalidDecisionError(msg)
    import jsonschema  # a tenth of a second: imported only when deciding

    validator = jsonschema.Draft202012Validator(dict(schema))
    problems = sorted(validator.iter_errors(json.loads(text)), key=lambda e: list(e.path))
    if problems:
        where = ".".join(str(p) for p in problems[0].path) or "arguments"
        msg = (
            f"arguments for {found.tool} do not fit its parameters: {where}: "
            f"{problems[0].message}; nothing was changed"
        )
        raise InvalidDecisionError(msg)
    return text


def _text(value: object, name: str, limit: int, *, required: bool) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value.strip()):
        msg = f"{name} must be a non-empty text; got {value!r}; nothing was changed"
        raise InvalidDecisionError(msg)
    if len(value) > limit:
        msg = f"{name} must be at most {limit} characters; got {len(value)}; nothing was changed"
        raise InvalidDecisionError(msg)
    if "\0" in value or not storable(value):
        msg = f"{name} holds a NUL character or a lone surrogate; nothing was changed"
        raise InvalidDecisionError(msg)
    return legible(value) if name == "by" else value


# -- the VersionedPart ----------------------------------------------------------


class ApprovalPart:
    """How approvals follow rollback, fork, prune and delete (see the module docstring)."""

    def rollback(self, conn: Conn, agent_id: str, to_version: int, new_version: int) -> None:
        """Cancel suspensions begun after ``to_version``; ask again those it holds."""
        note = f"rolled back to version {to_version}"
        conn.execute(
            """
            UPDATE approvals SET status = 'cancelled', ended_in = ?3, note = ?4
             WHERE agent_id = ?1 AND suspended_in > ?2 AND ended_in IS NULL
            """,
            (agent_id, to_version, new_version, note),
        )
        conn.execute(
            """
            UPDATE approvals SET status = 'pending', ended_in = NULL, decided_at = NULL,
                   decided_by = NULL, decided_arguments = NULL, note = ?3
             WHERE agent_id = ?1 AND suspended_in <= ?2 AND ended_in > ?2
               AND status IN ('approved', 'denied')
            """,
            (agent_id, to_version, f"asked again: {note}"),
        )
        conn.execute(  # decisions no longer stand: no resumption waits for them
            """
            UPDATE alarms SET status = 'cancelled', ended_in = ?2, last_error = ?3,
                   lease_owner = NULL, lease_token = NULL, updated_at = ?4
             WHERE agent_id = ?1 AND kind = 'resume' AND ended_in IS NULL
            """,
            (agent_id, new_version, note, time.time()),
        )

    def fork(
        self, conn: Conn, agent_id: str, version: int, new_agent_id: str, sealer: Sealer
    ) -> None:
        """Refuse a version that holds a suspended turn; there is nothing else to copy."""
        held = conn.execute(
            """
            SELECT conversation, suspended_in FROM approvals
             WHERE agent_id = ?1 AND suspended_in <= ?2 AND (ended_in IS NULL OR ended_in > ?2)
               AND status <> 'cancelled' LIMIT 1
            """,
            (agent_id, version),
        ).fetchone()
        if held is not None:
            conversation, suspended_in = held
            msg = (
                f"version {version} of {agent_id!r} holds a turn suspended for approval "
                f"(conversation {conversation!r}, since version {suspended_in}); fork version "
                f"{suspended_in - 1} or one after the turn resumed. Nothing was written."
            )
            raise DurableError(msg)

    def prune(self, conn: Conn, agent_id: str, keep_from: int) -> None:
        """Delete the approvals of suspensions that ended at or before ``keep_from``."""
        conn.execute(
            "DELETE FROM approvals WHERE agent_id = ? AND ended_in <= ?", (agent_id, keep_from)
        )

    def delete(self, conn: Conn, agent_id: str) -> None:
        """Delete every approval of the agent."""
        conn.execute("DELETE FROM approvals WHERE agent_id = ?", (agent_id,))
