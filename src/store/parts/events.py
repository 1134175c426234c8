"""Events: messages from the outside world to an agent's inbox, and workflows that wait for them.

An event is a row of the runners' queue (``alarms``, kind ``'event'``; see
``engine/sqlite/schema.sql``): its name in ``topic``, its JSON payload in
``action``. It goes to exactly one consumer. If a workflow step waits for an
event of that name for that agent (:func:`wait`), the event is the step's result,
in the transaction that sends it; otherwise a runner delivers it as a turn of
the agent (``on_event(name, payload)``), marked done in that turn's commit, with
the leases, retries and dead events that alarms have.

The inbox belongs to the world, not to the agent's versions: a rollback leaves
it as it is (an event delivered stays delivered; its turn is undone), and a fork
starts with an empty one. An event's row goes when prune removes the versions up
to its delivery; its idempotency key is remembered as long as the row is kept.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, NoReturn

from ...errors import InvalidEventError, NotFoundError
from ..engine.seam import Conn
from ..ids import validate_agent_id
from ..rows import dumps, storable, utc
from ..sealing import PLAIN, Sealer
from .alarms import current_version, opened_action, sealed_action
from .steps import opened_step, sealed_step

#: Longest event name.
MAX_NAME = 200
#: Longest idempotency key.
MAX_KEY = 200
#: Largest JSON text of a payload.
MAX_PAYLOAD = 64 * 1024
#: What a workflow step that waits for event ``name`` is recorded as, in its journal.
WAIT_PREFIX = "event:"

type EventStatus = Literal["pending", "dead", "done", "cancelled"]


@dataclass(frozen=True, slots=True)
class EventInfo:
    """One event of an agent's inbox.

    ``status`` is ``"pending"`` (waiting for a runner), ``"dead"`` (its delivery
    failed ``attempts`` times; re-arm it as an alarm), or ``"done"``: delivered
    as the turn that committed ``delivered_in``, or taken by the workflow step
    ``taken_by`` (``"workflow/step key"``).

    .. versionadded:: 0.2.0
    """

    event_id: str
    agent_id: str
    name: str
    payload: Any
    status: EventStatus
    sent_at: datetime
    delivered_in: int | None
    attempts: int
    last_error: str | None
    taken_by: str | None


def event_id(agent_id: str, key: str | None) -> str:
    """The event's id: derived from its idempotency key, so that a retried send finds it."""
    if key is None:
        return "evt_" + secrets.token_hex(8)
    digest = hashlib.blake2b(f"{agent_id}\0{key}".encode(), digest_size=10).hexdigest()
    return f"evt_{digest}"


def check_event(agent_id: object, name: object, payload: object, key: object) -> str:
    """The payload as JSON text, if the event is one the database can hold.

    Raises:
        InvalidEventError: The agent id, name, payload or key is not valid.
    """
    try:
        validate_agent_id(agent_id)
    except ValueError as e:
        _invalid(str(e))
    _check_text(name, "name", MAX_NAME)
    if key is not None:
        _check_text(key, "key", MAX_KEY)
    try:
        text = json.dumps(payload, ensure_ascii=False, allow_nan=False, sort_keys=True)
    except (TypeError, ValueError) as e:
        _invalid(f"the payload must be JSON values (objects, lists, text, numbers): {e}")
    if not storable(text) or "\0" in text:
        text = json.dumps(payload, ensure_ascii=True, allow_nan=False, sort_keys=True)
    size = len(text.encode())
    if size > MAX_PAYLOAD:
        _invalid(f"the payload must be at most {MAX_PAYLOAD} bytes as JSON; got {size}")
    return text


