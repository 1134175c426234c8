"""Schema versions of an SQLite file: the current one, and forward migrations.

``MIGRATIONS[n]`` upgrades a database from ``PRAGMA user_version = n`` to ``n + 1``.
A fresh database is created from ``schema.sql`` instead; ``tests/store`` proves that
both paths end in the same schema. Never edit a migration that has been released:
append a new one and update ``schema.sql``.
"""

from __future__ import annotations

from importlib import resources

SCHEMA_VERSION = 9

_V1 = """
CREATE TABLE agents (
    agent_id   TEXT PRIMARY KEY NOT NULL,
    version    INTEGER NOT NULL CHECK (version >= 1),
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
) STRICT;
CREATE TABLE versions (
    agent_id     TEXT NOT NULL REFERENCES agents (agent_id) ON DELETE CASCADE,
    version      INTEGER NOT NULL,
    kind         TEXT NOT NULL CHECK (kind IN ('turn', 'rollback', 'fork', 'compaction')),
    template     TEXT,
    state        TEXT,
    added        INTEGER NOT NULL,
    removed      INTEGER NOT NULL,
    detail       TEXT,
    committed_at REAL NOT NULL,
    PRIMARY KEY (agent_id, version)
) STRICT, WITHOUT ROWID;
CREATE TABLE messages (
    agent_id   TEXT NOT NULL REFERENCES agents (agent_id) ON DELETE CASCADE,
    position   REAL NOT NULL,
    added_in   INTEGER NOT NULL,
    removed_in INTEGER CHECK (removed_in > added_in),
    message_id TEXT NOT NULL,
    role       TEXT NOT NULL,
    body       TEXT NOT NULL,
    PRIMARY KEY (agent_id, position, added_in)
) STRICT;
CREATE UNIQUE INDEX messages_active ON messages (agent_id, position)
    WHERE removed_in IS NULL;
CREATE TABLE handoffs (
    agent_id     TEXT PRIMARY KEY NOT NULL,
    base_version INTEGER NOT NULL,
    template     TEXT NOT NULL,
    arguments    TEXT NOT NULL,
    status       TEXT NOT NULL CHECK (status IN ('running', 'failed')),
    error        TEXT,
    interrupted  TEXT,
    host         TEXT NOT NULL,
    pid          INTEGER NOT NULL,
    started_at   REAL NOT NULL,
    ended_at     REAL
) STRICT;
CREATE TABLE workflow_steps (
    workflow     TEXT NOT NULL,
    step_key     TEXT NOT NULL,
    number       INTEGER NOT NULL,
    agent_id     TEXT,
    template     TEXT NOT NULL,
    arguments    TEXT NOT NULL,
    status       TEXT NOT NULL CHECK (status IN ('running', 'done', 'failed')),
    result       TEXT,
    base_version INTEGER,
    version      INTEGER,
    started_at   REAL NOT NULL,
    finished_at  REAL,
    PRIMARY KEY (workflow, step_key)
) STRICT;
CREATE UNIQUE INDEX workflow_steps_number ON workflow_steps (workflow, number);
CREATE TABLE compactions (
    agent_id       TEXT NOT NULL REFERENCES agents (agent_id) ON DELETE CASCADE,
    version        INTEGER NOT NULL,
    summary_id     TEXT NOT NULL,
    first_position REAL NOT NULL,
    last_position  REAL NOT NULL,
    messages       INTEGER NOT NULL,
    summarizer     TEXT NOT NULL,
    PRIMARY KEY (agent_id, version)
) STRICT, WITHOUT ROWID;
CREATE VIRTUAL TABLE compacted_text USING fts5 (
    text, agent_id UNINDEXED, position UNINDEXED, version UNINDEXED,
    tokenize = 'porter unicode61'
);
"""

