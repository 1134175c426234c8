-- effectful-durable database schema on PostgreSQL, version 10.
--
-- A fresh database is created from this file; older ones are upgraded by
-- postgres_schema.MIGRATIONS, and a test proves both produce the same schema.
-- The same tables as schema.sql (read it for what each one means), in
-- PostgreSQL's types: times are Unix seconds and positions double precision,
-- payloads JSON text, changesets bytea. Ids and keys compare as bytes
-- (COLLATE "C"), as SQLite compares text, so that every listing has the same
-- order on both backends.

-- Marks the database as ours and names its schema version (SQLite: PRAGMA
-- application_id and user_version). One row.
CREATE TABLE effectful_durable (
    application_id bigint NOT NULL,
    schema_version integer NOT NULL,
    created_at     double precision NOT NULL
);

CREATE TABLE agents (
    agent_id   text COLLATE "C" PRIMARY KEY,
    version    bigint NOT NULL CHECK (version >= 1),
    created_at double precision NOT NULL,
    updated_at double precision NOT NULL
);

CREATE TABLE versions (
    agent_id     text COLLATE "C" NOT NULL REFERENCES agents (agent_id) ON DELETE CASCADE,
    version      bigint NOT NULL,
    kind         text NOT NULL
                 CHECK (kind IN ('turn', 'rollback', 'fork', 'compaction', 'delete')),
    conversation text COLLATE "C",
    template     text,
    state        text,
    added        bigint NOT NULL,
    removed      bigint NOT NULL,
    detail       text,
    committed_at double precision NOT NULL,
    -- The id of the turn's commit that wrote the row (effectful_durable_advance
    -- sets it for its transaction): after a connection broke while committing,
    -- it tells whether the commit landed. NULL for the other writes.
    commit_id    text DEFAULT nullif(current_setting('effectful_durable.commit', true), ''),
    PRIMARY KEY (agent_id, version)
);

CREATE TABLE messages (
    agent_id     text COLLATE "C" NOT NULL REFERENCES agents (agent_id) ON DELETE CASCADE,
    conversation text COLLATE "C" NOT NULL,
    position     double precision NOT NULL,
    added_in     bigint NOT NULL,
    removed_in   bigint CHECK (removed_in > added_in),
    message_id   text NOT NULL,
    role         text NOT NULL,
    body         text NOT NULL,
    PRIMARY KEY (agent_id, conversation, position, added_in)
);

CREATE UNIQUE INDEX messages_active ON messages (agent_id, conversation, position)
    WHERE removed_in IS NULL;

CREATE INDEX messages_removed ON messages (agent_id, removed_in)
    WHERE removed_in IS NOT NULL;

CREATE TABLE handoffs (
    agent_id     text COLLATE "C" NOT NULL,
    conversation text COLLATE "C" NOT NULL,
    base_version bigint NOT NULL,
    template     text NOT NULL,
    arguments    text NOT NULL,
    status       text NOT NULL CHECK (status IN ('running', 'failed')),
    error        text,
    interrupted  text,
    host         text NOT NULL,
    pid          bigint NOT NULL,
    started_at   double precision NOT NULL,
    ended_at     double precision,
    PRIMARY KEY (agent_id, conversation)
);

CREATE TABLE workflow_steps (
    workflow     text COLLATE "C" NOT NULL,
    step_key     text COLLATE "C" NOT NULL,
    number       bigint NOT NULL,
    agent_id     text COLLATE "C",
    conversation text COLLATE "C",
    template     text NOT NULL,
    arguments    text NOT NULL,
    status       text NOT NULL CHECK (status IN ('running', 'done', 'failed')),
    result       text,
    base_version bigint,
    version      bigint,
    started_at   double precision NOT NULL,
    finished_at  double precision,
    PRIMARY KEY (workflow, step_key)
);

CREATE UNIQUE INDEX workflow_steps_number ON workflow_steps (workflow, number);

CREATE INDEX workflow_steps_waiting ON workflow_steps (agent_id, template)
    WHERE status = 'running';

CREATE TABLE compactions (
    agent_id       text COLLATE "C" NOT NULL REFERENCES agents (agent_id) ON DELETE CASCADE,
    version        bigint NOT NULL,
    summary_id     text NOT NULL,
    first_position double precision NOT NULL,
    last_position  double precision NOT NULL,
    messages       bigint NOT NULL,
    summarizer     text NOT NULL,
    PRIMARY KEY (agent_id, version)
);

