"""A PostgreSQL database of many agents, written in bulk with COPY (issue 39, item 4).

``build(url)`` fills a fresh database (its schema made by ``Store``) with
``agents`` agents and about ``messages`` messages in all, row for row as the
library writes them: the rows' shapes were copied from a database that real
turns wrote (PersistenceHandler with FakeLLM under effectful's LiteLLMProvider, an
AgentRunner delivering an alarm and an event, a turn suspended for an approval,
a turn that failed). Per agent, in the ``default`` conversation:

* a first turn that stores the agent's fields (``versions.state``) and adds the
  system message; then turns of a question and an answer (55%), a question, a
  ``self__lookup`` tool call, its result (1 in 50 an error) and an answer (35%),
  an event delivered (``on_event``, 6%) or an alarm delivered (``on_alarm``, 4%),
  each of those with its ``alarms`` row done in that version;
* a number of turns drawn from a log-normal distribution (median 11, 90th
  percentile 40, a long tail to ~1,800), scaled so that the total is
  ``messages``; message bodies of 275-616 bytes of JSON (450 on average); commit
  times spread over the last 90 days;
* one ``conversations`` row, as every agent's first turn writes;
* for a few agents what the agents list's "needs attention" filter finds: a turn
  suspended for an approval (1 in 500, its last turn: a question and the tool
  call, the approval ``pending``), a dead alarm (1 in 1,000), a failed turn's
  handoff (1 in 1,000) or a crashed one's (``running``, 1 in 5,000); and what
  waits without needing a person: a pending alarm (1 in 20), a pending event
  (1 in 200), an approval decided long ago (1 in 50);
* and ``long``, an agent of ``long_turns`` tool turns (as bench_ui.py's).

The bodies go through the library's own encoder (``history.message_json``). The
rows of ``messages`` and ``versions`` are written in commit-time order within
batches of ~4,000 agents, so that an agent's rows lie scattered over the table's
pages as turns over time leave them, and by two connections at once
(``COPY ... FREEZE`` after a ``TRUNCATE`` in the same transaction, so that no
VACUUM has to visit them before index-only scans work; the indexes are built
once the rows are in: see ``bulk``), then every table is
vacuumed and analyzed, as autovacuum would leave them, and a checkpoint flushes
it all (else the first turns timed would share the disk with that flush).

``BenchServer`` is tests/support/postgres_server.py's throwaway cluster on a Unix socket,
but with fsync on and PostgreSQL's default shared_buffers (128 MB).
"""

from __future__ import annotations

import contextlib
import math
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parents[1]

#: Turns by kind, each a letter: the first one, a question and answer, a tool
#: turn, an event's turn, an alarm's turn, a turn suspended for an approval.
FIRST, CHAT, TOOL, EVENT, ALARM, SUSPENDED = b"fctead"
#: Messages each kind of turn adds (the first adds the system message too).
ADDS = {FIRST: 3, CHAT: 2, TOOL: 4, EVENT: 2, ALARM: 2, SUSPENDED: 2}
#: How often each kind follows the first turn.
MIX = ((CHAT, 0.55), (TOOL, 0.35), (EVENT, 0.06), (ALARM, 0.04))