# Schema 2 adds conversations (several histories per agent), what Store.prune
# records, then what an agent keeps besides messages and fields. One section per
# part, in schema.sql's order.
#
# Conversations change the keys of messages, handoffs and journal steps, and add
# a column and a kind to versions. SQLite cannot alter a key, so those tables
# are rebuilt by its documented procedure (sqlite.org/lang_altertable.html
# #otheralter: new table, copy, drop, rename, recreate indexes), inside the
# migration's one transaction; every schema-1 row lands in the conversation
# 'default'. No table refers to the rebuilt ones, so foreign keys stay on.
_V2_CONVERSATIONS = """
-- The conversations of each agent, versioned as messages are: one exists at
-- version v when a row has added_in <= v and removed_in NULL or > v. A row is
-- added by the first commit in the conversation; deleting it (or rolling back
-- to before it) sets removed_in.
CREATE TABLE conversations (
    agent_id     TEXT NOT NULL REFERENCES agents (agent_id) ON DELETE CASCADE,
    conversation TEXT NOT NULL,
    added_in     INTEGER NOT NULL,
    removed_in   INTEGER CHECK (removed_in > added_in),
    created_at   REAL NOT NULL,
    PRIMARY KEY (agent_id, conversation, added_in)
) STRICT;

CREATE UNIQUE INDEX conversations_active ON conversations (agent_id, conversation)
    WHERE removed_in IS NULL;

INSERT INTO conversations (agent_id, conversation, added_in, created_at)
SELECT agent_id, 'default', 1, created_at FROM agents;

-- messages: the conversation joins the key; loading one conversation reads
-- exactly its active rows through messages_active.
CREATE TABLE messages_v2 (
    agent_id     TEXT NOT NULL REFERENCES agents (agent_id) ON DELETE CASCADE,
    conversation TEXT NOT NULL,
    position     REAL NOT NULL,
    added_in     INTEGER NOT NULL,
    removed_in   INTEGER CHECK (removed_in > added_in),
    message_id   TEXT NOT NULL,
    role         TEXT NOT NULL,
    body         TEXT NOT NULL,
    PRIMARY KEY (agent_id, conversation, position, added_in)
) STRICT;

INSERT INTO messages_v2
SELECT agent_id, 'default', position, added_in, removed_in, message_id, role, body
  FROM messages;

DROP TABLE messages;

ALTER TABLE messages_v2 RENAME TO messages;

CREATE UNIQUE INDEX messages_active ON messages (agent_id, conversation, position)
    WHERE removed_in IS NULL;

-- versions: which conversation each version changed (NULL: all of them, as a
-- rollback or a fork does), and the kind 'delete' for a deleted conversation.
CREATE TABLE versions_v2 (
    agent_id     TEXT NOT NULL REFERENCES agents (agent_id) ON DELETE CASCADE,
    version      INTEGER NOT NULL,
    kind         TEXT NOT NULL
                 CHECK (kind IN ('turn', 'rollback', 'fork', 'compaction', 'delete')),
    conversation TEXT,
    template     TEXT,
    state        TEXT,
    added        INTEGER NOT NULL,
    removed      INTEGER NOT NULL,
    detail       TEXT,
    committed_at REAL NOT NULL,
    PRIMARY KEY (agent_id, version)
) STRICT, WITHOUT ROWID;

INSERT INTO versions_v2
SELECT agent_id, version, kind,
       CASE WHEN kind IN ('turn', 'compaction') THEN 'default' END,
       template, state, added, removed, detail, committed_at
  FROM versions;

DROP TABLE versions;

ALTER TABLE versions_v2 RENAME TO versions;

-- handoffs: one per conversation, so a crash is told to the next turn of the
-- conversation it cut off.
CREATE TABLE handoffs_v2 (
    agent_id     TEXT NOT NULL,
    conversation TEXT NOT NULL,
    base_version INTEGER NOT NULL,
    template     TEXT NOT NULL,
    arguments    TEXT NOT NULL,
    status       TEXT NOT NULL CHECK (status IN ('running', 'failed')),
    error        TEXT,
    interrupted  TEXT,
    host         TEXT NOT NULL,
    pid          INTEGER NOT NULL,
    started_at   REAL NOT NULL,
    ended_at     REAL,
    PRIMARY KEY (agent_id, conversation)
) STRICT;

INSERT INTO handoffs_v2
SELECT agent_id, 'default', base_version, template, arguments, status, error,
       interrupted, host, pid, started_at, ended_at
  FROM handoffs;

DROP TABLE handoffs;

ALTER TABLE handoffs_v2 RENAME TO handoffs;

-- workflow_steps: the conversation a step ran in (NULL for a free template).
-- Steps are counted per agent and conversation: "coder-1#2", "coder-1@c-42#0".
CREATE TABLE workflow_steps_v2 (
    workflow     TEXT NOT NULL,
    step_key     TEXT NOT NULL,
    number       INTEGER NOT NULL,
    agent_id     TEXT,
    conversation TEXT,
    template     TEXT NOT NULL,
    arguments    TEXT NOT NULL,
    status       TEXT NOT NULL CHECK (status IN ('running', 'done', 'failed')),
    result       TEXT,
    base_version INTEGER,
    version      INTEGER,
    started_at   REAL NOT NULL,
    finished_at  REAL,
    PRIMARY KEY (workflow, step_key)
) STRICT;

INSERT INTO workflow_steps_v2
SELECT workflow, step_key, number, agent_id,
       CASE WHEN agent_id IS NOT NULL THEN 'default' END,
       template, arguments, status, result, base_version, version, started_at,
       finished_at
  FROM workflow_steps;

DROP TABLE workflow_steps;

ALTER TABLE workflow_steps_v2 RENAME TO workflow_steps;

CREATE UNIQUE INDEX workflow_steps_number ON workflow_steps (workflow, number);
"""
_V2_RETENTION = """
CREATE TABLE retention (
    agent_id  TEXT PRIMARY KEY NOT NULL REFERENCES agents (agent_id) ON DELETE CASCADE,
    kept_from INTEGER NOT NULL CHECK (kept_from >= 1),
    state     TEXT,
    pruned_at REAL NOT NULL
) STRICT, WITHOUT ROWID;
CREATE INDEX messages_removed ON messages (agent_id, removed_in)
    WHERE removed_in IS NOT NULL;
"""
_V2_MEMORY = """
CREATE TABLE memory (
    agent_id   TEXT NOT NULL REFERENCES agents (agent_id) ON DELETE CASCADE,
    kind       TEXT NOT NULL CHECK (kind IN ('key', 'note')),
    key        TEXT NOT NULL,
    added_in   INTEGER NOT NULL,
    removed_in INTEGER CHECK (removed_in > added_in),
    value      TEXT NOT NULL,
    PRIMARY KEY (agent_id, kind, key, added_in)
) STRICT;
CREATE UNIQUE INDEX memory_active ON memory (agent_id, kind, key)
    WHERE removed_in IS NULL;
"""
_V2_WORKSPACE = """
CREATE TABLE workspace_log (
    agent_id  TEXT NOT NULL REFERENCES agents (agent_id) ON DELETE CASCADE,
    version   INTEGER NOT NULL,
    seq       INTEGER NOT NULL,
    ddl       TEXT,
    changeset BLOB,
    CHECK ((ddl IS NULL) <> (changeset IS NULL)),
    PRIMARY KEY (agent_id, version, seq)
) STRICT;
"""
_V2_ALARMS = """
-- One row per span of an alarm's life: from the version that scheduled it (or
-- that a rollback restored it in) to the version that delivered its last
-- occurrence or cancelled it. An alarm is pending at version v when one of its
-- spans has created_in <= v < ended_in (or ended_in IS NULL). fire_at is the
-- occurrence to deliver next; due_at is when a runner may claim it: fire_at, a
-- retry time after a failed delivery, or the end of a runner's lease.
CREATE TABLE alarms (
    alarm_id    TEXT NOT NULL,
    created_in  INTEGER NOT NULL,
    agent_id    TEXT NOT NULL,
    action      TEXT NOT NULL,
    fire_at     REAL NOT NULL,
    due_at      REAL NOT NULL,
    every       REAL CHECK (every > 0),
    cron        TEXT,
    timezone    TEXT,
    status      TEXT NOT NULL CHECK (status IN ('pending', 'dead', 'done', 'cancelled')),
    ended_in    INTEGER CHECK (ended_in >= created_in),
    attempts    INTEGER NOT NULL DEFAULT 0,
    deliveries  INTEGER NOT NULL DEFAULT 0,
    last_error  TEXT,
    lease_owner TEXT,
    lease_token TEXT,
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL,
    PRIMARY KEY (alarm_id, created_in),
    CHECK ((ended_in IS NULL) = (status IN ('pending', 'dead')))
) STRICT;

-- The runner's one query: the earliest claimable alarm.
CREATE INDEX alarms_due ON alarms (due_at) WHERE status = 'pending';
CREATE UNIQUE INDEX alarms_open ON alarms (alarm_id) WHERE ended_in IS NULL;
CREATE INDEX alarms_agent ON alarms (agent_id, ended_in);
CREATE INDEX alarms_leased ON alarms (lease_owner) WHERE lease_owner IS NOT NULL;

-- The last status report of each runner (written at start, on SIGUSR1, at stop).
CREATE TABLE runner_status (
    runner_id   TEXT PRIMARY KEY NOT NULL,
    host        TEXT NOT NULL,
    pid         INTEGER NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('running', 'stopped')),
    started_at  REAL NOT NULL,
    reported_at REAL NOT NULL,
    report      TEXT NOT NULL
) STRICT;
"""

