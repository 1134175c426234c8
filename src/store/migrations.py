"""Schema versions: the application id that marks our files, and forward migrations.

``MIGRATIONS[n]`` upgrades a database from ``PRAGMA user_version = n`` to ``n + 1``.
A fresh database is created from ``schema.sql`` instead; ``tests/store`` proves that
both paths end in the same schema. Never edit a migration that has been released:
append a new one and update ``schema.sql``.
"""

from __future__ import annotations

from importlib import resources

APPLICATION_ID = 0x45464455  # "EFDU": PRAGMA application_id of every file we create
SCHEMA_VERSION = 2

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
_V2_CONVERSATIONS = """
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
"""
_V2_WORKSPACE = """
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

MIGRATIONS: tuple[str, ...] = (
    _V1,
    _V2_CONVERSATIONS + _V2_RETENTION + _V2_MEMORY + _V2_WORKSPACE + _V2_ALARMS,
)


def schema_sql() -> str:
    """Return the DDL of the current schema, as shipped in ``schema.sql``."""
    return resources.files(__package__).joinpath("schema.sql").read_text("utf-8")
