"""``effectful-durable run`` as a real process: SIGUSR1, SIGHUP (good and bad), SIGTERM."""

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import StderrLines, persisted_rows
from pg_faults import FaultyServer
from postgres_server import running

from effectful_durable import Store
from effectful_durable.cli import main
from effectful_durable.store.alarms import make_schedule

START_TIMEOUT = 120.0


class Runner(StderrLines):
    """One ``effectful-durable run`` process whose log lines are read with deadlines."""

    def __init__(
        self, store_url: str, config: Path, *, slow: float, extra: tuple[str, ...] = ()
    ) -> None:
        env = {
            **os.environ,
            "ALARMS_APP_SLOW": str(slow),
        }
        super().__init__(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "effectful_durable",
                    "run",
                    str(store_url),
                    "--agents",
                    "alarms_app:make_agent",
                    "--handlers",
                    "alarms_app:make_handlers",
                    "--config",
                    str(config),
                    *extra,
                ],
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
        )

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


def schedule(store_url: str, agent_id: str, action: str, delay: float = 0.0) -> str:
    with Store(store_url) as store:
        return store.schedule_alarm(agent_id, action, make_schedule(time.time(), delay=delay))


def write_config(path: Path, hooks: Path, mood: str, grace: float) -> None:
    path.write_text(
        f"[runner]\npoll_interval = 0.1\ngrace_seconds = {grace}\n\n"
        f'[features]\nhook_file = "{hooks}"\nmood = "{mood}"\n'
    )


