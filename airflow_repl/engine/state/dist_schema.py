"""The distribution database's schema as versioned migrations: :data:`MIGRATIONS` in order,
each recorded in ``airflow_repl.schema_version`` once applied (:func:`ensure_schema`), and what
every statement on the schema asks first (is it there, which database it is).

A database reached the highest version recorded there.  One made before versions were recorded
(no ``schema_version`` table) is recognised by the comment ``ensure_schema`` left on the schema,
the digest of the DDL it ran (:data:`DIGEST_MARKS`), which names the migrations that DDL was;
any other (an earlier release's, or none) starts from version 0, and migrations 1-10, written to
be idempotent, bring it up to date as that release's DDL did.  Later migrations run exactly once,
in the transaction that records them: a new change to the schema is a new migration at the end of
the list, never an edit of one already released."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import TupleRow

from airflow_repl.engine.errors import NotInitialized, TopologyError
from airflow_repl.engine.postgres import advisory_locks

SCHEMA = "airflow_repl"


@dataclass(frozen=True)
class Migration:
    """One step of the distribution schema: the statements that bring version ``version`` - 1
    to ``version``."""

    version: int
    name: str
    sql: str


#: The distribution schema's migrations, versions 1, 2, ... in order (:func:`check_ordered`).
MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "the first tables: publications and articles, subscriptions, snapshots, transactions and commands, the Log Reader's position, agent history and errors",
        """
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
""",
    ),
    Migration(
        2,
        "the subscription status 'expired'",
        """-- 'reinitialize': the Queue Reader met a conflict under "sub reinit"; the next snapshot run initializes it
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
""",
    ),
    Migration(
        3,
        "the Queue Reader's conflicts",
        """-- conflicts the Queue Reader met applying queued subscriber transactions at the publisher
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
""",
    ),
    Migration(
        4,
        "the Distribution Agent's conflicts at a queued subscriber",
        """-- ... and those the Distribution Agent met delivering the publisher's commands to a queued
