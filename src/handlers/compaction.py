"""CompactionHandler: replace an agent's older messages with one summary, losing nothing."""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from effectful.handlers.llm import Agent, Template
from effectful.ops.semantics import fwd
from effectful.ops.syntax import ObjectInterpretation, implements
from effectful.ops.types import NotHandled

from ..agents.history import history_messages
from ..store.history import message_text
from .effectful_hooks import bound_agent, set_history
from .effects import Compacted, compaction_scope, history_compacted

logger = logging.getLogger("effectful_durable.compaction")

SUMMARY_PREFIX = "Summary of the earlier conversation, written by you for yourself:\n"


@Template.define
def summarize_context(transcript: str) -> str:
    """Summarise the conversation below so that you can continue it from the summary
    alone. Keep every decision, fact, name, number, file, open question and unfinished
    task; drop pleasantries. If it starts with an earlier summary, fold that in.
    Answer with the summary only.

    {transcript}"""
    raise NotHandled


# A free template's system prompt is its module's docstring; give it its own.
summarize_context.__system_prompt__ = (
    "You compress conversations into faithful, dense summaries for later use."
)


def approximate_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """A network-free token estimate: about four characters of JSON per token."""
    return (
        sum(
            len(json.dumps([m.get("content"), m.get("tool_calls")], default=str)) for m in messages
        )
        // 4
    )


class CompactionHandler(ObjectInterpretation[Any, Any]):  # type: ignore[no-untyped-call]
    """Keep an agent's context within a budget by summarising its older messages.

    After each outermost turn of any effectful ``Agent``, if its history holds more
    than ``max_messages`` messages or ``max_tokens`` tokens, the messages between
    the system message and the ``keep_recent`` latest are replaced by ONE summary
    message written by ``summarizer``. At least ``keep_recent`` messages are always
    kept: when the cut would part a tool call from its result, it moves earlier,
    keeping more. If that leaves fewer than two messages to summarise, nothing
    changes and a warning is logged. A later compaction folds the previous
    summary into the new one. If the summariser fails, the history is left as it
    was and the error is logged.

    With :class:`~effectful_durable.PersistenceHandler`, the compaction is committed
    as data: the summary, the range it stands for and the summariser; the originals
    stay in the database, searchable with :class:`~effectful_durable.RecallTools`,
    and a new process loads the compacted context without summarising again.

    Install it just before PersistenceHandler in the ``with``, so that the
    persistence handler sees each call first and the compaction commits in the same
    transaction as the turn that crossed the budget (as the next version). Listed
    after it, the compaction runs once the turn has committed, and commits as its
    own version right after::

        with (
            handler(LiteLLMProvider(model="gpt-4o-mini")),
            handler(RetryLLMHandler()),
            handler(CompactionHandler(max_messages=40, keep_recent=10)),
            handler(PersistenceHandler("state.db")),
        ):
            bot.ask("What did we decide yesterday?")

    Args:
        max_messages: Compact when the history holds more messages than this.
        max_tokens: Compact when ``count_tokens(history)`` exceeds this.
        keep_recent: Latest messages kept verbatim: at least this many, more when the
            cut would otherwise part a tool call from its result.
        summarizer: A ``Template`` taking the transcript (str) and returning the
            summary (str); it runs through the installed handlers like any template.
        count_tokens: Token counter over a list of messages; the default needs no network.

    Raises:
        ValueError: No budget is given, or ``keep_recent`` leaves nothing to compact.

    .. versionadded:: 0.1.0
    """

    def __init__(
        self,
        *,
        max_messages: int | None = None,
        max_tokens: int | None = None,
        keep_recent: int = 10,
        summarizer: Callable[[str], str] = summarize_context,
        count_tokens: Callable[[Sequence[Mapping[str, Any]]], int] = approximate_tokens,
    ) -> None:
        super().__init__()
        if max_messages is None and max_tokens is None:
            msg = "CompactionHandler needs a budget: pass max_messages=, max_tokens= or both"
            raise ValueError(msg)
        if keep_recent < 0:
            msg = f"keep_recent must be >= 0, not {keep_recent}"
            raise ValueError(msg)
        if max_messages is not None and max_messages < keep_recent + 3:
            msg = (
                f"max_messages={max_messages} leaves no room to compact with "
                f"keep_recent={keep_recent}: it must be at least keep_recent + 3 "
                "(system message, summary, and one message to summarise)"
            )
            raise ValueError(msg)
        self.max_messages = max_messages
        self.max_tokens = max_tokens
        self.keep_recent = keep_recent
        self.summarizer = summarizer
        self.count_tokens = count_tokens
        self._local = threading.local()

    @implements(Template.__apply__)  # type: ignore[untyped-decorator]
    def _apply(self, template: Template[..., Any], *args: Any, **kwargs: Any) -> Any:
        agent = bound_agent(template, Agent)
        active: list[Agent] = self._local.__dict__.setdefault("active", [])
        if agent is None or any(a is agent for a in active):
            return fwd()
        active.append(agent)
        try:
            result = fwd()
        finally:
            active.pop()
        self.compact(agent)
        return result

    def over_budget(self, messages: Sequence[Mapping[str, Any]]) -> bool:
        """Whether ``messages`` exceed the message or token budget."""
        if self.max_messages is not None and len(messages) > self.max_messages:
            return True
        return self.max_tokens is not None and self.count_tokens(messages) > self.max_tokens

    def compact(self, agent: Agent) -> bool:
        """Compact ``agent``'s history now if it is over budget.

        Returns:
            Whether the history was compacted.
        """
        history = agent.__history__
        over_count = self.max_messages is not None and len(history) > self.max_messages
        if not over_count and self.max_tokens is None:
            return False  # the common case costs no pass over the history
        messages = history_messages(history)
        if not self.over_budget(messages):
            return False
        start = 1 if messages and messages[0].get("role") == "system" else 0
        cut = valid_cut(messages, start, len(messages) - self.keep_recent)
        if cut is None:
            logger.warning(
                "not compacting %s: over budget, but keeping at least keep_recent=%d of "
                "its %d messages, without parting a tool call from its result, leaves "
                "fewer than two to summarise",
                _name(agent),
                self.keep_recent,
                len(messages),
            )
            return False
        name = getattr(self.summarizer, "__name__", "summarizer")
        with compaction_scope(agent, cut - start, name) as outcome:
            compacted = self._compact(agent, messages, start, cut, name)
            if outcome is not None:
                outcome("compacted" if compacted else "summarizer_failed")
            return compacted

    def _compact(self, agent: Agent, messages: list[Any], start: int, cut: int, name: str) -> bool:
        """Summarise ``messages[start:cut]`` and put the summary in their place."""
        try:
            text = self.summarizer(render_transcript(messages[start:cut]))
        except Exception:
            logger.exception("not compacting %s: the summariser %s failed", _name(agent), name)
            return False
        summary = {
            "id": f"summary-{uuid.uuid4()}",
            "role": "user",
            "content": [{"type": "text", "text": SUMMARY_PREFIX + text}],
        }
        set_history(agent, [*messages[:start], summary, *messages[cut:]])
        try:
            history_compacted(agent, Compacted(messages, start, cut - 1, summary, name))
        except BaseException:
            set_history(agent, messages)
            raise
        logger.info(
            "compacted %s: %d messages -> 1 summary, %d kept",
            _name(agent),
            cut - start,
            len(messages) - cut,
        )
        return True


