"""A runner's heartbeat refused by something other than an outage of the database (another
program's trigger, a table taken away, a bug): the error is logged and the heartbeat tried
again; if it stays refused for DEAD_AFTER seconds, the runner's claims are no longer its
own, and it stops, loudly (``runner/heartbeat.py``).

The runners run in threads of the test's own, on the real clock. The stop takes
DEAD_AFTER seconds: the default run plays it on PostgreSQL (a fleet's backend);
``EFFECTFUL_DURABLE_CRASH=full`` on SQLite too.
"""

import threading

import pytest
from helpers import edit_rows, wait_until

from effectful_durable import AgentRunner, Store
from effectful_durable.runner import heartbeat

#: Another program's trigger that refuses every heartbeat (an UPDATE of runner_status),
#: by backend: the statements that make it, and the one that drops it.
REFUSING = {
    "sqlite": (
        [
            "CREATE TRIGGER refuse BEFORE UPDATE ON runner_status"
            " BEGIN SELECT RAISE(ABORT, 'heartbeats refused'); END"
        ],
        "DROP TRIGGER refuse",
    ),
    "postgres": (
        [
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql"
            " AS $$ BEGIN RAISE EXCEPTION 'heartbeats refused'; END $$",
            "CREATE TRIGGER refuse BEFORE UPDATE ON runner_status"
            " FOR EACH ROW EXECUTE FUNCTION refuse()",
        ],
        "DROP TRIGGER refuse ON runner_status",
    ),
}


class RunnerThread:
    """An AgentRunner running in a thread of the test's own, and what ``run`` returned."""

    def __init__(self, url: str) -> None:
        from pg_faults_app import make_agent, make_handlers

        self.url = url
        self.runner = AgentRunner(url, agents=make_agent, handlers=make_handlers)
        self.returned: list[int] = []
        self.thread = threading.Thread(target=lambda: self.returned.append(self.runner.run()))

    def __enter__(self) -> "RunnerThread":
        self.thread.start()
        with Store(self.url, readonly=True) as store:
            wait_until(store.runner_statuses, 40, "the runner's status recorded")
        return self

    def __exit__(self, *exc: object) -> None:
        self.runner.stop()
        self.thread.join(timeout=60)
        self.runner.close()

    def reported_at(self) -> object:
        with Store(self.url, readonly=True) as store:
            (status,) = store.runner_statuses()
        return status["reported_at"]


def refuse_heartbeats(url: str) -> str:
    """Install the refusing trigger in ``url``; the statement that drops it."""
    make, drop = REFUSING["postgres" if "://" in url else "sqlite"]
    for statement in make:
        edit_rows(url, statement, foreign=True)
    return drop


class TestRefusedHeartbeats:
    """A heartbeat refused by something other than an outage is logged and tried again;
    a runner whose heartbeats stay refused stops, and says so."""

    def test_a_refused_heartbeat_is_logged_and_beats_again(
        self, store_url: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Another program's trigger refuses the runner's heartbeats: the error is
        logged with its words, and once the trigger is dropped the heartbeats land
        again and the runner runs on."""
        with RunnerThread(store_url) as running:
            drop = refuse_heartbeats(store_url)
            wait_until(
                lambda: "heartbeats refused" in caplog.text, 40, "a refused heartbeat logged"
            )
            refused_at = running.reported_at()
            edit_rows(store_url, drop, foreign=True)
            wait_until(
                lambda: running.reported_at() != refused_at,
                2 * heartbeat.HEARTBEAT_EVERY,
                "the heartbeats landing again",
            )
            assert running.thread.is_alive(), caplog.text
        assert running.returned == [0]
        assert "could not write the runner's heartbeat" in caplog.text

    def test_a_runner_whose_heartbeats_stay_refused_stops_loudly(
        self, fleet_url: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Heartbeats refused for DEAD_AFTER seconds (its claims are no longer its own):
        the runner stops on its own, logs why at CRITICAL, and run() returns 1."""
        with RunnerThread(fleet_url) as running:
            refuse_heartbeats(fleet_url)
            running.thread.join(timeout=heartbeat.HEARTBEAT_EVERY + heartbeat.DEAD_AFTER + 15)
            assert not running.thread.is_alive(), f"the runner runs on:\n{caplog.text}"
        assert running.returned == [1]
        (stopping,) = [r for r in caplog.records if r.levelname == "CRITICAL"]
        assert "heartbeats refused" in stopping.getMessage(), stopping.getMessage()
