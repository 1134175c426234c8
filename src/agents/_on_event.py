# The default on_event template, alone in a module without a docstring: effectful
# prompts a template with its module's docstring, and ours is not for the model.
# (No module docstring here on purpose.)

from effectful.handlers.llm import Template
from effectful.ops.types import NotHandled


class OnEvent:
    """Gives an agent the default ``on_event(name, payload)`` template the runner calls."""

    @Template.define
    def on_event(self, name: str, payload: str) -> str:
        """An event was sent to you: {name}. Its payload, as JSON: {payload}. Handle it as your instructions say, then reply with a short summary of what you did."""  # noqa: E501
        raise NotHandled
