"""Benchmark: what PersistenceHandler adds to each turn of a long conversation.

For each N in ``--turns`` one ``Bot`` (a PersistentAgent) with persistence and one
without play an N-turn conversation side by side (turns interleaved, so both have
the same history length whenever they are measured). Each turn is a ~300-byte user
message and a ~700-byte answer from the offline ``FakeLLM`` under effectful's
``LiteLLMProvider``. Printed per N (see bench/README.md for the columns):

* median wall time of a turn without and with persistence;
* overhead = with minus without, per turn pair: median and p90 over all turns and
  over the last 10% of turns (is the cost independent of history length?);
* handler time = a persisted turn's wall time minus the time spent below the
  PersistenceHandler (a timing handler sits between it and the provider), less the
  same difference in the plain turn (the template call's own cost, which both arms
  pay): the handler's own work measured directly, without the noise of two calls;
* the ratio of durable to plain turn time (median, and over the last 10%);
* garbage-collection time per turn in each arm (``gc.callbacks``), since what we
  keep alive costs the user outside our own code;
* database size (db + wal after a TRUNCATE checkpoint);
* loading the N-turn agent in a fresh process (see ``child_load``).

``--agents 50`` plays 50 bots per arm round-robin in one database instead (N turns
each): what switching agents costs. ``--baseline DIR`` plays one more arm, under
the PersistenceHandler of another checkout of effectful-durable (DIR holds its
``src/``, e.g. a ``git worktree`` of main), in the same process, turns interleaved
with the others, and measures its loads in fresh processes too: a before-and-after
in one run, each printed on a row of its own (``N base``). ``--profile`` splits
the handler's time into the handoff write at turn start, planning the change, the
commit and the rest, and plays two more arms: under a handler that only calls
``fwd()`` (what effectful charges for any handler in that place) and under
``TwoWrites``, which makes only the writes every turn must make (the floor of the
handler's time). ``--keys`` runs our arm with encryption at rest (a fresh master key,
``PersistenceHandler(db, keys=...)``): with ``--baseline .`` (this checkout, plain),
the two rows give encryption's cost per turn.

Run: ``.venv/bin/python bench/bench_persistence.py [--turns 100,1000,5000] [--quick]``.
No assertions: targets are in bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import importlib.util
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # before litellm is imported

import apsw
from effectful.handlers.llm import Template
from effectful.handlers.llm.completions import LiteLLMProvider
from effectful.ops.semantics import fwd, handler
from effectful.ops.syntax import ObjectInterpretation, implements
from effectful.ops.types import NotHandled

from effectful_durable import Keys, LocalMasterKey, PersistenceHandler, PersistentAgent, Store
from effectful_durable.store.history import HistoryChange
from effectful_durable.testing import FakeLLM

QUESTION = "please tell me more about the durable state of agents and how it is kept; "
ANSWER = "Durable state is kept in SQLite, one transaction per turn, append only. "


@dataclasses.dataclass
class Bot(PersistentAgent):
    """You are a helpful assistant."""

    topic: str = "benchmarks"  # a persisted field, unchanged by turns

    @Template.define
    def ask(self, question: str) -> str:
        """Answer the question: {question}"""
        raise NotHandled


def bot_class(package: Any) -> type:
    """``Bot`` over the PersistentAgent of ``package`` (another checkout's, for --baseline)."""

    @dataclasses.dataclass
    class Bot(package.PersistentAgent):  # type: ignore[name-defined, misc]
        """You are a helpful assistant."""

        topic: str = "benchmarks"

        @Template.define
        def ask(self, question: str) -> str:
            """Answer the question: {question}"""
            raise NotHandled

    return Bot


def baseline_package(tree: Path) -> Any:
    """The effectful_durable package of the checkout ``tree``, imported under its own name."""
    name = "effectful_durable_baseline"
    src = tree / "src"
    spec = importlib.util.spec_from_file_location(
        name, src / "__init__.py", submodule_search_locations=[str(src)]
    )
    assert spec is not None and spec.loader is not None
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    spec.loader.exec_module(package)
    return package


BASELINE: Path | None = None  # --baseline
KEY_FILE: Path | None = None  # --keys: our arm's master key
#: The master key file a child's load of our arm opens its database with.
KEY_FILE_VARIABLE = "BENCH_PERSISTENCE_KEY_FILE"


def our_keys(key_file: str | Path | None, store: str | None = None) -> Any:
    """Keys for our arm (None: plain)."""
    return None if key_file is None else Keys.from_file(key_file, store=store)


class PassThrough(ObjectInterpretation):
    """A handler that does nothing but forward: effectful's cost of one handler layer."""

    @implements(Template.__apply__)
    def _apply(self, template, *args, **kwargs):
        return fwd()


class TwoWrites(ObjectInterpretation):
    """Only what the design makes every turn pay: the agent's lock, the handoff row
    committed before the model is called, and one commit of the turn's new messages.

    No planning, no fields, no bookkeeping: the floor under PersistenceHandler's time.
    """

    def __init__(self, db: Path) -> None:
        self.store = Store(db)
        self.written: dict[str, int] = {}  # messages committed, per agent

    @implements(Template.__apply__)
    def _apply(self, template, *args, **kwargs):
        history = template.__history__
        agent_id = f"writes-{id(history)}"
        with self.store.turns.start(agent_id, template="ask", arguments=list(args)) as start:
            result = fwd()
            written = self.written.get(agent_id, 0)
            # Only the tail: a floor that copied the whole history would grow with it.
            keys = list(itertools.islice(reversed(history), len(history) - written))
            added = [history[key] for key in reversed(keys)]
            change = HistoryChange([(float(written + i), m) for i, m in enumerate(added)], [], 0)
            self.store.turns.commit(
                agent_id, base_version=start.version, template="ask", change=change, state=None
            )
            self.written[agent_id] = written + len(added)
        return result


class Below(ObjectInterpretation):
    """Times every template call below it (the provider and the fake model)."""

    seconds = 0.0

    @implements(Template.__apply__)
    def _apply(self, template, *args, **kwargs):
        start = time.perf_counter()
        try:
            return fwd()
        finally:
            self.seconds = time.perf_counter() - start


def question(i: int) -> str:
    return (f"Turn {i}: " + QUESTION * 5)[:300]


def answer(_call) -> str:
    return (ANSWER * 10)[:700]


def fake_llm() -> FakeLLM:
    return FakeLLM(respond=answer)


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1] if len(values) > 1 else values[0]


