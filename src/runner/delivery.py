"""A claimed alarm, event or resumption is marked delivered in the commit of the very
turn that delivers it, and nowhere else; whatever else comes of the delivery is
settled here, in one place.

:class:`Delivery` is the interpretation the runner installs just outside its
PersistenceHandler: it stages "delivered" on the delivering turn (fenced by the
claim's token, so a turn whose claim another runner took commits nothing), and
stops a worker's turn at its next template call or model request once the
runner is stopping past its grace period. :func:`turn_of` names the template a
claim calls. :class:`Deliverer` runs the turn of a claim and settles its
outcome, one small method each: delivered, suspended, put back (paused, busy,
waiting for a decision), given back (a lapsed hold, a failing database, an
interruption), or failed and retried later.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from effectful.handlers.llm import Template
from effectful.ops.semantics import fwd
from effectful.ops.syntax import ObjectInterpretation, implements

from ..agents.alarms import alarm_delivered
from ..agents.persistent import PersistentAgent
from ..errors import (
    AgentInUseError,
    AlarmLeaseLostError,
    DatabaseUnavailableError,
    DurableError,
    HoldLapsedError,
    StorageError,
    TurnSuspended,
)
from ..handlers.effectful_hooks import bound_agent
from ..handlers.persistence import PersistenceHandler
from ..store.parts.alarms import Claim
from .config import RunnerConfig
from .outages import Outages, noun

if TYPE_CHECKING:
    from ..store.alarm_queue import AlarmQueue

log = logging.getLogger("effectful_durable.runner")

_IN_USE_RETRY = 1.0  # seconds before retrying an alarm whose agent another process runs
_SUSPENDED_RETRY = 10.0  # seconds before retrying one whose agent waits for a decision
_PAUSED_RETRY = 60.0  # seconds, at least, before looking again at a paused agent's


@dataclasses.dataclass
class Armed:
    """The claim a thread's next turn of ``agent`` delivers, and whether it was marked."""

    agent: PersistentAgent
    claim: Claim
    next_fire: float | None
    now: float
    marked: bool = False


class Delivery(ObjectInterpretation[Any, Any]):  # type: ignore[no-untyped-call]
    """Installed just outside PersistenceHandler: when the delivering turn's ``on_alarm``
    starts, stage "alarm delivered" on that turn, so it commits with it.

    The delivering turn of an event or alarm is the runner's own call, not a
    suspended turn that call resumes first (its approvals decided), which commits
    on its own: marked there, the event would be done even if the runner's turn
    never committed. The delivering turn of a resumption is the resumed turn.

    Each thread delivers its own claim (``armed`` is per thread). Once ``cancel`` is
    set, a turn running in a worker thread stops at its next template call or
    model request (the runner is stopping past its grace period).
    """

    def __init__(self) -> None:
        super().__init__()
        self._local = threading.local()
        self.cancel = threading.Event()
        self.persistence: PersistenceHandler | None = None

    @property
    def armed(self) -> Armed | None:
        armed: Armed | None = getattr(self._local, "armed", None)
        return armed

    @armed.setter
    def armed(self, armed: Armed | None) -> None:
        self._local.armed = armed

    def _cancelled(self) -> None:
        if self.cancel.is_set() and threading.current_thread() is not threading.main_thread():
            msg = "the runner is stopping: its grace period is over"
            raise KeyboardInterrupt(msg)

    def at_requests(self) -> dict[Any, Any]:
        """An interpretation that stops a cancelled turn at its next model request.

        Built when the stack is (effectful's completions module imports litellm).
        """
        from effectful.handlers.llm.completions import completion

        def checked(*args: Any, **kwargs: Any) -> Any:
            self._cancelled()
            return fwd()

        return {completion: checked}

    @implements(Template.__apply__)  # type: ignore[untyped-decorator]
    def _apply(self, template: Template[..., Any], *args: Any, **kwargs: Any) -> Any:
        self._cancelled()
        armed = self.armed
        if (
            armed is not None
            and not armed.marked
            and bound_agent(template, PersistentAgent) is armed.agent
            and self._resuming(armed.agent) == (armed.claim.kind == "resume")
        ):
            armed.marked = True
            alarm_delivered(armed.agent, armed.claim, armed.next_fire, armed.now)
        return fwd()

    def _resuming(self, agent: PersistentAgent) -> bool:
        """Whether this call on ``agent`` resumes its suspended turn."""
        persistence = self.persistence
        return persistence is not None and persistence.resuming(agent)


def turn_of(agent: PersistentAgent, claim: Claim) -> tuple[Template[..., Any], tuple[Any, ...]]:
    """The template that delivers ``claim`` (an alarm or an event), with its arguments."""
    name = "on_event" if claim.kind == "event" else "on_alarm"
    template = getattr(agent, name, None)
    if not isinstance(template, Template):
        mixin = "OnEvent" if claim.kind == "event" else "AlarmTools"
        msg = (
            f"agent {claim.agent_id!r} ({type(agent).__name__}) has no {name} template; "
            f"mix in {mixin} or define one"
        )
        raise DurableError(msg)
    if claim.kind == "event":
        return template, (claim.topic or "", claim.action)
    return template, (claim.action,)


