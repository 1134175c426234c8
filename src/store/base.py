"""What the Store's groups of methods use of one another, declared once for mypy.

:class:`~effectful_durable.Store` is assembled from one mixin per concern
(``reads.py``, ``turns.py``, ``maintenance.py``, ``agent_parts.py``, and
``journal.py``'s workflow journal) on top of the connections and locks of
``store.py``. Each mixin subclasses :class:`StoreBase` to see the rest, and the
helpers that work on a whole Store (``retention.py``, ``copy.py``,
``alarm_queue.py``) take a StoreBase, so that nothing imports ``store.py`` back.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import apsw

from .engine.seam import Conn

if TYPE_CHECKING:
    from .engine.seam import Database
    from .engine.sqlite.damage import DamageWatch
    from .parts.versioned import VersionedPart
    from .records import AgentRecord
    from .workspace.cache import WorkspaceCache


class StoreBase:
    """The attributes and internal methods of a Store, as its mixins see them."""

    if TYPE_CHECKING:
        path: str
        readonly: bool
        busy_timeout: float
        _db: Database
        _damage: DamageWatch
        _workspaces: WorkspaceCache

        @property
        def _parts(self) -> tuple[VersionedPart, ...]: ...

        def _connection(self) -> apsw.Connection: ...

        def _reading(self) -> AbstractContextManager[Conn]: ...

        def _writing(self) -> AbstractContextManager[Conn]: ...

        def _fenced_writing(self, agent_id: str) -> AbstractContextManager[Conn]: ...

        def _holding(self, agent_id: str) -> AbstractContextManager[Conn]: ...

        def agent_lock(
            self, agent_id: str, *, wait: float = 0.0
        ) -> AbstractContextManager[None]: ...

        def agents(self) -> list[AgentRecord]: ...

        def _store_at(self, path: str) -> AbstractContextManager[StoreBase]: ...

        def _checked_version(self, conn: Conn, agent_id: str, version: int | None) -> int: ...

        def _checked_rows_of(
            self,
            conn: Conn,
            agent_id: str,
            version: int | None,
            table: str,
            where: str,
            *params: Any,
        ) -> int: ...

        def _insert_version(
            self,
            conn: Conn,
            agent_id: str,
            version: int,
            *,
            kind: str,
            template: str | None,
            state: str | None,
            added: int,
            removed: int,
            detail: Mapping[str, Any] | None,
            conversation: str | None = None,
        ) -> None: ...
