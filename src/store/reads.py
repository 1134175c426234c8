"""The Store's reads of agents, histories, state, versions, handoffs and conversations."""

from __future__ import annotations

import json
from typing import Any

from ..errors import NotFoundError
from . import retention
from .base import StoreBase
from .browse import VERSION_SELECT, version_info
from .engine.seam import Conn
from .ids import DEFAULT_CONVERSATION, validate_agent_id, validate_conversation_id
from .inflight import AgentInFlight, read_in_flight
from .parts import conversation_fields
from .parts import conversations as _conversations
from .records import AgentRecord, ConversationInfo, Handoff, VersionInfo
from .rows import (
    code_version_in,
    current_version,
    decode_messages,
    state_at,
    storable,
    trace_in,
    utc,
)
from .turns import HANDOFF_SELECT, handoff_of


class StoreReads(StoreBase):
    """The read methods of :class:`~effectful_durable.Store` (a base of it)."""

    def agents(self) -> list[AgentRecord]:
        """Every agent in the database, by id."""
        with self._reading() as conn:
            rows: list[tuple[Any, ...]] = conn.execute(
                """
                SELECT agent_id, version, created_at, updated_at,
                       (SELECT count(*) FROM messages AS m
                         WHERE m.agent_id = a.agent_id AND m.removed_in IS NULL)
                  FROM checked_agents AS a ORDER BY agent_id
                """
            ).fetchall()
        return [
            AgentRecord(agent_id, version, messages, utc(created), utc(updated))
            for agent_id, version, created, updated, messages in rows
        ]

    def history(
        self,
        agent_id: str,
        version: int | None = None,
        *,
        conversation: str = DEFAULT_CONVERSATION,
        include_compacted: bool = False,
        code_versions: bool = False,
    ) -> list[dict[str, Any]]:
        """One conversation's active messages, in order, at ``version`` (default: latest).

        With ``include_compacted``, the originals that compactions replaced are
        included too, in their places, so nothing the agent ever saw is missing.
        Each of them carries ``"durable": {"compacted_in": <version>}``, and each
        summary ``"durable": {"summary_of": <number of messages>}``.

        Args:
            agent_id: The agent.
            version: The version to read; the latest by default.
            conversation: The conversation; the default one unless named. The
                default conversation of an agent that never used it is empty.
            include_compacted: Include the originals compactions replaced.
            code_versions: Mark each message whose turn was committed with a
                ``code_version`` with it: ``"durable": {"code_version": ...}``.

        Raises:
            NotFoundError: No such agent or version, or no such conversation at
                that version.

        .. versionchanged:: 0.2.0
           ``conversation`` and ``code_versions``.
        """
        with self._reading() as conn:
            version = self._checked_rows_of(
                conn,
                agent_id,
                version,
                "messages",
                "conversation = ? AND added_in <= ?",
                conversation,
                version,
            )
            self._checked_conversation(conn, agent_id, conversation, version)
            marks = self._code_version_marks(conn, agent_id) if code_versions else {}
            if not include_compacted:
                bodies = conn.execute(
                    """
                    SELECT body, added_in FROM checked_messages
                     WHERE agent_id = ?1 AND conversation = ?3 AND added_in <= ?2
                       AND (removed_in IS NULL OR removed_in > ?2)
                     ORDER BY position
                    """,
                    (agent_id, version, conversation),
                ).fetchall()
                messages = decode_messages(body for body, _ in bodies)
                for message, (_, added_in) in zip(messages, bodies, strict=True):
                    _mark_code_version(message, marks.get(added_in))
                return messages
            # Which originals a compaction replaced is read from the compactions rows.
            self._db.check_rows(conn, "compactions", "agent_id = ?", (agent_id,))
            rows: list[tuple[Any, ...]] = conn.execute(
                """
                SELECT m.body, c.version, s.messages, m.added_in FROM checked_messages AS m
                  LEFT JOIN compactions AS c
                    ON c.agent_id = m.agent_id AND c.version = m.removed_in
                   AND m.position BETWEEN c.first_position AND c.last_position
                  LEFT JOIN checked_compactions AS s
                    ON s.agent_id = m.agent_id AND s.version = m.added_in
                   AND s.summary_id = m.message_id
                 WHERE m.agent_id = ?1 AND m.conversation = ?3 AND m.added_in <= ?2
                   AND (m.removed_in IS NULL OR m.removed_in > ?2 OR c.version IS NOT NULL)
                 ORDER BY m.position, m.added_in
                """,
                (agent_id, version, conversation),
            ).fetchall()
        messages = decode_messages(body for body, _, _, _ in rows)
        for message, (_, compacted_in, summary_of, added_in) in zip(messages, rows, strict=True):
            if compacted_in is not None:
                message["durable"] = {"compacted_in": compacted_in}
            elif summary_of is not None:
                message["durable"] = {"summary_of": summary_of}
            _mark_code_version(message, marks.get(added_in))
        return messages

    def _code_version_marks(self, conn: Conn, agent_id: str) -> dict[int, str]:
        """The code version of each of the agent's versions committed with one."""
        rows = conn.execute(
            "SELECT version, detail FROM checked_versions "
            "WHERE agent_id = ? AND detail IS NOT NULL",
            (agent_id,),
        )
        found = ((version, code_version_in(detail)) for version, detail in rows)
        return {version: code for version, code in found if code is not None}

    def search_compacted(
        self,
        agent_id: str,
        query: str,
        limit: int = 5,
        *,
        conversation: str = DEFAULT_CONVERSATION,
    ) -> list[dict[str, Any]]:
        """Compacted messages of one conversation that match ``query``, best match first.

        Every word of ``query`` must occur (stemmed, case-insensitive), through
        SQLite's FTS5 full-text index (PostgreSQL's full-text search on
        PostgreSQL). Other conversations are never searched.

        Raises:
            InvalidAgentIdError: ``agent_id`` is not a valid agent id.
            InvalidConversationIdError: ``conversation`` is not a valid conversation id.

        .. versionchanged:: 0.2.0
           ``conversation``.
        """
        validate_agent_id(agent_id)  # PostgreSQL's text cannot even hold some invalid ids
        validate_conversation_id(conversation)
        words = query.replace("\0", " ").split()
        if not words or not storable(" ".join(words)):  # a lone surrogate is in no stored text
            return []
        with self._reading() as conn:
            bodies = self._db.search_compacted(conn, agent_id, words, limit, conversation)
        return decode_messages(bodies)

    def state(
        self,
        agent_id: str,
        version: int | None = None,
        *,
        conversation: str = DEFAULT_CONVERSATION,
    ) -> dict[str, Any]:
        """The agent's persisted fields as JSON values, at ``version`` (default: latest).

        The shared fields, and the values ``conversation`` holds of the fields
        declared :func:`~effectful_durable.per_conversation` (absent until a turn
        in it stored them).

        Raises:
            NotFoundError: No such agent or version.

        .. versionchanged:: 0.2.0
           ``conversation``.
        """
        validate_conversation_id(conversation)
        with self._reading() as conn:
            version = self._checked_version(conn, agent_id, version)
            state = state_at(conn, agent_id, version)
            own = conversation_fields.state_at(conn, agent_id, conversation, version)
        values: dict[str, Any] = json.loads(state) if state is not None else {}
        return values | json.loads(own) if own is not None else values

    def versions(self, agent_id: str) -> list[VersionInfo]:
        """Every committed version of the agent, oldest first.

        Raises:
            NotFoundError: No such agent.
        """
        with self._reading() as conn:
            self._checked_version(conn, agent_id, None)
            rows: list[tuple[Any, ...]] = conn.execute(
                f"{VERSION_SELECT} WHERE agent_id = ? ORDER BY version", (agent_id,)
            ).fetchall()
        return [version_info(agent_id, row) for row in rows]

    def _version_trace(self, agent_id: str, version: int) -> str | None:
        """The ``traceparent`` of the traced turn that committed ``version``, if any."""
        with self._reading() as conn:
            row = conn.execute(
                "SELECT detail FROM checked_versions WHERE agent_id = ? AND version = ?",
                (agent_id, version),
            ).fetchone()
        return trace_in(row[0]) if row else None

    def agent_count(self) -> int:
        """How many agents the database holds: one read.

        .. versionadded:: 0.2.0
        """
        with self._reading() as conn:
            return int(conn.execute("SELECT count(*) FROM agents").get)

    def agent_ids(self, *, after: str | None = None, limit: int = 500) -> list[str]:
        """A page of agent ids, in order: those after ``after`` (from the start if None).

        Read the next page with ``after`` set to the last id of this one; each page
        is one indexed read, however many agents the database holds.

        .. versionadded:: 0.2.0
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            msg = f"limit must be an int >= 1, not {limit!r}"
            raise ValueError(msg)
        with self._reading() as conn:
            if after is None:
                rows = conn.execute(
                    "SELECT agent_id FROM checked_agents ORDER BY agent_id LIMIT ?", (limit,)
                )
            else:
                rows = conn.execute(
                    "SELECT agent_id FROM checked_agents WHERE agent_id > ? "
                    "ORDER BY agent_id LIMIT ?",
                    (after, limit),
                )
            return [agent_id for (agent_id,) in rows]

    def in_flight(self, agent_ids: list[str]) -> list[AgentInFlight]:
        """What the agents ``agent_ids`` hold at their latest versions, as a check reads it:
        their fields, their conversations' tool calls and results, their memory's keys,
        their code version. Pass a page of :meth:`agent_ids`: each read takes the range
        from the first id to the last.

        Eight set-wise reads for all of them (at most 1,000 ids a call), however
        long their histories: only the tool calls of their active messages, and the
        first and last 400 characters of each tool result. Agents the database does
        not hold are left out.

        .. versionadded:: 0.2.0
        """
        if len(agent_ids) > _IN_LIST:
            msg = f"in_flight reads at most {_IN_LIST} agents a call, not {len(agent_ids)}"
            raise ValueError(msg)
        if not agent_ids:
            return []
        with self._reading() as conn:
            return read_in_flight(conn, agent_ids)

    def code_versions(self, agent_ids: list[str]) -> dict[str, str | None]:
        """The ``code_version`` each agent's latest turn was committed with (None: not said).

        One read for all of ``agent_ids`` (see ``PersistenceHandler(code_version=...)``).

        .. versionadded:: 0.2.0
        """
        found: dict[str, str | None] = dict.fromkeys(agent_ids)
        for start in range(0, len(agent_ids), _IN_LIST):
            chunk = agent_ids[start : start + _IN_LIST]
            marks = ", ".join("?" * len(chunk))
            with self._reading() as conn:
                rows = conn.execute(
                    f"""
                    SELECT agent_id, detail FROM checked_versions
                     WHERE (agent_id, version) IN (
                        SELECT agent_id, max(version) FROM versions
                         WHERE agent_id IN ({marks}) AND kind = 'turn' GROUP BY agent_id)
                    """,
                    chunk,
                ).fetchall()
            for agent_id, detail in rows:
                found[agent_id] = code_version_in(detail)
        return found

    def handoffs(self) -> list[Handoff]:
        """Turns that started and did not commit: running, crashed or failed."""
        with self._reading() as conn:
            rows = conn.execute(f"{HANDOFF_SELECT} ORDER BY agent_id, conversation").fetchall()
        return [handoff_of(row) for row in rows]

    def conversations(self, agent_id: str, version: int | None = None) -> list[ConversationInfo]:
        """The agent's conversations at ``version`` (default: the latest), by id.

        Raises:
            NotFoundError: No such agent or version.

        .. versionadded:: 0.2.0
        """
        with self._reading() as conn:
            checked, current = self._checked_rows_and_current(
                conn, agent_id, version, "conversations", "added_in <= ?", version
            )
            return _conversations.listed(conn, agent_id, checked, latest=checked == current)

    def _checked_rows_of(
        self, conn: Conn, agent_id: str, version: int | None, table: str, where: str, *params: Any
    ) -> int:
        """:meth:`_checked_version`, for a read that chooses rows of ``table`` by their
        version marks: at an earlier version, every row ``where`` (after ``agent_id =
        ?``) selects is checked first, so that a damaged mark refuses the read rather
        than leaves a row out (the latest version's rows are found by an index)."""
        return self._checked_rows_and_current(conn, agent_id, version, table, where, *params)[0]

    def _checked_rows_and_current(
        self, conn: Conn, agent_id: str, version: int | None, table: str, where: str, *params: Any
    ) -> tuple[int, int]:
        """:meth:`_checked_rows_of`, and the latest version."""
        checked, current = self._checked_and_current(conn, agent_id, version)
        if checked < current:
            self._db.check_rows(conn, table, f"agent_id = ? AND {where}", (agent_id, *params))
        return checked, current

    def _checked_version(self, conn: Conn, agent_id: str, version: int | None) -> int:
        return self._checked_and_current(conn, agent_id, version)[0]

    def _checked_and_current(
        self, conn: Conn, agent_id: str, version: int | None
    ) -> tuple[int, int]:
        """``version`` (the latest when None), checked to exist, and the latest version."""
        current = current_version(conn, validate_agent_id(agent_id))
        if current is None:
            raise NotFoundError(no_agent(agent_id, self._db.location))
        if version is None:
            return current, current
        if not 1 <= version <= current:
            msg = f"agent {agent_id!r} has no version {version}; it has versions 1 to {current}"
            raise NotFoundError(msg)
        if version < current and version < (kept := retention.kept_from(conn, agent_id)):
            msg = (
                f"version {version} of agent {agent_id!r} was pruned; it keeps "
                f"versions {kept} to {current}"
            )
            raise NotFoundError(msg)
        return version, current

    def _checked_conversation(
        self, conn: Conn, agent_id: str, conversation: str, version: int
    ) -> None:
        if conversation == DEFAULT_CONVERSATION:
            return  # an agent that never used it has it empty
        validate_conversation_id(conversation)
        if not _conversations.exists(conn, agent_id, conversation, version):
            raise NotFoundError(no_conversation(agent_id, conversation, version))


# Ids bound in one ``IN (...)`` list: far below SQLite's 32,766 and PostgreSQL's 65,535.
_IN_LIST = 1000


def _mark_code_version(message: dict[str, Any], code_version: str | None) -> None:
    if code_version is not None:
        message["durable"] = {**message.get("durable", {}), "code_version": code_version}


def no_conversation(agent_id: str, conversation: str, version: int) -> str:
    return (
        f"agent {agent_id!r} has no conversation {conversation!r} at version {version}; "
        "Store.conversations() lists the ones it has"
    )


def no_agent(agent_id: str, path: str) -> str:
    return f"no agent {agent_id!r} in {path}; Store.agents() lists the agents it holds"
