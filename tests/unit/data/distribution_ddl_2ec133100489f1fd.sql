
CREATE SCHEMA IF NOT EXISTS airflow_repl;
CREATE TABLE IF NOT EXISTS airflow_repl.publications (
    name            text PRIMARY KEY,
    pg_publication  text NOT NULL,
    slot_name       text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS airflow_repl.articles (
    publication     text NOT NULL REFERENCES airflow_repl.publications ON DELETE CASCADE,
    name            text NOT NULL,
    definition      jsonb NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (publication, name)
);
CREATE TABLE IF NOT EXISTS airflow_repl.subscriptions (
    publication          text NOT NULL REFERENCES airflow_repl.publications ON DELETE CASCADE,
    subscriber           text NOT NULL,
    status               text NOT NULL DEFAULT 'pending'
                         CHECK (status IN ('pending', 'initializing', 'active', 'reinitialize', 'expired')),
    snapshot_id          text,
    start_xact_seqno     pg_lsn,
    delivered_xact_seqno pg_lsn,
    delivered_at         timestamptz,
    options              jsonb NOT NULL DEFAULT '{}',
    articles_hash        text,  -- the article definitions the subscriber was initialized with
    PRIMARY KEY (publication, subscriber)
);
ALTER TABLE airflow_repl.subscriptions ADD COLUMN IF NOT EXISTS articles_hash text;
CREATE TABLE IF NOT EXISTS airflow_repl.snapshots (
    publication     text NOT NULL,
    snapshot_id     text NOT NULL,
    folder          text NOT NULL,
    consistent_lsn  pg_lsn NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    manifest        jsonb NOT NULL,
    PRIMARY KEY (publication, snapshot_id)
);
CREATE TABLE IF NOT EXISTS airflow_repl.transactions (
    publication     text NOT NULL,
    xact_seqno      pg_lsn NOT NULL,
    xid             bigint NOT NULL,
    commit_time     timestamptz NOT NULL,
    end_lsn         pg_lsn NOT NULL,
    command_count   integer NOT NULL,
    article_rows    json NOT NULL DEFAULT '{}',  -- article -> rows the transaction changed (jsonb before, read alike)
    entry_time      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (publication, xact_seqno)
);
CREATE TABLE IF NOT EXISTS airflow_repl.commands (
    publication     text NOT NULL,
    xact_seqno      pg_lsn NOT NULL,
    command_id      integer NOT NULL,
    article         text NOT NULL,
    op              text NOT NULL CHECK (op IN ('I', 'U', 'D', 'T')),
    -- the command's JSON as the Log Reader wrote it: json, not jsonb, stores and returns the
    -- text as it is (a distribution database made by an earlier airflow-repl has jsonb here,
    -- which works the same, slower)
    data            json NOT NULL,
    PRIMARY KEY (publication, xact_seqno, command_id)
);
-- columns added after the first release of a table: keep older distribution databases current
ALTER TABLE airflow_repl.transactions ADD COLUMN IF NOT EXISTS article_rows json NOT NULL DEFAULT '{}';
-- the replication origin a transaction came from (a Queue Reader's: a subscriber's queued change)
ALTER TABLE airflow_repl.transactions ADD COLUMN IF NOT EXISTS origin text;
CREATE TABLE IF NOT EXISTS airflow_repl.logreader_state (
    publication     text PRIMARY KEY,
    read_xact_seqno pg_lsn,
    read_end_lsn    pg_lsn,
    updated_at      timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS airflow_repl.agent_history (
    run_id          bigserial PRIMARY KEY,
    agent           text NOT NULL,
    publication     text,
    subscriber      text,
    started_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at     timestamptz,
    status          text NOT NULL DEFAULT 'running',
    transactions    bigint NOT NULL DEFAULT 0,
    commands        bigint NOT NULL DEFAULT 0,
    rows_copied     bigint NOT NULL DEFAULT 0,
    message         text,
    details         jsonb
);
CREATE TABLE IF NOT EXISTS airflow_repl.errors (
    error_id        bigserial PRIMARY KEY,
    run_id          bigint REFERENCES airflow_repl.agent_history ON DELETE SET NULL,
    occurred_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    agent           text NOT NULL,
    publication     text,
    subscriber      text,
    xact_seqno      pg_lsn,
    command_id      integer,
    article         text,
    sqlstate        text,
    message         text NOT NULL,
    command         jsonb,
    skipped         boolean NOT NULL DEFAULT false  -- the transaction was skipped (SkipErrors)
);
ALTER TABLE airflow_repl.errors ADD COLUMN IF NOT EXISTS skipped boolean NOT NULL DEFAULT false;
-- 'reinitialize': the Queue Reader met a conflict under "sub reinit"; the next snapshot run initializes it
-- 'expired': not synchronized within the maximum retention (cleanup agent); reinitialize it
DO $do$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint WHERE conrelid = 'airflow_repl.subscriptions'::regclass
                   AND conname = 'subscriptions_status_check'
                   AND pg_catalog.pg_get_constraintdef(oid) LIKE '%expired%') THEN
        ALTER TABLE airflow_repl.subscriptions DROP CONSTRAINT IF EXISTS subscriptions_status_check;
        ALTER TABLE airflow_repl.subscriptions ADD CONSTRAINT subscriptions_status_check
            CHECK (status IN ('pending', 'initializing', 'active', 'reinitialize', 'expired'));
    END IF;
END
$do$;
-- conflicts the Queue Reader met applying queued subscriber transactions at the publisher
CREATE TABLE IF NOT EXISTS airflow_repl.conflicts (
    conflict_id     bigserial PRIMARY KEY,
    publication     text NOT NULL,
    subscriber      text NOT NULL,
    article         text NOT NULL,
    key             jsonb NOT NULL,
    kind            text NOT NULL,
    publisher_row   jsonb,
    subscriber_row  jsonb,
    policy          text NOT NULL,
    outcome         text NOT NULL,
    queued_xid      bigint NOT NULL,
    queue_id        bigint NOT NULL,  -- the row of the subscriber's queue (its command)
    detected_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (publication, subscriber, queued_xid, queue_id)
);
CREATE INDEX IF NOT EXISTS conflicts_detected ON airflow_repl.conflicts (detected_at);
-- ... and those the Distribution Agent met delivering the publisher's commands to a queued
-- subscriber (agent 'distribution': the publisher's transaction and command, no queued one)
ALTER TABLE airflow_repl.conflicts ADD COLUMN IF NOT EXISTS agent text NOT NULL DEFAULT 'queuereader';
ALTER TABLE airflow_repl.conflicts ADD COLUMN IF NOT EXISTS xact_seqno pg_lsn;
ALTER TABLE airflow_repl.conflicts ADD COLUMN IF NOT EXISTS command_id integer;
ALTER TABLE airflow_repl.conflicts ALTER COLUMN queued_xid DROP NOT NULL;
ALTER TABLE airflow_repl.conflicts ALTER COLUMN queue_id DROP NOT NULL;
CREATE UNIQUE INDEX IF NOT EXISTS conflicts_delivered
    ON airflow_repl.conflicts (publication, subscriber, xact_seqno, command_id) WHERE xact_seqno IS NOT NULL;
-- updatable subscriptions: the publication's options, the subscription's current update mode
-- (a failover subscription switches between 'failover' and 'queued failover') and when it was
-- last initialized
ALTER TABLE airflow_repl.publications ADD COLUMN IF NOT EXISTS allow_sync_tran boolean NOT NULL DEFAULT false;
ALTER TABLE airflow_repl.publications ADD COLUMN IF NOT EXISTS allow_queued_tran boolean NOT NULL DEFAULT false;
ALTER TABLE airflow_repl.publications ADD COLUMN IF NOT EXISTS conflict_policy text NOT NULL DEFAULT 'pub wins';
ALTER TABLE airflow_repl.subscriptions ADD COLUMN IF NOT EXISTS update_mode text NOT NULL DEFAULT 'read only';
ALTER TABLE airflow_repl.subscriptions ADD COLUMN IF NOT EXISTS initialized_at timestamptz;
-- schema changes (airflow-repl schema-change): a command 'S' in the transaction that made one,
-- which is flagged so that the Distribution Agent delivers it in a subscriber commit of its own
ALTER TABLE airflow_repl.transactions ADD COLUMN IF NOT EXISTS schema_change boolean NOT NULL DEFAULT false;
DO $do$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint WHERE conrelid = 'airflow_repl.commands'::regclass
                   AND conname = 'commands_op_check'
                   AND pg_catalog.pg_get_constraintdef(oid) LIKE '%''S''%') THEN
        ALTER TABLE airflow_repl.commands DROP CONSTRAINT IF EXISTS commands_op_check;
        ALTER TABLE airflow_repl.commands ADD CONSTRAINT commands_op_check CHECK (op IN ('I', 'U', 'D', 'T', 'S'));
    END IF;
END
$do$;
-- scripts that regenerate an article's custom procedures at a subscriber after a schema change
-- (SQL Server's sp_register_custom_scripting): kind 'sql' (a template) or 'python' (module:function)
CREATE TABLE IF NOT EXISTS airflow_repl.custom_scripts (
    publication     text NOT NULL,
    article         text NOT NULL,
    kind            text NOT NULL CHECK (kind IN ('sql', 'python')),
    body            text NOT NULL,
    registered_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (publication, article)
);
-- a paused subscription (airflow-repl pause, topology key paused): the Distribution Agent skips
-- it; its status keeps its meaning ('active' ...), so retention holds and expires it as any other
ALTER TABLE airflow_repl.subscriptions ADD COLUMN IF NOT EXISTS paused boolean NOT NULL DEFAULT false;
-- tracer tokens (SQL Server's MStracer_tokens / MStracer_history; statements in state.progress):
-- posted at the publisher, read by the Log Reader, arrived at each subscriber
CREATE TABLE IF NOT EXISTS airflow_repl.tracer_tokens (
    token_id        bigserial PRIMARY KEY,
    publication     text NOT NULL,
    posted_at       timestamptz NOT NULL,
    xact_seqno      pg_lsn,
    distributor_at  timestamptz
);
CREATE INDEX IF NOT EXISTS tracer_tokens_position ON airflow_repl.tracer_tokens (publication, xact_seqno);
CREATE TABLE IF NOT EXISTS airflow_repl.tracer_history (
    publication     text NOT NULL,
    token_id        bigint NOT NULL REFERENCES airflow_repl.tracer_tokens ON DELETE CASCADE,
    subscriber      text NOT NULL,
    subscriber_at   timestamptz NOT NULL,
    PRIMARY KEY (token_id, subscriber)
);
-- the cleanup agent (state/retention): every transaction up to cleaned_xact_seqno was cleaned up
CREATE TABLE IF NOT EXISTS airflow_repl.cleanup_state (
    publication        text PRIMARY KEY,
    cleaned_xact_seqno pg_lsn NOT NULL,
    updated_at         timestamptz NOT NULL DEFAULT now()
);
-- drops under way (airflow-repl drop): a row exists from the drop's first change to its last, so
-- a drop that stopped halfway is known, and finished by running it again
CREATE TABLE IF NOT EXISTS airflow_repl.drops (
    publication     text NOT NULL,
    kind            text NOT NULL CHECK (kind IN ('article', 'subscription', 'publication')),
    name            text NOT NULL,
    started_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (publication, kind, name)
);
