"""What makes a valid agent id, conversation id or subject."""

from __future__ import annotations

from ..errors import InvalidAgentIdError, InvalidConversationIdError, InvalidSubjectError

MAX_AGENT_ID_LENGTH = 200

# The conversation of an agent that never names one (and of every schema-1 row).
DEFAULT_CONVERSATION = "default"


def validate_agent_id(agent_id: object) -> str:
    """Return ``agent_id`` if it is a valid agent id.

    Raises:
        InvalidAgentIdError: It is not a non-empty string of at most 200 printable
            characters without leading or trailing whitespace.
    """
    problem = _problem(agent_id)
    if problem:
        raise InvalidAgentIdError(agent_id, problem)
    return agent_id  # type: ignore[return-value]  # _problem checked it is a str


def validate_conversation_id(conversation: object) -> str:
    """Return ``conversation`` if it is a valid conversation id (the rules of agent ids).

    Raises:
        InvalidConversationIdError: It is not a non-empty string of at most 200
            printable characters without leading or trailing whitespace.
    """
    problem = _problem(conversation)
    if problem:
        raise InvalidConversationIdError(conversation, problem)
    return conversation  # type: ignore[return-value]  # _problem checked it is a str


def validate_subject(subject: object) -> str:
    """Return ``subject`` if it is a valid subject (the rules of agent ids).

    Raises:
        InvalidSubjectError: It is not a non-empty string of at most 200 printable
            characters without leading or trailing whitespace.
    """
    problem = _problem(subject)
    if problem:
        raise InvalidSubjectError(subject, problem)
    return subject  # type: ignore[return-value]  # _problem checked it is a str


def _problem(name: object) -> str | None:
    """Why ``name`` is not a valid id, or None."""
    if not isinstance(name, str):
        return f"it is a {type(name).__name__}"
    if not name:
        return "it is empty"
    if len(name) > MAX_AGENT_ID_LENGTH:
        return f"it is {len(name)} characters long"
    if not name.isprintable():
        return "it holds non-printable characters"
    if name != name.strip():
        return "it starts or ends with whitespace"
    return None
