-- effectful-durable database schema, version 8.
--
-- A fresh database is created from this file; older ones are upgraded by
-- migrations.MIGRATIONS, and a test proves both produce the same schema.
-- PRAGMA application_id marks the file as ours; PRAGMA user_version is the
-- schema version. Times are Unix seconds; payloads are JSON text. Every table
-- ends with crc, the CRC-32 of the row's other values, kept by effectful-durable's
-- connections and checked when the row is read (store/row_checks.py): a row
-- another program changed or inserted is refused when read, and only that row.

-- One row per durable agent: its id and last committed version. state_in is
-- the newest version whose row holds a state (versions.state not NULL): the
-- state of the agent now, read without a walk back through the versions that
-- left it unchanged (NULL: none known; then that walk finds it).
CREATE TABLE agents (
    agent_id   TEXT PRIMARY KEY NOT NULL,
    version    INTEGER NOT NULL CHECK (version >= 1),
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    state_in   INTEGER,
    crc        INTEGER
) STRICT;

-- One row per committed version: a turn, a rollback, a fork, a compaction or
-- the deletion of a conversation. conversation is the one the version changed
-- (NULL for a rollback or a fork, which take every conversation along).
-- state is the JSON object of the agent's persisted fields, or NULL when
-- unchanged since the previous version (read the newest non-NULL one).
CREATE TABLE versions (
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
    crc          INTEGER,
    PRIMARY KEY (agent_id, version)
) STRICT, WITHOUT ROWID;

-- Append-only message log, one history per conversation of the agent. A row
-- is part of the active history from version added_in until the version that
-- removed it (removed_in; NULL while active). Rows are deleted only by deleting
-- the whole agent, or by Store.prune when no kept version shows them, so every
-- kept version's history reads back.
-- position orders a conversation's history; among the rows of one conversation
-- active at any one version, positions are unique.
CREATE TABLE messages (
    agent_id     TEXT NOT NULL REFERENCES agents (agent_id) ON DELETE CASCADE,
    conversation TEXT NOT NULL,
    position     REAL NOT NULL,
    added_in     INTEGER NOT NULL,
    removed_in   INTEGER CHECK (removed_in > added_in),
    message_id   TEXT NOT NULL,
    role         TEXT NOT NULL,
    body         TEXT NOT NULL,
    crc          INTEGER,
    PRIMARY KEY (agent_id, conversation, position, added_in)
) STRICT;

-- Loading a conversation reads exactly its active rows, in order, through this index.
CREATE UNIQUE INDEX messages_active ON messages (agent_id, conversation, position)
    WHERE removed_in IS NULL;

-- The turn in flight or the last failed turn, per conversation of an agent.
-- Written and committed when a turn starts, deleted by the turn's own commit: a
-- row still 'running' after its process died is a crash, and the next turn in
-- that conversation is told about it.
CREATE TABLE handoffs (
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
    crc          INTEGER,
    PRIMARY KEY (agent_id, conversation)
) STRICT;

-- The step journal of crash-resumable workflows. Each outermost template call
-- of a workflow run is a step, keyed by the agent, its conversation unless the
-- default one, and its sequence number there ("coder-1#2", "coder-1@c-42#0"; a
-- call nested inside another step's turn extends that key:
-- "architect#0/reviewer#0"). conversation is NULL for a free template. A step's row is written 'running' with its turn's
-- handoff and set 'done', with the template's result as JSON, in the turn's own
-- commit, so a re-run replays it without calling the model.
CREATE TABLE workflow_steps (
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
    crc          INTEGER,
    PRIMARY KEY (workflow, step_key)
) STRICT;

CREATE UNIQUE INDEX workflow_steps_number ON workflow_steps (workflow, number);

-- A step that waits for an event (template 'event:<name>') stays 'running' until
-- the event is sent; sending one finds the waiting steps of its agent here.
CREATE INDEX workflow_steps_waiting ON workflow_steps (agent_id, template)
    WHERE status = 'running';

