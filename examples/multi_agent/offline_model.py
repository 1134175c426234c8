"""A scripted, offline stand-in for the model that the textkit team talks to.

Every answer is a function of the request alone: which template is asking (the
first words of the turn's prompt), which module it names, and what the tools
returned so far in this turn. Answers therefore never depend on how the two coder
threads interleave, and a run is the same every time. The code the "model" writes
is a real, working textkit whose own tests pass.

The reviewer is scripted to check two things in the files it reads: every public
function has a docstring, and the tests try the empty string. The first draft of
``redact`` misses both, so the review-and-fix loop runs once.
"""

import ast
import re
import threading

from effectful_durable.testing import FakeCall, FakeLLM, FakeLLMError, Reply, ToolCall

# -- The plan the architect answers with -------------------------------------------
PLAN = {
    "package": "textkit",
    "modules": [
        {
            "name": "slugify",
            "summary": "Turn any text into a lowercase ASCII slug for URLs.",
            "functions": ["slugify(text: str) -> str"],
        },
        {
            "name": "wrap",
            "summary": "Wrap text into lines of at most a given width.",
            "functions": ["wrap(text: str, width: int) -> list[str]"],
        },
        {
            "name": "redact",
            "summary": "Mask email addresses and phone numbers in text.",
            "functions": ["redact(text: str) -> str"],
        },
    ],
}

# -- The code the coders write ------------------------------------------------------
SLUGIFY = '''\
"""Turn any text into a URL slug."""

import re
import unicodedata

__all__ = ["slugify"]


def slugify(text: str) -> str:
    """Return ``text`` as a lowercase, ASCII, hyphen-separated slug.

    Accents are dropped ("Crème brûlée" -> "creme-brulee"), every run of other
    characters becomes one hyphen, and the slug never starts or ends with one.
    """
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return re.sub(r"[^a-z0-9]+", "-", ascii_text.lower()).strip("-")
'''

TEST_SLUGIFY = """\
import pytest

from textkit.slugify import slugify


@pytest.mark.parametrize(
    ("text", "slug"),
    [
        ("Hello, World!", "hello-world"),
        ("  many   spaces  ", "many-spaces"),
        ("Crème brûlée", "creme-brulee"),
        ("already-a-slug", "already-a-slug"),
        ("C++ & Python 3.12", "c-python-3-12"),
        ("", ""),
        ("!!!", ""),
    ],
)
def test_slugify(text, slug):
    assert slugify(text) == slug
"""

WRAP = '''\
"""Wrap text into lines of at most a given width."""

__all__ = ["wrap"]


def wrap(text: str, width: int) -> list[str]:
    """Split ``text`` into lines of at most ``width`` characters, between words.

    Runs of whitespace count as one space, and a word longer than ``width`` is
    cut across as many lines as it needs.

    Raises:
        ValueError: ``width`` is less than 1.
    """
    if width < 1:
        msg = f"width must be at least 1, not {width}"
        raise ValueError(msg)
    lines: list[str] = []
    line = ""
    for word in text.split():
        while len(word) > width:  # no line can hold it: cut it
            if line:
                lines.append(line)
                line = ""
            lines.append(word[:width])
            word = word[width:]
        if not line:
            line = word
        elif len(line) + 1 + len(word) <= width:
            line = f"{line} {word}"
        else:
            lines.append(line)
            line = word
    if line:
        lines.append(line)
    return lines
'''

TEST_WRAP = """\
import pytest

from textkit.wrap import wrap


def test_breaks_between_words():
    assert wrap("the quick brown fox jumps", 10) == ["the quick", "brown fox", "jumps"]


def test_every_line_fits_and_no_word_is_lost():
    text = "lorem ipsum dolor sit amet consectetur adipiscing elit"
    lines = wrap(text, 12)
    assert all(len(line) <= 12 for line in lines)
    assert " ".join(lines) == text


def test_cuts_a_word_longer_than_the_width():
    assert wrap("a supercalifragilistic word", 8) == [
        "a",
        "supercal",
        "ifragili",
        "stic",
        "word",
    ]


def test_empty_and_blank_text_give_no_lines():
    assert wrap("", 5) == []
    assert wrap("  \\n ", 5) == []


def test_width_must_be_positive():
    with pytest.raises(ValueError):
        wrap("text", 0)
"""

