"""Benchmark: how soon is an agent held by a host cut off the network usable elsewhere?

Each round, on a fresh database of a throwaway PostgreSQL cluster that listens on an
address of the tests' own network (``tests/netns.py``: 198.18.0.0/15, network
namespaces joined by veth pairs), a holder on a host of that network starts a turn
of agent ``shared`` whose model takes a minute: a worker (``tests/partition_worker.py``,
a process running one turn, as a web service does) or a runner (``effectful-durable
run`` delivering an event, ``tests/heartbeat_app.py``). Once its model is called,
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
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from effectful.ops.semantics import handler  # noqa: E402

from effectful_durable import AgentInUseError, PersistenceHandler, Store  # noqa: E402
from effectful_durable.testing import FakeLLM  # noqa: E402
from tests.helpers import Assistant  # noqa: E402


@contextmanager
def servers(paths: list[str]) -> Iterator[tuple[object, object, object | None]]:
    """The network, a cluster listening on it, and a PgBouncer if asked for."""
    from netns import network
    from pgbouncer_server import PgBouncer, find_pgbouncer
    from postgres_server import PostgresServer, find_bindir

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


def hold(host, holder: str, remote: str, here: str, workdir: Path):  # type: ignore[no-untyped-def]
    """Start ``holder`` on ``host``; return once its model was called in a turn of ``shared``."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{ROOT}"}
    if holder == "worker":
        script = str(ROOT / "tests" / "partition_worker.py")
        command = [sys.executable, script, remote, "shared", "60"]
        proc = subprocess.Popen(host.command(command), stdout=subprocess.PIPE, text=True, env=env)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "model"
        return proc
    starts = workdir / "starts.txt"
    starts.unlink(missing_ok=True)
    config = workdir / "runner.toml"
    config.write_text("[runner]\npoll_interval = 0.1\n")
    command = [
        sys.executable, "-m", "effectful_durable", "run", remote,
        "--agents", "heartbeat_app:make_agent", "--handlers", "heartbeat_app:make_handlers",
        "--config", str(config),
    ]  # fmt: skip
    env |= {"HEARTBEAT_APP_STARTS": str(starts), "HEARTBEAT_APP_SECONDS": "60"}
    proc = subprocess.Popen(
        host.command(command), stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env
    )
    with Store(here) as store:
        store.send_event("shared", "job", {"n": 1}, create=True)
    deadline = time.monotonic() + 120
    while not (starts.exists() and starts.read_text()):
        if time.monotonic() > deadline:
            proc.kill()
            sys.exit("the runner did not begin the event's turn within 120 s")
        time.sleep(0.05)
    return proc


def free_after_cut(host, here: str) -> float:  # type: ignore[no-untyped-def]
    """Cut ``host`` off; seconds until a turn of ``shared`` here commits."""
    llm = FakeLLM(respond=lambda call: "here")
    persistence = PersistenceHandler(here)
    try:
        with handler(llm), handler(persistence):
            host.cut()
            cut = time.monotonic()
            bot = Assistant(agent_id="shared")
            while True:
                try:
                    bot.ask("is it free?")
                    return time.monotonic() - cut
                except AgentInUseError:
                    time.sleep(0.1)
    finally:
        persistence.close()


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
                    here = cluster.new_database()  # type: ignore[attr-defined]
                    port = 6432 if path == "pgbouncer" else 5432
                    name = here.rsplit("/", 1)[1]
                    remote = f"postgresql://postgres@{net.server}:{port}/{name}"  # type: ignore[attr-defined]
                    host = net.host()  # type: ignore[attr-defined]
                    proc = hold(host, holder, remote, here, Path(workdir))
                    try:
                        figures.append(free_after_cut(host, here))
                    finally:
                        host.heal()
                        proc.kill()
                        proc.wait()
                        cluster.drop_database(here)  # type: ignore[attr-defined]
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
