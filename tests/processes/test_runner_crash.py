"""kill -9 of a runner at random moments while alarms fire loses nothing and repeats nothing.

A forking server (``tests/programs/runner_child.py``) imports once and forks one runner after
another; the test SIGKILLs each at a random moment, at least 10 times (20 with
``EFFECTFUL_DURABLE_CRASH=full``, ``make crash``), while 240
one-shot alarms of four agents and two recurring ones are delivered, then lets a last
runner finish. Afterwards, read through connections of our own: integrity_check is
ok; each one-shot alarm is done, delivered once, and its turn is in its agent's
history exactly once; each recurring alarm's turns in the history equal its
delivery count; every agent's versions are 1..v, one alarm turn each.
"""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from alarms_app import delivered
from helpers import integrity, persisted_rows
from paths import PROGRAMS

from effectful_durable import Store
from effectful_durable.store.alarms import make_schedule

CHILD = PROGRAMS / "runner_child.py"
FULL = os.environ.get("EFFECTFUL_DURABLE_CRASH") == "full"
KILLS = 20 if FULL else 10
AGENTS = 4
ONE_SHOTS = 240


def read_line(proc: subprocess.Popen[str], timeout: float = 120.0) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    line = proc.stdout.readline()
    if not line or time.monotonic() > deadline:
        raise AssertionError(f"runner_child printed nothing (exit {proc.poll()})")
    return line.strip()


def pending_one_shots(store_url: str) -> int:
    rows = persisted_rows(
        store_url, "SELECT count(*) FROM alarms WHERE status = 'pending' AND every IS NULL"
    )
    return int(rows[0][0])


@pytest.mark.slow
class TestRunnerCrash:
    """A runner killed at random moments delivers every alarm exactly once in the end."""

    @pytest.mark.parametrize("concurrency", [1, 8])
    def test_random_kills_lose_and_repeat_nothing(
        self, store_url: str, tmp_path: Path, concurrency: int
    ) -> None:
        """After 10+ SIGKILLs (20+ in full) and a last runner, each alarm's turn is in its
        history once.

        With 8 turns at once, a kill cuts off several turns of different agents. The
        default run plays one turn at a time on PostgreSQL and 8 on SQLite;
        ``EFFECTFUL_DURABLE_CRASH=full`` both on both.
        """
        postgres = "://" in str(store_url)
        if not FULL and (concurrency > 1) == postgres:
            pytest.skip(
                f"{concurrency} turn(s) at once on {'PostgreSQL' if postgres else 'SQLite'}: "
                "EFFECTFUL_DURABLE_CRASH=full"
            )
        now = time.time()
        with Store(store_url) as store:
            for n in range(ONE_SHOTS):
                store.schedule_alarm(
                    f"agent-{n % AGENTS}", f"job {n}", make_schedule(now, delay=0)
                )
            store.schedule_alarm("agent-0", "tick", make_schedule(now, every=1.0))
            store.schedule_alarm("agent-1", "tock", make_schedule(now, every=0.5))
        env = {**os.environ, "ALARMS_APP_JITTER": "0.02"}
        stderr = (tmp_path / "child.stderr").open("w")
        server = subprocess.Popen(
            [sys.executable, str(CHILD), str(store_url), str(concurrency)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
        )
        rng = random.Random(8)
        mid_turn = 0
        try:
            assert read_line(server) == "loaded"
            kills = 0
            # On a loaded machine a runner may be killed before its first turn:
            # go on until at least 3 kills landed inside a turn (at most 60 kills).
            while kills < KILLS or (mid_turn < 3 and kills < 60):
                assert server.stdin is not None
                server.stdin.write("go\n")
                server.stdin.flush()
                word, pid = read_line(server).split()
                assert word == "child"
                time.sleep(rng.uniform(0.05, 0.6))
                os.kill(int(pid), signal.SIGKILL)
                kills += 1
                time.sleep(0.02)  # the kernel reaps it (SIGCHLD is ignored)
                cut_off = persisted_rows(
                    store_url,
                    "SELECT count(*) FROM handoffs WHERE status = 'running' AND pid = ?",
                    int(pid),
                )
                mid_turn += min(cut_off[0][0], 1)
            assert pending_one_shots(store_url) > 0, "alarms ran out before the kills did"
            server.stdin.write("go\n")
            server.stdin.flush()
            _, last = read_line(server).split()
            deadline = time.monotonic() + 120
            while pending_one_shots(store_url) and time.monotonic() < deadline:
                time.sleep(0.1)
            os.kill(int(last), signal.SIGTERM)
            time.sleep(0.5)
        finally:
            if server.stdin:
                server.stdin.close()
            server.wait(timeout=30)
            stderr.close()
        print(f"{kills} kills, {mid_turn} of them inside a turn")  # shown with -s
        assert mid_turn >= 3, "too few kills landed inside a turn to test anything"
        assert integrity(store_url) == "ok"
        with Store(store_url) as store:
            alarms = store.alarms(include_ended=True)
            seen: list[str] = []
            for n in range(AGENTS):
                agent_id = f"agent-{n}"
                history = delivered(store.history(agent_id))
                seen += [action for action in history if action.startswith("job")]
                versions = store.versions(agent_id)
                assert [v.version for v in versions] == list(range(1, len(versions) + 1))
                assert all(v.template == "on_alarm" for v in versions)
                assert len(versions) == len(history)
                for alarm in alarms:
                    if alarm.agent_id == agent_id and alarm.every is not None:
                        assert history.count(alarm.action) == alarm.deliveries
            assert sorted(seen) == sorted(f"job {n}" for n in range(ONE_SHOTS))
            for alarm in alarms:
                if alarm.every is None:
                    assert (alarm.status, alarm.deliveries) == ("done", 1), alarm