-- subscriber (agent 'distribution': the publisher's transaction and command, no queued one)
ALTER TABLE airflow_repl.conflicts ADD COLUMN IF NOT EXISTS agent text NOT NULL DEFAULT 'queuereader';
ALTER TABLE airflow_repl.conflicts ADD COLUMN IF NOT EXISTS xact_seqno pg_lsn;
ALTER TABLE airflow_repl.conflicts ADD COLUMN IF NOT EXISTS command_id integer;
ALTER TABLE airflow_repl.conflicts ALTER COLUMN queued_xid DROP NOT NULL;
ALTER TABLE airflow_repl.conflicts ALTER COLUMN queue_id DROP NOT NULL;
CREATE UNIQUE INDEX IF NOT EXISTS conflicts_delivered
    ON airflow_repl.conflicts (publication, subscriber, xact_seqno, command_id) WHERE xact_seqno IS NOT NULL;
""",
    ),
    Migration(
        5,
        "updatable subscriptions: publication options, update mode",
        """-- updatable subscriptions: the publication's options, the subscription's current update mode
-- (a failover subscription switches between 'failover' and 'queued failover') and when it was
-- last initialized
ALTER TABLE airflow_repl.publications ADD COLUMN IF NOT EXISTS allow_sync_tran boolean NOT NULL DEFAULT false;
ALTER TABLE airflow_repl.publications ADD COLUMN IF NOT EXISTS allow_queued_tran boolean NOT NULL DEFAULT false;
ALTER TABLE airflow_repl.publications ADD COLUMN IF NOT EXISTS conflict_policy text NOT NULL DEFAULT 'pub wins';
ALTER TABLE airflow_repl.subscriptions ADD COLUMN IF NOT EXISTS update_mode text NOT NULL DEFAULT 'read only';
ALTER TABLE airflow_repl.subscriptions ADD COLUMN IF NOT EXISTS initialized_at timestamptz;
""",
    ),
    Migration(
        6,
        "schema changes: the schema-change flag and command, custom scripts",
        """-- schema changes (airflow-repl schema-change): a command 'S' in the transaction that made one,
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
""",
    ),
    Migration(
        7,
        "tracer tokens",
        """-- tracer tokens (SQL Server's MStracer_tokens / MStracer_history; statements in state.progress):
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
""",
    ),
    Migration(
        8,
        "the cleanup agent's position",
        """-- the cleanup agent (state/retention): every transaction up to cleaned_xact_seqno was cleaned up
CREATE TABLE IF NOT EXISTS airflow_repl.cleanup_state (
    publication        text PRIMARY KEY,
    cleaned_xact_seqno pg_lsn NOT NULL,
    updated_at         timestamptz NOT NULL DEFAULT now()
);
""",
    ),
    Migration(
        9,
        "paused subscriptions",
        """-- a paused subscription (airflow-repl pause, topology key paused): the Distribution Agent skips
-- it; its status keeps its meaning ('active' ...), so retention holds and expires it as any other
ALTER TABLE airflow_repl.subscriptions ADD COLUMN IF NOT EXISTS paused boolean NOT NULL DEFAULT false;
""",
    ),
    Migration(
        10,
        "drops under way",
        """-- drops under way (airflow-repl drop): a row exists from the drop's first change to its last, so
-- a drop that stopped halfway is known, and finished by running it again
CREATE TABLE IF NOT EXISTS airflow_repl.drops (
    publication     text NOT NULL,
    kind            text NOT NULL CHECK (kind IN ('article', 'subscription', 'publication')),
    name            text NOT NULL,
    started_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (publication, kind, name)
);
""",
    ),
    Migration(
        11,
        "the schema's version recorded in a table of its own (no longer its comment's digest)",
        """
CREATE TABLE IF NOT EXISTS airflow_repl.schema_version (
    version         integer PRIMARY KEY,
    name            text NOT NULL,
    applied_at      timestamptz NOT NULL DEFAULT now()
);
COMMENT ON SCHEMA airflow_repl IS 'airflow-repl distribution schema (its version: airflow_repl.schema_version)';
""",
    ),
    Migration(
        12,
        "the articles each subscription holds, and the hand-off of each article copied on its own",
        """-- the articles each subscription holds (dist_subscription_articles): 'active' once copied (with the
-- subscription's snapshot, or on its own), 'copying' while a copy of its own is under way; an article of
-- the publication without a row is not copied yet.  handoff_xact_seqno: the article's commands at or
-- before it are in its copy (NULL: copied with the subscription's snapshot)
CREATE TABLE IF NOT EXISTS airflow_repl.subscription_articles (
    publication         text NOT NULL,
    subscriber          text NOT NULL,
    article             text NOT NULL,
    status              text NOT NULL CHECK (status IN ('copying', 'active')),
    handoff_xact_seqno  pg_lsn,
    snapshot_id         text,
    rows_copied         bigint,
    updated_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (publication, subscriber, article),
    FOREIGN KEY (publication, subscriber) REFERENCES airflow_repl.subscriptions ON DELETE CASCADE
);
INSERT INTO airflow_repl.subscription_articles (publication, subscriber, article, status)
SELECT s.publication, s.subscriber, a.name, 'active'
FROM airflow_repl.subscriptions s JOIN airflow_repl.articles a ON a.publication = s.publication
WHERE s.status = 'active'
ON CONFLICT DO NOTHING;
""",
    ),
)

#: The comments :func:`ensure_schema` left on the schema before versions were recorded (the
#: digest of the DDL it ran) -> the version a database so marked has: migrations 1-8's
#: statements together, and those with migration 9's inserted before the tracer tokens' and 10's
#: at the end.
DIGEST_MARKS = {
    "airflow-repl distribution schema c65c0fe6d55c40f8": 8,
    "airflow-repl distribution schema 2ec133100489f1fd": 10,
}


def check_ordered(migrations: tuple[Migration, ...]) -> None:
    """The migrations are numbered 1, 2, ... in order, with no gap and no repeat (a bug
    otherwise: ValueError)."""
    versions = [m.version for m in migrations]
    if versions != list(range(1, len(migrations) + 1)):
        raise ValueError(f"the distribution schema's migrations are not numbered 1, 2, ... in order: {versions}")


def pending(reached: int, migrations: tuple[Migration, ...], dbname: str) -> tuple[Migration, ...]:
    """The migrations a database at version ``reached`` still needs, in order; a database newer
    than the last of ``migrations`` (made by a later airflow-repl) is refused (TopologyError)."""
    check_ordered(migrations)
    latest = len(migrations)
    if reached > latest:
        raise TopologyError(
            f"the distribution database {dbname!r} has schema version {reached}, newer than this airflow-repl "
            f"knows (up to {latest}): run the airflow-repl release that upgraded it, or a later one"
        )
    return migrations[reached:]


def version_before_records(comment: str | None) -> int:
    """The version of a distribution schema made before versions were recorded, from the
    comment on its schema (:data:`DIGEST_MARKS`); 0 for an earlier release's, or no schema."""
    return DIGEST_MARKS.get(comment or "", 0)


def reached_version(conn: psycopg.Connection[Any]) -> int:
    """The version the distribution schema has reached (0: no schema, or an earlier release's
    that recorded none)."""
    recorded, comment = one_row(
        conn.execute(
            "SELECT to_regclass('airflow_repl.schema_version') IS NOT NULL, "
            "(SELECT pg_catalog.obj_description(oid, 'pg_namespace') FROM pg_catalog.pg_namespace "
            "WHERE nspname = 'airflow_repl')"
        )
    )
    if not recorded:
        return version_before_records(comment)
    return int(one_row(conn.execute("SELECT coalesce(max(version), 0) FROM airflow_repl.schema_version"))[0])


def ensure_schema(conn: psycopg.Connection[Any]) -> None:
    """Create the distribution schema where it is missing, or bring it to the last version of
    :data:`MIGRATIONS`, recording each migration applied; a current schema runs nothing.

    The check reads only ``schema_version``: agents and commands that start next to running
    agents (the Queue Reader, ``set-update-mode``, ``register-script``) take no lock those
    agents' transactions would wait for, or deadlock with, unless the schema needs migrating.
    Migrations run in one transaction under an advisory lock, after reading the version again:
    of two agents starting together, the second finds the first's work done."""
    with conn.transaction():
        current = not pending(reached_version(conn), MIGRATIONS, conn.info.dbname)
    if current:
        return
    with conn.transaction():
        advisory_locks.lock_distribution_schema(conn)
        steps = pending(reached_version(conn), MIGRATIONS, conn.info.dbname)
        for migration in steps:
            conn.execute(migration.sql)
        for migration in steps:
            conn.execute(
                "INSERT INTO airflow_repl.schema_version (version, name) VALUES (%s, %s)",
                (migration.version, migration.name),
            )


def check_encoding(conn: psycopg.Connection) -> None:
    """Commands hold replicated values as JSON, which a database in another encoding
    than UTF8 cannot store for characters outside its character set: refuse such a
    distribution database up front, naming it and the fix."""
    dbname, encoding = one_row(
        conn.execute(
            "SELECT current_database(), pg_catalog.pg_encoding_to_char(encoding) "
            "FROM pg_catalog.pg_database WHERE datname = current_database()"
        )
    )
    conn.rollback()
    if encoding != "UTF8":
        raise TopologyError(
            f"the distribution database {dbname!r} uses encoding {encoding}, which cannot hold every replicated "
            f"character: create it with ENCODING 'UTF8' (CREATE DATABASE ... ENCODING 'UTF8' TEMPLATE "
            f"template0) and point the topology's distributor at it"
        )


def one_row(cur: psycopg.Cursor[TupleRow]) -> TupleRow:
    """The row of a statement that always returns one."""
    row = cur.fetchone()
    if row is None:
        raise psycopg.ProgrammingError("the statement returned no row")
    return row


def deployed(conn: psycopg.Connection[Any], table: str) -> bool:
    """Does the distribution database have the table ``airflow_repl.<table>`` yet?"""
    return bool(one_row(conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{SCHEMA}.{table}",)))[0])


def require_deployed(conn: psycopg.Connection[Any]) -> None:
    """The distribution database has the ``airflow_repl`` tables (else NotInitialized, naming the fix)."""
    if not deployed(conn, "agent_history"):
        raise NotInitialized(
            f"the distribution database {conn.info.dbname!r} has no {SCHEMA} tables yet: "
            f"run 'airflow-repl apply' (or the Snapshot Agent) first"
        )
    conn.commit()
