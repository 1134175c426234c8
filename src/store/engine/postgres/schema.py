"""PostgreSQL's schema versions: the DDL of a fresh database, and forward migrations.

The ``effectful_durable`` table marks a database as ours and names its schema
version (SQLite's ``PRAGMA application_id`` and ``user_version``). A fresh
database is created from ``schema.sql``; ``MIGRATIONS[n]`` upgrades one
at version ``n`` to ``n + 1``, and ``tests/store/test_postgres.py`` proves that
both paths end in the same schema. PostgreSQL's versions count on from 3, the
SQLite schema the backend first carried; never edit a released migration.
"""

from __future__ import annotations

import functools
from importlib import resources

#: The first schema version a PostgreSQL database had.
FIRST_VERSION = 3

# Schema 4 carries the SQL workspace's log and alarms (see schema.sql).
_V4 = """
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
    PRIMARY KEY (alarm_id, created_in),
    CHECK ((ended_in IS NULL) = (status IN ('pending', 'dead')))
);

CREATE INDEX alarms_due ON alarms (due_at) WHERE status = 'pending';
CREATE UNIQUE INDEX alarms_open ON alarms (alarm_id) WHERE ended_in IS NULL;
CREATE INDEX alarms_agent ON alarms (agent_id, ended_in);
CREATE INDEX alarms_leased ON alarms (lease_owner) WHERE lease_owner IS NOT NULL;

-- Runners LISTEN on effectful_durable_alarms (store/postgres_listen.py). A write
-- that leaves a pending alarm unleased makes it claimable at a new time: it was
-- scheduled, delivered with a next occurrence, released, retried, re-armed,
-- restored by a rollback or copied in. Each transaction that makes one notifies
-- the runners once (PostgreSQL folds equal notifications), naming the schema,
-- and only if it commits.
CREATE FUNCTION effectful_durable_alarm_due() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('effectful_durable_alarms', TG_TABLE_SCHEMA);
    RETURN NULL;
END
$$;

CREATE TRIGGER alarms_due AFTER INSERT OR UPDATE ON alarms
    FOR EACH ROW WHEN (NEW.status = 'pending' AND NEW.lease_token IS NULL)
    EXECUTE FUNCTION effectful_durable_alarm_due();

CREATE TABLE runner_status (
    runner_id   text COLLATE "C" PRIMARY KEY,
    host        text NOT NULL,
    pid         bigint NOT NULL,
    state       text NOT NULL CHECK (state IN ('running', 'stopped')),
    started_at  double precision NOT NULL,
    reported_at double precision NOT NULL,
    report      text NOT NULL
);
"""

# Schema 5 carries events and resumptions in the runners' queue, the approvals of
# suspended turns, and the index of workflow steps that wait for an event.
_V5 = """
ALTER TABLE alarms
    ADD COLUMN kind text NOT NULL DEFAULT 'alarm' CHECK (kind IN ('alarm', 'event', 'resume')),
    ADD COLUMN topic text;

CREATE INDEX workflow_steps_waiting ON workflow_steps (agent_id, template)
    WHERE status = 'running';

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
"""

# Schema 6 carries the functions that save a turn round trips (see schema.sql).
_V6 = """
-- Functions that save a turn round trips to the server (issue 25). A turn's
-- start sends effectful_durable_lock with its handoff row in one pipeline: the
-- lock's error, when another session holds the agent, makes the server skip the
-- insert. A turn's commit sends its statements with BEGIN and COMMIT in one
-- pipeline: effectful_durable_advance's error, when another writer moved the
-- agent, makes the server skip the rest. See engine/postgres/database.py.
CREATE FUNCTION effectful_durable_lock(key bigint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_try_advisory_lock(key) THEN
        -- No % placeholders here: the Store's connection doubles every % it sends.
        RAISE EXCEPTION USING ERRCODE = 'EDLCK',
            MESSAGE = 'advisory lock ' || key || ' is held by another session';
    END IF;
END
$$;

CREATE FUNCTION effectful_durable_advance(
    agent text, base bigint, new_version bigint, now double precision
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
END
$$;
"""

# Schema 7 starts a turn in one statement that never fails for a held lock: the
# lock's error filled the server's log, once for each turn that found its agent busy.
_V7 = """
DROP FUNCTION effectful_durable_lock(bigint);

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
"""

