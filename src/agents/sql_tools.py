"""SQLTools: the agent's own SQL tables, as tools its model calls."""

from __future__ import annotations

from typing import Any, ClassVar

from effectful.handlers.llm import Tool
from effectful.ops.types import Operation

from ..errors import DurableError
from ..store.workspace.sandbox import SQLLimits
from ..store.workspace.schema import Declaration, parse_declaration


def _unhandled(agent: Any) -> DurableError:
    msg = (
        f"cannot run SQL for {getattr(agent, 'agent_id', agent)!r}: install "
        "PersistenceHandler to use SQLTools"
    )
    return DurableError(msg)


@Operation.define
def workspace_query(agent: Any, query: str, params: Any) -> str:
    """Run the model's read-only query on the agent's tables; PersistenceHandler answers it."""
    raise _unhandled(agent)


@Operation.define
def workspace_execute(agent: Any, statement: str, params: Any) -> str:
    """Run the model's write statement on the agent's tables; PersistenceHandler answers it."""
    raise _unhandled(agent)


@Operation.define
def workspace_insert(agent: Any, table: str, values: Any) -> str:
    """Insert the model's row into one of the agent's tables; PersistenceHandler answers it."""
    raise _unhandled(agent)


class SQLTools:
    """Give the model SQL over the agent's own tables, versioned with its turns.

    Mix it into a :class:`~effectful_durable.PersistentAgent` and declare the
    tables in ``__sql_schema__`` (CREATE TABLE and CREATE INDEX statements; every
    table needs a PRIMARY KEY). Under :class:`~effectful_durable.PersistenceHandler`
    the model gets ``sql_query``, ``sql_execute`` and ``sql_insert``, and is told
    the tables and their columns in its system message. Its writes commit with
    the turn, and :meth:`~effectful_durable.Store.rollback` and
    :meth:`~effectful_durable.Store.fork` carry the tables. Tables and columns
    added to the declaration later are created at the agent's next turn.

    Class attributes:

    * ``__sql_schema__``: the declared tables (default: none).
    * ``__sql_create_tables__``: let the model create, alter and drop tables and
      indexes of its own (default ``False``); declared tables stay protected.
    * ``__sql_limits__``: a :class:`~effectful_durable.SQLLimits`.

    Example::

        @dataclasses.dataclass
        class Tracker(PersistentAgent, SQLTools):
            \"""You track the user's runs.\"""

            __sql_schema__ = "CREATE TABLE runs (id INTEGER PRIMARY KEY, km REAL, day TEXT)"

            @Template.define
            def log(self, note: str) -> str:
                \"""Record this: {note}\"""
                raise NotHandled

    Raises:
        SQLWorkspaceError: At class definition, when ``__sql_schema__`` is not a
            valid declaration.

    .. versionadded:: 0.2.0
    """

    __sql_schema__: ClassVar[str] = ""
    __sql_create_tables__: ClassVar[bool] = False
    __sql_limits__: ClassVar[SQLLimits] = SQLLimits()
    __sql_declaration__: ClassVar[Declaration] = Declaration("")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__sql_declaration__.text != cls.__sql_schema__:
            cls.__sql_declaration__ = parse_declaration(cls.__sql_schema__, cls.__name__)

    @Tool.define
    def sql_query(self, query: str, params: list[Any] | None = None) -> str:
        """Read from your SQL tables with one SELECT statement.

        Use ? placeholders in `query` and give their values in `params`, in
        order. Returns JSON: the column names, the rows, and a note when the
        result was cut at the row or size limit. Your tables are listed in the
        system message.
        """
        return str(workspace_query(self, query, params))

    @Tool.define
    def sql_execute(self, statement: str, params: list[Any] | None = None) -> str:
        """Change your SQL tables with one INSERT, UPDATE or DELETE statement.

        Use ? placeholders in `statement` and give their values in `params`, in
        order. The change is saved when your turn completes. A statement that
        fails changes nothing, and you get the error.
        """
        return str(workspace_execute(self, statement, params))

    @Tool.define
    def sql_insert(self, table: str, values: dict[str, Any]) -> str:
        """Insert one row into one of your SQL tables.

        `values` maps column names to values. Returns the number of rows
        inserted, or the error.
        """
        return str(workspace_insert(self, table, values))
