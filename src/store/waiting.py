"""What agents wait for: approvals decided, re-targeted and audited; events sent (SQL in
the parts).

The deciders of one turn's approvals go one at a time (``Database.serialize``);
an approved call whose turn may be resuming is re-targeted under the agent's
hold, as that turn runs. :class:`~effectful_durable.Store` documents them.
"""

from __future__ import annotations

import getpass
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ..errors import NotFoundError
from .engine.seam import Database
from .holds import holding
from .parts import approvals as _approvals
from .parts import events as _events
from .parts.events import EventInfo
from .records import ApprovalInfo, ApprovalStatus, DecisionPage
from .sealing import PLAIN, Sealer


def decide(
    db: Database,
    approval_id: str,
    by: str | None,
    note: str | None,
    arguments: Mapping[str, Any] | None,
    parameters: Mapping[str, Any] | None,
    *,
    approve: bool,
    sealer: Sealer = PLAIN,
) -> ApprovalInfo:
    """Store.approve and Store.deny: decide the approval; it, decided."""
    with db.writing() as conn:
        found = _approvals.one(conn, approval_id, sealer)
        if found is not None:  # deciders of one turn's approvals go one at a time
            db.serialize(conn, "approvals", found.agent_id)
        return _approvals.decide(
            conn,
            approval_id,
            approve=approve,
            by=getpass.getuser() if by is None else by,
            note=note,
            arguments=arguments,
            parameters=parameters,
            now=time.time(),
            sealer=sealer,
        )


def retarget(
    db: Database,
    approval_id: str,
    *,
    tool: str,
    arguments: Mapping[str, Any],
    parameters: Mapping[str, Any],
    by: str | None,
    sealer: Sealer = PLAIN,
) -> ApprovalInfo:
    """Store.retarget_approval: make the approval name ``tool`` and ``arguments``."""
    with db.reading() as conn:
        found = _approvals.one(conn, approval_id, sealer)
    # An approved call's turn may be resuming: hold the agent, as that turn does.
    approved = found is not None and found.status == "approved"
    writing = holding(db, found.agent_id) if found and approved else db.writing()
    with writing as conn:
        found = _approvals.one(conn, approval_id, sealer)
        if found is not None:
            db.serialize(conn, "approvals", found.agent_id)
        return _approvals.retarget(
            conn,
            approval_id,
            tool=tool,
            arguments=arguments,
            parameters=parameters,
            by=getpass.getuser() if by is None else by,
            sealer=sealer,
        )


def decisions(
    db: Database,
    status: ApprovalStatus | None,
    by: str | None,
    agent_text: str | None,
    since: datetime | None,
    until: datetime | None,
    page: int,
    per_page: int,
    sealer: Sealer = PLAIN,
) -> DecisionPage:
    """Store.decisions: a page of the approvals no longer pending, newest decision first."""
    if status is not None and status not in ("approved", "denied", "cancelled"):
        msg = f"status must be 'approved', 'denied' or 'cancelled'; not {status!r}"
        raise ValueError(msg)
    if page < 1 or not 1 <= per_page <= 500:
        msg = f"page must be >= 1 and per_page from 1 to 500; not {page} and {per_page}"
        raise ValueError(msg)
    with db.reading() as conn:
        found, total = _approvals.decided(
            conn,
            status=status,
            by=by,
            agent_text=agent_text,
            since=None if since is None else since.timestamp(),
            until=None if until is None else until.timestamp(),
            limit=per_page,
            offset=(page - 1) * per_page,
            sealer=sealer,
        )
    return DecisionPage(found, total, page, per_page)


def send_event(
    db: Database,
    agent_id: str,
    name: str,
    payload: Any,
    *,
    key: str | None,
    create: bool,
    sealer: Sealer = PLAIN,
) -> EventInfo:
    """Store.send_event: the event sent (or the first one sent with ``key``)."""
    payload_json = _events.check_event(agent_id, name, payload, key)
    with db.writing() as conn:
        db.serialize(conn, "events", agent_id)
        event, _ = _events.send(
            conn, agent_id, name, payload_json, key, create=create, now=time.time(), sealer=sealer
        )
    return event


def unknown(approval_id: str) -> NotFoundError:
    """The error for an approval id that names none."""
    return NotFoundError(f"no approval {approval_id!r}; Store.approvals() lists them")