# Schema 8 gives each turn's commit an id of its own, kept in its versions' rows:
# when the connection breaks while committing, a new one tells whether it landed.
_V8 = """
ALTER TABLE versions ADD COLUMN commit_id text
    DEFAULT nullif(current_setting('effectful_durable.commit', true), '');

DROP FUNCTION effectful_durable_advance(text, bigint, bigint, double precision);

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
"""

# Schema 9 tells readers of every commit: LISTEN effectful_durable_commits (the page).
_V9 = """
-- Readers LISTEN on effectful_durable_commits (the page, engine/postgres/listen.py)
-- to hear of each commit without reading a table. A statement that changes an
-- agent (every turn, rollback, fork or deletion moves its agents row), an
-- approval, an alarm or event, a handoff marked failed or cleared, a journal
-- step or a runner's status notifies them; PostgreSQL folds the equal
-- notifications of one transaction into one, sent only if it commits. A turn's
-- start (a handoff row written) notifies nobody: it is on every turn's path.
CREATE FUNCTION effectful_durable_committed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('effectful_durable_commits', TG_TABLE_SCHEMA);
    RETURN NULL;
END
$$;

CREATE TRIGGER agents_committed AFTER INSERT OR UPDATE OR DELETE ON agents
    FOR EACH STATEMENT EXECUTE FUNCTION effectful_durable_committed();
CREATE TRIGGER approvals_committed AFTER INSERT OR UPDATE OR DELETE ON approvals
    FOR EACH STATEMENT EXECUTE FUNCTION effectful_durable_committed();
CREATE TRIGGER alarms_committed AFTER INSERT OR UPDATE OR DELETE ON alarms
    FOR EACH STATEMENT EXECUTE FUNCTION effectful_durable_committed();
CREATE TRIGGER handoffs_committed AFTER UPDATE OR DELETE ON handoffs
    FOR EACH STATEMENT EXECUTE FUNCTION effectful_durable_committed();
CREATE TRIGGER workflow_steps_committed AFTER INSERT OR UPDATE OR DELETE ON workflow_steps
    FOR EACH STATEMENT EXECUTE FUNCTION effectful_durable_committed();
CREATE TRIGGER runner_status_committed AFTER INSERT OR UPDATE OR DELETE ON runner_status
    FOR EACH STATEMENT EXECUTE FUNCTION effectful_durable_committed();
"""

# Schema 10 notifies nobody: a transaction that sent a NOTIFY takes, at its commit,
# a lock of the whole server (async.c, PreCommit_Notify), so that every notifying
# commit of every database on it waited for the one before. Readers poll instead
# (engine/postgres/watch.py, the runner's poll_interval).
_V10 = """
DROP TRIGGER alarms_due ON alarms;
DROP FUNCTION effectful_durable_alarm_due();
DROP TRIGGER agents_committed ON agents;
DROP TRIGGER approvals_committed ON approvals;
DROP TRIGGER alarms_committed ON alarms;
DROP TRIGGER handoffs_committed ON handoffs;
DROP TRIGGER workflow_steps_committed ON workflow_steps;
DROP TRIGGER runner_status_committed ON runner_status;
DROP FUNCTION effectful_durable_committed();
"""