-- One row per compaction: the summary message that replaced a run of older
-- messages in the active history, and the position range those originals
-- occupy. The originals stay in messages (removed_in = version), readable and
-- searchable through compacted_text; rolling back before the compaction brings
-- them back.
CREATE TABLE compactions (
    agent_id       TEXT NOT NULL REFERENCES agents (agent_id) ON DELETE CASCADE,
    version        INTEGER NOT NULL,
    summary_id     TEXT NOT NULL,
    first_position REAL NOT NULL,
    last_position  REAL NOT NULL,
    messages       INTEGER NOT NULL,
    summarizer     TEXT NOT NULL,
    crc            INTEGER,
    PRIMARY KEY (agent_id, version)
) STRICT, WITHOUT ROWID;

-- Full-text index of compacted messages, for agents to recall them.
CREATE VIRTUAL TABLE compacted_text USING fts5 (
    text, agent_id UNINDEXED, position UNINDEXED, version UNINDEXED,
    tokenize = 'porter unicode61'
);

-- == Conversations: the histories of one agent ==

-- The conversations of each agent, versioned as messages are: one exists at
-- version v when a row has added_in <= v and removed_in NULL or > v. A row is
-- added by the first commit in the conversation; deleting it (or rolling back
-- to before it) sets removed_in. Messages, handoffs and journal steps name
-- their conversation; an agent that never names one uses 'default'.
CREATE TABLE conversations (
    agent_id     TEXT NOT NULL REFERENCES agents (agent_id) ON DELETE CASCADE,
    conversation TEXT NOT NULL,
    added_in     INTEGER NOT NULL,
    removed_in   INTEGER CHECK (removed_in > added_in),
    created_at   REAL NOT NULL,
    crc          INTEGER,
    PRIMARY KEY (agent_id, conversation, added_in)
) STRICT;

CREATE UNIQUE INDEX conversations_active ON conversations (agent_id, conversation)
    WHERE removed_in IS NULL;

-- The values of an agent's fields declared per_conversation() in each of its
-- conversations, one JSON object per row, versioned as memory is: version v
-- holds the row with added_in <= v and removed_in NULL or > v. A turn adds a
-- row only when its conversation's values changed.
CREATE TABLE conversation_fields (
    agent_id     TEXT NOT NULL REFERENCES agents (agent_id) ON DELETE CASCADE,
    conversation TEXT NOT NULL,
    added_in     INTEGER NOT NULL,
    removed_in   INTEGER CHECK (removed_in > added_in),
    state        TEXT NOT NULL,
    crc          INTEGER,
    PRIMARY KEY (agent_id, conversation, added_in)
) STRICT;

CREATE UNIQUE INDEX conversation_fields_active ON conversation_fields (agent_id, conversation)
    WHERE removed_in IS NULL;

-- == Retention: what Store.prune removed, per agent ==

-- Versions before kept_from were pruned: their rows are gone, and reading or
-- rolling back to them is refused. state is the agent's state as of version
-- kept_from - 1, for the kept versions that inherit it (versions.state NULL).
CREATE TABLE retention (
    agent_id  TEXT PRIMARY KEY NOT NULL REFERENCES agents (agent_id) ON DELETE CASCADE,
    kept_from INTEGER NOT NULL CHECK (kept_from >= 1),
    state     TEXT,
    pruned_at REAL NOT NULL,
    crc       INTEGER
) STRICT, WITHOUT ROWID;

-- Pruning finds the rows that only pruned versions showed through this index.
CREATE INDEX messages_removed ON messages (agent_id, removed_in)
    WHERE removed_in IS NOT NULL;

-- == Memory: the keys an agent decided to keep (StateTools) ==

-- The agent's memory, versioned like messages: one row per value a key held
-- ('key') and per context note ('note', keyed by the time it was added). A put
-- marks the key's active row removed_in = version and adds a row added_in =
-- version, so a write costs what it writes; version v holds the rows with
-- added_in <= v < coalesce(removed_in, infinity). value is JSON text: the
-- value of a key, {"at": <unix seconds>, "text": ...} for a note.
CREATE TABLE memory (
    agent_id   TEXT NOT NULL REFERENCES agents (agent_id) ON DELETE CASCADE,
    kind       TEXT NOT NULL CHECK (kind IN ('key', 'note')),
    key        TEXT NOT NULL,
    added_in   INTEGER NOT NULL,
    removed_in INTEGER CHECK (removed_in > added_in),
    value      TEXT NOT NULL,
    crc        INTEGER,
    PRIMARY KEY (agent_id, kind, key, added_in)
) STRICT;

