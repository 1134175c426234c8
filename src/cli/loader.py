"""The user's code, named ``MODULE:FUNC`` on the command line: the one loader, and the
agents an ``--agents`` factory builds. Each failure is one line naming where it happened.

Only the commands that run the user's code call these; they import it (and with it
effectful's LLM layer) when they run, never when the command line is imported.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING, Any

from ..errors import DurableError
from ..upgrades.user_code import failure

if TYPE_CHECKING:
    from ..agents.persistent import PersistentAgent


def load(spec: str, what: str) -> Any:
    """Import ``module:attribute`` (the current directory is on the path, as for uvicorn).

    Raises:
        DurableError: In one line, naming the module, its file and line: the
            module is missing, does not parse, or raised while it was imported,
            or has no such attribute.
    """
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        msg = f"{what} must be given as MODULE:FUNCTION, not {spec!r}"
        raise DurableError(msg)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and (module_name + ".").startswith(e.name + "."):
            msg = f"cannot load {what} {spec!r}: {e}"
            raise DurableError(msg) from e
        msg = f"cannot load {what} {spec!r}: importing {module_name} failed: {failure(e)}"
        raise DurableError(msg) from e
    except (Exception, SystemExit) as e:  # a SyntaxError, or the module raised at import
        msg = f"cannot load {what} {spec!r}: importing {module_name} failed: {failure(e)}"
        raise DurableError(msg) from e
    try:
        return getattr(module, attribute)
    except AttributeError as e:
        msg = f"cannot load {what} {spec!r}: {e}"
        raise DurableError(msg) from e


def build(agents: Any, spec: str, agent_id: str) -> PersistentAgent:
    """The agent ``agent_id`` as the ``--agents`` factory builds it.

    Raises:
        DurableError: In one line: the factory raised (where, in the user's code),
            or returned no PersistentAgent.
    """
    from ..agents.persistent import PersistentAgent

    try:
        agent = agents(agent_id)
    except Exception as error:
        msg = f"the --agents factory {spec!r} cannot build agent {agent_id!r}: {failure(error)}"
        raise DurableError(msg) from error
    if not isinstance(agent, PersistentAgent):
        msg = (
            f"the --agents factory {spec!r} returned a {type(agent).__name__} for agent "
            f"{agent_id!r}, not a PersistentAgent"
        )
        raise DurableError(msg)
    return agent