_REDACT_HEAD = '''\
"""Mask email addresses and phone numbers in text."""

import re

__all__ = ["redact"]

EMAIL = re.compile(r"[\\w.+-]+@[\\w-]+(?:\\.[\\w-]+)+")
# An optional "+" or "(", then 7 to 15 digits with spaces, dots, dashes or
# parentheses between them: "+1 (555) 123-4567", "020 7946 0958".
PHONE = re.compile(r"(?<!\\w)[+(]?\\d(?:[\\s().-]*\\d){6,14}(?!\\w)")


def redact(text: str) -> str:
'''

_REDACT_BODY = """\
    return PHONE.sub("[phone]", EMAIL.sub("[email]", text))
"""

_REDACT_DOC = '''\
    """Return ``text`` with every email address and phone number masked.

    Emails become ``[email]`` and phone numbers ``[phone]``; all other text,
    short numbers included, is left as it is.
    """
'''

REDACT_DRAFT = _REDACT_HEAD + _REDACT_BODY
REDACT = _REDACT_HEAD + _REDACT_DOC + _REDACT_BODY

TEST_REDACT_DRAFT = """\
from textkit.redact import redact


def test_masks_emails():
    text = "Mail ada@example.com or bob.smith+news@mail.co.uk."
    assert redact(text) == "Mail [email] or [email]."


def test_masks_phone_numbers():
    text = "Call +1 (555) 123-4567 or 020 7946 0958."
    assert redact(text) == "Call [phone] or [phone]."


def test_keeps_other_text_and_short_numbers():
    text = "Order 42 shipped in 3 boxes on day 7."
    assert redact(text) == text
"""

TEST_REDACT = (
    TEST_REDACT_DRAFT
    + """

def test_empty_string():
    assert redact("") == ""
"""
)

PACKAGE_INIT = '''\
"""textkit: small text utilities."""

from textkit.redact import redact
from textkit.slugify import slugify
from textkit.wrap import wrap

__all__ = ["redact", "slugify", "wrap"]
'''

PYPROJECT = """\
[project]
name = "textkit"
version = "0.1.0"
description = "Small text utilities: slugify, wrap, redact."
requires-python = ">=3.10"

[tool.pytest.ini_options]
pythonpath = ["."]
testpaths = ["tests"]
"""

# module name -> (first draft, final version), each as (module source, test source)
DRAFTS = {"redact": (REDACT_DRAFT, TEST_REDACT_DRAFT)}
FINAL = {
    "slugify": (SLUGIFY, TEST_SLUGIFY),
    "wrap": (WRAP, TEST_WRAP),
    "redact": (REDACT, TEST_REDACT),
}


# -- Reading the request -------------------------------------------------------------
def _text(message: dict) -> str:
    content = message.get("content") or ""
    if isinstance(content, str):
        return content
    return "".join(block.get("text", "") for block in content)


def _this_turn(call: FakeCall) -> tuple[str, list[dict]]:
    """The prompt that started the current turn, and the messages since."""
    for i in range(len(call.messages) - 1, -1, -1):
        if call.messages[i]["role"] == "user":
            return _text(call.messages[i]), call.messages[i + 1 :]
    return "", []


def _tools_called(since: list[dict]) -> list[str]:
    """Names of the tools called so far in this turn, short form, in order."""
    return [
        tc["function"]["name"].rsplit("__", 1)[-1]
        for m in since
        if m["role"] == "assistant"
        for tc in m.get("tool_calls") or ()
    ]


def _tool_results(since: list[dict]) -> list[str]:
    return [_text(m) for m in since if m["role"] == "tool"]


