"""A claimed alarm, event or resumption is marked delivered in the commit of the very
turn that delivers it, and nowhere else.

:class:`Delivery` is the interpretation the runner installs just outside its
PersistenceHandler: it stages "delivered" on the delivering turn (fenced by the
claim's token, so a turn whose claim another runner took commits nothing), and
stops a worker's turn at its next template call or model request once the
runner is stopping past its grace period. :func:`turn_of` names the template a
claim calls.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from effectful.handlers.llm import Template
from effectful.ops.semantics import fwd
from effectful.ops.syntax import ObjectInterpretation, implements

from ..agents.alarms import alarm_delivered
from ..agents.persistent import PersistentAgent
from ..errors import DurableError
from ..handlers.effectful_hooks import bound_agent
from ..handlers.persistence import PersistenceHandler
from ..store.parts.alarms import Claim
from .config import RunnerConfig


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


def noun(kind: str) -> str:
    """What the log calls a queued delivery of ``kind``: an alarm, an event, a resumption."""
    return "resumption" if kind == "resume" else kind
