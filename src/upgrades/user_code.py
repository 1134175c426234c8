"""Where the user's code raised, in one line: what the check's breaks and the commands'
errors say of an agent factory or a module that failed. Imports only the standard library."""

from __future__ import annotations

import os
import sysconfig
import traceback


def failure(error: BaseException) -> str:
    """``error`` in one line, with where the user's code raised it: ``KeyError: 'x' (at
    shop.py, line 12)``. That is the innermost frame outside the standard library,
    the installed packages and this package; else the innermost frame."""
    text = " ".join(str(error).split())
    if isinstance(error, SyntaxError) and error.filename:
        return f"{type(error).__name__}: {error.msg} (at {error.filename}, line {error.lineno})"
    frames = traceback.extract_tb(error.__traceback__)
    own = [frame for frame in frames if not _library(frame.filename)]
    frame = (own or frames)[-1] if frames else None
    where = f" (at {frame.filename}, line {frame.lineno})" if frame is not None else ""
    return f"{type(error).__name__}: {text}{where}" if text else f"{type(error).__name__}{where}"


# Where code that is not the user's lives: the standard library, installed packages, us.
_LIBRARIES = tuple(
    {
        os.path.realpath(path) + os.sep
        for path in (
            sysconfig.get_paths()["stdlib"],
            sysconfig.get_paths()["purelib"],
            sysconfig.get_paths()["platlib"],
            os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        )
    }
)


def _library(filename: str) -> bool:
    if filename.startswith("<"):  # <frozen importlib._bootstrap>, <string>
        return True
    return os.path.realpath(filename).startswith(_LIBRARIES)
