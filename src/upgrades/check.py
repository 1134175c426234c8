"""check_upgrade: read every agent's in-flight work a page at a time, ask the new code
whether it carries it, dry-run the workflows, and say what it found. Writes nothing."""

from __future__ import annotations

import os
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from ..agents.persistent import PersistentAgent
from ..store import Store
from ..store.engine.seam import redacted
from ..store.inflight import AgentInFlight
from .agent_checks import Commands, Shape, StoredAgent, check_agent, factory_name
from .dry_run import dry_run
from .report import Break, UpgradeReport
from .user_code import failure

#: What a report counts, in the order it says it.
IN_FLIGHT = ("agents", "conversations", "approvals", "alarms", "events", "workflows")

#: Agents read and checked per page (at most 1,000: Store.in_flight's limit).
PAGE = 1000


def check_upgrade(
    db: str | os.PathLike[str] | Store,
    *,
    agents: Callable[[str], PersistentAgent],
    workflow: Callable[[Callable[..., Any]], Any] | None = None,
    code_version: str | None = None,
    page: int = PAGE,
    progress: Callable[[int, int], None] | None = None,
) -> UpgradeReport:
    """Check what new agent code will do to every agent in flight, before it runs.

    Calls no model and no tool and writes nothing: the database is opened
    read-only (an open Store is only read). For each agent, built by
    ``agents(agent_id)`` from the new code, it reports each piece of in-flight
    work the new code cannot carry: approvals whose tool is gone or whose
    arguments no longer fit (a call is judged as it will run: a retarget's tool
    and arguments, or the approved ones; a denied call never runs); alarms and
    events whose callback is gone or no longer takes them; stored fields that no
    longer load (or that the new class drops); memory the agent can no longer
    reach; tool calls in the context its model will see that name tools it no
    longer has, or that have no result.
    ``workflow(persistence)``, if given, runs the workflow's program in a dry run:
    it must call ``persistence(workflow="name")`` where it would build
    ``PersistenceHandler(db, workflow="name")``, and install the result as it
    would install that; every recorded step is answered from the journal, and
    the first step that would go live stops the run::

        def program(persistence):
            with handler(LiteLLMProvider()), handler(persistence(workflow="nightly")):
                nightly_report(make_team())

        report = check_upgrade("state.db", agents=make_agent, workflow=program)
        for problem in report.breaks:
            print(problem.agent_id, problem.problem, "->", problem.way_forward)

    Each way forward names the commands that follow it, runnable as printed
    (``Break.commands``): with ``db`` as given and ``agents`` by the
    ``MODULE:NAME`` its module holds it under (``MODULE:FUNC`` for a lambda).

    Args:
        db: The database (file or ``postgresql://`` URL), or an open Store.
        agents: Builds an agent of the new code from its id.
        workflow: Runs the workflow's program with the dry run's handler.
        code_version: The new code's version, for the report.
        page: How many agents are read per page (1 to 1,000).
        progress: Called with (agents checked, agents in all) after each page.

    Returns:
        The report; ``report.ok`` when everything carries over.

    Raises:
        DurableError: The database cannot be read (see :class:`~effectful_durable.Store`).
        ValueError: ``page`` is out of range.

    .. versionadded:: 0.2.0
    """
    if isinstance(page, bool) or not isinstance(page, int) or not 1 <= page <= PAGE:
        msg = f"page must be an int from 1 to {PAGE}, not {page!r}"
        raise ValueError(msg)
    started = time.monotonic()
    store = db if isinstance(db, Store) else Store(db, readonly=True)
    run = Commands(
        redacted(store.path if isinstance(db, Store) else os.fspath(db)), factory_name(agents)
    )
    try:
        total = store.agent_count()
        waiting = _Waiting(store)
        breaks: list[Break] = []
        counts: Counter[str] = Counter()
        versions: Counter[str] = Counter()
        shapes: dict[type, Shape] = {}
        checked = 0
        for held_page in _pages(store, page):
            for held in held_page:
                versions[held.code_version or "(not recorded)"] += 1
                counts["conversations"] += len(held.conversations)
                breaks += _check_one(agents, held, waiting, shapes, run)
            checked += len(held_page)
            if progress is not None:
                progress(checked, max(total, checked))
        runs = tuple(dry_run(store, workflow)) if workflow is not None else ()
        counts["agents"] = checked
        counts["workflows"] = len(runs)
        for key in ("approvals", "alarms", "events"):
            counts[key] = waiting.counts[key]
        return UpgradeReport(
            database=redacted(str(store.path)),
            checked_at=datetime.now(UTC).isoformat(timespec="seconds"),
            code_version=code_version,
            in_flight={key: counts[key] for key in IN_FLIGHT},
            code_versions=dict(versions.most_common()),
            breaks=tuple(breaks),
            workflows=runs,
            seconds=time.monotonic() - started,
        )
    finally:
        if store is not db:
            store.close()


type _Page = list[AgentInFlight]


def _pages(store: Store, size: int) -> Iterator[_Page]:
    """Every agent a page at a time, in order. Two pages ahead are read meanwhile, each
    in a thread of its own, so that the database's time and the check's overlap."""

    def read(ids: list[str]) -> _Page:
        return store.in_flight(ids)

    with ThreadPoolExecutor(_READERS, thread_name_prefix="effectful-durable-check") as readers:
        ahead: deque[Future[_Page]] = deque()
        after: str | None = None
        more = True
        while more or ahead:
            while more and len(ahead) <= _READERS:
                ids = store.agent_ids(after=after, limit=size)
                more = bool(ids)
                if more:
                    ahead.append(readers.submit(read, ids))
                    after = ids[-1]
            if ahead:
                yield ahead.popleft().result()


#: Pages read at once, besides the one being checked.
_READERS = 2


class _Waiting:
    """The database's open approvals, alarms and events, by agent: three reads in all."""

    def __init__(self, store: Store) -> None:
        approvals = store.unresumed_approvals()
        alarms = store.alarms()
        events = store.events()
        self.approvals = _by_agent(approvals)
        self.alarms = _by_agent(alarms)
        self.events = _by_agent(events)
        self.counts = {"approvals": len(approvals), "alarms": len(alarms), "events": len(events)}


def _by_agent[T](items: Iterable[T]) -> dict[str, list[T]]:
    grouped: dict[str, list[T]] = defaultdict(list)
    for item in items:
        grouped[item.agent_id].append(item)  # type: ignore[attr-defined]
    return grouped


def _check_one(
    agents: Callable[[str], PersistentAgent],
    held: AgentInFlight,
    waiting: _Waiting,
    shapes: dict[type, Shape],
    run: Commands,
) -> list[Break]:
    agent_id = held.agent_id
    try:
        agent = agents(agent_id)
        if not isinstance(agent, PersistentAgent):
            msg = f"the factory returned a {type(agent).__name__}, not a PersistentAgent"
            raise TypeError(msg)
    except Exception as error:
        return [
            Break(
                "agent",
                agent_id,
                agent_id,
                f"the new code cannot build it: {failure(error)}",
                "make the --agents factory build every agent id the database holds",
            )
        ]
    shape = shapes.get(type(agent))
    if shape is None:
        shape = shapes[type(agent)] = Shape.of(agent)
    stored = StoredAgent(
        held,
        waiting.approvals.get(agent_id, []),
        waiting.alarms.get(agent_id, []),
        waiting.events.get(agent_id, []),
    )
    return check_agent(agent, shape, stored, run)