@pytest.mark.slow
class TestSignals:
    """The runner reacts to its signals as the docs say."""

    def test_status_reload_and_clean_stop(
        self, store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """SIGUSR1 reports, SIGHUP reloads (a bad file changes nothing), SIGTERM waits."""
        hooks, config = tmp_path / "hooks.jsonl", tmp_path / "agents.toml"
        write_config(config, hooks, "calm", grace=30)
        schedule(store_url, "k", "first")
        runner = Runner(store_url, config, slow=1.5)
        try:
            runner.expect("started", timeout=START_TIMEOUT)
            runner.expect("delivered alarm")

            runner.signal(signal.SIGUSR1)
            line = runner.expect("status:")
            assert "1 turns, 0 errors" in line
            assert main(["status", str(store_url), "--json"]) == 0
            assert '"turns": 1' in capsys.readouterr().out

            config.write_text("[runner\n")
            runner.signal(signal.SIGHUP)
            runner.expect("config not reloaded, keeping generation 1")
            write_config(config, hooks, "busy", grace=30)
            runner.signal(signal.SIGHUP)
            runner.expect("config reloaded: generation 2")
            moods = hooks.read_text().splitlines()
            assert len(moods) == 2 and '"busy"' in moods[1]  # seen at start, then reload

            schedule(store_url, "k", "slow second")
            runner.expect("delivering alarm")  # noticed within the poll interval
            runner.signal(signal.SIGTERM)
            runner.expect("stopping: waiting up to 30 s")
            runner.expect("delivered alarm")
            runner.expect("stopped after 2 turns")
            assert runner.proc.wait(timeout=30) == 0
        finally:
            runner.stop()
        rows = persisted_rows(store_url, "SELECT action, status FROM alarms ORDER BY created_at")
        assert rows == [("first", "done"), ("slow second", "done")]
        assert main(["status", str(store_url)]) == 0
        assert "state: stopped" in capsys.readouterr().out

    def test_stop_past_grace_interrupts_the_turn(self, store_url: str, tmp_path: Path) -> None:
        """A turn longer than the grace period is interrupted: handoff left, alarm kept."""
        hooks, config = tmp_path / "hooks.jsonl", tmp_path / "agents.toml"
        write_config(config, hooks, "calm", grace=0.5)
        runner = Runner(store_url, config, slow=30)
        try:
            runner.expect("started", timeout=START_TIMEOUT)
            schedule(store_url, "k", "slow job")
            runner.expect("delivering alarm")
            runner.signal(signal.SIGTERM)
            runner.expect("grace period of 0.5 s over")
            runner.expect("turn interrupted; alarm put back")
            assert runner.proc.wait(timeout=30) == 0
        finally:
            runner.stop()
        assert persisted_rows(store_url, "SELECT status, attempts FROM alarms") == [("pending", 0)]
        (handoff,) = persisted_rows(store_url, "SELECT status, error FROM handoffs")
        assert handoff[0] == "failed" and "KeyboardInterrupt" in handoff[1]
        assert persisted_rows(store_url, "SELECT count(*) FROM versions") == [(0,)]

    def test_turns_at_once_are_listed_and_all_finish_on_sigterm(
        self, store_url: str, tmp_path: Path
    ) -> None:
        """``--concurrency 4``: four slow turns run at once, SIGUSR1 lists them, SIGTERM waits."""
        hooks, config = tmp_path / "hooks.jsonl", tmp_path / "agents.toml"
        write_config(config, hooks, "calm", grace=30)
        runner = Runner(store_url, config, slow=5, extra=("--concurrency", "4"))
        try:
            runner.expect("started", timeout=START_TIMEOUT)
            # Due together, a second from now: on a busy machine scheduling them one by
            # one took longer than a turn, and the first turn ended before the last began.
            with Store(store_url) as store:
                due = make_schedule(time.time(), delay=1.0)
                for n in range(4):
                    store.schedule_alarm(f"k{n}", "slow job", due)
            for _ in range(4):
                runner.expect("delivering alarm")
            runner.signal(signal.SIGUSR1)
            line = runner.expect("status:")
            assert line.count("'kind': 'alarm'") == 4, line
            runner.signal(signal.SIGTERM)
            runner.expect("stopping: waiting up to 30 s for 4 turn(s)")
            runner.expect("stopped after 4 turns")
            assert runner.proc.wait(timeout=30) == 0
        finally:
            runner.stop()
        rows = persisted_rows(store_url, "SELECT status FROM alarms")
        assert rows == [("done",)] * 4


@pytest.fixture(scope="module")
def faulty_server() -> Iterator[FaultyServer]:
    """A cluster of this module's own: it is frozen."""
    with running(FaultyServer) as server:
        yield server


@pytest.mark.slow
class TestFrozenServer:
    """SIGTERM while the PostgreSQL server is frozen: ``run`` exits within grace + 5 s."""

    @pytest.mark.parametrize("concurrency", [1, 4])
    def test_sigterm_with_turns_in_flight_and_the_server_frozen(
        self, faulty_server: FaultyServer, tmp_path: Path, concurrency: int
    ) -> None:
        """Turns in model requests when the server freezes (SIGSTOP of all its
        processes), then SIGTERM: past the grace, the turns' connections are closed
        instead of waiting out statement_timeout (10 s), and ``run`` exits 0 within
        grace + 5 s; after the thaw every alarm is still there, pending."""
        grace = 3.0
        url = faulty_server.new_database()
        hooks, config = tmp_path / "hooks.jsonl", tmp_path / "agents.toml"
        write_config(config, hooks, "calm", grace=grace)  # statement_timeout: 10 s
        runner = Runner(url, config, slow=60, extra=("--concurrency", str(concurrency)))
        try:
            runner.expect("started", timeout=START_TIMEOUT)
            with Store(url) as store:
                due = make_schedule(time.time(), delay=0.5)
                for n in range(concurrency):
                    store.schedule_alarm(f"f{n}", "slow job", due)
            for _ in range(concurrency):
                runner.expect("delivering alarm")
            time.sleep(0.5)  # into the model requests
            faulty_server.freeze()
            time.sleep(1.0)
            stopped = time.monotonic()
            runner.signal(signal.SIGTERM)
            runner.proc.wait(timeout=grace + 60)
            took = time.monotonic() - stopped
        finally:
            faulty_server.thaw()
            runner.stop()
        log = "\n".join(runner.log)
        (tmp_path / "runner.log").write_text(log)  # kept by pytest, for a failure's story
        print(f"--concurrency {concurrency}: exited {took:.1f} s after SIGTERM, grace {grace:g} s")
        assert runner.proc.returncode == 0, log
        assert took <= grace + 5, (took, log)
        assert "Traceback" not in log, log
        rows = persisted_rows(url, "SELECT status, attempts FROM alarms")
        assert rows == [("pending", 0)] * concurrency, (rows, log)
        faulty_server.drop_database(url)