# Schema 3 adds the values of fields declared per conversation.
_V3 = """
CREATE TABLE conversation_fields (
    agent_id     TEXT NOT NULL REFERENCES agents (agent_id) ON DELETE CASCADE,
    conversation TEXT NOT NULL,
    added_in     INTEGER NOT NULL,
    removed_in   INTEGER CHECK (removed_in > added_in),
    state        TEXT NOT NULL,
    PRIMARY KEY (agent_id, conversation, added_in)
) STRICT;
CREATE UNIQUE INDEX conversation_fields_active ON conversation_fields (agent_id, conversation)
    WHERE removed_in IS NULL;
"""

# Schema 4 keeps a checksum per row (row_checks.py) instead of one per page: each
# table gains crc, filled for the rows it holds (by the row_crc function that
# every connection of ours registers). The columns are schema 3's, in order.
_V3_COLUMNS: dict[str, str] = {
    "agents": "agent_id, version, created_at, updated_at",
    "versions": "agent_id, version, kind, conversation, template, state, added, removed, detail, "
    "committed_at",
    "messages": "agent_id, conversation, position, added_in, removed_in, message_id, role, body",
    "handoffs": "agent_id, conversation, base_version, template, arguments, status, error, "
    "interrupted, host, pid, started_at, ended_at",
    "workflow_steps": "workflow, step_key, number, agent_id, conversation, template, arguments, "
    "status, result, base_version, version, started_at, finished_at",
    "compactions": "agent_id, version, summary_id, first_position, last_position, messages, "
    "summarizer",
    "conversations": "agent_id, conversation, added_in, removed_in, created_at",
    "conversation_fields": "agent_id, conversation, added_in, removed_in, state",
    "retention": "agent_id, kept_from, state, pruned_at",
    "memory": "agent_id, kind, key, added_in, removed_in, value",
    "workspace_log": "agent_id, version, seq, ddl, changeset",
    "alarms": "alarm_id, created_in, agent_id, action, fire_at, due_at, every, cron, timezone, "
    "status, ended_in, attempts, deliveries, last_error, lease_owner, lease_token, created_at, "
    "updated_at",
    "runner_status": "runner_id, host, pid, state, started_at, reported_at, report",
}
_V4 = "".join(
    f"ALTER TABLE {table} ADD COLUMN crc INTEGER;\n"
    f"UPDATE {table} SET crc = row_crc('{table}', {columns});\n"
    for table, columns in _V3_COLUMNS.items()
)