# Schema 11 holds agents by lease rows renewed in the server's clock, not by
# session advisory locks, which lived as long as the server believed a session
# lived: about two hours for a host powered off or cut from the network (issue
# 43). The turn's functions change with it; a process of an earlier version
# calls the old ones and fails, rather than holding agents in a way the new ones
# do not see. Runners' status rows gain the place of their pid (engine/process.py).
_V11 = """
ALTER TABLE runner_status ADD COLUMN place text;

DROP FUNCTION effectful_durable_start(
    bigint, text, text, text, text, text, bigint, double precision, text);
DROP FUNCTION effectful_durable_advance(text, bigint, bigint, double precision, text);

-- Who holds each agent, one row per agent ever held: the hold's own token (NULL
-- once let go), who holds it (host and pid, and the place where that pid names a
-- process: the kernel's boot and PID namespace, engine/process.py), when it was
-- taken and last renewed, and for how long a renewal holds, all in the server's
-- clock. A hold is its holder's while renewed within ttl seconds, counted from
-- the server's start when that is later (nobody could renew while the server was
-- down); once it lapses anyone may take it, and a commit that names it is
-- refused. Nothing here lives in a server session: a holder whose host was
-- powered off or cut from the network loses its agents ttl seconds after its
-- last renewal, however long the server believes its session lives. Taking and
-- letting go update the row in place (no index changes: heap-only updates, room
-- for which the fillfactor keeps). See engine/postgres/holds.py.
CREATE TABLE agent_holds (
    agent_id   text COLLATE "C" PRIMARY KEY,
    token      text COLLATE "C",
    host       text NOT NULL,
    pid        bigint NOT NULL,
    place      text,
    taken_at   double precision NOT NULL,
    renewed_at double precision NOT NULL,
    ttl        double precision NOT NULL CHECK (ttl > 0)
) WITH (fillfactor = 70);

CREATE FUNCTION effectful_durable_lapsed(renewed double precision, lease double precision)
RETURNS boolean LANGUAGE sql VOLATILE AS $$
    SELECT greatest(renewed, extract(epoch FROM pg_postmaster_start_time())) + lease
           < extract(epoch FROM clock_timestamp())
$$;

-- Functions that save a turn round trips to the server. A turn starts with
-- effectful_durable_take: the agent's hold (a row let go or new, or one that is
-- this hold's own, lapsed, or among ours: holds of this process that may be left
-- in the table, or of a holder found gone) and,
-- if it was taken and with_handoff, the turn's handoff row (engine/seam.py's
-- HANDOFF_INSERT: none when an earlier handoff or a suspended turn is there), in
-- one statement that raises nothing when the agent is held (no error for the
-- server's log). Its values: whether the hold was taken; the version the turn
-- starts from, or NULL when no row was written; else who holds the agent.
CREATE FUNCTION effectful_durable_take(
    agent text, hold text, holder_host text, holder_pid bigint, holder_place text,
    lease double precision, ours text[], with_handoff boolean,
    conv text, tmpl text, args text, started double precision, note text,
    OUT taken boolean, OUT base bigint, OUT held_by text, OUT held_host text,
    OUT held_pid bigint, OUT held_place text
) LANGUAGE plpgsql AS $$
DECLARE
    clock double precision := extract(epoch FROM clock_timestamp());
BEGIN
    INSERT INTO agent_holds AS h (agent_id, token, host, pid, place, taken_at, renewed_at, ttl)
    VALUES (agent, hold, holder_host, holder_pid, holder_place, clock, clock, lease)
    ON CONFLICT (agent_id) DO UPDATE SET token = excluded.token, host = excluded.host,
        pid = excluded.pid, place = excluded.place, taken_at = excluded.taken_at,
        renewed_at = excluded.renewed_at, ttl = excluded.ttl
     WHERE h.token IS NULL OR h.token = hold OR h.token = ANY(ours)
        OR effectful_durable_lapsed(h.renewed_at, h.ttl);
    taken := FOUND;
    IF NOT taken THEN
        SELECT h.token, h.host, h.pid, h.place INTO held_by, held_host, held_pid, held_place
          FROM agent_holds AS h WHERE h.agent_id = agent;
        RETURN;
    END IF;
    IF with_handoff THEN
        INSERT INTO handoffs (agent_id, conversation, base_version, template, arguments,
            status, interrupted, host, pid, started_at)
        SELECT agent, conv,
            coalesce((SELECT a.version FROM agents AS a WHERE a.agent_id = agent), 0),
            tmpl, args, 'running', note, holder_host, holder_pid, started
         WHERE NOT EXISTS (SELECT 1 FROM approvals AS p
                            WHERE p.agent_id = agent AND p.conversation = conv
                              AND p.ended_in IS NULL)
        ON CONFLICT (agent_id, conversation) DO NOTHING
        RETURNING handoffs.base_version INTO base;
    END IF;
END
$$;

-- The fence of every write made under a hold: it raises (SQLSTATE EDLPS, the
-- agent's id as message, what happened as detail) unless the agent's hold is
-- still the token's and has not lapsed, and keeps the row from being taken until
-- the transaction ends (FOR KEY SHARE: a taker's upsert waits; the holder's own
-- renewal does not).
CREATE FUNCTION effectful_durable_held(agent text, hold text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    -- No % here (no %ROWTYPE): the Store's connection doubles every % it sends.
    holder text;
    holder_host text;
    holder_pid bigint;
    taken double precision;
    renewed double precision;
    lease double precision;
    clock double precision := extract(epoch FROM clock_timestamp());
BEGIN
    SELECT h.token, h.host, h.pid, h.taken_at, h.renewed_at, h.ttl
      INTO holder, holder_host, holder_pid, taken, renewed, lease
      FROM agent_holds AS h WHERE h.agent_id = agent FOR KEY SHARE;
    IF NOT FOUND OR holder IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'EDLPS', MESSAGE = agent,
            DETAIL = 'no process holds it now: it was taken and let go since';
    ELSIF holder <> hold THEN
        RAISE EXCEPTION USING ERRCODE = 'EDLPS', MESSAGE = agent,
            DETAIL = 'process ' || holder_pid || ' on ' || holder_host || ' took it '
                || round((clock - taken)::numeric, 1) || ' s ago';
    ELSIF effectful_durable_lapsed(renewed, lease) THEN
        RAISE EXCEPTION USING ERRCODE = 'EDLPS', MESSAGE = agent,
            DETAIL = 'it was last renewed ' || round((clock - renewed)::numeric, 1)
                || ' s ago, and a hold lapses ' || lease || ' s after its last renewal';
    END IF;
END
$$;

-- A turn's commit sends its statements with BEGIN and COMMIT in one pipeline:
-- effectful_durable_advance's error, when the turn's hold is no longer its own
-- (EDLPS, above) or another writer moved the agent (EDMVD), makes the server skip
-- the rest; it also names the commit (effectful_durable.commit, kept in
-- versions.commit_id), so that a commit whose answer was lost can be looked up.
-- A write made without a hold (hold NULL) is fenced by the version alone. See
-- engine/postgres/database.py.
CREATE FUNCTION effectful_durable_advance(
    agent text, base bigint, new_version bigint, now double precision, commit text, hold text
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    found_version bigint;
BEGIN
    IF hold IS NOT NULL THEN
        PERFORM effectful_durable_held(agent, hold);
    END IF;
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
"""