def send(
    conn: Conn,
    agent_id: str,
    name: str,
    payload_json: str,
    key: str | None,
    *,
    create: bool,
    now: float,
    sealer: Sealer = PLAIN,
) -> tuple[EventInfo, bool]:
    """Put the event in the agent's inbox, or give it to the workflow step waiting for it.

    Returns:
        The event, and whether it is new (False: its key was sent before).

    Raises:
        NotFoundError: The database knows no such agent and ``create`` is False.
        InvalidEventError: The key was used before for another event of the agent.
    """
    version = current_version(conn, agent_id)
    if version == 0 and not create:
        msg = (
            f"no agent {agent_id!r} in this database; check the id (Store.agents() lists "
            "them), or pass create=True (--create) to start it with this event. Nothing was sent."
        )
        raise NotFoundError(msg)
    found_id = event_id(agent_id, key)
    if key is not None:
        earlier = _one(conn, found_id, sealer)
        if earlier is not None:
            same = (earlier.name, dumps(earlier.payload)) == (
                name,
                dumps(json.loads(payload_json)),
            )
            if not same:
                _invalid(f"key {key!r} was used for another event of {agent_id!r}: {earlier.name}")
            return earlier, False
    waiting = _waiting_step(conn, agent_id, name, now, sealer)
    conn.execute(
        """
        INSERT INTO alarms (alarm_id, created_in, agent_id, action, fire_at, due_at,
                            status, ended_in, deliveries, last_error, created_at,
                            updated_at, kind, topic)
        VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?6, ?7, ?8, ?9, ?5, ?5, 'event', ?10)
        """,
        (
            found_id,
            version,
            agent_id,
            sealed_action(sealer, agent_id, found_id, payload_json),
            now,
            "pending" if waiting is None else "done",
            None if waiting is None else version,
            0 if waiting is None else 1,
            None if waiting is None else _taken_note(*waiting),
            name,
        ),
    )
    sent = _one(conn, found_id, sealer)
    assert sent is not None
    if waiting is not None:
        _finish_wait(conn, waiting[0], waiting[1], sent, version, now, sealer)
    return sent, True


def wait(
    conn: Conn,
    workflow: str,
    step_key: str,
    number: int,
    agent_id: str,
    name: str,
    timeout: float,
    now: float,
    sealer: Sealer = PLAIN,
) -> tuple[bool, str | None, float]:
    """Begin, or look again at, a workflow step that waits for the agent's event ``name``.

    The first pending event of that name in the agent's inbox (not held by a
    runner) is taken: it is the step's result. With none, a step past its
    deadline (``timeout`` seconds from when it began waiting) ends with the
    result null.

    Returns:
        ``(done, result JSON, deadline)``: done is False while it waits.
    """
    row = conn.execute(
        """
        SELECT status, started_at FROM checked_workflow_steps WHERE workflow = ? AND step_key = ?
        """,
        (workflow, step_key),
    ).fetchone()
    if row is None or row[0] != "running":
        arguments = sealed_step(
            sealer, agent_id, None, workflow, step_key, "arguments", wait_arguments(timeout)
        )
        conn.execute(
            """
            INSERT INTO workflow_steps (workflow, step_key, number, agent_id, template,
                arguments, status, started_at)
            VALUES (?, ?, ?, ?, ?, ?, 'running', ?)
            ON CONFLICT (workflow, step_key) DO UPDATE SET
                number = excluded.number, agent_id = excluded.agent_id,
                template = excluded.template, arguments = excluded.arguments,
                status = 'running', result = NULL, started_at = excluded.started_at,
                finished_at = NULL
            """,
            (workflow, step_key, number, agent_id, WAIT_PREFIX + name, arguments, now),
        )
        started = now
    else:
        started = float(row[1])
    deadline = started + timeout
    found = conn.execute(
        """
        SELECT alarm_id FROM checked_alarms
         WHERE agent_id = ? AND ended_in IS NULL AND kind = 'event' AND topic = ?
           AND status = 'pending' AND lease_token IS NULL
         ORDER BY created_at, alarm_id LIMIT 1
        """,
        (agent_id, name),
    ).fetchone()
    version = current_version(conn, agent_id)
    if found is not None:
        event = _one(conn, found[0], sealer)
        assert event is not None
        conn.execute(  # the event may be newer than the agent's version: then it ends there
            """
            UPDATE alarms SET status = 'done', deliveries = 1, last_error = ?3, updated_at = ?4,
                   ended_in = CASE WHEN created_in > ?2 THEN created_in ELSE ?2 END
             WHERE alarm_id = ?1 AND ended_in IS NULL
            """,
            (event.event_id, version, _taken_note(workflow, step_key), now),
        )
        result = _finish_wait(conn, workflow, step_key, event, version, now, sealer)
        return True, result, deadline
    if now >= deadline:
        _end_step(conn, workflow, step_key, agent_id, "null", now, sealer)
        return True, "null", deadline
    return False, None, deadline