# Schema 5 adds events and resumptions to the runners' queue (alarms.kind and
# alarms.topic, which come before crc, so the table is rebuilt: each row's crc
# carries its old discrepancy over, so a damaged row stays refused), the
# approvals of suspended turns, and an index for the workflow steps that wait
# for an event.
_ALARM_COLUMNS = _V3_COLUMNS["alarms"]
_V5 = f"""
CREATE TABLE alarms_v5 (
    alarm_id    TEXT NOT NULL,
    created_in  INTEGER NOT NULL,
    agent_id    TEXT NOT NULL,
    action      TEXT NOT NULL,
    fire_at     REAL NOT NULL,
    due_at      REAL NOT NULL,
    every       REAL CHECK (every > 0),
    cron        TEXT,
    timezone    TEXT,
    status      TEXT NOT NULL CHECK (status IN ('pending', 'dead', 'done', 'cancelled')),
    ended_in    INTEGER CHECK (ended_in >= created_in),
    attempts    INTEGER NOT NULL DEFAULT 0,
    deliveries  INTEGER NOT NULL DEFAULT 0,
    last_error  TEXT,
    lease_owner TEXT,
    lease_token TEXT,
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL,
    kind        TEXT NOT NULL DEFAULT 'alarm' CHECK (kind IN ('alarm', 'event', 'resume')),
    topic       TEXT,
    crc         INTEGER,
    PRIMARY KEY (alarm_id, created_in),
    CHECK ((ended_in IS NULL) = (status IN ('pending', 'dead')))
) STRICT;
INSERT INTO alarms_v5 ({_ALARM_COLUMNS}, kind, topic, crc)
SELECT {_ALARM_COLUMNS}, 'alarm', NULL,
       updated_crc('alarms', 18, crc, {_ALARM_COLUMNS}, {_ALARM_COLUMNS}, 'alarm', NULL)
  FROM alarms;
DROP TABLE alarms;
ALTER TABLE alarms_v5 RENAME TO alarms;
CREATE INDEX alarms_due ON alarms (due_at) WHERE status = 'pending';
CREATE UNIQUE INDEX alarms_open ON alarms (alarm_id) WHERE ended_in IS NULL;
CREATE INDEX alarms_agent ON alarms (agent_id, ended_in);
CREATE INDEX alarms_leased ON alarms (lease_owner) WHERE lease_owner IS NOT NULL;

CREATE TABLE approvals (
    approval_id       TEXT PRIMARY KEY NOT NULL,
    agent_id          TEXT NOT NULL REFERENCES agents (agent_id) ON DELETE CASCADE,
    conversation      TEXT NOT NULL,
    suspended_in      INTEGER NOT NULL,
    ended_in          INTEGER CHECK (ended_in >= suspended_in),
    template          TEXT NOT NULL,
    turn_arguments    TEXT NOT NULL,
    workflow          TEXT,
    step_key          TEXT,
    tool              TEXT NOT NULL,
    tool_call_id      TEXT NOT NULL,
    arguments         TEXT NOT NULL,
    parameters        TEXT NOT NULL,
    reason            TEXT,
    status            TEXT NOT NULL
                      CHECK (status IN ('pending', 'approved', 'denied', 'cancelled')),
    asked_at          REAL NOT NULL,
    asked_by          TEXT NOT NULL,
    decided_at        REAL,
    decided_by        TEXT,
    note              TEXT,
    decided_arguments TEXT,
    crc               INTEGER
) STRICT;

-- A turn's start looks here for its conversation's open suspension.
CREATE INDEX approvals_open ON approvals (agent_id, conversation) WHERE ended_in IS NULL;
CREATE INDEX approvals_pending ON approvals (asked_at) WHERE status = 'pending';

-- The last status report of each runner (written at start, on SIGUSR1, at stop).
CREATE INDEX workflow_steps_waiting ON workflow_steps (agent_id, template)
    WHERE status = 'running';
"""

