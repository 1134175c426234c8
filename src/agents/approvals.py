"""Tools that need a person's approval before they run, and what an approved tool may know."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

#: Whether a tool call needs approval, from the tool's name (the method's) and its
#: arguments: falsy runs it; True, or a text saying why, asks a person first.
type ApprovalPolicy = Callable[[str, Mapping[str, Any]], bool | str | None]

_RULE = "__durable_approval__"


@dataclass(frozen=True, slots=True)
class ApprovalRule:
    """What :func:`requires_approval` marked a tool with."""

    when: Callable[..., Any] | None
    reason: str | None

    def applies(self, arguments: Mapping[str, Any]) -> str | None:
        """Why a call with ``arguments`` needs approval, or None when it does not.

        A ``when`` that raises asks for approval: a rule that cannot decide never
        lets a call through.
        """
        if self.when is not None:
            try:
                if not self.when(**arguments):
                    return None
            except Exception as error:
                return f"the approval rule failed ({type(error).__name__}: {error})"
        return self.reason or "this tool needs approval"


def requires_approval(
    function: Any = None,
    /,
    *,
    when: Callable[..., Any] | None = None,
    reason: str | None = None,
) -> Any:
    """Mark a tool so that the model's calls of it wait for a person's approval.

    Put it under ``@Tool.define``; ``when`` (called with the tool's arguments as
    keywords) narrows it to some calls, and ``reason`` is shown to whoever
    decides::

        @Tool.define
        @requires_approval(when=lambda order, amount: amount > 100, reason="large refund")
        def refund(self, order: str, amount: float) -> str:
            \"""Refund ``amount`` EUR on ``order``.\"""

    Under :class:`~effectful_durable.PersistenceHandler` a call that needs
    approval suspends the turn (:class:`~effectful_durable.TurnSuspended`); see
    :doc:`/approvals`.

    .. versionadded:: 0.2.0
    """

    def mark(fn: Any) -> Any:
        setattr(fn, _RULE, ApprovalRule(when, reason))
        return fn

    return mark(function) if function is not None else mark


def approval_rule(tool: object) -> ApprovalRule | None:
    """The rule ``tool`` (an effectful Tool, or its function) was marked with, if any."""
    rule = getattr(tool, _RULE, None)
    return rule if isinstance(rule, ApprovalRule) else None


_CURRENT: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "effectful_durable_approval", default=None
)


def current_approval() -> str | None:
    """The id of the approval the running tool was approved by, or None.

    An approved tool whose effect lies outside the database (a payment, an
    email) can pass it to that system as an idempotency key: a turn that runs the
    tool again after a crash, before its commit, then does the effect once.

    .. versionadded:: 0.2.0
    """
    return _CURRENT.get()


@contextlib.contextmanager
def running_approved(approval_id: str) -> Iterator[None]:
    """Make :func:`current_approval` name ``approval_id`` while the block runs."""
    token = _CURRENT.set(approval_id)
    try:
        yield
    finally:
        _CURRENT.reset(token)
