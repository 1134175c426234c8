"""The fleet example (examples/fleet) runs briefly, end to end, through PgBouncer.

As its README runs it: ``up.py`` starts a throwaway PostgreSQL cluster, PgBouncer
in transaction mode, the web service, two runners and the page; ``drive.py``
sends a small burst of requests and events; Ctrl-C stops it all. Between the
burst and the stop, the test reads the database itself: each request committed
an ``ask`` turn of its own, and each event (and the reminder a request asked
for) was delivered exactly once. It runs once, in a module-scoped fixture (each
of the service and the runners pays seconds to import litellm).

Skipped where the PostgreSQL server programs, psycopg or pgbouncer are missing,
saying so in one line; a failure instead when $EFFECTFUL_DURABLE_REQUIRE_POSTGRES
is set (tests/support/postgres_server.py, tests/support/pgbouncer_server.py).
"""

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from paths import ROOT
from pgbouncer_server import HOW_TO_ENABLE as NO_PGBOUNCER
from pgbouncer_server import find_pgbouncer
from postgres_server import REQUIRE_ENV, unavailable

EXAMPLE = ROOT / "examples" / "fleet"
ENV = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
USERS, REQUESTS, EVENTS = 4, 12, 8  # drive.py: one request in ten asks for a reminder
STARTUP = 240  # seconds up.py may take to start everything (three imports of litellm)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform == "win32", reason="Unix sockets; Ctrl-C as SIGINT"),
]


@dataclasses.dataclass
class Run:
    """One run of the fleet: what up.py and drive.py printed, and the database as
    the test read it after the burst."""

    out: Path
    fleet: dict[str, Any]
    drive: dict[str, Any]
    drive_returncode: int
    versions: dict[str, list[Any]]  # agent id -> VersionInfo
    events: list[Any]  # EventInfo, delivered ones included
    states: dict[str, dict[str, Any]]
    up_returncode: int
    up_output: str