# Schema 6 gives each agent's row state_in, the newest version holding a state,
# so that loading an agent reads its state without a walk back through the
# versions that left it unchanged (each of which the walk must check). The table
# is rebuilt (state_in comes before crc; migrations run with foreign keys off,
# so that dropping the old table deletes none of its children), each
# row's crc carrying its old discrepancy over. A version row that fails its own
# checksum counts as holding a state: loading the agent reads it, and refuses it.
_AGENT_COLUMNS = _V3_COLUMNS["agents"]
_V6 = f"""
CREATE TABLE agents_v6 (
    agent_id   TEXT PRIMARY KEY NOT NULL,
    version    INTEGER NOT NULL CHECK (version >= 1),
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    state_in   INTEGER,
    crc        INTEGER
) STRICT;
INSERT INTO agents_v6 ({_AGENT_COLUMNS}, state_in, crc)
SELECT {_AGENT_COLUMNS}, state_in,
       updated_crc('agents', 4, crc, {_AGENT_COLUMNS}, {_AGENT_COLUMNS}, state_in)
  FROM (SELECT a.*,
               (SELECT max(v.version) FROM versions AS v
                 WHERE v.agent_id = a.agent_id
                   AND (v.state IS NOT NULL
                        OR v.crc IS NOT row_crc('versions', {_V3_COLUMNS["versions"]})))
                 AS state_in
          FROM agents AS a);
DROP TABLE agents;
ALTER TABLE agents_v6 RENAME TO agents;
"""