-- The current memory, in key order, one indexed range per agent and kind.
CREATE UNIQUE INDEX memory_active ON memory (agent_id, kind, key)
    WHERE removed_in IS NULL;

-- == SQL workspace: the agent's own tables (SQLTools) ==

-- The tables themselves live in one SQLite file per agent beside this one
-- (<db>-workspaces/<blake2b of agent id>.sqlite), a view rebuilt from this log
-- whenever it is behind. Per version, the steps that turn the previous
-- version's tables into this one's, in seq order: DDL text, or an SQLite
-- session changeset of row changes. ddl '-- reset' drops every table (a
-- snapshot, written by fork, prune and rollbacks across schema changes).
CREATE TABLE workspace_log (
    agent_id  TEXT NOT NULL REFERENCES agents (agent_id) ON DELETE CASCADE,
    version   INTEGER NOT NULL,
    seq       INTEGER NOT NULL,
    ddl       TEXT,
    changeset BLOB,
    crc       INTEGER,
    CHECK ((ddl IS NULL) <> (changeset IS NULL)),
    PRIMARY KEY (agent_id, version, seq)
) STRICT;

-- == Alarms, events and resumptions: turns a runner delivers ==

-- One row per span of an alarm's life: from the version that scheduled it (or
-- that a rollback restored it in) to the version that delivered its last
-- occurrence or cancelled it. An alarm is pending at version v when one of its
-- spans has created_in <= v < ended_in (or ended_in IS NULL). fire_at is the
-- occurrence to deliver next; due_at is when a runner may claim it: fire_at, a
-- retry time after a failed delivery, or the end of a runner's lease.
-- kind says what a delivery does: 'alarm' calls on_alarm(action); 'event' is a
-- message sent to the agent's inbox (topic its name, action its JSON payload),
-- delivered by on_event(name, payload) or taken by a workflow waiting for it;
-- 'resume' resumes the agent's suspended turn in conversation topic once every
-- approval it waits for is decided (action: {"suspended_in": version}).
-- Rollback and fork carry alarms only: the inbox belongs to the world.
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
    kind        TEXT NOT NULL DEFAULT 'alarm' CHECK (kind IN ('alarm', 'event', 'resume')),
    topic       TEXT,
    crc         INTEGER,
    PRIMARY KEY (alarm_id, created_in),
    CHECK ((ended_in IS NULL) = (status IN ('pending', 'dead')))
) STRICT;

-- The runner's one query: the earliest claimable alarm.
CREATE INDEX alarms_due ON alarms (due_at) WHERE status = 'pending';
CREATE UNIQUE INDEX alarms_open ON alarms (alarm_id) WHERE ended_in IS NULL;
CREATE INDEX alarms_agent ON alarms (agent_id, ended_in);
CREATE INDEX alarms_leased ON alarms (lease_owner) WHERE lease_owner IS NOT NULL;

-- == Approvals: tool calls that wait for a person's decision ==

-- One row per tool call the model made that needs approval. The turn that made
-- it is suspended: its messages so far committed as version suspended_in (the
-- call's tool_call_id names it in the assistant's message), the call waiting
-- here. A decision is recorded once: 'approved' (decided_arguments: what the
-- tool runs with) or 'denied' (note: the reason the model reads). The turn,
-- resumed once every approval of its suspension is decided, commits the tool's
-- result as version ended_in. A rollback to before suspended_in cancels the row
-- (ended_in set); to a version the suspension holds, asks again (pending, the
-- decision cleared). parameters is the JSON schema the arguments must fit.
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
CREATE TABLE runner_status (
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

-- Since when every write to the file has overwritten what it deleted (our
-- connections' PRAGMA secure_delete): a fact about the file, not agent data, so
-- no crc. A file older than schema 8 has no row until its first erasure vacuums it.
CREATE TABLE scrubbed (since REAL NOT NULL) STRICT;
INSERT INTO scrubbed VALUES (0);

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
