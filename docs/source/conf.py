"""Sphinx configuration for the effectful-durable documentation.

Build with ``bash scripts/docs.sh`` (warnings are errors, nitpicky on).
"""

from __future__ import annotations

import os
import re
from importlib import metadata
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)

# Autodoc imports effectful_durable.testing, which imports litellm; without this
# litellm tries to download a model price list on import (there is no network in CI).
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

# -- Project -----------------------------------------------------------------

project = "effectful-durable"
author = "effectful-durable contributors"
copyright = "effectful-durable contributors"
release = metadata.version("effectful-durable")
version = ".".join(release.split(".")[:2])

# -- General -----------------------------------------------------------------

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.doctest",
    "sphinx.ext.viewcode",
]

exclude_patterns = ["_build"]
nitpicky = True

# intersphinx is not used: the docs must build offline, and an inventory that
# cannot be downloaded is a warning, so a build with -W would fail. Without
# inventories, references to other projects cannot resolve; ignore exactly
# those, and nothing of our own (a broken reference to effectful_durable.* must
# still fail the build).
nitpick_ignore_regex = [
    # effectful: Agent, Template, ObjectInterpretation, handler, ...
    (r"py:.*", r"effectful(\..*)?"),
    # apsw: the SQLite driver under the store.
    (r"py:.*", r"apsw(\..*)?"),
    # pydantic: how persisted fields are serialised; FakeCall.response_format.
    (r"py:.*", r"pydantic(_core)?(\..*)?"),
    # litellm: FakeLLM answers with litellm.ModelResponse.
    (r"py:.*", r"litellm(\..*)?"),
    # OpenTelemetry: PersistenceHandler(tracing=TracerProvider) (an optional extra).
    (r"py:.*", r"(opentelemetry(\..*)?|TracerProvider)"),
    # The standard library (no python.org inventory either); dataclasses for
    # ephemeral(), whose docstring points to dataclasses.field().
    (r"py:.*", r"(typing|collections\.abc|contextlib|dataclasses|datetime|os|threading)(\..*)?"),
    # PersistenceHandler's internal bases, one per part of an agent's record
    # (conversations, memory, SQL workspace, alarms): shown by :show-inheritance:,
    # not public API.
    (r"py:class", r"effectful_durable\.handlers\.\w+\.\w+Handling"),
]

# -- Autodoc and napoleon -----------------------------------------------------

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_class_signature = "mixed"
autodoc_preserve_defaults = True
# Our modules use ``from __future__ import annotations``, so signatures hold the
# alias's name; point it at the entry api.rst writes for it.
autodoc_type_aliases = {
    "Durability": "effectful_durable.store.Durability",
    "AlarmStatus": "~effectful_durable.store.alarms.AlarmStatus",
}

napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_include_init_with_doc = False

# -- HTML --------------------------------------------------------------------

html_theme = "alabaster"
html_title = f"effectful-durable {release}"
html_theme_options = {
    "description": "Durable, crash-safe state for effectful LLM agents, on SQLite.",
    "fixed_sidebar": True,
}

# -- Checks --------------------------------------------------------------------

_API_PAGE = Path(__file__).resolve().parent / "api.rst"


def _check_api_page(app: Sphinx) -> None:
    """Warn (an error under -W) when api.rst misses a name of effectful_durable.__all__."""
    import effectful_durable

    text = _API_PAGE.read_text(encoding="utf-8")
    documented = set(re.findall(r"::\s+effectful_durable\.(\w+)\b", text))
    for name in sorted(set(effectful_durable.__all__) - documented):
        logger.warning(
            "api.rst does not document effectful_durable.%s; add an auto* directive for it",
            name,
            location="api",
        )


def _public_bases(app: Sphinx, name: str, obj: object, options: object, bases: list) -> None:
    """Leave PersistenceHandler's internal mixins (one per part: MemoryHandling, ...) out of
    its "Bases:" line; they are how the handler is built, not API."""
    bases[:] = [
        base
        for base in bases
        if not (
            getattr(base, "__module__", "").startswith("effectful_durable.handlers.")
            and base.__name__.endswith("Handling")
        )
    ]


def setup(app: Sphinx) -> None:
    app.connect("builder-inited", _check_api_page)
    app.connect("autodoc-process-bases", _public_bases)