# Schema 12: a hold changes hands only once the writes made under it are over
# (issue 49). Each write under a hold takes the hold's transaction-level lock
# shared, and a take takes it alone, ending the sessions of writes under a hold
# that lapsed; the fence bounds the rest of its transaction by the lease.
_V12 = """
DROP FUNCTION effectful_durable_take(
    text, text, text, bigint, text, double precision, text[], boolean,
    text, text, text, double precision, text);
DROP FUNCTION effectful_durable_held(text, text);

-- When a hold lapses: ttl seconds after its last renewal, counted from the
-- server's start when that is later (nobody could renew while the server was
-- down; a crash restart, which keeps the start time, and a promoted standby,
-- which has its own, give no such grace: docs' backends page).
CREATE FUNCTION effectful_durable_lapses_at(renewed double precision, lease double precision)
RETURNS double precision LANGUAGE sql STABLE AS $$
    SELECT greatest(renewed, extract(epoch FROM pg_postmaster_start_time())) + lease
$$;

CREATE OR REPLACE FUNCTION effectful_durable_lapsed(
    renewed double precision, lease double precision
) RETURNS boolean LANGUAGE sql VOLATILE AS $$
    SELECT effectful_durable_lapses_at(renewed, lease) <= extract(epoch FROM clock_timestamp())
$$;

-- The transaction-level advisory lock of an agent's hold: each write under the
-- hold takes it shared (effectful_durable_held) until its transaction ends, and
-- a take takes it alone, so that no hold changes hands while a write made under
-- it is still open.
CREATE FUNCTION effectful_durable_hold_key(agent text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hashtextextended('effectful-durable hold ' || agent, 0)
$$;

-- The sessions whose transactions hold the hold's lock of effectful_durable_hold_key
-- ``key`` shared: writes made under a hold, open (pg_locks shows a bigint key's
-- halves as classid and objid).
CREATE FUNCTION effectful_durable_writers(key bigint) RETURNS SETOF integer
LANGUAGE sql STABLE AS $$
    SELECT l.pid FROM pg_locks AS l
     WHERE l.locktype = 'advisory' AND l.granted AND l.mode = 'ShareLock'
       AND l.database = (SELECT d.oid FROM pg_database AS d
                          WHERE d.datname = current_database())
       AND l.classid = ((key >> 32) & 4294967295)::oid
       AND l.objid = (key & 4294967295)::oid AND l.objsubid = 1
       AND l.pid <> pg_backend_pid()
$$;

-- Functions that save a turn round trips to the server. A turn starts with
-- effectful_durable_take: the agent's hold (a row let go or new, or one that is
-- this hold's own, lapsed, or among ours: holds of this process that may be left
-- in the table, or of a holder found gone) and,
-- if it was taken and with_handoff, the turn's handoff row (engine/seam.py's
-- HANDOFF_INSERT: none when an earlier handoff or a suspended turn is there), in
-- one statement that raises nothing when the agent is held (no error for the
-- server's log). Its values: whether the hold was taken; the version the turn
-- starts from, or NULL when no row was written; else who holds the agent.
--
-- A hold changes hands only under the hold's lock, taken alone: a write made
-- under the hold before is over first. Such a write still open when its hold is
-- free, lapsed or ours can never commit (its last fence, just before COMMIT,
-- would refuse it), and it may be a process stopped or cut off in the middle of
-- it, which no server timeout ends (a pipeline half sent waits with none): its
-- session is ended, where this role may (its own role's sessions, or with
-- pg_signal_backend), and waited for up to lock_wait seconds otherwise (then
-- the take is refused, and the writers' sessions tell why: effectful_durable_writers).
CREATE FUNCTION effectful_durable_take(
    agent text, hold text, holder_host text, holder_pid bigint, holder_place text,
    lease double precision, ours text[], with_handoff boolean,
    conv text, tmpl text, args text, started double precision, note text,
    lock_wait double precision,
    OUT taken boolean, OUT base bigint, OUT held_by text, OUT held_host text,
    OUT held_pid bigint, OUT held_place text
) LANGUAGE plpgsql AS $$
DECLARE
    clock double precision := extract(epoch FROM clock_timestamp());
    key bigint := effectful_durable_hold_key(agent);
    renewed double precision;
    ttl double precision;
    writer integer;
    busy text;
BEGIN
    IF NOT pg_try_advisory_xact_lock(key) THEN
        -- A write under a hold of the agent is open, or another take is under way.
        SELECT h.token, h.host, h.pid, h.place, h.renewed_at, h.ttl
          INTO held_by, held_host, held_pid, held_place, renewed, ttl
          FROM agent_holds AS h WHERE h.agent_id = agent;
        IF held_by IS NOT NULL AND held_by <> hold AND NOT held_by = ANY(ours)
           AND NOT effectful_durable_lapsed(renewed, ttl) THEN
            taken := false;
            RETURN;
        END IF;
        FOR writer IN SELECT effectful_durable_writers(key) LOOP
            BEGIN
                PERFORM pg_terminate_backend(writer, 1000);
            EXCEPTION WHEN insufficient_privilege THEN
                NULL;  -- another role's session, and no pg_signal_backend: wait for it
            END;
        END LOOP;
        busy := current_setting('lock_timeout');
        PERFORM set_config('lock_timeout', greatest(1, ceil(lock_wait * 1000))::bigint::text,
                           true);
        BEGIN
            PERFORM pg_advisory_xact_lock(key);
        EXCEPTION WHEN lock_not_available THEN
            taken := false;  -- the holder read above, and the writers, say who
            RETURN;
        END;
        PERFORM set_config('lock_timeout', busy, true);
    END IF;
    INSERT INTO agent_holds AS h (agent_id, token, host, pid, place, taken_at, renewed_at, ttl)
    VALUES (agent, hold, holder_host, holder_pid, holder_place, clock, clock, lease)
    ON CONFLICT (agent_id) DO UPDATE SET token = excluded.token, host = excluded.host,
        pid = excluded.pid, place = excluded.place, taken_at = excluded.taken_at,
        renewed_at = excluded.renewed_at, ttl = excluded.ttl
     WHERE h.token IS NULL OR h.token = hold OR h.token = ANY(ours)
        OR effectful_durable_lapsed(h.renewed_at, h.ttl);
    taken := FOUND;
    IF NOT taken THEN
        SELECT h.token, h.host, h.pid, h.place INTO held_by, held_host, held_pid, held_place
          FROM agent_holds AS h WHERE h.agent_id = agent;
        RETURN;
    END IF;
    held_by := NULL;
    held_host := NULL;
    held_pid := NULL;
    held_place := NULL;
    IF with_handoff THEN
        INSERT INTO handoffs (agent_id, conversation, base_version, template, arguments,
            status, interrupted, host, pid, started_at)
        SELECT agent, conv,
            coalesce((SELECT a.version FROM agents AS a WHERE a.agent_id = agent), 0),
            tmpl, args, 'running', note, holder_host, holder_pid, started
         WHERE NOT EXISTS (SELECT 1 FROM approvals AS p
                            WHERE p.agent_id = agent AND p.conversation = conv
                              AND p.ended_in IS NULL)
        ON CONFLICT (agent_id, conversation) DO NOTHING
        RETURNING handoffs.base_version INTO base;
    END IF;
END
$$;

-- The fence of every write made under a hold, at its start and again just
-- before its COMMIT (with bound false: that one is sent with the COMMIT): it
-- raises (SQLSTATE EDLPS, the agent's id as message, what happened as detail)
-- unless the agent's hold is still the token's and has not
-- lapsed, and holds the hold's lock shared until the transaction ends, so that
-- no take passes it (a take waits, or ends the transaction once the hold
-- lapsed). It also bounds what is left of the transaction on the server's side,
-- whatever the session's settings: each statement, and each wait for the
-- client, to half of what is left of the lease (never longer than the session
-- already allows), so that a writer stopped or cut off in the middle of it
-- leaves no locks behind once its hold lapses.
CREATE FUNCTION effectful_durable_held(agent text, hold text, bound boolean DEFAULT true)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    -- No % here (no %ROWTYPE): the Store's connection doubles every % it sends.
    holder text;
    holder_host text;
    holder_pid bigint;
    taken double precision;
    lapses double precision;
    renewed double precision;
    lease double precision;
    clock double precision;
    left_ms bigint;
    setting text;
    now_ms double precision;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(effectful_durable_hold_key(agent));
    clock := extract(epoch FROM clock_timestamp());
    SELECT h.token, h.host, h.pid, h.taken_at, h.renewed_at, h.ttl,
           effectful_durable_lapses_at(h.renewed_at, h.ttl)
      INTO holder, holder_host, holder_pid, taken, renewed, lease, lapses
      FROM agent_holds AS h WHERE h.agent_id = agent;
    IF NOT FOUND OR holder IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'EDLPS', MESSAGE = agent,
            DETAIL = 'no process holds it now: it was taken and let go since';
    ELSIF holder <> hold THEN
        RAISE EXCEPTION USING ERRCODE = 'EDLPS', MESSAGE = agent,
            DETAIL = 'process ' || holder_pid || ' on ' || holder_host || ' took it '
                || round((clock - taken)::numeric, 1) || ' s ago';
    ELSIF lapses <= clock THEN
        RAISE EXCEPTION USING ERRCODE = 'EDLPS', MESSAGE = agent,
            DETAIL = 'it was last renewed ' || round((clock - renewed)::numeric, 1)
                || ' s ago, and a hold lapses ' || lease || ' s after its last renewal';
    END IF;
    IF NOT bound THEN
        RETURN;
    END IF;
    left_ms := greatest(1, floor((lapses - clock) * 500))::bigint;
    FOREACH setting IN ARRAY ARRAY['statement_timeout', 'idle_in_transaction_session_timeout']
    LOOP
        now_ms := extract(epoch FROM current_setting(setting)::interval) * 1000;
        IF now_ms = 0 OR now_ms > left_ms THEN
            PERFORM set_config(setting, left_ms::text, true);
        END IF;
    END LOOP;
END
$$;

-- A turn's commit sends its statements with BEGIN and COMMIT in one pipeline:
-- effectful_durable_advance's error, when the turn's hold is no longer its own
-- (EDLPS, above) or another writer moved the agent (EDMVD), makes the server skip
-- the rest; it also names the commit (effectful_durable.commit, kept in
-- versions.commit_id), so that a commit whose answer was lost can be looked up.
-- A write made without a hold (hold NULL) is fenced by the version alone. The
-- hold's fence here bounds nothing: the statements of a pipeline are in the
-- server's hands already (a write of several round trips is fenced on its own
-- first). See engine/postgres/database.py.
CREATE OR REPLACE FUNCTION effectful_durable_advance(
    agent text, base bigint, new_version bigint, now double precision, commit text, hold text
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    found_version bigint;
BEGIN
    IF hold IS NOT NULL THEN
        PERFORM effectful_durable_held(agent, hold, false);
    END IF;
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
    IF hold IS NOT NULL THEN
        PERFORM set_config('effectful_durable.hold', hold, true);  -- agents_fenced
    END IF;
END
$$;

-- The last fence of a turn's commit, in its COMMIT itself: effectful_durable_advance
-- names the hold (effectful_durable.hold, for the transaction), and this check,
-- deferred to the commit, refuses it there unless the hold is still the token's
-- and has not lapsed (no statement of its own: a turn costs no more round trips
-- or statements for it). Other writes under a hold send their last fence with
-- their COMMIT instead.
CREATE FUNCTION effectful_durable_fenced() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    hold text := current_setting('effectful_durable.hold', true);
BEGIN
    IF hold <> '' THEN
        PERFORM effectful_durable_held(NEW.agent_id, hold, false);
    END IF;
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER agents_fenced AFTER INSERT OR UPDATE ON agents
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION effectful_durable_fenced();
"""

