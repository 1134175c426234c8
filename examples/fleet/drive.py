"""Drive the fleet with a burst of requests and events, then check what was delivered.

    python examples/fleet/drive.py --users 20 --requests 100 --events 50

At once: ``--requests`` HTTP requests to the service, spread over ``--users``
users (each request is one turn of that user's agent; one in ten asks for a
reminder a second later, an alarm that a runner delivers), and ``--events``
events sent to the same agents (``Store.send_event``, as ``effectful-durable
send-event`` does), which the runners deliver. Then it waits for the runners,
and checks in the database that every request committed a turn of its own and
that every event and reminder was delivered exactly once. It prints the
throughput, and what PgBouncer saw (clients and server connections) meanwhile.
Exit status 0 when every check passed, 1 otherwise.

It finds the fleet in out/fleet.json, which up.py writes; or give --service URL
--db URL. Each run tags its texts and events anew: run it as often as you like.
"""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # stay offline

import argparse
import asyncio
import itertools
import json
import secrets
import statistics
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from effectful_durable import EventInfo, NotFoundError, Store

HERE = Path(__file__).resolve().parent
REMINDER_EVERY = 10  # one request in ten asks for a reminder
REMINDER_DELAY = 1  # seconds


class Burst:
    """What one run sent, and what came back."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.tag = secrets.token_hex(3)  # this run's, in every text it sends
        self.users = [f"u{n:02d}" for n in range(args.users)]
        self.answers: list[dict[str, Any]] = []  # the service's, one per request
        self.failures: list[str] = []
        self.latencies: list[float] = []
        self.events: list[EventInfo] = []
        self.reminders: dict[str, str] = {}  # reminder text -> agent id
        self.requests_seconds = self.events_seconds = 0.0


# -- The burst ---------------------------------------------------------------------------
async def send_requests(burst: Burst, service: str, count: int, parallel: int) -> None:
    """``count`` requests, ``parallel`` at a time: one turn each."""
    limit = asyncio.Semaphore(parallel)
    limits = httpx.Limits(max_connections=parallel)
    async with httpx.AsyncClient(base_url=service, timeout=120, limits=limits) as client:

        async def one(number: int) -> None:
            user = burst.users[number % len(burst.users)]
            if number % REMINDER_EVERY == REMINDER_EVERY - 1:
                reminder = f"stand up ({burst.tag}-r{number})"
                burst.reminders[reminder] = f"user-{user}"
                text = f"remind me in {REMINDER_DELAY} second to {reminder}"
            else:
                text = f"note {burst.tag}-q{number}: buy milk"
            async with limit:
                started = time.monotonic()
                try:
                    response = await client.post(f"/users/{user}/ask", json={"text": text})
                except httpx.HTTPError as error:
                    burst.failures.append(f"request {number}: {error!r}")
                    return
                burst.latencies.append(time.monotonic() - started)
            if response.status_code != 200:
                burst.failures.append(f"request {number}: {response.status_code} {response.text}")
            else:
                burst.answers.append(response.json())

        started = time.monotonic()
        await asyncio.gather(*(one(number) for number in range(count)))
        burst.requests_seconds = time.monotonic() - started


async def send_events(burst: Burst, store: Store, count: int) -> None:
    """``count`` events, spread over the users; each user's are sent one after the
    other (so they have an order to be delivered in), four users' at a time."""
    loop = asyncio.get_running_loop()
    numbers: dict[str, list[int]] = {}
    for number in range(count):
        numbers.setdefault(burst.users[(number * 7) % len(burst.users)], []).append(number)

    def send(user: str, numbers: list[int]) -> list[EventInfo]:
        sent = []
        for number in numbers:
            payload = {"text": f"parcel {burst.tag}-e{number} delivered"}
            # The key makes a retried send send nothing new (effectful-durable
            # send-event --key KEY does the same); create: the agent may not exist yet.
            sent.append(
                store.send_event(
                    f"user-{user}", "parcel", payload, key=f"{burst.tag}-e{number}", create=True
                )
            )
        return sent

    started = time.monotonic()
    with ThreadPoolExecutor(4) as pool:  # the Store's calls block: threads send
        sent = await asyncio.gather(
            *(loop.run_in_executor(pool, send, user, ours) for user, ours in numbers.items())
        )
    burst.events = [event for events in sent for event in events]
    burst.events_seconds = time.monotonic() - started