def default_handlers(config: RunnerConfig) -> list[Any]:
    """The handler stack of a runner given none: ``LiteLLMProvider`` and ``RetryLLMHandler``."""
    from effectful.handlers.llm.completions import LiteLLMProvider, RetryLLMHandler

    provider = (
        LiteLLMProvider(model=config.model)  # type: ignore[no-untyped-call]
        if config.model
        else LiteLLMProvider()  # type: ignore[no-untyped-call]
    )
    return [provider, RetryLLMHandler()]


class Resting:
    """The agents a runner leaves alone for a while: those whose claim it gave back,
    due when it was, because the agent could not take it then (paused, busy in
    another process, waiting for a decision). Due later instead, the agent's later
    alarms and events would overtake it (one agent's are delivered in order,
    whichever runner)."""

    def __init__(self, queue: AlarmQueue, outages: Outages) -> None:
        self._queue = queue
        self._outages = outages
        self._lock = threading.Lock()
        self._until: dict[str, float] = {}  # agent id -> clock time

    def put_back(self, claim: Claim, now: float, pause: float) -> None:
        """Give ``claim`` back, due when it was, and leave its agent alone ``pause`` s."""
        due = claim.due_at if claim.due_at is not None else now
        with self._lock:
            self._until[claim.agent_id] = now + pause
        self._outages.written_back(claim, "gave back", lambda: self._queue.release(claim, due))

    def agents(self, now: float) -> list[str]:
        """The agents left alone at ``now``."""
        with self._lock:
            for agent_id, until in list(self._until.items()):
                if until <= now:
                    del self._until[agent_id]
            return list(self._until)

    def next_end(self) -> float | None:
        """When the first of them may be taken again (clock time), if any."""
        with self._lock:
            return min(self._until.values(), default=None)