DAY = 86400.0
SYSTEM = (
    "You are the support agent of an online shop. You answer customers' questions about "
    "their orders, deliveries, returns and refunds. Look orders up with your tools before "
    "you say anything about them; never promise a refund without an approval."
)
QUESTIONS = (
    "Where is my order {order}? I placed it {days} days ago and the tracking page has not "
    "changed since. Could you check with the carrier and tell me when it will arrive?",
    "Hello, I would like to return the shoes from order {order}: they are a size too small. "
    "Do I need to print a label, and how long does the refund take once you have them?",
    "My parcel for order {order} says delivered but nothing is at my door or with my "
    "neighbours. What can you do? I need the items before the weekend.",
    "Can I still change the delivery address of order {order}? I am moving on day {days} "
    "and would rather have it sent to my new flat.",
    "I was charged twice for order {order}. Please look into it and refund the second "
    "payment to the same card.",
)
#: What follows each question: a customer's sign-off.
SIGN_OFF = (
    " The order is under my name and the email address of my account. Thank you for looking "
    "into it; I am available all day if you need anything else from me."
)
#: What follows each answer.
CLOSING = (
    " If you have another question about this order or any other, just write to me here: I "
    "keep our whole conversation and can pick it up at any time, even weeks from now."
)
ANSWERS = (
    "Thanks for waiting. Order {order} left our warehouse {days} days ago and is with the "
    "carrier now; the last scan was at the regional hub this morning. It should reach you "
    "within two working days. I will keep an eye on it and write to you if anything changes. "
    "Is there anything else I can help you with today?",
    "I have checked order {order}: it is eligible for a free return within 30 days. You do "
    "not need to print anything; show the QR code from the email I just sent at any drop-off "
    "point. Once the parcel is scanned, the refund reaches your card in 3 to 5 working days.",
    "I am sorry about that. I opened an investigation with the carrier for order {order}; "
    "they usually answer within 48 hours. If the parcel is not found by then, we send a "
    "replacement at no cost, or refund you, whichever you prefer.",
)
RESULT = (
    "order {order}: status shipped, carrier DHL, tracking 0034043416{n:010d}, last scan "
    "regional hub, expected in {days} days, items 2, paid 84.90 EUR, address 12 Long Street, "
    "10115 Berlin, weight 1.4 kg, insured yes, signature required no, returns open until day 30"
)
ERROR = (
    "Tool execution failed: Error executing tool 'self__lookup': no order {order} (the order "
    "service did not answer within 30 s; the call may be made again)"
)
EVENT_TEXT = (
    "An event was sent to you: order_shipped. Its payload, as JSON: {payload}. Handle it as "
    "your instructions say, then reply with a short summary of what you did."
)
ALARM_TEXT = (
    "An alarm you scheduled is due now. Do what it asks, then reply with a short summary of "
    "what you did. The alarm's action: check order {order} again and tell the customer"
)
SHORT = (
    "Done: I noted it for order {order} and wrote to the customer that the parcel is on its "
    "way, with the carrier's tracking link and the expected day of delivery; nothing else was "
    "needed, and no refund or replacement is due."
)


@dataclass(frozen=True)
class Built:
    """What ``build`` wrote."""

    agents: int
    messages: int
    versions: int
    alarms: int
    approvals: int
    handoffs: int
    seconds: float
    bytes: int


def agent_id(i: int) -> str:
    return f"agent-{i:06d}"


class BenchServer:
    """tests/support/postgres_server.py's throwaway cluster with fsync on: ``start()``,
    ``stop()``."""

    def __new__(cls) -> Any:
        sys.path.insert(0, str(ROOT / "tests" / "support"))
        from postgres_server import PostgresServer, find_bindir, unavailable

        reason = unavailable()
        if reason is not None:
            sys.exit(f"no PostgreSQL server to run: {reason}; or pass --postgres URL")

        class Synced(PostgresServer):
            def _pg_ctl(self, action: str) -> None:
                options = (
                    f"-c listen_addresses='' -c unix_socket_directories='{self.directory}' "
                    "-c fsync=on -c max_connections=100 -c shared_buffers=128MB "
                    "-c max_wal_size=4GB"
                )
                self._run("pg_ctl", "-D", self.data, "-o", options, "-l", self.log, "-w", action)

        bindir = find_bindir()
        assert bindir is not None
        return Synced(bindir)


@contextlib.contextmanager
def databases(server_url: str | None) -> Iterator[Any]:
    """A function ``(name) -> url`` of a database of that name, made if missing: on
    ``server_url``'s server, or on a throwaway one that ends with the block."""
    import psycopg

    if server_url is not None:

        def on_server(name: str) -> str:
            with psycopg.connect(server_url, autocommit=True) as admin:
                found = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
                if found.fetchone() is None:
                    admin.execute(f'CREATE DATABASE "{name}"'.encode())
            base, _, _ = server_url.rpartition("/")
            return f"{base}/{name}"

        yield on_server
        return
    server = BenchServer()
    server.start()
    try:

        def throwaway(name: str) -> str:
            server.admin(f'CREATE DATABASE "{name}"')
            return str(server.url(name))

        yield throwaway
    finally:
        server.stop()


