"""Runners cut off the network at random deliver every event once, in order, with one
model call each but for the turns the cuts caught (DESIGN.md, promise 11), on PostgreSQL.

Three runners (``heartbeat_app``, concurrency 2), each on a host of its own
(``tests/support/netns.py``), reach the server over TCP. Events for 40 agents are sent
while, again and again, a random runner is cut off for 20 to 60 s (blackhole
routes: nothing tells it or the server) and healed. Each turn's model takes 0.5
to 2 s, so cuts find turns in flight. No runner is restarted.

Then: every event was delivered (its agent's history holds it once, in the
order sent); each event's model was called once, and a second time only when
the first call ran on a runner cut off before its turn could commit; every
runner is still running. The seed, the cuts and the times from each event's
sending to its commit are printed (``-s``).

``EFFECTFUL_DURABLE_CRASH=full`` (``make crash``) only: 200 events and 10 cuts,
about 8 minutes. The default run has the single cut of ``test_partitions.py``.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import threading
import time
from pathlib import Path

import pytest
from heartbeat_app import PAYLOAD
from helpers import texts, wait_until
from netns import Host, Network
from postgres_server import PostgresServer
from runner_procs import Runner, Start, starts_of, write_config

from effectful_durable import Store

FULL = os.environ.get("EFFECTFUL_DURABLE_CRASH") == "full"
RUNNERS, AGENTS, EVENTS, CUTS = 3, 40, 200, 10
CUT_SECONDS = (20.0, 60.0)
PAUSE = 5.0  # seconds between a heal and the next cut
# A turn that began before its runner's cut may run this long past its start (its
# model call, its commit) and still be caught by the cut.
CAUGHT_WITHIN = 2.0 + 15.0

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not FULL, reason="EFFECTFUL_DURABLE_CRASH=full (make crash)"),
]


class Cut:
    """One runner's time off the network."""

    def __init__(self, pid: int, began: float, ended: float) -> None:
        self.pid, self.began, self.ended = pid, began, ended

    def caught(self, start: Start) -> bool:
        """Whether this cut may have kept ``start``'s turn from committing."""
        return start.pid == self.pid and self.began - CAUGHT_WITHIN <= start.at <= self.ended


def test_runners_cut_off_at_random_deliver_every_event_once(
    net: Network, listening_server: PostgresServer, tmp_path: Path
) -> None:
    """Three runners, 10 cuts of 20 to 60 s, 200 events: each delivered once and in
    order; a second model call only for a turn a cut caught; no runner restarted."""
    seed = int(os.environ.get("EFFECTFUL_DURABLE_SEED", time.time_ns() % 1_000_000))
    print(f"seed {seed}")
    chance = random.Random(seed)
    here = listening_server.new_database()
    remote = f"postgresql://postgres@{net.server}:5432/{here.rsplit('/', 1)[1]}"
    config = write_config(tmp_path / "runner.toml", concurrency=2)
    starts = tmp_path / "starts.txt"
    hosts: list[Host] = [net.host() for _ in range(RUNNERS)]
    runners = [Runner(host.command([]), remote, config, starts) for host in hosts]
    sent: dict[int, float] = {}
    cuts: list[Cut] = []
    planned = CUTS * (sum(CUT_SECONDS) / 2 + PAUSE)

    def send_events() -> None:
        with Store(here) as store:
            for n in range(EVENTS):
                agent = f"a{n % AGENTS:02d}"
                payload = {"n": n, "seconds": round(chance.uniform(0.5, 2.0), 2)}
                store.send_event(agent, "job", payload, create=True)
                sent[n] = time.time()
                time.sleep(planned / EVENTS)

    sender = threading.Thread(target=send_events)
    try:
        sender.start()
        for _ in range(CUTS):
            time.sleep(PAUSE)
            at = chance.randrange(RUNNERS)
            hosts[at].cut()
            began = time.time()
            time.sleep(chance.uniform(*CUT_SECONDS))
            hosts[at].heal()
            cuts.append(Cut(runners[at].proc.pid, began, time.time()))
            print(f"cut runner {at} for {cuts[-1].ended - began:.0f} s")
        sender.join()
        with Store(here) as store:
            wait_until(
                lambda: (
                    [e.status for e in store.events(include_delivered=True)] == ["done"] * EVENTS
                ),
                300,
                "every event delivered",
                poll=1.0,
            )
            histories = {f"a{n:02d}": store.history(f"a{n:02d}") for n in range(AGENTS)}
            committed = {
                f"a{n:02d}": [v.committed_at.timestamp() for v in store.versions(f"a{n:02d}")]
                for n in range(AGENTS)
            }
        alive = [runner.proc.poll() is None for runner in runners]
    finally:
        for host in hosts:
            if host.is_cut:
                host.heal()
        for runner in runners:
            runner.stop()
        sender.join()
        listening_server.drop_database(here)

    assert alive == [True] * RUNNERS, [runner.text()[-2000:] for runner in runners]
    for agent, history in histories.items():
        told = [PAYLOAD.search(text) for text in texts(history) if text.startswith("user:")]
        numbers = [json.loads(found[1])["n"] for found in told if found]
        mine = [n for n in range(EVENTS) if f"a{n % AGENTS:02d}" == agent]
        assert numbers == mine, (agent, numbers)  # once each, in the order sent
    by_event: dict[int, list[Start]] = {}
    for start in starts_of(starts):
        by_event.setdefault(int(start.payload["n"]), []).append(start)
    again = 0
    for n, calls in by_event.items():
        extra = len(calls) - 1
        caught = sum(1 for call in calls if any(cut.caught(call) for cut in cuts))
        assert extra <= caught, (n, calls, [vars(cut) for cut in cuts])
        again += extra
    assert sorted(by_event) == list(range(EVENTS))
    latencies = sorted(
        at - sent[n]
        for agent, times in committed.items()
        for n, at in zip(
            [n for n in range(EVENTS) if f"a{n % AGENTS:02d}" == agent], times, strict=True
        )
    )
    print(
        f"{EVENTS} events, {len(cuts)} cuts, {again} model calls again (turns caught by a "
        f"cut); sent to committed: median {statistics.median(latencies):.2f} s, "
        f"max {latencies[-1]:.2f} s"
    )
