"""``effectful-durable ui`` run for real, in a child process, for the tests to use."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from paths import PROGRAMS, ROOT

#: ``python -m effectful_durable``, with log records at INFO on stderr (the command
#: configures no logging but uvicorn's own).
LOGGING_AT_INFO = """
import logging, sys
from effectful_durable.cli import main
logging.basicConfig(level=logging.INFO)
sys.exit(main())
"""


def cli_json(*argv: str) -> Any:
    """The JSON a command of ``effectful-durable`` prints (``--json``), run in a process."""
    ran = subprocess.run(
        [sys.executable, "-m", "effectful_durable", *argv, "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout)


@dataclass
class Server:
    """A running page: its process, the address it printed, and what it wrote."""

    process: subprocess.Popen[str]
    url: str
    output: list[str] = field(default_factory=list)

    @property
    def base(self) -> str:
        """``http://host:port``."""
        return self.url.split("/?", 1)[0]

    @contextlib.contextmanager
    def client(self) -> Iterator[httpx.Client]:
        """A client let in through the printed address (it holds the cookie)."""
        with httpx.Client(base_url=self.base, timeout=30, follow_redirects=True) as client:
            entered = client.get(self.url)
            assert entered.status_code == 200, entered.text
            yield client


@contextlib.contextmanager
def serving(db: str, *options: str, logging: bool = False) -> Iterator[Server]:
    """Run ``effectful-durable ui DB --no-browser --port 0 OPTIONS`` until the block ends;
    with ``logging``, its log records at INFO join its output."""
    command = ["-c", LOGGING_AT_INFO] if logging else ["-m", "effectful_durable"]
    process = subprocess.Popen(
        [sys.executable, *command, "ui", db, "--no-browser", *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stdout is not None
    output: list[str] = []
    url = None
    for line in process.stdout:
        output.append(line)
        found = re.match(r"open (http://\S+)", line)
        if found:
            url = found[1]
            break
    if url is None:
        process.wait(timeout=30)
        raise AssertionError("the page did not start:\n" + "".join(output))
    reader = threading.Thread(target=lambda: output.extend(process.stdout or ()), daemon=True)
    reader.start()
    server = Server(process, url, output)
    try:
        yield server
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def write_turns(db: str, turns: int) -> subprocess.CompletedProcess[str]:
    """Commit ``turns`` turns of agent ``w`` from another process (programs/turns_child.py)."""
    return subprocess.run(
        [sys.executable, str(PROGRAMS / "turns_child.py"), db, str(turns)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