def _waiting_step(
    conn: Conn, agent_id: str, name: str, now: float, sealer: Sealer
) -> tuple[str, str] | None:
    """The first workflow step that waits for the agent's event ``name``, if not timed out."""
    rows = conn.execute(
        """
        SELECT workflow, step_key, arguments, started_at FROM checked_workflow_steps
         WHERE agent_id = ? AND template = ? AND status = 'running'
         ORDER BY started_at, number
        """,
        (agent_id, WAIT_PREFIX + name),
    ).fetchall()
    for workflow, step_key, arguments, started_at in rows:
        told = opened_step(sealer, agent_id, None, workflow, step_key, "arguments", arguments)
        if now < started_at + float(json.loads(told)["timeout"]):
            return workflow, step_key
    return None


def wait_arguments(timeout: float) -> str:
    """The journal's arguments of a step that waits ``timeout`` seconds for an event."""
    return dumps({"timeout": timeout})


def _taken_note(workflow: str, step_key: str) -> str:
    return f"taken by workflow {workflow!r} step {step_key}"


def _finish_wait(
    conn: Conn,
    workflow: str,
    step_key: str,
    event: EventInfo,
    version: int,
    now: float,
    sealer: Sealer,
) -> str:
    result = dumps(
        {
            "event_id": event.event_id,
            "name": event.name,
            "payload": event.payload,
            "sent_at": event.sent_at.isoformat(),
        }
    )
    _end_step(conn, workflow, step_key, event.agent_id, result, now, sealer, version)
    return result


def _end_step(
    conn: Conn,
    workflow: str,
    step_key: str,
    agent_id: str,
    result: str,
    now: float,
    sealer: Sealer,
    version: int | None = None,
) -> None:
    sealed = sealed_step(sealer, agent_id, None, workflow, step_key, "result", result)
    conn.execute(
        """
        UPDATE workflow_steps SET status = 'done', result = ?3, version = ?4, finished_at = ?5
         WHERE workflow = ?1 AND step_key = ?2
        """,
        (workflow, step_key, sealed, version, now),
    )


# -- reads ----------------------------------------------------------------------

_SELECT = """
    SELECT alarm_id, agent_id, topic, action, status, created_at, ended_in, attempts,
           last_error
      FROM checked_alarms
"""


def _info(row: tuple[Any, ...], sealer: Sealer) -> EventInfo:
    alarm_id, agent_id, name, payload, status, created_at, ended_in, attempts, note = row
    payload = opened_action(sealer, agent_id, alarm_id, "event", payload)
    taken = note if status == "done" and note and note.startswith("taken by workflow") else None
    return EventInfo(
        alarm_id,
        agent_id,
        name,
        json.loads(payload),
        status,
        utc(created_at),
        ended_in,
        attempts,
        None if taken else note,
        taken.removeprefix("taken by ") if taken else None,
    )


def _one(conn: Conn, found_id: str, sealer: Sealer) -> EventInfo | None:
    row = conn.execute(
        f"{_SELECT} WHERE alarm_id = ? AND kind = 'event' ORDER BY created_in DESC LIMIT 1",
        (found_id,),
    ).fetchone()
    return None if row is None else _info(row, sealer)


def listed(
    conn: Conn, agent_id: str | None, *, include_delivered: bool, sealer: Sealer = PLAIN
) -> list[EventInfo]:
    """The events (of one agent), oldest first; pending and dead ones unless asked."""
    where = ["kind = 'event'"]
    params: list[Any] = []
    if agent_id is not None:
        where.append("agent_id = ?")
        params.append(agent_id)
    if not include_delivered:
        where.append("ended_in IS NULL")
    rows = conn.execute(
        f"{_SELECT} WHERE {' AND '.join(where)} ORDER BY created_at, alarm_id", params
    ).fetchall()
    return sealer.listed(rows, lambda row: _info(row, sealer))


def _check_text(value: object, name: str, limit: int) -> None:
    if not isinstance(value, str) or not value.strip():
        _invalid(f"the {name} must be a non-empty text; got {value!r}")
    if len(value) > limit:
        _invalid(f"the {name} must be at most {limit} characters; got {len(value)}")
    if not value.isprintable():
        _invalid(f"the {name} must be printable text (no control characters); got {value!r}")


def _invalid(reason: str) -> NoReturn:
    raise InvalidEventError(reason)