class GCClock:
    """Seconds spent in the garbage collector, from ``gc.callbacks``."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started


class Profile:
    """With --profile: time spent in parts of the handler, per turn."""

    def __init__(self) -> None:
        self.parts: dict[str, list[float]] = {"begin": [], "plan": [], "commit": []}
        self._turn: dict[str, float] = {}

    def wrap(self, owner: object, name: str, part: str) -> None:
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self._turn[part] = self._turn.get(part, 0.0) + time.perf_counter() - start

        setattr(owner, name, timed)

    def wrap_entry(self, owner: object, name: str, part: str) -> None:
        """Time entering the context manager that ``owner.name(...)`` returns."""
        inner = getattr(owner, name)

        @contextlib.contextmanager
        def timed(*args, **kwargs):
            start = time.perf_counter()
            with inner(*args, **kwargs) as value:
                self._turn[part] = self._turn.get(part, 0.0) + time.perf_counter() - start
                yield value

        setattr(owner, name, timed)

    def end_turn(self) -> None:
        for part, values in self.parts.items():
            values.append(self._turn.get(part, 0.0))
        self._turn = {}


PROFILE: Profile | None = None


def play(n: int, db: Path, agents: int = 1) -> dict[str, list[float]]:
    """Play n turns of each of ``agents`` plain and persisted Bots; per-turn seconds."""
    fake, below, gc_clock = fake_llm(), Below(), GCClock()
    persistence = PersistenceHandler(db, keys=our_keys(KEY_FILE))
    if PROFILE is not None:
        persistence_module = sys.modules[PersistenceHandler.__module__]
        PROFILE.wrap_entry(persistence.store.turns, "start", "begin")  # the lock + handoff
        PROFILE.wrap(persistence.store.turns, "commit", "commit")
        PROFILE.wrap(persistence_module, "_plan", "plan")
    # With --profile, two more arms: the same turns under a handler that only
    # forwards, and under one that only makes the two writes every turn must make.
    two_writes = TwoWrites(db.with_suffix(".writes.db")) if PROFILE else None
    extra = {"pass": PassThrough(), "writes": two_writes} if two_writes else {}
    classes: dict[str, type] = {}
    if BASELINE is not None:
        package = baseline_package(BASELINE)
        extra["baseline"] = package.PersistenceHandler(db.with_suffix(".base.db"))
        classes["baseline"] = bot_class(package)
    arms = {"plain": {}, "durable": persistence, **extra}
    bots = {
        arm: [classes.get(arm, Bot)(agent_id=f"{arm}-{j}") for j in range(agents)] for arm in arms
    }
    times: dict[str, list[float]] = {
        f"{kind}{arm}": [] for arm in arms for kind in ("", "below_", "gc_")
    }
    order = list(arms)
    gc.callbacks.append(gc_clock)
    with handler(LiteLLMProvider(model="fake")), handler(fake), handler(below):
        for i in range(n):
            q = question(i)
            for j in range(agents):
                for arm in order[i % len(order) :] + order[: i % len(order)]:  # rotate
                    gc_before = gc_clock.seconds
                    with handler(arms[arm]):
                        start = time.perf_counter()
                        bots[arm][j].ask(q)
                        times[arm].append(time.perf_counter() - start)
                    times[f"gc_{arm}"].append(gc_clock.seconds - gc_before)
                    times[f"below_{arm}"].append(below.seconds)
                    if arm == "durable" and PROFILE is not None:
                        PROFILE.end_turn()
                fake.calls.clear()  # keep memory flat: .calls holds every request
            if (i + 1) % max(1, n // 10) == 0:
                print(f"\rN={n}x{agents}: {i + 1} turns", end="", file=sys.stderr, flush=True)
    gc.callbacks.remove(gc_clock)
    print(file=sys.stderr)
    persistence.close()
    if two_writes is not None:
        two_writes.store.close()
    if "baseline" in arms:
        arms["baseline"].close()
    return times


def db_bytes(db: Path) -> int:
    conn = apsw.Connection(str(db))
    conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_TRUNCATE)
    conn.close()
    wal = db.with_name(db.name + "-wal")
    return db.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def child_load(db: str, agent_id: str, what: str) -> None:
    """In a fresh process: time loading the agent (``what``: load, ask, ask-warm); print JSON.

    Everything is imported (module top) and warmed up first: an effectful turn
    without persistence and a persisted turn on a scratch database, so one-time
    costs (pydantic schemas, apsw statement compilation) are not counted; then
    ``gc.collect()``, so that a full collection the imports made due does not land
    in the timed window by chance. Each measure gets its own process, so neither
    runs with the other's copy of the history in memory. Timed:

    * load: ``PersistenceHandler(db)`` (open the file) + ``store.turns.load(id)``
      (one indexed read of the active messages, JSON decode);
    * ask: ``persistence.load(bot)`` for a new ``Bot`` object with that id
      (read, then restore history and state into the object: ``restore_ms``), then
      its first ``ask()`` under persistence minus the median first ``ask()`` of 3
      new Bots without persistence holding the same history in memory, freshly
      decoded from JSON as a load leaves it (``first_turn_extra_ms``; effectful's
      model call is itself O(history), so an empty Bot would be the wrong
      baseline, and so would one holding the loaded Bot's messages, which its
      turn has just brought into the CPU's caches). Compare it with the overhead
      of an ordinary turn: the first turn after a load should cost no more;
    * ask-warm: the same in a process that has already written to the database (a
      turn of another agent through the same handler, before the load): the first
      write of a process pays costs that are not the load's, once per process and
      database (SQLite syncs the header of a WAL it starts afresh, and the turn's
      statements are compiled on the thread's connection). The median over the
      agent and two forks of it, loaded one after the other.
    """
    fake, q = fake_llm(), question(0)
    key_file = os.environ.get(KEY_FILE_VARIABLE)
    with handler(LiteLLMProvider(model="fake")), handler(fake):
        Bot(agent_id="warm").ask(q)
        with tempfile.TemporaryDirectory() as tmp:
            warm_keys = our_keys(key_file, store=str(Path(tmp) / "warm.keys"))
            scratch = PersistenceHandler(Path(tmp) / "warm.db", keys=warm_keys)
            with handler(scratch):
                Bot(agent_id="warm").ask(q)
            scratch.close()
        gc.collect()

        start = time.perf_counter()
        persistence = PersistenceHandler(db, keys=our_keys(key_file))
        if what == "load":
            store: Any = persistence.store  # a checkout from before issue 51: load_agent
            (store.turns.load if hasattr(store, "turns") else store.load_agent)(agent_id)
            print(json.dumps({"load_ms": (time.perf_counter() - start) * 1e3}))
            return
        # ask: one agent, the first write of the process. ask-warm: the agent and
        # two forks of it, after a turn of another agent; the median of the three.
        agents = [agent_id]
        if what == "ask-warm":
            with handler(persistence):
                Bot(agent_id="other-agent").ask(q)
            for k in range(2):
                persistence.store.fork(agent_id, None, f"{agent_id}-{k}")
                agents.append(f"{agent_id}-{k}")
        extras, restores = [], []
        for one in agents:
            fresh = Bot(agent_id=one)
            gc.collect()
            start = time.perf_counter()
            persistence.load(fresh)
            restores.append(time.perf_counter() - start)
            start = time.perf_counter()
            with handler(persistence):
                fresh.ask(q)
            first = time.perf_counter() - start
            # The baseline is the first ask() of new plain Bots too: effectful's
            # first call on an agent object builds its bound template, on either side.
            # Each gets its history as a load leaves it: objects just decoded, which
            # no turn has touched yet (the loaded ones are warm from the turn above).
            loaded = json.dumps(list(fresh.__history__.items())[:-2])
            del fresh
            base = []
            for k in range(3):
                gc.collect()
                plain = Bot(agent_id=f"baseline-{k}")
                plain.__history__.update(json.loads(loaded))
                start = time.perf_counter()
                plain.ask(q)
                base.append(time.perf_counter() - start)
                fake.calls.clear()
            del loaded, plain
            extras.append((first - statistics.median(base)) * 1e3)
    if what == "ask-warm":
        print(json.dumps({"first_turn_warm_extra_ms": statistics.median(extras)}))
    else:
        restore = statistics.median(restores) * 1e3
        print(json.dumps({"restore_ms": restore, "first_turn_extra_ms": extras[0]}))


def fresh_loads(arms: list[tuple[Path, str, Path | None]]) -> list[dict[str, float]]:
    """The fresh-process measures of each arm ``(db, agent id, checkout or None for
    ours)``, each the median of its runs; the arms take turns, run by run, so that
    they meet the same machine.

    The asks commit a turn, so they run last; ask-warm forks the agent under fixed
    ids, so it runs once.
    """
    runs: list[dict[str, list[float]]] = [{} for _ in arms]
    with tempfile.TemporaryDirectory() as path:
        envs = []
        for k, (_, _, tree) in enumerate(arms):
            env = dict(os.environ)
            if tree is not None:  # the child imports that checkout's package instead of ours
                os.makedirs(Path(path) / str(k))
                os.symlink((tree / "src").resolve(), Path(path) / str(k) / "effectful_durable")
                env["PYTHONPATH"] = os.pathsep.join(
                    [str(Path(path) / str(k)), env.get("PYTHONPATH", "")]
                )
            elif KEY_FILE is not None:
                env[KEY_FILE_VARIABLE] = str(KEY_FILE)
            envs.append(env)
        for what, repeats in (("load", 3), ("ask", 3), ("ask-warm", 1)):
            for _ in range(repeats):
                for (db, agent_id, _), env, found in zip(arms, envs, runs, strict=True):
                    out = subprocess.run(
                        [sys.executable, __file__, "--child-load", str(db), agent_id, what],
                        capture_output=True,
                        text=True,
                        check=True,
                        env=env,
                    )
                    for key, value in json.loads(out.stdout.strip().splitlines()[-1]).items():
                        found.setdefault(key, []).append(value)
    return [{key: statistics.median(values) for key, values in found.items()} for found in runs]


def measure(n: int, directory: Path, agents: int = 1) -> list[dict[str, float]]:
    """Play n turns (of ``agents`` bots per arm) and measure; a row per durable arm:
    ours, then the --baseline checkout's."""
    db = directory / f"bench-{n}x{agents}.db"
    t = play(n, db, agents)
    arms = [("durable", db, None)]
    if BASELINE is not None:
        arms.append(("baseline", db.with_suffix(".base.db"), BASELINE))
    if agents == 1:
        loads = fresh_loads([(path, f"{arm}-0", tree) for arm, path, tree in arms])
    else:
        keys = ("load_ms", "restore_ms", "first_turn_extra_ms", "first_turn_warm_extra_ms")
        loads = [dict.fromkeys(keys, 0.0) for _ in arms]
    return [
        {**arm_row(t, arm, n, agents, path), **load}
        for (arm, path, _), load in zip(arms, loads, strict=True)
    ]


def arm_row(
    t: dict[str, list[float]], arm: str, n: int, agents: int, db: Path
) -> dict[str, float]:
    """The measures of the durable ``arm`` against the plain one, the same turns."""
    over = [d - p for d, p in zip(t[arm], t["plain"], strict=True)]
    # Above the provider, each turn also pays effectful's cost of calling the
    # template, with or without a handler: take the plain turn's from the durable's.
    floor = [p - b for p, b in zip(t["plain"], t["below_plain"], strict=True)]
    own = [d - b - f for d, b, f in zip(t[arm], t[f"below_{arm}"], floor, strict=True)]
    turns = n * agents
    tail = slice(turns - max(1, turns // 10), turns)
    median = statistics.median
    ms = 1e3
    profile = {}
    if PROFILE is not None and arm == "durable":
        parts = {part: values[-turns:] for part, values in PROFILE.parts.items()}
        rest = [o - sum(p) for o, *p in zip(own, *parts.values(), strict=True)]
        profile = {f"p_{part}": median(v) * ms for part, v in [*parts.items(), ("rest", rest)]}
        for extra in ("pass", "writes"):
            arm_own = [
                a - b - f for a, b, f in zip(t[extra], t[f"below_{extra}"], floor, strict=True)
            ]
            profile[f"p_{extra}"] = median(arm_own) * ms
        profile["gc_pass"] = sum(t["gc_pass"]) / turns * ms
    return {
        **profile,
        "ratio": median(t[arm]) / median(t["plain"]),
        "ratio_tail": median(t[arm][tail]) / median(t["plain"][tail]),
        "gc_p": sum(t["gc_plain"]) / turns * ms,
        "gc_d": sum(t[f"gc_{arm}"]) / turns * ms,
        "plain": median(t["plain"]) * ms,
        "durable": median(t[arm]) * ms,
        "over": statistics.median(over) * ms,
        "over90": p90(over) * ms,
        "over_tail": statistics.median(over[tail]) * ms,
        "over90_tail": p90(over[tail]) * ms,
        "own": statistics.median(own) * ms,
        "own90": p90(own) * ms,
        "own_tail": statistics.median(own[tail]) * ms,
        "own90_tail": p90(own[tail]) * ms,
        "mb": db_bytes(db) / 1e6,
    }


COLUMNS = [  # (header, format)
    ("turns", "{label:>10}"),
    ("plain ms", "{plain:>8.2f}"),
    ("durable ms", "{durable:>10.2f}"),
    ("ratio all/last10%", "{ratio:>6.3f}/{ratio_tail:<6.3f}"),
    ("gc ms plain/durable", "{gc_p:>6.2f}/{gc_d:<6.2f}"),
    ("overhead med/p90", "{over:>7.2f}/{over90:<8.2f}"),
    ("last10% med/p90", "{over_tail:>7.2f}/{over90_tail:<7.2f}"),
    ("handler med/p90", "{own:>7.2f}/{own90:<7.2f}"),
    ("last10% med/p90", "{own_tail:>7.2f}/{own90_tail:<7.2f}"),
    ("db MB", "{mb:>6.2f}"),
    ("load ms", "{load_ms:>7.2f}"),
    ("restore ms", "{restore_ms:>10.2f}"),
    ("1st turn +ms/warm", "{first_turn_extra_ms:>8.2f}/{first_turn_warm_extra_ms:<6.2f}"),
]


PROFILE_COLUMNS = [
    ("turns", "{label:>10}"),
    ("handler ms", "{own:>10.3f}"),
    ("handoff write", "{p_begin:>13.3f}"),
    ("plan change", "{p_plan:>11.3f}"),
    ("commit", "{p_commit:>6.3f}"),
    ("rest", "{p_rest:>6.3f}"),
    ("pass-through handler", "{p_pass:>20.3f}"),
    ("two writes only", "{p_writes:>15.3f}"),
    ("gc ms pass-through", "{gc_pass:>18.2f}"),
]


def print_table(rows: list[dict[str, float]], columns: list[tuple[str, str]] = COLUMNS) -> None:
    cells = [[fmt.format(**row) for _, fmt in columns] for row in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, (h, _) in enumerate(columns)]
    print("  ".join(h.rjust(w) for (h, _), w in zip(columns, widths, strict=True)))
    for row in cells:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", default="100,1000,5000", help="comma-separated N values")
    parser.add_argument("--long", action="store_true", help="--turns 100,1000,5000,10000")
    parser.add_argument("--agents", type=int, default=0, help="also play A agents round-robin")
    parser.add_argument("--agent-turns", type=int, default=100, help="turns of each of A agents")
    parser.add_argument("--profile", action="store_true", help="split the handler's time")
    parser.add_argument("--quick", action="store_true", help="smoke run: --turns 20,100")
    parser.add_argument("--dir", type=Path, help="where to put the databases (default: tmp)")
    parser.add_argument(
        "--baseline", type=Path, help="a checkout to compare with, in the same run (its root)"
    )
    parser.add_argument("--keys", action="store_true", help="our arm with encryption at rest")
    parser.add_argument("--child-load", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_load:
        child_load(*args.child_load)
        return
    global PROFILE, BASELINE, KEY_FILE
    PROFILE = Profile() if args.profile else None
    BASELINE = args.baseline
    turns = [20, 100] if args.quick else [int(n) for n in args.turns.split(",")]
    turns = [100, 1000, 5000, 10000] if args.long else turns
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        if args.keys:
            KEY_FILE = Path(tmp) / "master.key"
            KEY_FILE.write_text(LocalMasterKey.generate())
        plays = [(str(n), n, 1) for n in turns]
        if args.agents:
            plays.append((f"{args.agents}x{args.agent_turns}", args.agent_turns, args.agents))
        rows = []
        for label, n, agents in plays:
            for row, suffix in zip(measure(n, Path(tmp), agents), ("", " base"), strict=False):
                rows.append({"label": label + suffix, **row})
    print_table(rows)
    if PROFILE is not None:
        print("\nhandler time split (medians, ms):")
        print_table([row for row in rows if "p_rest" in row], PROFILE_COLUMNS)
    print(
        f"(times in ms; run took {time.perf_counter() - started:.0f} s; 1-min load average "
        f"{load_before:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; "
        f"Python {sys.version.split()[0]}, SQLite {apsw.sqlite_lib_version()})"
    )


if __name__ == "__main__":
    main()
