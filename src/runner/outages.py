"""A runner outlives its database's outages: it says so once (then every 30 s) and when
the database is back, and what it could not write back it keeps, in order, until the
database takes it.

A delivery's outcome (a claim given back, a failure recorded) that the database
refused is a :class:`WriteBack`; :class:`Outages` keeps them, writes them at the
runner's next steps, oldest first, and names their agents, whose later alarms the
runner holds back meanwhile (one agent's are delivered in order).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable

from ..errors import DatabaseUnavailableError, StorageError
from ..store.parts.alarms import Claim

log = logging.getLogger("effectful_durable.runner")

_REPORT_EVERY = 30.0  # seconds between warnings while the database keeps failing


@dataclasses.dataclass(frozen=True, eq=False)
class WriteBack:
    """A delivery's outcome the database refused, to write when it answers again."""

    claim: Claim
    done: str  # what writing it does, in the past tense: "gave back", "recorded ..."
    write: Callable[[], object]


class Outages:
    """The database's failures as one runner meets them, and the writes they left.

    Args:
        location: The database, as messages name it.
    """

    def __init__(self, location: str) -> None:
        self._location = location
        self._lock = threading.Lock()
        self._pending: list[WriteBack] = []
        self._down_since: float | None = None  # time.monotonic() of the first failure
        self._logged = 0.0

    @property
    def down(self) -> bool:
        """Whether the database failed, and has not answered since."""
        return self._down_since is not None

    def failed(self, error: Exception, retry_every: float) -> None:
        """Log a failed read or write: a warning the first time, then one every 30 s."""
        now = time.monotonic()
        if self._down_since is None:
            self._down_since = self._logged = now
            log.warning(
                "the database failed; waiting for it, trying again every %g s: %s",
                retry_every,
                error,
                extra={"db": self._location},
            )
        elif now - self._logged >= _REPORT_EVERY:
            self._logged = now
            log.warning(
                "still waiting for the database (failing for %.0f s): %s",
                now - self._down_since,
                error,
                extra={"db": self._location},
            )
        else:
            log.debug("the database failed again: %s", error)

    def answered(self) -> None:
        """After a step that reached the database: log its return, once."""
        if self._down_since is not None:
            log.info(
                "the database answers again, after %.1f s", time.monotonic() - self._down_since
            )
            self._down_since = None

    def written_back(
        self, claim: Claim, done: str, write: Callable[[], object], reason: str = ""
    ) -> None:
        """Write a delivery's outcome back (``write``); if the database fails, keep it
        to write at the next steps, holding the agent's later alarms back until then.

        ``done`` says what it did, in the past tense ("gave back"); ``reason``, why.
        """
        try:
            write()
        except (StorageError, DatabaseUnavailableError) as error:
            with self._lock:
                self._pending.append(WriteBack(claim, done, write))
            log.warning(
                "could not write back %s %s of %s%s: %s; the runner tries again at each "
                "step, and holds the agent's later alarms back meanwhile",
                noun(claim.kind),
                claim.alarm_id,
                claim.agent_id,
                f" ({reason})" if reason else "",
                error,
                extra={"agent": claim.agent_id, "alarm": claim.alarm_id},
            )

    def write_back(self) -> None:
        """Write back what the database refused earlier, oldest first.

        Raises:
            StorageError, DatabaseUnavailableError: It still fails; what is left
                stays to be written back at the next step.
        """
        while True:
            with self._lock:
                if not self._pending:
                    return
                pending = self._pending[0]
            pending.write()
            with self._lock:
                self._pending.remove(pending)
            log.info(
                "%s %s %s of %s, now that the database answers",
                pending.done,
                noun(pending.claim.kind),
                pending.claim.alarm_id,
                pending.claim.agent_id,
                extra={"agent": pending.claim.agent_id, "alarm": pending.claim.alarm_id},
            )

    def agents(self) -> list[str]:
        """The agents with an outcome still to write back."""
        with self._lock:
            return [pending.claim.agent_id for pending in self._pending]

    def left(self) -> list[WriteBack]:
        """What is still to write back, oldest first."""
        with self._lock:
            return list(self._pending)


def noun(kind: str) -> str:
    """What the log calls a queued delivery of ``kind``: an alarm, an event, a resumption."""
    return "resumption" if kind == "resume" else kind