@dataclasses.dataclass
class Deliverer:
    """Delivers a claim as one turn of its agent, and settles what came of it.

    The runner's collaborators it settles with: the queue (a claim finished,
    given back, failed), the outages (a write the database refused, kept to write
    back), the resting agents, and the runner's counters and stop.
    """

    runner_id: str
    queue: AlarmQueue
    outages: Outages
    delivery: Delivery
    resting: Resting
    #: The config in force, the PersistenceHandler of the stack in force, the agent
    #: of an id (built once), the counters, and the runner's stop.
    config: Callable[[], RunnerConfig]
    persistence: Callable[[], PersistenceHandler]
    agent_of: Callable[[str], PersistentAgent]
    count: Callable[..., None]
    stopping: threading.Event

    def deliver(self, claim: Claim, now: float) -> str:
        """Deliver ``claim`` (a span of its own when traced); its outcome in a word."""
        tracing = self.persistence().traces
        if tracing is None:
            return self._delivered(claim, now)
        from .tracing import delivery  # imports opentelemetry: only when traced

        with delivery(tracing, self.queue, claim, self.runner_id) as outcome:
            word = self._delivered(claim, now)
            outcome(word)
            return word

    def _delivered(self, claim: Claim, now: float) -> str:
        config = self.config()  # the config a turn starts with is the one it ends with
        context = {"agent": claim.agent_id, "alarm": claim.alarm_id}
        if config.agent(claim.agent_id).paused:
            self.resting.put_back(claim, now, max(config.poll_interval, _PAUSED_RETRY))
            log.debug("agent paused: %s put back", noun(claim.kind), extra=context)
            return "paused"
        started = time.monotonic()
        log.info(
            "delivering %s %s to %s", noun(claim.kind), claim.alarm_id, claim.agent_id,
            extra=context,
        )  # fmt: skip
        try:
            agent = self.agent_of(claim.agent_id)
            if not self._turn(agent, claim, now, config):
                log.info("nothing left to resume", extra=context)
                return "nothing_to_resume"
        except TurnSuspended as suspended:
            return self._suspended(claim, suspended, now, context)
        except AlarmLeaseLostError as error:
            self.count(errors=1)
            log.warning("lease lost; the turn committed nothing: %s", error, extra=context)
            return "lease_lost"
        except (HoldLapsedError, DatabaseUnavailableError, StorageError) as error:
            return self._given_back(claim, error, now, context)
        except AgentInUseError:
            self.resting.put_back(claim, now, _IN_USE_RETRY)
            log.info("agent busy in another process; %s put back", noun(claim.kind), extra=context)
            return "agent_busy"
        except KeyboardInterrupt:
            # Interrupted by a stop past its grace (or Ctrl-C): the turn left its
            # handoff; give the alarm back so that the next runner delivers it at once.
            with contextlib.suppress(DurableError):
                self.queue.release(claim, now)
            log.warning("turn interrupted; %s put back", noun(claim.kind), extra=context)
            self.stopping.set()
            return "interrupted"
        except Exception as error:
            self.count(errors=1)
            self._failed(claim, error, now, config)
            return "failed"
        finally:
            self.delivery.armed = None
        self.count(turns=1)
        duration = time.monotonic() - started
        version = getattr(agent.__dict__.get("__durable__"), "version", None)
        log.info(
            "delivered %s %s to %s as version %s in %.3f s",
            noun(claim.kind),
            claim.alarm_id,
            claim.agent_id,
            version,
            duration,
            extra={**context, "turn": version, "duration": round(duration, 6)},
        )
        return "delivered"

    def _turn(
        self, agent: PersistentAgent, claim: Claim, now: float, config: RunnerConfig
    ) -> bool:
        """Run the turn that delivers ``claim``; False if a resumption found nothing left
        to resume (resumed elsewhere, or rolled back: the claim is finished).

        Raises:
            DurableError: The turn never began (so nothing marked the claim).
        """
        persistence = self.persistence()
        if claim.kind == "resume":
            self.delivery.armed = Armed(agent, claim, None, now)
            if not persistence.resume_queued(agent, claim.topic or ""):
                self.queue.finish(claim)
                return False
        else:
            template, arguments = turn_of(agent, claim)
            coalesce = config.missed == "coalesce"
            next_fire = claim.schedule.next_after(claim.schedule.fire_at, now, coalesce=coalesce)
            self.delivery.armed = Armed(agent, claim, next_fire, now)
            if claim.kind == "alarm":
                with persistence.delivering(agent, claim):
                    template(*arguments)
            else:
                template(*arguments)
        armed = self.delivery.armed
        if armed is None or not armed.marked:
            msg = f"the turn delivering {claim.alarm_id} of {claim.agent_id!r} never began"
            raise DurableError(msg)
        return True

    def _suspended(
        self, claim: Claim, suspended: TurnSuspended, now: float, context: dict[str, Any]
    ) -> str:
        armed = self.delivery.armed
        if armed is not None and armed.marked:
            # The turn committed up to a tool call that waits for a person (the
            # delivery with it); a decision queues its resumption.
            self.count(turns=1)
            log.info("turn suspended: %s", suspended, extra=context)
            return "suspended"
        # The agent's conversation waits for a decision: no turn began. The
        # resumption the decision queues goes first (the alarm queue claims a
        # resumption before its agent's alarms and events).
        self.resting.put_back(claim, now, _SUSPENDED_RETRY)
        log.info(
            "agent waits for a decision; %s put back for %g s",
            claim.alarm_id,
            _SUSPENDED_RETRY,
            extra=context,
        )
        return "waits_for_decision"

    def _given_back(
        self,
        claim: Claim,
        error: HoldLapsedError | DatabaseUnavailableError | StorageError,
        now: float,
        context: dict[str, Any],
    ) -> str:
        """Not the alarm's fault: no attempt counted, and due again when it was. The
        database failed (a turn whose commit did land marked it done: giving it back
        is a no-op), or this runner was cut off from it, or stalled, longer than a
        hold lasts (the turn committed nothing; another runner may deliver it now)."""
        self.count(errors=1)
        lapsed = isinstance(error, HoldLapsedError)
        what = "the hold on the agent lapsed" if lapsed else "the database failed"
        due = claim.due_at if claim.due_at is not None else now
        log.warning(
            "%s during the delivery of %s %s; it is given back, no attempt counted: %s",
            what,
            noun(claim.kind),
            claim.alarm_id,
            error,
            extra=context,
        )
        self.outages.written_back(claim, "gave back", lambda: self.queue.release(claim, due), what)
        return "hold_lapsed" if lapsed else "database_failed"

    def _failed(self, claim: Claim, error: Exception, now: float, config: RunnerConfig) -> None:
        """Record a failed delivery: retried with backoff, dead after the last attempt."""
        max_attempts = config.agent(claim.agent_id).max_attempts or config.max_attempts
        attempts = claim.attempts + 1
        retry_at = None if attempts >= max_attempts else now + config.retry_delay(attempts)
        text = f"{type(error).__name__}: {error}"
        context = {"agent": claim.agent_id, "alarm": claim.alarm_id, "attempt": attempts}
        self.outages.written_back(
            claim,
            f"recorded failed delivery {attempts} of",
            lambda: self.queue.fail(claim, text, retry_at),
        )
        if retry_at is None:
            log.error(
                "%s %s is dead after %d failed deliveries: %s",
                noun(claim.kind),
                claim.alarm_id,
                attempts,
                text,
                extra=context,
            )
        else:
            log.warning(
                "delivery %d of %s %s failed, retrying in %g s: %s",
                attempts,
                noun(claim.kind),
                claim.alarm_id,
                retry_at - now,
                text,
                extra=context,
            )
