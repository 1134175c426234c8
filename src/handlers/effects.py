"""Operations our handlers use to talk to each other, as effectful intends."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from effectful.ops.types import Operation


@dataclass(frozen=True)
class Compacted:
    """A compaction of an agent's history: ``before[first:last + 1]`` became ``summary``."""

    before: list[Mapping[str, Any]]
    first: int
    last: int
    summary: Mapping[str, Any]
    summarizer: str


@Operation.define
def history_compacted(agent: Any, compacted: Compacted) -> None:
    """Report that ``agent``'s history was just compacted, so that it can be persisted.

    Unhandled, nothing is persisted: the agent is not durable.
    """
    del agent, compacted


@Operation.define
def compaction_scope(
    agent: Any, messages: int, summarizer: str
) -> contextlib.AbstractContextManager[Any]:
    """The context a compaction of ``agent``'s history runs in: a trace span when traced.

    CompactionHandler asks for it only when it compacts. It yields None, or a
    function to call with the compaction's outcome. Unhandled, nothing.
    """
    del agent, messages, summarizer
    return contextlib.nullcontext()
