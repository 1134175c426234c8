# The default on_alarm template, alone in a module without a docstring: effectful
# prompts a template with its module's docstring, and ours is not for the model.
# (No module docstring here on purpose.)

from effectful.handlers.llm import Template
from effectful.ops.types import NotHandled


class OnAlarm:
    """Gives an agent the default ``on_alarm(action)`` template the runner calls."""

    @Template.define
    def on_alarm(self, action: str) -> str:
        """An alarm you scheduled is due now. Do what it asks, then reply with a short summary of what you did. The alarm's action: {action}"""  # noqa: E501
        raise NotHandled