# Schema 7 gives each runner's status row the place of its pid (the kernel's boot
# and PID namespace: engine/process.py), so that a runner judges another's process
# gone only where that pid names the same process. The table is rebuilt (place
# comes before crc), each row's crc carrying its old discrepancy over; the rows
# kept have no place, and are judged by their heartbeats alone.
_RUNNER_COLUMNS = _V3_COLUMNS["runner_status"]
_V7 = f"""
CREATE TABLE runner_status_v7 (
    runner_id   TEXT PRIMARY KEY NOT NULL,
    host        TEXT NOT NULL,
    pid         INTEGER NOT NULL,
    place       TEXT,
    state       TEXT NOT NULL CHECK (state IN ('running', 'stopped')),
    started_at  REAL NOT NULL,
    reported_at REAL NOT NULL,
    report      TEXT NOT NULL,
    crc         INTEGER
) STRICT;
INSERT INTO runner_status_v7 (runner_id, host, pid, place, state, started_at, reported_at,
                              report, crc)
SELECT runner_id, host, pid, NULL, state, started_at, reported_at, report,
       updated_crc('runner_status', 7, crc, {_RUNNER_COLUMNS},
                   runner_id, host, pid, NULL, state, started_at, reported_at, report)
  FROM runner_status;
DROP TABLE runner_status;
ALTER TABLE runner_status_v7 RENAME TO runner_status;
"""

# Schema 8: subjects, erasures and a file that overwrites what it deletes (issue 52).
_V8 = """
-- == Privacy: subjects and erasures (schema 8) ==

-- Who an agent's content is about: the subject (a person, a tenant) the
-- application names for the agent (conversation '') or for one of its
-- conversations. A label, not versioned: a fork takes its source's, and it goes
-- with its agent. Store.erase(subject=...) erases what carries it.
CREATE TABLE subjects (
    agent_id     TEXT NOT NULL,
    conversation TEXT NOT NULL,
    subject      TEXT NOT NULL,
    set_at       REAL NOT NULL,
    crc          INTEGER,
    PRIMARY KEY (agent_id, conversation)
) STRICT;
CREATE INDEX subjects_subject ON subjects (subject);

-- The receipt of each erasure (Store.erase): what was erased, counted by kind,
-- and when, with its digest; none of the erased content, nor the subject's
-- name (only its digest).
CREATE TABLE erasures (
    erasure_id TEXT PRIMARY KEY NOT NULL,
    erased_at  REAL NOT NULL,
    receipt    TEXT NOT NULL,
    digest     TEXT NOT NULL,
    crc        INTEGER
) STRICT;

-- Deleting a compacted message's text takes its words out of the index at once,
-- not at a later merge.
INSERT INTO compacted_text (compacted_text, rank) VALUES ('secure-delete', 1);

CREATE TABLE scrubbed (since REAL NOT NULL) STRICT;
"""

# Schema 9: encryption at rest (issue 52).
_V9 = """
-- == Encryption at rest (schema 9) ==

-- Whether the content of the rows is sealed (sealing.py), and the check value
-- that proves a Store's keys are the ones: one row once keys were first given;
-- none for a database without encryption. complete: every row is sealed (a plain
-- value where a sealed one belongs is damage). Not agent data, so no crc: the
-- check value authenticates itself.
CREATE TABLE encryption (
    id          INTEGER PRIMARY KEY NOT NULL CHECK (id = 1),
    check_value TEXT NOT NULL,
    complete    INTEGER NOT NULL,
    since       REAL NOT NULL
) STRICT;

-- A sealed copy of a conversation's active messages at one version, for loading
-- a long sealed history in one piece (snapshots.py): only ever a copy, the
-- message rows stay the truth. Sealed (its own authentication), so no crc.
CREATE TABLE history_snapshots (
    agent_id     TEXT NOT NULL REFERENCES agents (agent_id) ON DELETE CASCADE,
    conversation TEXT NOT NULL,
    version      INTEGER NOT NULL,
    messages     BLOB NOT NULL,
    PRIMARY KEY (agent_id, conversation)
) STRICT;
"""

MIGRATIONS: tuple[str, ...] = (
    _V1,
    _V2_CONVERSATIONS + _V2_RETENTION + _V2_MEMORY + _V2_WORKSPACE + _V2_ALARMS,
    _V3,
    _V4,
    _V5,
    _V6,
    _V7,
    _V8,
    _V9,
)


def schema_sql() -> str:
    """Return the DDL of the current schema, as shipped in ``schema.sql``."""
    return resources.files(__package__).joinpath("schema.sql").read_text("utf-8")