def _module(prompt: str) -> str:
    found = re.search(r"textkit/(\w+)\.py", prompt)
    if found is None or found[1] not in FINAL:
        msg = f"the offline model knows no module in this prompt: {prompt[:200]!r}"
        raise FakeLLMError(msg)
    return found[1]


def _write(name: str, sources: tuple[str, str]) -> list[ToolCall]:
    module, tests = sources
    return [
        ToolCall("write_file", {"path": f"textkit/{name}.py", "content": module}),
        ToolCall("write_file", {"path": f"tests/test_{name}.py", "content": tests}),
    ]


def _read(name: str) -> list[ToolCall]:
    return [
        ToolCall("read_file", {"path": f"textkit/{name}.py"}),
        ToolCall("read_file", {"path": f"tests/test_{name}.py"}),
    ]


# -- Each template's script ------------------------------------------------------------
def _write_module(prompt: str, since: list[dict]) -> Reply:
    name = _module(prompt)
    if not _tools_called(since):
        return _write(name, DRAFTS.get(name, FINAL[name]))
    return f"Wrote textkit/{name}.py and tests/test_{name}.py."


def _fix_module(prompt: str, since: list[dict]) -> Reply:
    name = _module(prompt)
    called = _tools_called(since)
    if not called:
        return _read(name)
    if "write_file" not in called:
        return _write(name, FINAL[name])
    return f"Fixed textkit/{name}.py and tests/test_{name}.py as the review asked."


def _review(prompt: str, since: list[dict]) -> Reply:
    name = _module(prompt)
    if not _tools_called(since):
        return _read(name)
    module, tests = _tool_results(since)[-2:]
    comments = review_comments(name, module, tests)
    return {"approved": not comments, "comments": comments}


def _package(prompt: str, since: list[dict]) -> Reply:
    if not _tools_called(since):
        return [
            ToolCall("write_file", {"path": "textkit/__init__.py", "content": PACKAGE_INIT}),
            ToolCall("write_file", {"path": "pyproject.toml", "content": PYPROJECT}),
        ]
    return "Wrote textkit/__init__.py (re-exports redact, slugify, wrap) and pyproject.toml."


SCRIPTS = {
    "Plan": lambda prompt, since: PLAN,
    "Write the module": _write_module,
    "The reviewer did not approve": _fix_module,
    "Review the module": _review,
    "Finish the package": _package,
}


def review_comments(name: str, module: str, tests: str) -> list[str]:
    """What the scripted reviewer asks to change; empty when it approves."""
    comments = []
    try:
        tree = ast.parse(module)
    except SyntaxError as e:
        return [f"textkit/{name}.py does not parse: {e}"]
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            if ast.get_docstring(node) is None:
                comments.append(
                    f"{node.name}() has no docstring: say what it masks or returns "
                    "and what it leaves alone."
                )
    if '("")' not in tests and '("",' not in tests:
        comments.append(f"tests/test_{name}.py never tries the empty string.")
    return comments


def respond(call: FakeCall) -> Reply:
    """Answer one request from the prompt that started the turn and the tool results since."""
    prompt, since = _this_turn(call)
    for opening, script in SCRIPTS.items():
        if prompt.lstrip().startswith(opening):
            return script(prompt, since)
    msg = f"the offline model has no script for this prompt: {prompt[:200]!r}"
    raise FakeLLMError(msg)


def scripted_model(*, delay: float = 0.0, stopping: threading.Event | None = None) -> FakeLLM:
    """The offline model: a FakeLLM answering with :func:`respond`.

    Args:
        delay: Seconds each answer takes, so that a person can press Ctrl-C mid-run.
        stopping: Set when the run is being stopped; a waiting answer then raises
            KeyboardInterrupt instead of arriving.
    """
    stopping = stopping or threading.Event()

    def slow_respond(call: FakeCall) -> Reply:
        if delay and stopping.wait(delay):
            raise KeyboardInterrupt
        return respond(call)

    return FakeLLM(respond=slow_respond)
