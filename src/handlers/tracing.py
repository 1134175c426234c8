"""OpenTelemetry spans of PersistenceHandler's turns, imported only when tracing is on.

``PersistenceHandler(tracing=True)`` imports this module; with tracing off
nothing imports it, so ``opentelemetry`` is never loaded and a turn pays one
``is None`` check per hook. Span names and attributes follow the OpenTelemetry
GenAI semantic conventions where they name the thing (``invoke_agent``,
``chat``, ``execute_tool``; ``gen_ai.*``); ours are under ``effectful_durable.``
(see :doc:`/traces`). Only the OpenTelemetry API is used: the SDK, its
processors and exporters are the application's choice.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

try:
    from opentelemetry import trace
    from opentelemetry.trace import Link, Span, SpanKind, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as error:  # the optional extra is not installed
    msg = (
        "PersistenceHandler(tracing=...) needs the OpenTelemetry API, which is not "
        "installed: pip install 'effectful-durable[otel]' (and, to see the spans, "
        "an OpenTelemetry SDK and exporter of your choice)."
    )
    raise ImportError(msg) from error

from ..agents.persistent import PersistentAgent
from ..errors import TurnSuspended
from .approvals import NothingToResume, ResumeFirst, Suspend
from .effectful_hooks import tool_arguments, tool_failed, tool_name

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from ..store import CommitStats
    from .turn import Turn

#: The instrumentation scope of our spans.
SCOPE = "effectful_durable"

#: Longest text of a tool call's arguments recorded (with ``trace_tool_arguments``).
MAX_ARGUMENTS = 1024

# GenAI semantic conventions (opentelemetry.io/docs/specs/semconv/gen-ai/).
OPERATION = "gen_ai.operation.name"
AGENT_ID = "gen_ai.agent.id"
AGENT_NAME = "gen_ai.agent.name"
CONVERSATION = "gen_ai.conversation.id"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
RESPONSE_ID = "gen_ai.response.id"
FINISH_REASONS = "gen_ai.response.finish_reasons"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
TOOL_ARGUMENTS = "gen_ai.tool.call.arguments"
ERROR_TYPE = "error.type"

# Ours.
PREFIX = "effectful_durable."
TEMPLATE = PREFIX + "template"
OUTCOME = PREFIX + "outcome"
VERSION = PREFIX + "version"
BASE_VERSION = PREFIX + "base_version"
WORKFLOW = PREFIX + "workflow"
STEP = PREFIX + "step"
CODE_VERSION = PREFIX + "code_version"
REPLAYED = PREFIX + "replayed"
ATTEMPT = PREFIX + "attempt"
LINK = PREFIX + "link"
MESSAGES = PREFIX + "messages"
LOAD_MS = PREFIX + "load.ms"
ROWS = PREFIX + "commit.rows"
BYTES = PREFIX + "commit.bytes"
PARTS = PREFIX + "commit.parts"
SUMMARIZER = PREFIX + "compaction.summarizer"

_PROPAGATOR = TraceContextTextMapPropagator()

# Links for the next turn to start in this context (a runner's delivery: the
# turn that scheduled the alarm), taken by that turn's span.
_next_turn_links: ContextVar[tuple[Link, ...]] = ContextVar(
    "effectful_durable_next_turn_links", default=()
)


class Tracing:
    """Makes the spans of one PersistenceHandler's turns.

    Args:
        provider: The TracerProvider to use; None: the global one
            (``opentelemetry.trace.set_tracer_provider``), looked up at each span.
        tool_arguments: Record each tool call's arguments, as the model wrote
            them (untrusted text, cut to :data:`MAX_ARGUMENTS` characters).
    """

    def __init__(self, provider: TracerProvider | None, *, tool_arguments: bool) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            ours = version("effectful-durable")
        except PackageNotFoundError:  # pragma: no cover - a source tree on sys.path
            ours = None
        self.tracer = trace.get_tracer(SCOPE, ours, tracer_provider=provider)
        self.tool_arguments = tool_arguments

    # -- the turn ---------------------------------------------------------------

    @contextmanager
    def turn(
        self,
        agent: PersistentAgent,
        turn: Turn,
        workflow: str | None,
        code_version: str | None = None,
    ) -> Iterator[Span]:
        """The span of ``turn``, current while it runs; its outcome set as it ends."""
        name = type(agent).__name__
        attributes: dict[str, Any] = {
            OPERATION: "invoke_agent",
            AGENT_ID: agent.agent_id,
            AGENT_NAME: name,
            CONVERSATION: turn.conversation,
            TEMPLATE: turn.template,
        }
        if code_version is not None:
            attributes[CODE_VERSION] = code_version
        if workflow is not None and turn.step is not None:
            attributes[WORKFLOW] = workflow
            attributes[STEP] = turn.step.key
        links = _next_turn_links.get()
        reset = _next_turn_links.set(()) if links else None
        try:
            with self.span(f"invoke_agent {name}", attributes, links=links) as span:
                try:
                    yield span
                except (TurnSuspended, Suspend):
                    span.set_attribute(OUTCOME, "suspended")
                    raise
                except (ResumeFirst, NothingToResume):
                    span.set_attribute(OUTCOME, "not_started")  # another turn runs instead
                    raise
                except BaseException as error:
                    self.failed(span, error)
                    raise
        finally:
            if reset is not None:
                _next_turn_links.reset(reset)

    def failed(self, span: Span, error: BaseException) -> None:
        """Mark the span of a turn (or of its delivery) failed with ``error``.

        A tool's error that ended the turn is told as the tool's own span tells
        it: its type, and its message and exception event only when tool
        arguments are recorded (a tool's error often repeats its arguments).
        """
        failed(span, error, detail=self.tool_arguments or not _from_tool(error))

    def committed(self, span: Span, version: int) -> None:
        """Mark the turn's span committed as ``version``."""
        span.set_attribute(VERSION, version)
        span.set_attribute(OUTCOME, "committed")

    def started(self, span: Span, base_version: int, earlier: str | None, status: str) -> None:
        """Note the version the turn starts from, linking the turn that did not end before it.

        Args:
            span: The turn's span.
            base_version: The committed version the turn starts from.
            earlier: The ``traceparent`` of the earlier turn whose handoff this one
                replaces (crashed or failed), if it was traced.
            status: That handoff's status: ``"running"`` (its process died) or ``"failed"``.
        """
        span.set_attribute(BASE_VERSION, base_version)
        if earlier is not None:
            reason = "interrupted" if status == "running" else "failed"
            add_link(span, earlier, reason)

    def resumes(self, span: Span, suspended: str) -> None:
        """Link the turn's span to the span of the turn it resumes (``traceparent``
        ``suspended``), which waited for a person's decision."""
        add_link(span, suspended, "suspended")

    # -- inside a turn -----------------------------------------------------------

    def interpretation(self, turn: Turn, is_current: Callable[[], bool]) -> dict[Any, Any]:
        """Handlers of ``turn``'s model calls and tool calls, each in a span of its own.

        ``is_current()`` tells whether the call belongs to this turn rather than to
        a turn nested inside it (which has spans of its own).
        """
        from effectful.handlers.llm.completions import call_assistant, call_tool, completion
        from effectful.ops.semantics import fwd

        attempts = [0]

        def on_assistant(*args: Any, **kwargs: Any) -> Any:
            if is_current():
                attempts[0] = 0  # RetryLLMHandler asks again below this call
            return fwd()

        def on_completion(*args: Any, **kwargs: Any) -> Any:
            if not is_current():
                return fwd()
            model = kwargs.get("model", args[0] if args else None)
            attempts[0] += 1
            attributes: dict[str, Any] = {OPERATION: "chat", ATTEMPT: attempts[0]}
            if isinstance(model, str):
                attributes[REQUEST_MODEL] = model
            name = f"chat {model}" if isinstance(model, str) else "chat"
            with self.span(name, attributes, kind=SpanKind.CLIENT) as span:
                try:
                    response = fwd()
                except BaseException as error:
                    failed(span, error)
                    raise
                _response(span, response)
                return response

        def on_tool(tool_call: Any) -> Any:
            if not is_current():
                return fwd()
            name = tool_name(tool_call)
            attributes: dict[str, Any] = {
                OPERATION: "execute_tool",
                TOOL_NAME: name,
                TOOL_TYPE: "function",
            }
            call_id = getattr(tool_call, "id", None)
            if isinstance(call_id, str):
                attributes[TOOL_CALL_ID] = call_id
            if self.tool_arguments:
                attributes[TOOL_ARGUMENTS] = _arguments_text(tool_call)
            with self.span(f"execute_tool {name}", attributes) as span:
                asked = len(turn.asked)
                resuming = turn.resuming
                if resuming is not None and call_id in resuming.tool_results:
                    span.set_attribute(OUTCOME, "replayed")  # ran before the suspension
                    return fwd()
                try:
                    message = fwd()
                except Suspend:
                    span.set_attribute(OUTCOME, "suspended")
                    raise
                except BaseException as error:
                    # The error's text may repeat the model's arguments: only when opted in.
                    cause = getattr(error, "original_error", None) or error
                    failed(span, cause, detail=self.tool_arguments)
                    raise
                if len(turn.asked) > asked:  # not run: it waits for a person's decision
                    span.set_attribute(OUTCOME, "awaiting_approval")
                elif tool_failed(message):  # RetryLLMHandler told the model the tool raised
                    failed(span, None, detail=False)
                else:
                    span.set_attribute(OUTCOME, "ok")
                return message

        return {call_assistant: on_assistant, completion: on_completion, call_tool: on_tool}

    @contextmanager
    def compaction(
        self, agent: Any, messages: int, summarizer: str
    ) -> Iterator[Callable[[str], None]]:
        """The span of a compaction that summarises ``messages`` of ``agent``'s messages;
        call the yielded function with its outcome."""
        attributes: dict[str, Any] = {MESSAGES: messages, SUMMARIZER: summarizer}
        agent_id = getattr(agent, "agent_id", None)
        if isinstance(agent_id, str):
            attributes[AGENT_ID] = agent_id
        with self._span("effectful_durable.compaction", attributes) as span:
            yield lambda outcome: span.set_attribute(OUTCOME, outcome)

    def replayed(
        self, workflow: str, step: str, template: str, agent_id: str | None, started_ns: int
    ) -> None:
        """Record a workflow step replayed from the journal (no model call), found since
        ``started_ns`` (``time.time_ns()``)."""
        attributes: dict[str, Any] = {
            WORKFLOW: workflow,
            STEP: step,
            TEMPLATE: template,
            REPLAYED: True,
            OUTCOME: "replayed",
        }
        if agent_id is not None:
            attributes[AGENT_ID] = agent_id
        span = self.tracer.start_span(
            "effectful_durable.replay", attributes=attributes, start_time=started_ns
        )
        span.end()

    # -- the store ---------------------------------------------------------------

    @contextmanager
    def load(self, agent_id: str, conversation: str) -> Iterator[Callable[[int], None]]:
        """The span of loading one conversation of an agent; call the yielded
        function with the number of messages loaded."""
        attributes = {AGENT_ID: agent_id, CONVERSATION: conversation}
        with self._span("effectful_durable.load", attributes) as span:
            started = time.perf_counter()

            def loaded(messages: int) -> None:
                span.set_attribute(MESSAGES, messages)
                span.set_attribute(LOAD_MS, round((time.perf_counter() - started) * 1000, 3))

            yield loaded

    @contextmanager
    def commit(self, agent_id: str, stats: CommitStats) -> Iterator[Span]:
        """The span of a turn's commit; ``stats`` is read as it ends without error."""
        with self._span("effectful_durable.commit", {AGENT_ID: agent_id}) as span:
            yield span
            span.set_attribute(ROWS, stats.rows)
            span.set_attribute(BYTES, stats.bytes)
            span.set_attribute(PARTS, stats.parts)

    def traceparent(self, span: Span) -> str | None:
        """The W3C ``traceparent`` of ``span``, to store beside what it writes."""
        return traceparent(span)

    def span(
        self,
        name: str,
        attributes: dict[str, Any],
        *,
        kind: SpanKind = SpanKind.INTERNAL,
        links: Sequence[Link] = (),
    ) -> AbstractContextManager[Span]:
        """``name`` as the current span; its caller sets its status and outcome."""
        return self.tracer.start_as_current_span(
            name,
            kind=kind,
            attributes=attributes,
            links=links,
            record_exception=False,
            set_status_on_exception=False,
        )

    @contextmanager
    def _span(self, name: str, attributes: dict[str, Any]) -> Iterator[Span]:
        with self.span(name, attributes) as span:
            try:
                yield span
            except BaseException as error:
                failed(span, error)
                raise


# -- helpers, also for the runner's spans ----------------------------------------


def traceparent(span: Span) -> str | None:
    """The W3C ``traceparent`` header of ``span``, or None for a span that is not recorded."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent")


def link_to(parent: str, reason: str) -> Link | None:
    """A link to the span of the W3C ``traceparent`` ``parent``, or None if it is not one."""
    context = trace.get_current_span(_PROPAGATOR.extract({"traceparent": parent}))
    span_context = context.get_span_context()
    if not span_context.is_valid:
        return None
    return Link(span_context, {LINK: reason})


def add_link(span: Span, parent: str, reason: str) -> None:
    """Link ``span`` to the span of the W3C ``traceparent`` ``parent``."""
    link = link_to(parent, reason)
    if link is not None:
        span.add_link(link.context, link.attributes)


@contextmanager
def next_turn_links(links: Sequence[Link]) -> Iterator[None]:
    """Give the next turn started in this context ``links`` (the runner's delivery)."""
    token = _next_turn_links.set(tuple(links))
    try:
        yield
    finally:
        _next_turn_links.reset(token)


def failed(span: Span, error: BaseException | None, *, detail: bool = True) -> None:
    """Mark ``span`` failed with ``error``: its type, and with ``detail`` its message and
    the exception event. None: a tool error RetryLLMHandler turned into a message."""
    kind = type(error).__qualname__ if error is not None else "ToolCallExecutionError"
    span.set_attribute(OUTCOME, "failed")
    span.set_attribute(ERROR_TYPE, kind)
    if not detail or error is None:
        span.set_status(StatusCode.ERROR)
        return
    span.set_status(StatusCode.ERROR, f"{kind}: {error}"[:MAX_ARGUMENTS])
    if isinstance(error, Exception):
        span.record_exception(error)


def _from_tool(error: BaseException) -> bool:
    """Whether ``error`` is a tool's failure, or was caused by one (effectful raises a
    tool's error as ``ToolCallExecutionError``, the tool's own as its cause)."""
    from effectful.handlers.llm.completions import ToolCallExecutionError

    seen: set[int] = set()
    found: BaseException | None = error
    while found is not None and id(found) not in seen:
        if isinstance(found, ToolCallExecutionError):
            return True
        seen.add(id(found))
        found = found.__cause__ or found.__context__
    return False


def _response(span: Span, response: Any) -> None:
    """Set what the response tells of the model call: model, id, finish reasons, usage."""
    model = getattr(response, "model", None)
    if isinstance(model, str):
        span.set_attribute(RESPONSE_MODEL, model)
    response_id = getattr(response, "id", None)
    if isinstance(response_id, str):
        span.set_attribute(RESPONSE_ID, response_id)
    choices = getattr(response, "choices", None) or []
    reasons = [r for r in (getattr(c, "finish_reason", None) for c in choices) if r]
    if reasons:
        span.set_attribute(FINISH_REASONS, [str(r) for r in reasons])
    usage = getattr(response, "usage", None)
    tokens = ((INPUT_TOKENS, "prompt_tokens"), (OUTPUT_TOKENS, "completion_tokens"))
    for attribute, field in tokens:
        count = getattr(usage, field, None)
        if isinstance(count, int):
            span.set_attribute(attribute, count)


def _arguments_text(tool_call: Any) -> str:
    """The tool call's arguments as JSON (model input), at most MAX_ARGUMENTS characters:
    a longer text is cut, and ends with a marker that gives its length."""
    import json

    try:
        text = json.dumps(tool_arguments(tool_call), ensure_ascii=False, default=repr)
    except (TypeError, ValueError, AttributeError):
        text = "<arguments not representable>"
    if len(text) > MAX_ARGUMENTS:
        marker = f"... ({len(text)} characters)"
        text = text[: MAX_ARGUMENTS - len(marker)] + marker
    return text