-- Full-text index of compacted messages (SQLite: the FTS5 table of that name).
-- words is the text under the 'english' configuration, which stems as SQLite's
-- porter tokenizer does but also drops English stop words ("the", "and"): a
-- query of stop words alone finds nothing here.
CREATE TABLE compacted_text (
    agent_id text COLLATE "C" NOT NULL,
    position double precision NOT NULL,
    version  bigint NOT NULL,
    text     text NOT NULL,
    words    tsvector NOT NULL
);

CREATE INDEX compacted_text_words ON compacted_text USING gin (words);
CREATE INDEX compacted_text_agent ON compacted_text (agent_id, version);

CREATE TABLE conversations (
    agent_id     text COLLATE "C" NOT NULL REFERENCES agents (agent_id) ON DELETE CASCADE,
    conversation text COLLATE "C" NOT NULL,
    added_in     bigint NOT NULL,
    removed_in   bigint CHECK (removed_in > added_in),
    created_at   double precision NOT NULL,
    PRIMARY KEY (agent_id, conversation, added_in)
);

CREATE UNIQUE INDEX conversations_active ON conversations (agent_id, conversation)
    WHERE removed_in IS NULL;

CREATE TABLE conversation_fields (
    agent_id     text COLLATE "C" NOT NULL REFERENCES agents (agent_id) ON DELETE CASCADE,
    conversation text COLLATE "C" NOT NULL,
    added_in     bigint NOT NULL,
    removed_in   bigint CHECK (removed_in > added_in),
    state        text NOT NULL,
    PRIMARY KEY (agent_id, conversation, added_in)
);

CREATE UNIQUE INDEX conversation_fields_active ON conversation_fields (agent_id, conversation)
    WHERE removed_in IS NULL;

CREATE TABLE retention (
    agent_id  text COLLATE "C" PRIMARY KEY REFERENCES agents (agent_id) ON DELETE CASCADE,
    kept_from bigint NOT NULL CHECK (kept_from >= 1),
    state     text,
    pruned_at double precision NOT NULL
);

CREATE TABLE memory (
    agent_id   text COLLATE "C" NOT NULL REFERENCES agents (agent_id) ON DELETE CASCADE,
    kind       text NOT NULL CHECK (kind IN ('key', 'note')),
    key        text COLLATE "C" NOT NULL,
    added_in   bigint NOT NULL,
    removed_in bigint CHECK (removed_in > added_in),
    value      text NOT NULL,
    PRIMARY KEY (agent_id, kind, key, added_in)
);

CREATE UNIQUE INDEX memory_active ON memory (agent_id, kind, key)
    WHERE removed_in IS NULL;

-- == SQL workspace and alarms (schema 4) ==

-- The log of each agent's SQL tables, as in schema.sql. The tables themselves
-- live in SQLite files in each machine's cache (workspace_cache.py), built from
-- this log and checked against versions.committed_at at each use.
CREATE TABLE workspace_log (
    agent_id  text COLLATE "C" NOT NULL REFERENCES agents (agent_id) ON DELETE CASCADE,
    version   bigint NOT NULL,
    seq       bigint NOT NULL,
    ddl       text,
    changeset bytea,
    CHECK ((ddl IS NULL) <> (changeset IS NULL)),
    PRIMARY KEY (agent_id, version, seq)
);

CREATE TABLE alarms (
    alarm_id    text COLLATE "C" NOT NULL,
    created_in  bigint NOT NULL,
    agent_id    text COLLATE "C" NOT NULL,
    action      text NOT NULL,
    fire_at     double precision NOT NULL,
    due_at      double precision NOT NULL,
    every       double precision CHECK (every > 0),
    cron        text,
    timezone    text,
    status      text NOT NULL CHECK (status IN ('pending', 'dead', 'done', 'cancelled')),
    ended_in    bigint CHECK (ended_in >= created_in),
    attempts    bigint NOT NULL DEFAULT 0,
    deliveries  bigint NOT NULL DEFAULT 0,
    last_error  text,
    lease_owner text COLLATE "C",
    lease_token text,
    created_at  double precision NOT NULL,
    updated_at  double precision NOT NULL,
    kind        text NOT NULL DEFAULT 'alarm' CHECK (kind IN ('alarm', 'event', 'resume')),
    topic       text,
    PRIMARY KEY (alarm_id, created_in),
    CHECK ((ended_in IS NULL) = (status IN ('pending', 'dead')))
);

