"""migrate_states: commit each agent's stored fields migrated to its class's state version,
as a version of its own, so that a rollback undoes it."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable

from ..agents.migrations import state_version, stored_version
from ..agents.persistent import PersistentAgent
from ..agents.state import dump_state, restore_state
from ..store import Store
from ..store.history import HistoryChange

#: The template name of the versions a migration commits.
MIGRATE_STATE = "migrate_state"


@dataclasses.dataclass(frozen=True, slots=True)
class MigratedAgent:
    """One agent whose stored fields were (or, in a dry run, would be) migrated.

    ``version`` is the version the migration committed (None in a dry run).

    .. versionadded:: 0.2.0
    """

    agent_id: str
    from_version: int
    to_version: int
    version: int | None


def migrate_states(
    db: str | os.PathLike[str] | Store,
    *,
    agents: Callable[[str], PersistentAgent],
    agent_id: str | None = None,
    dry_run: bool = False,
    code_version: str | None = None,
    page: int = 500,
) -> list[MigratedAgent]:
    """Migrate every agent's stored fields (or one agent's) to its class's state version.

    An agent whose fields were stored at an older ``__state_version__`` than its
    class (built by ``agents(agent_id)``) declares gets a new version, of template
    ``migrate_state``, whose fields are the migrated ones (see
    :func:`~effectful_durable.migrates_state`); its messages and memory are
    unchanged. Roll it back like any version. Each agent is migrated under its
    lock, in one transaction; one that fails stops the run, with the agents
    before it migrated.

    Returns:
        The agents migrated (or that would be, with ``dry_run``).

    Raises:
        StateMigrationError: An agent's fields cannot be migrated (nothing of it
            was written).
        StateSerializationError: The migrated fields do not fit the class.
        AgentInUseError: A turn of the agent is running.

    .. versionadded:: 0.2.0
    """
    store = db if isinstance(db, Store) else Store(db)
    try:
        migrated: list[MigratedAgent] = []
        for one in _agent_ids(store, agent_id, page):
            found = _migrate(store, agents(one), dry_run=dry_run, code_version=code_version)
            if found is not None:
                migrated.append(found)
        return migrated
    finally:
        if store is not db:
            store.close()


def _agent_ids(store: Store, agent_id: str | None, page: int) -> list[str]:
    if agent_id is not None:
        return [agent_id]
    ids: list[str] = []
    while batch := store.agent_ids(after=ids[-1] if ids else None, limit=page):
        ids += batch
    return ids


def _migrate(
    store: Store, agent: PersistentAgent, *, dry_run: bool, code_version: str | None
) -> MigratedAgent | None:
    target = state_version(type(agent))
    with store.agent_lock(agent.agent_id):
        loaded = store.turns.load(agent.agent_id)
        if loaded.state is None:
            return None
        found = stored_version(json.loads(loaded.state))
        if found >= target:
            return None
        restore_state(agent, loaded.state)  # migrates, and checks that the result fits
        if dry_run:
            return MigratedAgent(agent.agent_id, found, target, None)
        detail: dict[str, object] = {"migrated_state": {"from": found, "to": target}}
        if code_version is not None:
            detail["code_version"] = code_version
        version = store.turns.commit(
            agent.agent_id,
            base_version=loaded.version,
            template=MIGRATE_STATE,
            change=HistoryChange([], [], 0),
            state=dump_state(agent),
            detail=detail,
        )
    return MigratedAgent(agent.agent_id, found, target, version)
