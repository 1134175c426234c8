"""Operations our handlers use to talk to each other, as effectful intends."""

from __future__ import annotations

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