def start(out: Path) -> subprocess.Popen[bytes]:
    """up.py on any free port, its output in ``out/up.log``, until fleet.json says it is up."""
    with open(out / "up.log", "wb") as log:
        up = subprocess.Popen(
            [sys.executable, str(EXAMPLE / "up.py"), "--port", "0", "--out", str(out)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=ENV,
            # A background job's SIGINT may be ignored, and the child would inherit that.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    deadline = time.monotonic() + STARTUP
    while not (out / "fleet.json").exists():
        if up.poll() is not None or time.monotonic() > deadline:
            stop(up)
            pytest.fail(f"up.py did not start:\n{(out / 'up.log').read_text()[-5000:]}")
        time.sleep(0.2)
    return up


def stop(up: subprocess.Popen[bytes]) -> None:
    """Ctrl-C; if up.py still runs two minutes later, SIGKILL (its processes then
    get SIGTERM, and its temp dir stays)."""
    up.send_signal(signal.SIGINT)
    try:
        up.wait(timeout=120)
    except subprocess.TimeoutExpired:
        up.kill()
        up.wait()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Start the fleet, drive a burst, read the database, press Ctrl-C."""
    from effectful_durable import NotFoundError, Store

    reason = unavailable() or (None if find_pgbouncer() else NO_PGBOUNCER)
    if reason is not None:
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{reason} (and {REQUIRE_ENV} is set)")
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("fleet")
    up = start(out)
    try:
        fleet = json.loads((out / "fleet.json").read_text())
        drive = subprocess.run(
            [sys.executable, str(EXAMPLE / "drive.py"), "--out", str(out), "--json",
             "--users", str(USERS), "--requests", str(REQUESTS), "--events", str(EVENTS),
             "--wait", "60"],
            capture_output=True, text=True, env=ENV, timeout=180,
        )  # fmt: skip
        assert drive.stdout, drive.stderr
        versions, states = {}, {}
        with Store(fleet["database"], readonly=True) as store:
            for agent_id in (f"user-u{n:02d}" for n in range(USERS)):
                with contextlib.suppress(NotFoundError):
                    versions[agent_id] = store.versions(agent_id)
                    states[agent_id] = store.state(agent_id)
            events = store.events(include_delivered=True)
    finally:
        stop(up)
    return Run(
        out,
        fleet,
        json.loads(drive.stdout),
        drive.returncode,
        versions,
        events,
        states,
        up.returncode,
        (out / "up.log").read_text(),
    )


class TestBurst:
    def test_drive_finds_every_turn_and_delivery(self, run: Run) -> None:
        """drive.py exits 0: each request answered, each event and reminder delivered once."""
        assert run.drive_returncode == 0, run.drive
        assert run.drive["problems"] == []
        assert run.drive["requests"]["committed"] == REQUESTS
        assert run.drive["events"]["delivered"] == EVENTS
        assert run.drive["reminders"] == {"asked": REQUESTS // 10, "delivered": REQUESTS // 10}

    def test_every_request_committed_a_turn_of_its_own(self, run: Run) -> None:
        """Each user's agent holds one ask turn per request the burst sent it."""
        asks = Counter(
            info.agent_id
            for infos in run.versions.values()
            for info in infos
            if info.template == "ask"
        )
        sent = Counter(f"user-u{n % USERS:02d}" for n in range(REQUESTS))
        assert asks == sent

    def test_every_event_delivered_exactly_once(self, run: Run) -> None:
        """Each event is done, in an on_event turn of its agent that no other event
        shares, and its agent noted it once."""
        assert len(run.events) == EVENTS
        turns = {(i.agent_id, i.version): i.template for v in run.versions.values() for i in v}
        delivered_in = [(event.agent_id, event.delivered_in) for event in run.events]
        assert all(event.status == "done" for event in run.events)
        assert len(set(delivered_in)) == EVENTS
        assert {turns[turn] for turn in delivered_in} == {"on_event"}
        noted = Counter(note for state in run.states.values() for note in state["inbox"])
        assert noted == Counter(f"parcel: {event.payload['text']}" for event in run.events)
        on_event = sum(template == "on_event" for template in turns.values())
        assert on_event == EVENTS  # and no event turn twice

    def test_the_reminder_was_sent_once(self, run: Run) -> None:
        """The request that asked for a reminder got it, once, in an on_alarm turn."""
        sent = [note for state in run.states.values() for note in state["reminders"]]
        assert len(sent) == REQUESTS // 10 and len(set(sent)) == len(sent)
        alarms = [i for v in run.versions.values() for i in v if i.template == "on_alarm"]
        assert len(alarms) == REQUESTS // 10

    def test_every_process_went_through_pgbouncer(self, run: Run) -> None:
        """PgBouncer, in transaction mode, had each process of the fleet among its clients,
        and served them with at most as many server connections."""
        assert run.fleet["database"].endswith(f":{run.fleet['pooler']['port']}/fleet")
        assert "pool_mode = transaction" in run.up_output
        pooler = run.drive["pooler"]
        assert pooler["error"] is None
        clients = pooler["clients_by_process"]
        assert {"service", "runner-1", "runner-2", "page", "drive"} <= clients.keys()
        assert 0 < pooler["servers"] <= pooler["clients"]


class TestStop:
    def test_ctrl_c_stops_everything_and_removes_the_servers(self, run: Run) -> None:
        """Ctrl-C: up.py exits 0, its processes are gone, its temp dir removed."""
        assert run.up_returncode == 0, run.up_output[-5000:]
        assert f"up.py: stopped; {run.fleet['directory']} removed" in run.up_output
        assert not Path(run.fleet["directory"]).exists()
        for name, pid in run.fleet["pids"].items():
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
            assert f"{name} did not stop" not in run.up_output
        assert "Traceback" not in run.up_output
        assert not (run.out / "fleet.json").exists()

    def test_the_runners_stopped_cleanly(self, run: Run) -> None:
        """Each runner logged its clean stop, with no error."""
        for number in (1, 2):
            assert f"runner-{number}  | " in run.up_output
        assert run.up_output.count(" stopped after ") == 2
        assert " ERROR " not in run.up_output