# -- the plan: how many turns of which kind each agent has -----------------------


def plan(agents: int, messages: int, long_turns: int, seed: int) -> list[bytearray]:
    """Each agent's turns, one letter per turn; the last entry is ``long``'s."""
    rng = random.Random(seed)
    sigma = 1.1
    mean_adds = sum(ADDS[kind] * share for kind, share in MIX)
    wanted = max(messages - (1 + 4 * long_turns), agents * ADDS[FIRST])
    mu = math.log(max((wanted / agents - ADDS[FIRST]) / mean_adds, 0.01)) - sigma**2 / 2
    kinds, weights = [k for k, _ in MIX], [w for _, w in MIX]
    turns: list[bytearray] = []
    total = 0
    for i in range(agents):
        n = min(int(rng.lognormvariate(mu, sigma)), 5000)
        row = bytearray([FIRST])
        row += bytes(rng.choices(kinds, weights, k=n))
        if i % 500 == 7:
            row.append(SUSPENDED)
        turns.append(row)
        total += sum(ADDS[k] for k in row)
    while total < wanted:  # top up, a question and answer at a time, anywhere
        row = turns[rng.randrange(agents)]
        row.insert(len(row) - (row[-1] == SUSPENDED), CHAT)
        total += ADDS[CHAT]
    turns.append(bytearray([FIRST]) + bytes([TOOL]) * (long_turns - 1))
    return turns


# -- rows -------------------------------------------------------------------------


def _copy_text(value: str) -> str:
    """``value`` as a field of COPY's text format (our texts hold no tab or newline)."""
    return value.replace("\\", "\\\\")


