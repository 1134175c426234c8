"""An agent's state: its fields, its memory, its SQL tables by page, and a read-only query."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ...errors import SQLWorkspaceError
from ...store.workspace.workspace import jsonable
from . import number, render, required, store_of, text

#: Rows per page of a table.
PER_PAGE = 50
#: The most rows a query shows.
QUERY_ROWS = 500


def state(request: Request) -> Response:
    """``/state?id=``: fields, memory keys and notes, the SQL tables, and a query form."""
    store = store_of(request)
    agent_id = required(request, "id")
    version = number(request, "version")
    conversation = text(request, "conversation") or "default"
    query = text(request, "sql")
    result = error = None
    if query:
        try:
            found = store.sql(agent_id, query, version=version)
            rows = [[jsonable(v) for v in row] for row in found.rows[:QUERY_ROWS]]
            result = {"columns": found.columns, "rows": rows, "total": len(found.rows)}
        except SQLWorkspaceError as refused:
            error = str(refused)
    context = {
        "agent_id": agent_id,
        "version": version,
        "latest": store.version_page(agent_id, limit=1)[0].version,
        "conversation": conversation,
        "conversations": store.conversations(agent_id, version),
        "fields": store.state(agent_id, version, conversation=conversation),
        "memory": store.memory(agent_id, version),
        "notes": store.memory_notes(agent_id, version),
        "tables": store.sql_tables(agent_id, version),
        "query": query,
        "result": result,
        "error": error,
        "query_rows": QUERY_ROWS,
    }
    return render(request, "state.html", context)


def table(request: Request) -> Response:
    """``/table?id=&name=``: one page of the rows of one of the agent's SQL tables."""
    store = store_of(request)
    agent_id = required(request, "id")
    name = required(request, "name")
    version = number(request, "version")
    page = number(request, "page", 1) or 1
    found = store.table_page(agent_id, name, version=version, page=page, per_page=PER_PAGE)
    rows = [[jsonable(v) for v in row] for row in found.rows]
    context = {"agent_id": agent_id, "version": version, "found": found, "rows": rows}
    return render(request, "table.html", context)