def valid_cut(messages: Sequence[Mapping[str, Any]], start: int, preferred: int) -> int | None:
    """The first message to keep: ``preferred``, or the nearest valid cut before it.

    A cut summarises ``messages[start:cut]``. It is valid if that is at least two
    messages and every tool result kept after it has its request kept too. The cut
    only ever moves earlier, so at least ``len(messages) - preferred`` messages are
    kept; None if no such cut is valid.
    """
    invalid = _cuts_splitting_tool_calls(messages)
    preferred = min(preferred, len(messages))
    return next((cut for cut in range(preferred, start + 1, -1) if not invalid[cut]), None)


def _cuts_splitting_tool_calls(messages: Sequence[Mapping[str, Any]]) -> list[bool]:
    """For each cut 0..len, whether it would keep a tool result but not its request."""
    requested_at = {
        call.get("id"): index
        for index, message in enumerate(messages)
        for call in message.get("tool_calls") or []
    }
    # A result at j answering a request at k rules out every cut in k+1..j;
    # an unanswerable result rules out every cut up to j. Mark them in one pass.
    opened = [0] * (len(messages) + 2)
    for j, message in enumerate(messages):
        if message.get("role") == "tool":
            k = requested_at.get(message.get("tool_call_id"), -1)
            k = k if k < j else -1  # a result before its request answers nothing
            opened[k + 1] += 1
            opened[j + 1] -= 1
    invalid, depth = [], 0
    for cut in range(len(messages) + 1):
        depth += opened[cut]
        invalid.append(depth > 0)
    return invalid


def render_transcript(messages: Sequence[Mapping[str, Any]]) -> str:
    """The messages as plain text for the summariser, one block per message."""
    return "\n\n".join(f"[{m.get('role')}] {message_text(m)}".rstrip() for m in messages)


def _name(agent: Agent) -> str:
    return str(getattr(agent, "agent_id", type(agent).__name__))