class PoolerWatch:
    """The most client connections of each process and server connections that
    PgBouncer showed, read from its admin console every 0.2 s while the burst runs
    (``SHOW CLIENTS``: each client's process id; ``SHOW POOLS``)."""

    def __init__(self, pooler: dict[str, Any] | None) -> None:
        self.clients = self.servers = 0  # at once, in all
        self.by_process: dict[int, int] = {}  # pid -> its most client connections
        self.error: str | None = None if pooler else "no pooler known"
        self._pooler = pooler
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> "PoolerWatch":
        if self._pooler:
            self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()

    def _watch(self) -> None:
        import psycopg

        assert self._pooler is not None
        try:
            # The admin console speaks the simple query protocol only: ClientCursor.
            with psycopg.connect(
                host=self._pooler["host"],
                port=self._pooler["port"],
                dbname="pgbouncer",
                user="postgres",
                autocommit=True,
                cursor_factory=psycopg.ClientCursor,
            ) as console:
                while not self._done.wait(0.2):
                    clients = Counter(
                        row["remote_pid"]
                        for row in rows(console, "SHOW CLIENTS")
                        if row["database"] != "pgbouncer"
                    )
                    for pid, count in clients.items():
                        self.by_process[pid] = max(self.by_process.get(pid, 0), count)
                    self.clients = max(self.clients, clients.total())
                    for pool in rows(console, "SHOW POOLS"):
                        if pool["database"] != "pgbouncer":
                            servers = sum(v for k, v in pool.items() if k.startswith("sv_"))
                            self.servers = max(self.servers, servers)
        except psycopg.Error as error:
            self.error = str(error).strip()


def rows(console: Any, command: str) -> list[dict[str, Any]]:
    cursor = console.execute(command)
    names = [column.name for column in cursor.description or ()]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


# -- Waiting for the runners, and the checks --------------------------------------------
def delivered(burst: Burst, store: Store, wait: float) -> tuple[dict[str, EventInfo], float]:
    """The burst's events as the database holds them once all are delivered (or after
    ``wait`` seconds), and the seconds waited after the burst."""
    started, ours = time.monotonic(), {event.event_id for event in burst.events}
    while True:
        events = {
            event.event_id: event
            for event in store.events(include_delivered=True)
            if event.event_id in ours
        }
        alarms = [
            alarm for alarm in store.alarms(include_ended=True) if alarm.action in burst.reminders
        ]
        done = all(event.status == "done" for event in events.values()) and all(
            alarm.status == "done" for alarm in alarms
        )
        if (done and len(alarms) == len(burst.reminders)) or time.monotonic() - started > wait:
            return events, time.monotonic() - started
        time.sleep(0.25)


def check(burst: Burst, store: Store, events: dict[str, EventInfo]) -> dict[str, Any]:
    """Every request's turn committed once; every event and reminder delivered once.
    Also which agents' events were delivered in another order than sent."""
    problems = list(burst.failures)
    versions = {}  # agent id -> {version: VersionInfo}
    for agent_id in sorted({f"user-{user}" for user in burst.users}):
        try:
            versions[agent_id] = {v.version: v for v in store.versions(agent_id)}
        except NotFoundError:  # no request nor event of this run reached it
            versions[agent_id] = {}
    turns = Counter((answer["agent_id"], answer["version"]) for answer in burst.answers)
    for (agent_id, version), times in turns.items():
        found = versions[agent_id].get(version)
        if times > 1:
            problems.append(f"{agent_id} version {version} answered {times} requests")
        if found is None or found.template != "ask":
            problems.append(f"{agent_id} version {version}: not the request's turn: {found}")

    # What the agents noted (events) and sent (reminders), from their fields.
    noted: Counter[str] = Counter()
    sent: Counter[str] = Counter()
    for agent_id in versions:
        if versions[agent_id]:
            state = store.state(agent_id)
            noted.update(state.get("inbox", []))
            sent.update(state.get("reminders", []))
    latencies = []  # of the events delivered exactly once
    for event in burst.events:
        held = events.get(event.event_id)
        turn = (
            versions[event.agent_id].get(held.delivered_in) if held and held.delivered_in else None
        )
        if held is None or held.status != "done" or turn is None:
            problems.append(f"event {event.event_id} to {event.agent_id} not delivered: {held}")
            continue
        times = noted[f"parcel: {event.payload['text']}"]
        if turn.template != "on_event" or times != 1:
            problems.append(
                f"event {event.event_id} to {event.agent_id}: delivered in a "
                f"{turn.template} turn, noted {times} times"
            )
            continue
        latencies.append((turn.committed_at - event.sent_at).total_seconds())
    reordered = {}  # agent id -> the versions that delivered its events, in sent order
    for agent_id in versions:
        order = [
            events[event.event_id].delivered_in
            for event in burst.events
            if event.agent_id == agent_id and event.event_id in events
        ]
        if any(b is None or a is None or b <= a for a, b in itertools.pairwise(order)):
            reordered[agent_id] = order
    reminded = 0
    for reminder, agent_id in burst.reminders.items():
        if sent[reminder] == 1:
            reminded += 1
        else:
            problems.append(f"reminder {reminder!r} of {agent_id} sent {sent[reminder]} times")
    return {
        "problems": problems,
        "event_latencies": latencies,
        "reminded": reminded,
        "reordered": reordered,
    }


