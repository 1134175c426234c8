"""What every child program shares: one line to its parent, and the fake model.

Kept light (no apsw, no pytest), since each child imports it before it says ``loaded``.
"""

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

from effectful.handlers.llm.completions import LiteLLMProvider
from effectful.ops.semantics import handler

from effectful_durable.testing import FakeLLM


def say(*words: object) -> None:
    """Tell the parent one event, as one line in one write.

    One ``write(2)`` of less than PIPE_BUF bytes reaches the pipe whole or not at all,
    so a kill never leaves half a line. ``print`` may not do that: under
    PYTHONUNBUFFERED it writes each word and separator separately.
    """
    text = " ".join(str(word).replace("\n", " ") for word in words)
    os.write(sys.stdout.fileno(), (text + "\n").encode())


def model_stack(llm: FakeLLM, *, model: str = "fake") -> list[Any]:
    """The handlers a program's turns run under: LiteLLM's provider, answered by ``llm``."""
    return [LiteLLMProvider(model=model), llm]


@contextlib.contextmanager
def running(llm: FakeLLM, *handlers: Any) -> Iterator[None]:
    """Install :func:`model_stack` of ``llm``, then ``handlers``."""
    with contextlib.ExitStack() as stack:
        for each in (*model_stack(llm), *handlers):
            stack.enter_context(handler(each))
        yield