CREATE INDEX alarms_due ON alarms (due_at) WHERE status = 'pending';
CREATE UNIQUE INDEX alarms_open ON alarms (alarm_id) WHERE ended_in IS NULL;
CREATE INDEX alarms_agent ON alarms (agent_id, ended_in);
CREATE INDEX alarms_leased ON alarms (lease_owner) WHERE lease_owner IS NOT NULL;

CREATE TABLE runner_status (
    runner_id   text COLLATE "C" PRIMARY KEY,
    host        text NOT NULL,
    pid         bigint NOT NULL,
    state       text NOT NULL CHECK (state IN ('running', 'stopped')),
    started_at  double precision NOT NULL,
    reported_at double precision NOT NULL,
    report      text NOT NULL
);

-- == Events, resumptions and approvals (schema 5), as in schema.sql ==

CREATE TABLE approvals (
    approval_id       text COLLATE "C" PRIMARY KEY,
    agent_id          text COLLATE "C" NOT NULL REFERENCES agents (agent_id) ON DELETE CASCADE,
    conversation      text COLLATE "C" NOT NULL,
    suspended_in      bigint NOT NULL,
    ended_in          bigint CHECK (ended_in >= suspended_in),
    template          text NOT NULL,
    turn_arguments    text NOT NULL,
    workflow          text COLLATE "C",
    step_key          text COLLATE "C",
    tool              text NOT NULL,
    tool_call_id      text NOT NULL,
    arguments         text NOT NULL,
    parameters        text NOT NULL,
    reason            text,
    status            text NOT NULL
                      CHECK (status IN ('pending', 'approved', 'denied', 'cancelled')),
    asked_at          double precision NOT NULL,
    asked_by          text NOT NULL,
    decided_at        double precision,
    decided_by        text,
    note              text,
    decided_arguments text
);

CREATE INDEX approvals_open ON approvals (agent_id, conversation) WHERE ended_in IS NULL;
CREATE INDEX approvals_pending ON approvals (asked_at) WHERE status = 'pending';

-- Functions that save a turn round trips to the server (issue 25). A turn
-- starts with effectful_durable_start: the agent's advisory lock and, if it was
-- taken, the turn's handoff row (engine/seam.py's HANDOFF_INSERT: none when an
-- earlier handoff or a suspended turn is there), in one statement. Its value: -1
-- when another session holds the lock (nothing written, and no error for the
-- server's log), NULL when the lock was taken but no row written, else the
-- version the turn starts from. A turn's commit sends its statements with BEGIN
-- and COMMIT in one pipeline: effectful_durable_advance's error, when another
-- writer moved the agent, makes the server skip the rest; it also names the
-- commit (effectful_durable.commit, kept in versions.commit_id), so that a commit
-- whose answer was lost can be looked up. See engine/postgres/database.py.
CREATE FUNCTION effectful_durable_start(
    lock_key bigint, agent text, conv text, tmpl text, args text,
    host_name text, process bigint, started double precision, note text
) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    base bigint;
BEGIN
    IF NOT pg_try_advisory_lock(lock_key) THEN
        RETURN -1;
    END IF;
    INSERT INTO handoffs (agent_id, conversation, base_version, template, arguments,
        status, interrupted, host, pid, started_at)
    SELECT agent, conv, coalesce((SELECT a.version FROM agents AS a WHERE a.agent_id = agent), 0),
        tmpl, args, 'running', note, host_name, process, started
     WHERE NOT EXISTS (SELECT 1 FROM approvals AS p
                        WHERE p.agent_id = agent AND p.conversation = conv
                          AND p.ended_in IS NULL)
    ON CONFLICT (agent_id, conversation) DO NOTHING
    RETURNING handoffs.base_version INTO base;
    RETURN base;
END
$$;

CREATE FUNCTION effectful_durable_advance(
    agent text, base bigint, new_version bigint, now double precision, commit text
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    found_version bigint;
BEGIN
    IF base = 0 THEN
        INSERT INTO agents (agent_id, version, created_at, updated_at)
        VALUES (agent, new_version, now, now) ON CONFLICT (agent_id) DO NOTHING;
    ELSE
        UPDATE agents SET version = new_version, updated_at = now
         WHERE agent_id = agent AND version = base;
    END IF;
    IF NOT FOUND THEN
        SELECT a.version INTO found_version FROM agents AS a WHERE a.agent_id = agent;
        RAISE EXCEPTION USING ERRCODE = 'EDMVD', MESSAGE = agent,
            DETAIL = 'moved to version ' || coalesce(found_version, 0) || ' during this turn';
    END IF;
    PERFORM set_config('effectful_durable.commit', commit, true);
END
$$;

