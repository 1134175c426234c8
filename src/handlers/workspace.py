"""The SQL workspace side of PersistenceHandler: SQLTools' operations and system notes."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from effectful.ops.semantics import fwd
from effectful.ops.syntax import ObjectInterpretation, implements

from ..agents.sql_tools import SQLTools, workspace_execute, workspace_insert, workspace_query
from ..store.workspace.sandbox import Refused, row_limits_text
from ..store.workspace.workspace import SQLResult, WorkspaceTurn, jsonable

if TYPE_CHECKING:
    from ..store import Store
    from .turn import Turn

_PART = "workspace"
_MAX_PARAMS = 100


class WorkspaceHandling(ObjectInterpretation[Any, Any]):  # type: ignore[no-untyped-call]
    """Answer the SQL tools of SQLTools agents inside their turns (a PersistenceHandler base)."""

    store: Store

    @implements(workspace_query)  # type: ignore[untyped-decorator]
    def _workspace_query(self, agent: Any, query: str, params: Any) -> str:
        if not isinstance(agent, SQLTools):
            return fwd()  # type: ignore[no-any-return]
        return self._run_sql(agent, lambda ws, p: ws.query(query, p), params)

    @implements(workspace_execute)  # type: ignore[untyped-decorator]
    def _workspace_execute(self, agent: Any, statement: str, params: Any) -> str:
        if not isinstance(agent, SQLTools):
            return fwd()  # type: ignore[no-any-return]
        return self._run_sql(agent, lambda ws, p: ws.execute(statement, p), params)

    @implements(workspace_insert)  # type: ignore[untyped-decorator]
    def _workspace_insert(self, agent: Any, table: str, values: Any) -> str:
        if not isinstance(agent, SQLTools):
            return fwd()  # type: ignore[no-any-return]
        if not isinstance(values, Mapping):
            return _error("values must be an object of column names to values")
        checked = _checked_params(list(values.values()))
        if isinstance(checked, str):
            return checked
        row = dict(zip(values, checked, strict=True))
        return self._run_sql(agent, lambda ws, _: ws.insert(table, row), [])

    def _run_sql(self, agent: Any, run: Any, params: Any) -> str:
        checked = _checked_params(params)
        if isinstance(checked, str):
            return checked
        workspace = self._workspace(agent)
        if workspace is None:
            return _error("SQL tools work only during one of your turns")
        try:
            result: SQLResult = run(workspace, checked)
        except Refused as refused:
            return _error(str(refused))
        return _result_text(result)

    def _workspace(self, agent: Any, *, create: bool = True) -> WorkspaceTurn | None:
        """The workspace of ``agent``'s running turn, opened at its first use."""
        turn: Turn | None = self._turn_of(agent)  # type: ignore[attr-defined]
        if turn is None:
            return None
        workspace = turn.staged.get(_PART)
        if workspace is None and create:
            cls = type(agent)
            workspace = self.store.turns.workspace(
                agent.agent_id,
                declaration=cls.__sql_declaration__,
                allow_ddl=cls.__sql_create_tables__,
                limits=cls.__sql_limits__,
                owner=cls.__name__,
            )
            turn.staged[_PART] = workspace
        assert workspace is None or isinstance(workspace, WorkspaceTurn)
        return workspace

    def _tells(self, agent: Any) -> bool:
        earlier = getattr(super(), "_tells", None)
        return (earlier is not None and bool(earlier(agent))) or isinstance(agent, SQLTools)

    def _system_notes(self, turn: Turn) -> list[str]:
        earlier: list[str] = list(getattr(super(), "_system_notes", lambda _: [])(turn))
        if not isinstance(turn.agent, SQLTools):
            return earlier
        workspace = self._workspace(turn.agent)
        assert workspace is not None
        return [*earlier, _tables_note(turn.agent, workspace)]

    def _end_turn(self, turn: Turn, *, committed: bool) -> None:
        getattr(super(), "_end_turn", lambda _, **__: None)(turn, committed=committed)
        workspace = turn.staged.get(_PART)
        if isinstance(workspace, WorkspaceTurn):
            workspace.finish(committed=committed)


def _tables_note(agent: SQLTools, workspace: WorkspaceTurn) -> str:
    tables = workspace.tables()
    listed = "; ".join(table.describe() for table in tables) if tables else "none yet"
    ddl = (
        " You may also CREATE, ALTER and DROP tables and indexes of your own with "
        "sql_execute (every table needs a PRIMARY KEY)."
        if type(agent).__sql_create_tables__
        else ""
    )
    return (
        f"Your SQL tables (SQLite), kept across conversations: {listed}. Read them with "
        "sql_query and change them with sql_execute or sql_insert; changes are saved "
        f"when your turn completes. {row_limits_text(workspace.limits)}{ddl}"
    )


def _checked_params(params: Any) -> list[Any] | str:
    if params is None:
        return []
    if not isinstance(params, Sequence) or isinstance(params, str | bytes):
        return _error("params must be a list of values, one per ? placeholder")
    if len(params) > _MAX_PARAMS:
        return _error(f"at most {_MAX_PARAMS} params per statement; got {len(params)}")
    for value in params:
        if value is not None and not isinstance(value, str | int | float):
            return _error(
                f"params may hold only strings, numbers, booleans and null; got {value!r}"
            )
        if isinstance(value, float) and not math.isfinite(value):
            return _error(f"params may not hold {value!r}")
        if isinstance(value, int) and not -(2**63) <= value < 2**63:
            return _error(f"the integer {value} does not fit in 64 bits")
    return list(params)


def _error(text: str) -> str:
    return f"error: {text.rstrip('.')}. Nothing was changed by this call."


def _result_text(result: SQLResult) -> str:
    payload: dict[str, Any] = {}
    if result.columns:
        payload["columns"] = list(result.columns)
        payload["rows"] = [[jsonable(value) for value in row] for row in result.rows]
    if result.truncated:
        payload["note"] = f"result {result.truncated}; narrow the query to see the rest"
    if not result.columns or result.changes:
        payload["changes"] = result.changes
    return json.dumps(payload, ensure_ascii=False)