class Writer:
    """Writes one agent's rows: messages and versions to their COPY streams, the small
    tables to lists."""

    def __init__(self, now: float, seed: int) -> None:
        from effectful_durable.store.history import message_json

        self.encode = message_json
        self.now = now
        self.rng = random.Random(seed + 1)
        self.counter = 0
        # (commit time, COPY line): each batch is written in commit-time order.
        self.messages: list[tuple[float, str]] = []
        self.versions: list[tuple[float, str]] = []
        self.at = 0.0  # the commit time of the version being written
        self.conversations: list[str] = []
        self.alarms: list[str] = []
        self.approvals: list[str] = []
        self.handoffs: list[str] = []
        self.message_count = 0
        self.version_count = 0
        self.body_bytes = 0

    def _id(self) -> str:
        self.counter += 1
        return f"{self.counter:08x}-eb6f-11f1-8d70-02fc00000001"

    def _message(self, agent: str, position: int, version: int, message: dict[str, Any]) -> None:
        mid = self._id()
        message["id"] = mid
        body = self.encode(agent, message)
        self.body_bytes += len(body)
        line = (
            f"{agent}\tdefault\t{position}\t{version}\t\\N\t{mid}\t{message['role']}\t"
            f"{_copy_text(body)}\n"
        )
        self.messages.append((self.at, line))

    def times(self, index: int, turns: int) -> tuple[float, float, float]:
        """When the agent was created, the time between its turns, when it last committed."""
        created = self.now - 60 - 90 * DAY * ((index * 0.6180339887) % 1.0)
        span = (self.now - 30 - created) / turns
        return created, span, created + span * (turns - 0.5)

    def agent(self, index: int, agent: str, kinds: bytes | bytearray) -> None:
        """All rows of one agent but its ``agents`` row."""
        rng = self.rng
        created, span, updated = self.times(index, len(kinds))
        position = 0
        order = f"A-{index % 100000:05d}"
        tool_turns = 0
        last = len(kinds)
        for version, kind in enumerate(kinds, 1):
            at = created + span * (version - 1)
            committed = self.at = at + span * 0.5
            days = 1 + (version + index) % 9
            words = {"order": order, "days": days, "n": index * 7 + version}
            template, detail, state = "ask", "\\N", "\\N"
            start = position
            if kind == FIRST:
                state = _copy_text('{"customer":"' + agent + '","topic":"orders"}')
                self._message(agent, position, version, _text("system", SYSTEM))
                position += 1
                kind = TOOL if rng.random() < 0.4 else CHAT
            if kind in (CHAT, TOOL, SUSPENDED):
                question = QUESTIONS[(version + index) % len(QUESTIONS)].format(**words) + SIGN_OFF
                self._message(agent, position, version, _text("user", question))
                position += 1
            if kind == TOOL:
                tool_turns += 1
                call = f"call_{version}_0"
                self._message(agent, position, version, _call(call, "self__lookup", order))
                result = ERROR if tool_turns % 50 == 0 else RESULT
                self._message(agent, position + 1, version, _result(call, result.format(**words)))
                position += 2
            if kind == SUSPENDED:
                call = f"call_{version}_0"
                approval = f"apr_{self.counter:012x}"
                self._message(agent, position, version, _call(call, "self__refund", order))
                position += 1
                detail = _copy_text('{"suspended":["' + approval + '"]}')
                self.approvals.append(
                    _approval(approval, agent, version, None, call, order, "pending", committed)
                )
            elif kind in (EVENT, ALARM):
                payload = '{"carrier": "DHL", "order": "' + order + '"}'
                if kind == EVENT:
                    text = EVENT_TEXT.format(payload=payload)
                else:
                    text = ALARM_TEXT.format(**words)
                self._message(agent, position, version, _text("user", text))
                self._message(agent, position + 1, version, _answer(SHORT.format(**words)))
                position += 2
                template = "on_event" if kind == EVENT else "on_alarm"
                self.alarms.append(
                    _alarm(kind, self.counter, agent, version, payload, order, at, "done")
                )
            else:
                answer = ANSWERS[(version * 7 + index) % len(ANSWERS)].format(**words) + CLOSING
                self._message(agent, position, version, _answer(answer))
                position += 1
            line = (
                f"{agent}\t{version}\tturn\tdefault\t{template}\t{state}\t{position - start}\t0\t"
                f"{detail}\t{committed}\t{self.counter:016x}\n"
            )
            self.versions.append((committed, line))
        self.version_count += last
        self.message_count += position
        self.conversations.append(f"{agent}\tdefault\t1\t\\N\t{created}\n")
        self._waiting(index, agent, last, updated, order)

    def _waiting(self, index: int, agent: str, last: int, updated: float, order: str) -> None:
        """What waits for the agent: alarms, events, approvals, handoffs (module docstring)."""
        if index % 20 == 3:
            self.alarms.append(
                _alarm(ALARM, self.counter + 1, agent, last, "", order, updated, "pending")
            )
        if index % 200 == 5:
            payload = '{"order": "' + order + '", "status": "delivered"}'
            self.alarms.append(
                _alarm(EVENT, self.counter + 2, agent, last, payload, order, updated, "pending")
            )
        if index % 1000 == 13:
            self.alarms.append(
                _alarm(ALARM, self.counter + 3, agent, last, "", order, updated - DAY, "dead")
            )
        if index % 50 == 11 and last > 2:
            approval = f"apr_{self.counter + 4:012x}"
            self.approvals.append(
                _approval(approval, agent, 1, 2, "call_1_0", order, "approved", updated - DAY)
            )
        if index % 1000 == 29 or index % 5000 == 31:
            status, error = ("failed", "RuntimeError: model down")
            ended: Any = updated + 5
            if index % 5000 == 31:
                status, error, ended = "running", "\\N", "\\N"
            arguments = _copy_text('{"question":"Where is my order ' + order + '?"}')
            self.handoffs.append(
                f"{agent}\tdefault\t{last}\task\t{arguments}\t{status}\t{error}\t\\N\tvm\t"
                f"{4000 + index % 30000}\t{updated + 1}\t{ended}\n"
            )