# -- Output ------------------------------------------------------------------------------
def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(
    burst: Burst,
    checked: dict[str, Any],
    waited: float,
    watch: PoolerWatch,
    names: dict[int, str],
) -> dict[str, Any]:
    answered = len(burst.answers)
    latencies = checked["event_latencies"]
    return {
        "tag": burst.tag,
        "users": len(burst.users),
        "requests": {
            "sent": len(burst.answers) + len(burst.failures),
            "committed": answered,
            "seconds": round(burst.requests_seconds, 3),
            "per_second": round(answered / burst.requests_seconds, 1) if answered else 0.0,
            "latency_median": round(statistics.median(burst.latencies), 3)
            if burst.latencies
            else None,
            "latency_p95": round(quantile(burst.latencies, 0.95), 3) if burst.latencies else None,
        },
        "events": {
            "sent": len(burst.events),
            "send_seconds": round(burst.events_seconds, 3),
            "delivered": len(latencies),
            "delivery_median": round(statistics.median(latencies), 3) if latencies else None,
            "delivery_max": round(max(latencies), 3) if latencies else None,
        },
        "reminders": {"asked": len(burst.reminders), "delivered": checked["reminded"]},
        "waited_after_burst": round(waited, 3),
        "pooler": {
            "clients": watch.clients,
            "servers": watch.servers,
            "clients_by_process": {
                names.get(pid, f"pid {pid}"): count for pid, count in watch.by_process.items()
            },
            "error": watch.error,
        },
        "reordered": checked["reordered"],
        "problems": checked["problems"],
    }


def report(result: dict[str, Any]) -> str:
    requests, events, pooler = result["requests"], result["events"], result["pooler"]
    reminders = result["reminders"]
    lines = [
        f"requests   {requests['sent']} sent, {requests['committed']} turns committed in "
        f"{requests['seconds']:.2f} s: {requests['per_second']:g} turns/s; latency median "
        f"{requests['latency_median']} s, p95 {requests['latency_p95']} s",
        f"events     {events['sent']} sent in {events['send_seconds']:.2f} s; "
        f"{events['delivered']} delivered exactly once by the runners; from sent to "
        f"committed: median {events['delivery_median']} s, max {events['delivery_max']} s",
        f"reminders  {reminders['asked']} asked for by requests, due {REMINDER_DELAY} s later; "
        f"{reminders['delivered']} delivered exactly once",
        f"waited     {result['waited_after_burst']:.2f} s after the burst for the runners",
    ]
    if pooler["error"] is None:
        each = ", ".join(f"{name} {n}" for name, n in sorted(pooler["clients_by_process"].items()))
        lines.append(
            f"pgbouncer  at most {pooler['clients']} client connections at once ({each}), "
            f"sharing at most {pooler['servers']} server connections"
        )
    if result["reordered"]:
        agents = ", ".join(f"{a} {v}" for a, v in result["reordered"].items())
        lines.append(
            f"order      {len(result['reordered'])} of {result['users']} agents had their events "
            f"delivered in another order than sent (in versions): {agents}"
        )
    if result["problems"]:
        lines.append(f"PROBLEMS   {len(result['problems'])}:")
        lines += [f"  {problem}" for problem in result["problems"]]
    else:
        lines.append("ok: every request committed a turn; every event and reminder delivered once")
    return "\n".join(lines)


async def burst_of(args: argparse.Namespace, burst: Burst, service: str, store: Store) -> None:
    await asyncio.gather(
        send_requests(burst, service, args.requests, args.parallel),
        send_events(burst, store, args.events),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=20, help="agents (default 20)")
    parser.add_argument("--requests", type=int, default=100, help="HTTP requests (default 100)")
    parser.add_argument("--events", type=int, default=50, help="events (default 50)")
    parser.add_argument("--parallel", type=int, default=16, help="requests at once (16)")
    parser.add_argument(
        "--wait", type=float, default=120, help="seconds to wait for the runners (120)"
    )
    parser.add_argument("--service", help="the service's URL (default: from fleet.json)")
    parser.add_argument("--db", help="the database's URL (default: from fleet.json)")
    parser.add_argument(
        "--out", type=Path, default=HERE / "out", help="where up.py wrote fleet.json"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    fleet: dict[str, Any] = {}
    if not (args.service and args.db):
        try:
            fleet = json.loads((args.out / "fleet.json").read_text())
        except FileNotFoundError:
            parser.error(f"no {args.out / 'fleet.json'}: start up.py, or give --service and --db")
    service, db = args.service or fleet["service"], args.db or fleet["database"]

    burst = Burst(args)
    if not args.json:
        print(f"driving {service} and {db} (run {burst.tag})", flush=True)
    with Store(db) as store:
        with PoolerWatch(fleet.get("pooler")) as watch:
            asyncio.run(burst_of(args, burst, service, store))
            events, waited = delivered(burst, store, args.wait)
        names = {pid: name for name, pid in fleet.get("pids", {}).items()}
        names[os.getpid()] = "drive"
        result = summary(burst, check(burst, store, events), waited, watch, names)
    print(json.dumps(result, indent=2) if args.json else report(result))
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
