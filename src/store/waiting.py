"""The Store's methods for what agents wait for: approvals and events (SQL in their parts)."""

from __future__ import annotations

import getpass
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ..errors import NotFoundError
from .base import StoreBase
from .ids import DEFAULT_CONVERSATION
from .journal import step_number
from .parts import approvals as _approvals
from .parts import events as _events
from .parts.events import EventInfo
from .records import ApprovalInfo, ApprovalStatus, DecisionPage, Suspension


class WaitingMethods(StoreBase):
    """The approval and event methods of :class:`~effectful_durable.Store` (a base of it)."""

    # -- approvals (SQL in parts/approvals.py) ----------------------------------

    def approvals(
        self, agent_id: str | None = None, *, status: ApprovalStatus | None = "pending"
    ) -> list[ApprovalInfo]:
        """The approvals (of one agent) with ``status`` (None: all of them), oldest first.

        .. versionadded:: 0.2.0
        """
        with self._reading() as conn:
            return _approvals.listed(conn, agent_id=agent_id, status=status)

    def unresumed_approvals(self) -> list[ApprovalInfo]:
        """Every approval whose suspended turn has not resumed yet, decided or not, oldest
        first: one indexed read (what ``effectful-durable check --agents`` looks at).

        .. versionadded:: 0.2.0
        """
        with self._reading() as conn:
            return _approvals.unresumed(conn)

    def approval(self, approval_id: str) -> ApprovalInfo:
        """One approval, by its id.

        Raises:
            NotFoundError: No approval has that id.

        .. versionadded:: 0.2.0
        """
        with self._reading() as conn:
            found = _approvals.one(conn, approval_id)
        if found is None:
            raise _unknown(approval_id)
        return found

    def approval_parameters(self, approval_id: str) -> dict[str, Any]:
        """The JSON schema of the tool's parameters, as the model was offered it, that
        edited arguments of the approval must fit (:meth:`approve` checks them).

        Raises:
            NotFoundError: No approval has that id.

        .. versionadded:: 0.2.0
        """
        with self._reading() as conn:
            found = _approvals.parameters(conn, approval_id)
        if found is None:
            raise _unknown(approval_id)
        return found

    def decisions(
        self,
        *,
        status: ApprovalStatus | None = None,
        by: str | None = None,
        agent_text: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        page: int = 1,
        per_page: int = 50,
    ) -> DecisionPage:
        """The approvals no longer pending, newest decision first, filtered: the audit trail.

        Args:
            status: Keep only ``"approved"``, ``"denied"`` or ``"cancelled"`` ones
                (cancelled: a rollback undid the turn that asked).
            by: Keep those decided by this name, in any case.
            agent_text: Keep those of agents whose id holds this text, in any case.
            since: Keep those decided at or after this moment (an aware datetime).
            until: Keep those decided before this moment.
            page: The page, from 1.
            per_page: Decisions per page, from 1 to 500.

        Raises:
            ValueError: ``status`` is ``"pending"`` or unknown, or a page out of range.

        .. versionadded:: 0.2.0
        """
        if status is not None and status not in ("approved", "denied", "cancelled"):
            msg = f"status must be 'approved', 'denied' or 'cancelled'; not {status!r}"
            raise ValueError(msg)
        if page < 1 or not 1 <= per_page <= 500:
            msg = f"page must be >= 1 and per_page from 1 to 500; not {page} and {per_page}"
            raise ValueError(msg)
        with self._reading() as conn:
            found, total = _approvals.decided(
                conn,
                status=status,
                by=by,
                agent_text=agent_text,
                since=None if since is None else since.timestamp(),
                until=None if until is None else until.timestamp(),
                limit=per_page,
                offset=(page - 1) * per_page,
            )
        return DecisionPage(found, total, page, per_page)

    def approve(
        self,
        approval_id: str,
        *,
        by: str | None = None,
        arguments: Mapping[str, Any] | None = None,
        note: str | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> ApprovalInfo:
        """Approve a tool call that waits: the suspended turn may then run it, once.

        Args:
            approval_id: The approval, as :meth:`approvals` lists it.
            by: Who decides (default: the operating system's user name); kept.
            arguments: Run the tool with these instead of the model's: a JSON
                object that must fit the tool's parameters. The model is told.
            note: A note kept with the decision, shown to the model.
            parameters: The JSON schema of the tool's parameters in the code that
                will resume the turn, which the arguments must fit instead of the
                schema stored when the turn suspended (:meth:`approval_parameters`);
                it is stored in its place. ``effectful-durable approve --agents``
                finds it in the new code.

        Returns:
            The approval, decided. Once the last approval of its turn is decided, a
            runner resumes the turn (a workflow's turn: the workflow's next run).

        Raises:
            NotFoundError: No approval has that id.
            InvalidDecisionError: It was decided already, or cancelled by a
                rollback, or ``arguments`` do not fit. Nothing was changed.

        .. versionadded:: 0.2.0
        """
        return self._decide(
            approval_id,
            approve=True,
            by=by,
            note=note,
            arguments=arguments,
            parameters=parameters,
        )

    def deny(self, approval_id: str, *, reason: str, by: str | None = None) -> ApprovalInfo:
        """Deny a tool call that waits: the model reads ``reason`` as the tool's result.

        Raises:
            NotFoundError: No approval has that id.
            InvalidDecisionError: It was decided already, or cancelled, or the
                reason is empty or not text. Nothing was changed.

        .. versionadded:: 0.2.0
        """
        return self._decide(
            approval_id, approve=False, by=by, note=reason, arguments=None, parameters=None
        )

    def retarget_approval(
        self,
        approval_id: str,
        *,
        tool: str,
        arguments: Mapping[str, Any],
        parameters: Mapping[str, Any],
        by: str | None = None,
    ) -> ApprovalInfo:
        """Make an approval name ``tool`` (and ``arguments``) instead: new code renamed
        its tool, or changed what it takes.

        When the suspended turn resumes, the model's call is replayed, and
        committed, as a call of ``tool`` with ``arguments``, which is what an
        approval then lets run. Use it after ``effectful-durable check`` reports an
        approval whose tool is gone or whose arguments no longer fit
        (``effectful-durable retarget`` finds ``parameters``, the new tool's JSON
        schema, in the new code). An approval that was approved, and whose turn
        has not resumed, waits for a decision again: the decision was about
        another call.

        Raises:
            NotFoundError: No approval has that id.
            InvalidDecisionError: It is denied, cancelled or used already, or
                ``arguments`` do not fit ``parameters``. Nothing was changed.
            AgentInUseError: It was approved and a turn of the agent is running,
                or a runner is resuming its turn now.

        .. versionadded:: 0.2.0
        """
        with self._reading() as conn:
            found = _approvals.one(conn, approval_id)
        # An approved call's turn may be resuming: hold the agent, as that turn does.
        approved = found is not None and found.status == "approved"
        writing = self._holding(found.agent_id) if found and approved else self._writing()
        with writing as conn:
            found = _approvals.one(conn, approval_id)
            if found is not None:
                self._db.serialize(conn, "approvals", found.agent_id)
            return _approvals.retarget(
                conn,
                approval_id,
                tool=tool,
                arguments=arguments,
                parameters=parameters,
                by=getpass.getuser() if by is None else by,
            )

    def _decide(
        self,
        approval_id: str,
        *,
        approve: bool,
        by: str | None,
        note: str | None,
        arguments: Mapping[str, Any] | None,
        parameters: Mapping[str, Any] | None,
    ) -> ApprovalInfo:
        with self._writing() as conn:
            found = _approvals.one(conn, approval_id)
            if found is not None:  # deciders of one turn's approvals go one at a time
                self._db.serialize(conn, "approvals", found.agent_id)
            return _approvals.decide(
                conn,
                approval_id,
                approve=approve,
                by=getpass.getuser() if by is None else by,
                note=note,
                arguments=arguments,
                parameters=parameters,
                now=time.time(),
            )

    def suspension(
        self, agent_id: str, conversation: str = DEFAULT_CONVERSATION
    ) -> Suspension | None:
        """The conversation's suspended turn, if one waits (decided or not).

        .. versionadded:: 0.2.0
        """
        with self._reading() as conn:
            return _approvals.open_suspension(conn, agent_id, conversation)

    # -- events (SQL in parts/events.py) -------------------------------------------

    def send_event(
        self,
        agent_id: str,
        name: str,
        payload: Any = None,
        *,
        key: str | None = None,
        create: bool = False,
    ) -> EventInfo:
        """Send an event to an agent: a runner delivers it as a turn (``on_event``).

        If a workflow step waits for an event of that name for that agent, the
        event is that step's result instead, in this same transaction.

        Args:
            agent_id: The agent the event is for.
            name: What happened (``"payment_received"``): printable text.
            payload: Any JSON value, at most 64 KiB as JSON.
            key: An idempotency key: sending again with the same key (a retried
                sender) returns the first event and sends nothing.
            create: Accept an agent id the database does not know yet (the
                runner's agent factory builds it). Default: refuse it.

        Raises:
            InvalidEventError: The id, name, payload or key is not valid, or the key
                was used for another event. Nothing was sent.
            NotFoundError: No such agent, and ``create`` is False.

        .. versionadded:: 0.2.0
        """
        payload_json = _events.check_event(agent_id, name, payload, key)
        with self._writing() as conn:
            self._db.serialize(conn, "events", agent_id)
            event, _ = _events.send(
                conn, agent_id, name, payload_json, key, create=create, now=time.time()
            )
        return event

    def events(
        self, agent_id: str | None = None, *, include_delivered: bool = False
    ) -> list[EventInfo]:
        """The events (of one agent), oldest first: pending and dead ones, unless asked.

        .. versionadded:: 0.2.0
        """
        with self._reading() as conn:
            return _events.listed(conn, agent_id, include_delivered=include_delivered)

    def wait_event(
        self, workflow: str, step_key: str, agent_id: str, name: str, timeout: float
    ) -> tuple[bool, str | None, float]:
        """Begin or look again at a workflow step that waits for an event (the handler's).

        Returns:
            ``(done, result JSON, deadline)``; see ``parts/events.py``'s ``wait``.
        """
        now = time.time()
        with self._writing() as conn:
            self._db.serialize(conn, "workflow", workflow)
            self._db.serialize(conn, "events", agent_id)
            number = step_number(conn, workflow, step_key)
            return _events.wait(conn, workflow, step_key, number, agent_id, name, timeout, now)


def _unknown(approval_id: str) -> NotFoundError:
    return NotFoundError(f"no approval {approval_id!r}; Store.approvals() lists them")
