"""Benchmark: how soon is an agent held by a host cut off the network usable elsewhere?

Each round, on a fresh database of a throwaway PostgreSQL cluster that listens on an
address of the tests' own network (``tests/support/netns.py``: 198.18.0.0/15, network
namespaces joined by veth pairs), a holder on a host of that network starts a turn
of agent ``shared`` whose model takes a minute: a worker (``tests/programs/partition_worker.py``,
a process running one turn, as a web service does) or a runner (``effectful-durable
run`` delivering an event, ``tests/programs/heartbeat_app.py``). Once its model is called,
the host is cut off (a blackhole route on each side: packets vanish, and nobody is
told). This process then runs a turn of ``shared`` every 0.1 s (AgentInUseError
until the hold lapses), and the round's figure is the time from the cut to its
first committed turn. The host is healed and the holder stopped. Directly, and
through PgBouncer in transaction mode on the same address.

DESIGN.md's promise 11: within 30 s. A hold lapses 15 s after its last renewal, and
its holder renews every 5 s, so the figure lies between 10 and 15 s plus the try's
interval; a runner holds the event's claim too, given back by the other runners'
rescue (not needed here: the turn here is not a delivery).

Run: ``.venv/bin/python bench/bench_partitions.py [--cuts 10] [--holders worker,runner]
[--paths direct,pgbouncer]``, as root (network namespaces). No assertions.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

import paths  # noqa: E402  (the tests' modules, and the programs it starts)
from helpers import first_turn_after, wait_until  # noqa: E402
from netns import Host, Network, network  # noqa: E402
from pgbouncer_server import PgBouncer, find_pgbouncer  # noqa: E402
from postgres_server import PostgresServer, find_bindir  # noqa: E402
from runner_procs import Runner, starts_of, worker, write_config  # noqa: E402

from effectful_durable import Store  # noqa: E402

paths.install()

#: Seconds a holder's model takes: longer than any round.
MODEL = 60


@contextmanager
def servers(paths: list[str]) -> Iterator[tuple[Network, PostgresServer, PgBouncer | None]]:
    """The network, a cluster listening on it, and a PgBouncer if asked for."""
    with network() as net:
        bindir = find_bindir()
        if bindir is None:
            sys.exit("no PostgreSQL server binaries (apt-get install postgresql)")
        cluster = PostgresServer(bindir, listen=str(net.server))
        cluster.start()
        bouncer = None
        try:
            if "pgbouncer" in paths:
                executable = find_pgbouncer()
                if executable is None:
                    sys.exit("no pgbouncer (apt-get install pgbouncer)")
                bouncer = PgBouncer(executable, cluster, {"listen_addr": str(net.server)})
                bouncer.start()
            yield net, cluster, bouncer
        finally:
            if bouncer is not None:
                bouncer.stop()
            cluster.stop()


def hold(host: Host, holder: str, remote: str, here: str, workdir: Path) -> subprocess.Popen[str]:
    """Start ``holder`` on ``host``; its process, once its model was called in a turn of
    ``shared``."""
    if holder == "worker":
        return worker(host.command([]), remote, "shared", MODEL)
    starts = workdir / "starts.txt"
    starts.unlink(missing_ok=True)
    config = write_config(workdir / "runner.toml")
    runner = Runner(host.command([]), remote, config, starts, seconds=MODEL)
    try:
        with Store(here) as store:
            store.send_event("shared", "job", {"n": 1}, create=True)
        wait_until(lambda: starts_of(starts), 120, "the runner's turn of the event began")
    except BaseException:
        runner.proc.kill()
        raise
    return runner.proc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cuts", type=int, default=10)
    parser.add_argument("--holders", default="worker,runner")
    parser.add_argument("--paths", default="direct,pgbouncer")
    args = parser.parse_args()
    holders, paths = args.holders.split(","), args.paths.split(",")
    results: dict[tuple[str, str], list[float]] = {}
    with servers(paths) as (net, cluster, _), tempfile.TemporaryDirectory() as workdir:
        for path in paths:
            for holder in holders:
                figures = results[(holder, path)] = []
                for _ in range(args.cuts):
                    here = cluster.new_database()
                    port = 6432 if path == "pgbouncer" else 5432
                    name = here.rsplit("/", 1)[1]
                    remote = f"postgresql://postgres@{net.server}:{port}/{name}"
                    host = net.host()
                    proc = hold(host, holder, remote, here, Path(workdir))
                    try:
                        host.cut()
                        figures.append(first_turn_after(here, "shared", time.monotonic(), MODEL))
                    finally:
                        host.heal()
                        proc.kill()
                        proc.wait()
                        cluster.drop_database(here)
                    took = figures[-1]
                    print(f"{holder:6} {path:9} cut -> usable here: {took:5.1f} s", flush=True)
    print()
    print(f"{'holder':8}{'path':11}{'cuts':>5}{'median':>9}{'max':>8}{'min':>8}")
    for (holder, path), figures in results.items():
        print(
            f"{holder:8}{path:11}{len(figures):>5}{statistics.median(figures):>8.1f}s"
            f"{max(figures):>7.1f}s{min(figures):>7.1f}s"
        )


if __name__ == "__main__":
    main()