def _text(role: str, text: str) -> dict[str, Any]:
    if role == "user":
        text = f"Answer the customer: {text}"
    block = {"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}
    return {"role": role, "content": [block]}


def _answer(text: str) -> dict[str, Any]:
    return {
        "content": text,
        "role": "assistant",
        "tool_calls": None,
        "function_call": None,
        "provider_specific_fields": None,
    }


def _call(call: str, tool: str, order: str) -> dict[str, Any]:
    arguments = '{"order": "' + order + '", "fields": ["status", "carrier", "tracking", "eta"]}'
    function = {"arguments": arguments, "name": tool}
    return {
        "content": None,
        "role": "assistant",
        "tool_calls": [{"function": function, "id": call, "type": "function"}],
        "function_call": None,
        "provider_specific_fields": None,
    }


def _result(call: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "content": [{"type": "text", "text": text}], "tool_call_id": call}


def _alarm(
    kind: int, n: int, agent: str, version: int, payload: str, order: str, at: float, status: str
) -> str:
    """An ``alarms`` row: ``done`` in ``version`` (created in the one before), ``pending``
    or ``dead`` since ``version``."""
    if kind == EVENT:
        alarm_id, action, topic, what = f"evt_{n:016x}", payload, "order_shipped", "event"
    else:
        alarm_id, topic, what = f"alm_{n:012x}", None, "alarm"
        action = f"check order {order} again"
    fire = at + 60
    if status == "done":
        created_in, ended_in, attempts, deliveries, error = version - 1, version, 0, 1, None
    elif status == "dead":
        created_in, ended_in, attempts, deliveries = version, None, 5, 0
        error = "RuntimeError: the order service timed out"
    else:  # pending: due in the next month
        created_in, ended_in, attempts, deliveries, error = version, None, 0, 0, None
        fire = time.time() + DAY * (1 + n % 30)
    fields = [
        alarm_id, created_in, agent, action, fire, fire, None, None, None, status, ended_in,
        attempts, deliveries, error, None, None, at, fire, what, topic,
    ]  # fmt: skip
    return "\t".join("\\N" if f is None else _copy_text(str(f)) for f in fields) + "\n"


def _approval(
    approval: str,
    agent: str,
    suspended_in: int,
    ended_in: int | None,
    call: str,
    order: str,
    status: str,
    at: float,
) -> str:
    parameters = (
        '{"additionalProperties":false,"properties":{"order":{"title":"Order","type":"string"}},'
        '"required":["order"],"title":"Params","type":"object"}'
    )
    decided = (at + 600, "support-lead", "ok, refund it") if status == "approved" else (None,) * 3
    fields = [
        approval, agent, "default", suspended_in, ended_in, "ask",
        '{"question":"Please refund order ' + order + '"}', None, None, "refund", call,
        '{"order":"' + order + '"}', parameters, "a refund", status, at, "vm:4242", *decided, None,
    ]  # fmt: skip
    return "\t".join("\\N" if f is None else _copy_text(str(f)) for f in fields) + "\n"


# -- writing ----------------------------------------------------------------------


def build(
    url: str,
    *,
    agents: int = 100_000,
    messages: int = 5_000_000,
    long_turns: int = 10_000,
    seed: int = 39,
    progress: bool = True,
) -> Built:
    """Fill the (empty) database of ``url`` as the module docstring says."""
    import psycopg

    from effectful_durable import Store

    started = time.perf_counter()

    def say(what: str) -> None:
        if progress:
            print(f"  {time.perf_counter() - started:5.0f} s  {what}", file=sys.stderr, flush=True)

    Store(url).close()  # the schema, as the library makes it
    if built(url):
        msg = f"{url} holds agents already: build() fills an empty database"
        raise ValueError(msg)
    turns = plan(agents, messages, long_turns, seed)
    writer = Writer(time.time(), seed)
    ids = [*((i, agent_id(i)) for i in range(agents)), (agents, "long")]
    with psycopg.connect(url) as conn:  # the agents first: the other tables refer to them
        with conn.cursor().copy(
            "COPY agents (agent_id, version, created_at, updated_at) FROM STDIN"
        ) as copy:
            for i, agent in ids:
                created, _, updated = writer.times(i, len(turns[i]))
                copy.write(f"{agent}\t{len(turns[i])}\t{created}\t{updated}\n")
    say(f"{len(ids):,} agents")
    with bulk(url, "messages") as to_messages, bulk(url, "versions") as to_versions:
        every = max(agents // 10, 1)
        for i, agent in ids:
            writer.agent(i, agent, turns[i])
            if len(writer.messages) > 200_000 or i == agents:
                # In commit-time order, as turns write them: an agent's rows lie on as many
                # pages as a database written over time spreads them to, not side by side.
                for rows, to in ((writer.messages, to_messages), (writer.versions, to_versions)):
                    rows.sort(key=lambda row: row[0])
                    to.write("".join(line for _, line in rows))
                    rows.clear()
            if i % every == 0 and i:
                say(f"{i:,} agents' messages sent, {writer.message_count:,} in all")
        say("all messages sent; the indexes of messages and versions are built next")
    say(f"{writer.message_count:,} messages and {writer.version_count:,} versions committed")
    with psycopg.connect(url) as conn:
        for table, rows in {
            "conversations": writer.conversations,
            "alarms": writer.alarms,
            "approvals": writer.approvals,
            "handoffs": writer.handoffs,
        }.items():
            with conn.cursor().copy(f"COPY {table} FROM STDIN".encode()) as copy:
                copy.write("".join(rows))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE)")  # as autovacuum leaves it: statistics, visibility map
        try:  # the bulk's pages on disk now, not flushed while a turn is timed
            conn.execute("CHECKPOINT")
        except psycopg.errors.InsufficientPrivilege:
            pass
        size = conn.execute("SELECT pg_database_size(current_database())").fetchone()
    say("the small tables written, every table vacuumed and analyzed, a checkpoint made")
    return Built(
        agents + 1,
        writer.message_count,
        writer.version_count,
        len(writer.alarms),
        len(writer.approvals),
        len(writer.handoffs),
        time.perf_counter() - started,
        int(size[0]) if size else 0,
    )


@contextlib.contextmanager
def bulk(url: str, table: str) -> Iterator[Any]:
    """A COPY into ``table`` on a connection of its own, in one transaction that empties
    it first (so that COPY may FREEZE its rows: no VACUUM needs to visit them), drops its
    indexes and builds them again once the rows are in (a sort each, rather than an
    insertion per row), and commits. Where the role may (a superuser), its rows'
    references are not checked one by one (``session_replication_role``): they refer to
    agents written before."""
    import psycopg

    with psycopg.connect(url) as conn:
        try:
            conn.execute("SET session_replication_role = replica")
        except psycopg.errors.InsufficientPrivilege:
            conn.rollback()
        conn.execute("SET maintenance_work_mem = '256MB'")
        conn.execute(f"TRUNCATE {table}".encode())
        indexes = conn.execute(
            """
            SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid),
                   c.conname, pg_get_constraintdef(c.oid)
              FROM pg_index AS i LEFT JOIN pg_constraint AS c ON c.conindid = i.indexrelid
             WHERE i.indrelid = %s::regclass
            """,
            (table,),
        ).fetchall()
        for index, _, constraint, _ in indexes:
            if constraint is not None:
                conn.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{constraint}"'.encode())
            else:
                conn.execute(f'DROP INDEX "{index}"'.encode())
        columns = conn.execute(
            "SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute"
            " WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped",
            (table,),
        ).fetchone()
        assert columns is not None
        # Each of our rows lists every column but commit_id's default (versions).
        names = [c for c in str(columns[0]).split(", ") if c != "commit_id"]
        if table == "versions":
            names.append("commit_id")
        with conn.cursor().copy(
            f"COPY {table} ({', '.join(names)}) FROM STDIN (FREEZE)".encode()
        ) as copy:
            yield copy
        for _, definition, constraint, constraint_definition in indexes:
            if constraint is not None:
                conn.execute(
                    f'ALTER TABLE {table} ADD CONSTRAINT "{constraint}" '
                    f"{constraint_definition}".encode()
                )
            else:
                conn.execute(str(definition).encode())
        conn.commit()


def built(url: str) -> int:
    """How many agents the database of ``url`` holds (0 if it has no schema yet)."""
    import psycopg

    with psycopg.connect(url) as conn:
        found = conn.execute("SELECT to_regclass('agents') IS NOT NULL").fetchone()
        if not found or not found[0]:
            return 0
        row = conn.execute("SELECT count(*) FROM agents").fetchone()
        return int(row[0]) if row else 0


if __name__ == "__main__":  # a quick look: python bench/many_agents.py URL [agents messages]
    target = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 100_000
    m = int(sys.argv[3]) if len(sys.argv) > 3 else 5_000_000
    print(build(target, agents=n, messages=m))
