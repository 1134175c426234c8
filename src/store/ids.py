"""What makes a valid agent id."""

from __future__ import annotations

from ..errors import InvalidAgentIdError

MAX_AGENT_ID_LENGTH = 200


def validate_agent_id(agent_id: object) -> str:
    """Return ``agent_id`` if it is a valid agent id.

    Raises:
        InvalidAgentIdError: It is not a non-empty string of at most 200 printable
            characters without leading or trailing whitespace.
    """
    if not isinstance(agent_id, str):
        raise InvalidAgentIdError(agent_id, f"it is a {type(agent_id).__name__}")
    if not agent_id:
        raise InvalidAgentIdError(agent_id, "it is empty")
    if len(agent_id) > MAX_AGENT_ID_LENGTH:
        reason = f"it is {len(agent_id)} characters long"
        raise InvalidAgentIdError(agent_id, reason)
    if not agent_id.isprintable():
        raise InvalidAgentIdError(agent_id, "it holds non-printable characters")
    if agent_id != agent_id.strip():
        raise InvalidAgentIdError(agent_id, "it starts or ends with whitespace")
    return agent_id