# Schema 13: subjects and erasures (issue 52).
_V13 = """
-- == Privacy: subjects and erasures (schema 13) ==

-- Who an agent's content is about: the subject (a person, a tenant) the
-- application names for the agent (conversation '') or for one of its
-- conversations. A label, not versioned: a fork takes its source's, and it goes
-- with its agent. Store.erase(subject=...) erases what carries it.
CREATE TABLE subjects (
    agent_id     text COLLATE "C" NOT NULL,
    conversation text COLLATE "C" NOT NULL,
    subject      text COLLATE "C" NOT NULL,
    set_at       double precision NOT NULL,
    PRIMARY KEY (agent_id, conversation)
);
CREATE INDEX subjects_subject ON subjects (subject);

-- The receipt of each erasure (Store.erase): what was erased, counted by kind,
-- and when, with its digest; none of the erased content, nor the subject's
-- name (only its digest).
CREATE TABLE erasures (
    erasure_id text COLLATE "C" PRIMARY KEY,
    erased_at  double precision NOT NULL,
    receipt    text NOT NULL,
    digest     text NOT NULL
);
"""

_V14 = """
-- == Encryption at rest (schema 14) ==

-- Whether the content of the rows is sealed (sealing.py), and the check value
-- that proves a Store's keys are the ones: one row once keys were first given;
-- none for a database without encryption. complete: every row is sealed.
CREATE TABLE encryption (
    id          integer PRIMARY KEY CHECK (id = 1),
    check_value text NOT NULL,
    complete    integer NOT NULL,
    since       double precision NOT NULL
);

-- A sealed copy of a conversation's active messages at one version, for loading
-- a long sealed history in one piece (snapshots.py): only ever a copy, the
-- message rows stay the truth.
CREATE TABLE history_snapshots (
    agent_id     text COLLATE "C" NOT NULL REFERENCES agents (agent_id) ON DELETE CASCADE,
    conversation text COLLATE "C" NOT NULL,
    version      bigint NOT NULL,
    messages     bytea NOT NULL,
    PRIMARY KEY (agent_id, conversation)
);
"""

#: ``MIGRATIONS[n]`` upgrades a database at schema ``n`` to ``n + 1``.
MIGRATIONS: dict[int, str] = {
    3: _V4, 4: _V5, 5: _V6, 6: _V7, 7: _V8, 8: _V9, 9: _V10, 10: _V11, 11: _V12, 12: _V13,
    13: _V14,
}  # fmt: skip

#: The schema version this library writes on PostgreSQL.
SCHEMA_VERSION = FIRST_VERSION + len(MIGRATIONS)


@functools.cache
def schema_sql() -> str:
    """The DDL of the current schema, as shipped in ``schema.sql``."""
    return resources.files(__package__).joinpath("schema.sql").read_text("utf-8")
