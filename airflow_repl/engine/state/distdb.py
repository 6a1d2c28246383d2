"""The distribution database: topology metadata, replicated transactions and commands, agent
history and errors.  Its schema is created idempotently by :func:`ensure_schema`.

The subscribers' own ``airflow_repl`` tables are in
:mod:`~airflow_repl.engine.state.subscriber_state`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Generator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
import psycopg
from psycopg import sql
from psycopg.adapt import Buffer, Loader
from psycopg.rows import TupleRow
from psycopg.types.json import Jsonb

from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.errors import NotInitialized, TopologyError
from airflow_repl.engine.postgres import json_values, lsn

SCHEMA = "airflow_repl"

#: A row written to ``airflow_repl.commands`` by the Log Reader, as one line of COPY's text
#: format (:func:`command_line`): publication, xact_seqno, command_id, article, op, data (JSON).
NewCommandRow = bytes
#: A row of ``airflow_repl.transactions`` written by the Log Reader, as one line of COPY's text
#: format (:func:`transaction_line`): publication, xact_seqno, xid, commit_time, end_lsn,
#: command_count, article_rows (JSON), origin (the replication origin it came from, or NULL),
#: schema_change (it holds a schema-change command).
TransactionRow = bytes
#: A staged INSERT of the Log Reader: seq, article, op, data (JSON text).
StagedRow = tuple[int, str, str, str]

DISTRIBUTION_DDL = """
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
"""


def check_encoding(conn: psycopg.Connection) -> None:
    """Commands hold replicated values as JSON, which a database in another encoding
    than UTF8 cannot store for characters outside its character set: refuse such a
    distribution database up front, naming it and the fix."""
    dbname, encoding = _one(
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


#: The distribution schema's comment once :data:`DISTRIBUTION_DDL` has run there: its digest.
SCHEMA_MARK = "airflow-repl distribution schema " + hashlib.sha256(DISTRIBUTION_DDL.encode()).hexdigest()[:16]


def ensure_schema(conn: psycopg.Connection, *, unless_current: bool = False) -> None:
    """Create the distribution database schema where it is missing, or bring it to this
    version (idempotent), and mark it current (:data:`SCHEMA_MARK`, the schema's comment).

    ``unless_current``: nothing runs when the mark says the schema is this version.  Agents and
    commands that run next to running agents ask for that: the DDL's ``ALTER TABLE``s take ACCESS
    EXCLUSIVE locks even when they change nothing, which the running agents' transactions would
    wait for, or deadlock with."""
    if unless_current:
        with conn.transaction():
            row = conn.execute(
                "SELECT pg_catalog.obj_description(oid, 'pg_namespace') FROM pg_catalog.pg_namespace "
                "WHERE nspname = 'airflow_repl'"
            ).fetchone()
        if row is not None and row[0] == SCHEMA_MARK:
            return
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('airflow_repl.ddl'))")
        conn.execute(DISTRIBUTION_DDL)
        conn.execute(sql.SQL("COMMENT ON SCHEMA airflow_repl IS {}").format(sql.Literal(SCHEMA_MARK)))


# ---------------------------------------------------------------------- articles
@dataclass(frozen=True)
class UpdatingOptions:
    """A publication's updatable-subscription options as recorded in ``airflow_repl.publications``."""

    allow_sync_tran: bool = False
    allow_queued_tran: bool = False
    conflict_policy: str = "pub wins"


def save_publication(
    conn: psycopg.Connection,
    publication: str,
    pg_publication: str,
    slot: str,
    articles: list[ResolvedArticle],
    updating: UpdatingOptions | None = None,
) -> None:
    """Upsert the publication and its articles.  Updating options once allowed stay allowed
    (``apply`` refuses a topology that turns them off before anything changes)."""
    updating = updating or UpdatingOptions()
    conn.execute(
        "INSERT INTO airflow_repl.publications (name, pg_publication, slot_name, allow_sync_tran, "
        "allow_queued_tran, conflict_policy) VALUES (%s, %s, %s, %s, %s, %s) "
        "ON CONFLICT (name) DO UPDATE SET pg_publication = excluded.pg_publication, updated_at = now(), "
        "allow_sync_tran = airflow_repl.publications.allow_sync_tran OR excluded.allow_sync_tran, "
        "allow_queued_tran = airflow_repl.publications.allow_queued_tran OR excluded.allow_queued_tran, "
        "conflict_policy = excluded.conflict_policy",
        (
            publication,
            pg_publication,
            slot,
            updating.allow_sync_tran,
            updating.allow_queued_tran,
            updating.conflict_policy,
        ),
    )  # the slot keeps the name it was first given
    names = [a.name for a in articles]
    conn.execute(
        "DELETE FROM airflow_repl.articles WHERE publication = %s AND NOT (name = ANY(%s))", (publication, names)
    )
    for art in articles:
        conn.execute(
            "INSERT INTO airflow_repl.articles (publication, name, definition) VALUES (%s, %s, %s) "
            "ON CONFLICT (publication, name) DO UPDATE SET definition = excluded.definition, "
            "updated_at = now() WHERE airflow_repl.articles.definition IS DISTINCT FROM excluded.definition",
            (publication, art.name, Jsonb(art.to_dict())),
        )


def load_articles(conn: psycopg.Connection, publication: str) -> list[ResolvedArticle]:
    rows = (
        []
        if not _deployed(conn, "articles")
        else conn.execute(
            "SELECT definition FROM airflow_repl.articles WHERE publication = %s ORDER BY name", (publication,)
        ).fetchall()
    )
    if not rows:
        raise NotInitialized(
            f"publication {publication!r} is not deployed in the distribution database: run the "
            f"Snapshot Agent (or 'airflow-repl apply') for it first"
        )
    return [ResolvedArticle.from_dict(r[0]) for r in rows]


def save_article_definition(conn: psycopg.Connection, article: ResolvedArticle) -> None:
    """The article's definition after a schema change the Log Reader stored (same transaction)."""
    conn.execute(
        "UPDATE airflow_repl.articles SET definition = %s, updated_at = now() WHERE publication = %s AND name = %s",
        (Jsonb(article.to_dict()), article.publication, article.name),
    )


def definitions_before(conn: psycopg.Connection, publication: str, after: str) -> dict[str, ResolvedArticle]:
    """article -> its definition before the first schema change stored after xact_seqno
    ``after``: what a subscriber at watermark ``after`` still has (articles without a later
    schema change have their stored definition)."""
    rows = conn.execute(
        "SELECT DISTINCT ON (article) article, data->'s'->'before' FROM airflow_repl.commands "
        "WHERE publication = %s AND op = 'S' AND xact_seqno > %s::pg_lsn ORDER BY article, xact_seqno, command_id",
        (publication, after),
    ).fetchall()
    return {str(name): ResolvedArticle.from_dict(before) for name, before in rows}


def definitions_at(
    conn: psycopg.Connection, publication: str, position: str | None, current: list[ResolvedArticle]
) -> list[ResolvedArticle]:
    """The article definitions a subscriber that has everything up to ``position`` has: the
    ``current`` ones, except those with a schema change after it (sorted by name)."""
    out = {a.name: a for a in current}
    if position is not None:
        out.update(definitions_before(conn, publication, position))
    return [out[name] for name in sorted(out)]


def delivered_position(conn: psycopg.Connection, publication: str, subscriber: str) -> str | None:
    """The last xact_seqno recorded as delivered to the subscriber, if any."""
    row = conn.execute(
        "SELECT delivered_xact_seqno::text FROM airflow_repl.subscriptions WHERE publication = %s AND subscriber = %s",
        (publication, subscriber),
    ).fetchone()
    return str(row[0]) if row is not None and row[0] is not None else None


def set_subscription_articles_hash(conn: psycopg.Connection, publication: str, subscriber: str, value: str) -> None:
    """The definitions the subscriber has after a delivered schema change (committed with its
    delivery record)."""
    conn.execute(
        "UPDATE airflow_repl.subscriptions SET articles_hash = %s WHERE publication = %s AND subscriber = %s",
        (value, publication, subscriber),
    )


def save_custom_script(conn: psycopg.Connection, publication: str, article: str, kind: str, body: str) -> None:
    """Register (or replace) the script regenerating the article's custom procedures."""
    conn.execute(
        "INSERT INTO airflow_repl.custom_scripts (publication, article, kind, body) VALUES (%s, %s, %s, %s) "
        "ON CONFLICT (publication, article) DO UPDATE SET kind = excluded.kind, body = excluded.body, "
        "registered_at = now()",
        (publication, article, kind, body),
    )


def drop_custom_script(conn: psycopg.Connection, publication: str, article: str) -> bool:
    """Unregister the article's script; False when none was registered."""
    cur = conn.execute(
        "DELETE FROM airflow_repl.custom_scripts WHERE publication = %s AND article = %s", (publication, article)
    )
    return cur.rowcount > 0


def custom_scripts(conn: psycopg.Connection, publication: str) -> dict[str, tuple[str, str]]:
    """article -> (kind, body) of the publication's registered scripts."""
    if not _deployed(conn, "custom_scripts"):
        return {}
    rows = conn.execute(
        "SELECT article, kind, body FROM airflow_repl.custom_scripts WHERE publication = %s", (publication,)
    ).fetchall()
    return {str(a): (str(k), str(b)) for a, k, b in rows}


def slot_name(conn: psycopg.Connection, publication: str) -> str:
    """The publication's logical slot at the publisher, as recorded when it was first deployed."""
    row = conn.execute("SELECT slot_name FROM airflow_repl.publications WHERE name = %s", (publication,)).fetchone()
    if row is None:
        raise NotInitialized(
            f"publication {publication!r} is not deployed in the distribution database: run "
            f"the Snapshot Agent (or 'airflow-repl apply') for it first"
        )
    return str(row[0])


def recorded_updating_options(conn: psycopg.Connection, publications: list[str]) -> dict[str, UpdatingOptions]:
    """The updating options recorded for those of ``publications`` already applied ({} before the
    distribution database has the columns: nothing allowed updating then)."""
    has_columns = _one(
        conn.execute(
            "SELECT count(*) FROM pg_catalog.pg_attribute WHERE attrelid = to_regclass(%s) "
            "AND attname IN ('allow_sync_tran', 'allow_queued_tran', 'conflict_policy') AND NOT attisdropped",
            (f"{SCHEMA}.publications",),
        )
    )[0]
    if has_columns != 3:
        return {}
    rows = conn.execute(
        "SELECT name, allow_sync_tran, allow_queued_tran, conflict_policy FROM airflow_repl.publications "
        "WHERE name = ANY(%s)",
        (publications,),
    ).fetchall()
    return {str(name): UpdatingOptions(bool(sync), bool(queued), str(policy)) for name, sync, queued, policy in rows}


#: The two modes of a failover subscription, between which ``set-update-mode`` switches.
FAILOVER_MODES = ("failover", "queued failover")


def save_subscription(
    conn: psycopg.Connection, publication: str, subscriber: str, options: dict[str, Any], update_mode: str = "read only"
) -> None:
    """Upsert the subscription with its options and update mode.  A failover subscription keeps
    the mode ``set-update-mode`` switched it to while the topology still names a failover mode."""
    conn.execute(
        "INSERT INTO airflow_repl.subscriptions (publication, subscriber, options, update_mode) "
        "VALUES (%s, %s, %s, %s) ON CONFLICT (publication, subscriber) DO UPDATE SET options = excluded.options, "
        "update_mode = CASE WHEN airflow_repl.subscriptions.update_mode = ANY(%s) AND excluded.update_mode = ANY(%s) "
        "THEN airflow_repl.subscriptions.update_mode ELSE excluded.update_mode END",
        (publication, subscriber, Jsonb(options), update_mode, list(FAILOVER_MODES), list(FAILOVER_MODES)),
    )


@dataclass(frozen=True)
class SubscriptionUpdating:
    """What ``set-update-mode`` needs to know about a subscription."""

    update_mode: str
    status: str
    initialized_at: datetime | None


def subscription_updating(conn: psycopg.Connection, publication: str, subscriber: str) -> SubscriptionUpdating | None:
    """The subscription's recorded update mode, status and initialization time; None when it
    has not been applied."""
    if not _deployed(conn, "subscriptions"):
        return None
    row = conn.execute(
        "SELECT update_mode, status, initialized_at FROM airflow_repl.subscriptions "
        "WHERE publication = %s AND subscriber = %s",
        (publication, subscriber),
    ).fetchone()
    return SubscriptionUpdating(str(row[0]), str(row[1]), row[2]) if row is not None else None


def set_update_mode(conn: psycopg.Connection, publication: str, subscriber: str, update_mode: str) -> None:
    """Record the subscription's current update mode (committed by the caller)."""
    conn.execute(
        "UPDATE airflow_repl.subscriptions SET update_mode = %s WHERE publication = %s AND subscriber = %s",
        (update_mode, publication, subscriber),
    )


def agent_succeeded_since(
    conn: psycopg.Connection, agent: str, publication: str, subscriber: str, since: datetime
) -> bool:
    """Has a run of ``agent`` for the subscription (or for all subscriptions of the publication:
    subscriber NULL) started at or after ``since`` and succeeded?"""
    row = conn.execute(
        "SELECT 1 FROM airflow_repl.agent_history WHERE agent = %s AND publication = %s "
        "AND (subscriber = %s OR subscriber IS NULL) "
        "AND status = 'succeeded' AND started_at >= %s LIMIT 1",
        (agent, publication, subscriber, since),
    ).fetchone()
    return row is not None


# ---------------------------------------------------------------------- history and errors
def start_run(conn: psycopg.Connection, agent: str, publication: str | None, subscriber: str | None = None) -> int:
    row = _one(
        conn.execute(
            "INSERT INTO airflow_repl.agent_history (agent, publication, subscriber) VALUES (%s, %s, %s) "
            "RETURNING run_id",
            (agent, publication, subscriber),
        )
    )
    conn.commit()
    assert row is not None  # INSERT ... RETURNING returns the row
    return int(row[0])


def abandon_stale_runs(
    conn: psycopg.Connection, run_id: int, agent: str, publication: str, subscriber: str | None = None
) -> None:
    """Mark runs left 'running' by a killed agent as 'abandoned'.  Call it while holding the
    lock that keeps a second agent of the same kind away, so that they cannot be alive."""
    conn.execute(
        "UPDATE airflow_repl.agent_history SET status = 'abandoned', finished_at = clock_timestamp(), "
        "message = 'the agent stopped without reporting (killed or crashed); a later run took over' "
        "WHERE agent = %s AND publication = %s AND subscriber IS NOT DISTINCT FROM %s "
        "AND status = 'running' AND run_id < %s",
        (agent, publication, subscriber, run_id),
    )
    conn.commit()


def finish_run(
    conn: psycopg.Connection,
    run_id: int,
    status: str,
    *,
    transactions: int = 0,
    commands: int = 0,
    rows_copied: int = 0,
    message: str | None = None,
    details: dict[str, Any] | None = None,
) -> None:
    conn.execute(
        "UPDATE airflow_repl.agent_history SET finished_at = clock_timestamp(), status = %s, "
        "transactions = %s, commands = %s, rows_copied = %s, message = %s, details = %s "
        "WHERE run_id = %s",
        (status, transactions, commands, rows_copied, message, Jsonb(details) if details is not None else None, run_id),
    )
    conn.commit()


def record_run_progress(conn: psycopg.Connection, run_id: int, transactions: int, commands: int) -> None:
    """A running run's counts so far (a continuous run's progress); committed."""
    conn.execute(
        "UPDATE airflow_repl.agent_history SET transactions = %s, commands = %s WHERE run_id = %s AND status = 'running'",
        (transactions, commands, run_id),
    )
    conn.commit()


def last_stream_rates(conn: psycopg.Connection, publication: str, subscriber: str, streams: int) -> dict[str, float]:
    """The delivery rates (commands per second, spread over ``streams`` streams and on one) that
    the last successful Distribution Agent run of the subscription measured, or {}."""
    row = conn.execute(
        "SELECT details->'stream_rates' FROM airflow_repl.agent_history WHERE agent = 'distribution' "
        "AND publication = %s AND subscriber = %s AND status = 'succeeded' "
        "AND (details->'stream_rates'->>'streams')::int = %s ORDER BY run_id DESC LIMIT 1",
        (publication, subscriber, streams),
    ).fetchone()
    return {k: float(v) for k, v in (row[0] or {}).items() if k in ("spread", "one") and v is not None} if row else {}


def record_error(
    conn: psycopg.Connection,
    *,
    run_id: int | None,
    agent: str,
    publication: str | None,
    subscriber: str | None,
    message: str,
    xact_seqno: str | None = None,
    command_id: int | None = None,
    article: str | None = None,
    sqlstate: str | None = None,
    command: dict[str, Any] | None = None,
    skipped: bool = False,
    commit: bool = True,
) -> None:
    conn.execute(
        "INSERT INTO airflow_repl.errors (run_id, agent, publication, subscriber, xact_seqno, command_id, "
        "article, sqlstate, message, command, skipped) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (
            run_id,
            agent,
            publication,
            subscriber,
            xact_seqno,
            command_id,
            article,
            sqlstate,
            message,
            Jsonb(command) if command is not None else None,
            skipped,
        ),
    )
    if commit:
        conn.commit()


def dumps(value: Any) -> str:
    """Compact JSON text, as commands and transaction rows store it (:func:`dumps_bytes`)."""
    return dumps_bytes(value).decode()


def dumps_bytes(value: Any) -> bytes:
    """Compact JSON (UTF-8), as commands and transaction rows store it: orjson's, for the values
    commands and transaction rows hold (text, NULL, numbers, lists and objects with text keys);
    ``json``'s, one encoder for every call, for anything orjson refuses (an object with other
    keys, an integer beyond 64 bits) or writes otherwise (a float NaN or infinity, which orjson
    turns into null).  Both parse to the same values: non-ASCII text is written as UTF-8 where
    ``json`` writes ``\\u`` escapes, which the ``jsonb`` column does not keep apart."""
    try:
        return _orjson_dumps(value)
    except (orjson.JSONEncodeError, _NonFinite):
        return _ENCODER.encode(value).encode()


class _NonFinite(Exception):
    """A float orjson would write as null."""


def _default(value: Any) -> Any:
    raise TypeError  # a type orjson does not know: json's encoder decides


def _orjson_dumps(value: Any) -> bytes:
    out = orjson.dumps(value, default=_default)
    if b"null" in out and _has_non_finite(value):
        raise _NonFinite
    return out


def _has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return value != value or value in (float("inf"), float("-inf"))
    if isinstance(value, dict):
        return any(_has_non_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_has_non_finite(v) for v in value)
    return False


_ENCODER = json.JSONEncoder(separators=(",", ":"))


def command_data(data: dict[str, Any]) -> bytes:
    """A command's JSON (:meth:`Command.to_json`), as :func:`dumps_bytes` writes it.  A row
    change's holds only text, NULLs and the pair flag, which orjson writes as ``json`` does
    (no float to look for); a schema change's goes through :func:`dumps_bytes`."""
    if "s" not in data:
        try:
            return orjson.dumps(data, default=_default)
        except orjson.JSONEncodeError:
            pass
    return dumps_bytes(data)


def copy_field(value: str | None) -> bytes:
    """One field of a line of COPY's text format: UTF-8, backslash, newline, carriage return
    and tab escaped; NULL as ``\\N``."""
    if value is None:
        return b"\\N"
    return value.encode().replace(b"\\", b"\\\\").replace(b"\n", b"\\n").replace(b"\r", b"\\r").replace(b"\t", b"\\t")


def command_line(prefix: bytes, command_id: int, article: bytes, op: bytes, data: bytes) -> bytes:
    """One row of ``airflow_repl.commands`` as a line of COPY's text format: ``prefix`` is the
    publication's and the xact_seqno's fields with their tabs (:func:`copy_field`), ``article``
    a COPY field, ``data`` compact JSON (:func:`dumps_bytes`: its only backslashes are escapes,
    doubled here; it holds no newline, carriage return or tab)."""
    return b"%b%d\t%b\t%b\t%b\n" % (prefix, command_id, article, op, data.replace(b"\\", b"\\\\"))


def _one(cur: psycopg.Cursor[TupleRow]) -> TupleRow:
    """The row of a statement that always returns one."""
    row = cur.fetchone()
    if row is None:
        raise psycopg.ProgrammingError("the statement returned no row")
    return row


def _deployed(conn: psycopg.Connection[Any], table: str) -> bool:
    """Does the distribution database have the table ``airflow_repl.<table>`` yet?"""
    return bool(_one(conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{SCHEMA}.{table}",)))[0])


def require_deployed(conn: psycopg.Connection[Any]) -> None:
    """The distribution database has the ``airflow_repl`` tables (else NotInitialized, naming the fix)."""
    if not _deployed(conn, "agent_history"):
        raise NotInitialized(
            f"the distribution database {conn.info.dbname!r} has no {SCHEMA} tables yet: "
            f"run 'airflow-repl apply' (or the Snapshot Agent) first"
        )
    conn.commit()


# ---------------------------------------------------------------------- questions of the Snapshot Agent
def publication_was_read(conn: psycopg.Connection[Any], publication: str) -> bool:
    """Has the Log Reader ever stored a transaction of the publication, or does it have an
    active subscription?  (Then a missing slot means lost changes.)"""
    row = conn.execute(
        "SELECT 1 FROM airflow_repl.logreader_state WHERE publication = %s "
        "UNION ALL SELECT 1 FROM airflow_repl.subscriptions WHERE publication = %s "
        "AND status = 'active'",
        (publication, publication),
    ).fetchone()
    return row is not None


def active_subscriptions(conn: psycopg.Connection[Any], publication: str) -> dict[str, str | None]:
    """The publication's active subscribers -> the hash of the article definitions each was
    initialized with (None for a subscription initialized before hashes were kept); {} before
    the distribution database has its schema."""
    if not _deployed(conn, "subscriptions"):
        return {}
    rows = conn.execute(
        "SELECT subscriber, articles_hash FROM airflow_repl.subscriptions WHERE publication = %s AND status = 'active'",
        (publication,),
    ).fetchall()
    return {str(subscriber): articles_hash for subscriber, articles_hash in rows}


def record_snapshot(
    conn: psycopg.Connection[Any],
    publication: str,
    snapshot_id: str,
    folder: str,
    consistent_lsn: str,
    manifest: dict[str, Any],
) -> None:
    """Enter a snapshot folder written for the publication (committed by the caller)."""
    conn.execute(
        "INSERT INTO airflow_repl.snapshots (publication, snapshot_id, folder, consistent_lsn, "
        "manifest) VALUES (%s, %s, %s, %s, %s)",
        (publication, snapshot_id, folder, consistent_lsn, Jsonb(manifest)),
    )


def mark_initializing(conn: psycopg.Connection[Any], publication: str, subscriber: str, snapshot_id: str) -> None:
    """The subscription is being initialized from ``snapshot_id`` (committed by the caller)."""
    conn.execute(
        "UPDATE airflow_repl.subscriptions SET status = 'initializing', snapshot_id = %s "
        "WHERE publication = %s AND subscriber = %s",
        (snapshot_id, publication, subscriber),
    )


def activate_subscription(
    conn: psycopg.Connection[Any], publication: str, subscriber: str, consistent_lsn: str, articles_hash: str
) -> None:
    """The subscription holds the snapshot taken at ``consistent_lsn``: it is active, and
    delivered up to just before that point (committed by the caller)."""
    conn.execute(
        "UPDATE airflow_repl.subscriptions SET status = 'active', start_xact_seqno = %s::pg_lsn - 1, "
        "delivered_xact_seqno = %s::pg_lsn - 1, delivered_at = now(), articles_hash = %s, initialized_at = now() "
        "WHERE publication = %s AND subscriber = %s",
        (consistent_lsn, consistent_lsn, articles_hash, publication, subscriber),
    )


# ---------------------------------------------------------------------- questions of the Log Reader Agent
#: The Log Reader's staging table of the INSERTs of a long run of key updates (see
#: ``log_reader_agent._TxnWriter``): temporary, emptied at each commit.
_STAGED = "airflow_repl_staged"


def last_read_lsn(conn: psycopg.Connection[Any], publication: str) -> int:
    """The commit LSN of the last transaction the Log Reader stored, as a number (0: none)."""
    row = conn.execute(
        "SELECT read_xact_seqno::text FROM airflow_repl.logreader_state WHERE publication = %s", (publication,)
    ).fetchone()
    return lsn.lsn_to_int(row[0]) if row is not None and row[0] else 0


def transaction_stored(conn: psycopg.Connection[Any], publication: str, xact_seqno: str) -> bool:
    """Is the transaction that commits at ``xact_seqno`` stored already?"""
    row = conn.execute(
        "SELECT 1 FROM airflow_repl.transactions WHERE publication = %s AND xact_seqno = %s",
        (publication, xact_seqno),
    ).fetchone()
    return row is not None


class CommandCopy:
    """One COPY of command rows (publication, xact_seqno, command_id, article, op, data), each a
    line of COPY's text format (:func:`command_line`), kept open while the lines come: the server
    stores what it has received while the caller makes the next lines.  End it (:meth:`end`)
    before the connection runs anything else; :meth:`abort` ends it with an error (nothing of it
    is stored)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._stack = ExitStack()
        cur = self._stack.enter_context(conn.cursor())
        self._copy = self._stack.enter_context(
            cur.copy("COPY airflow_repl.commands (publication, xact_seqno, command_id, article, op, data) FROM STDIN")
        )

    def write(self, lines: bytes) -> None:
        self._copy.write(lines)

    def end(self) -> None:
        """Send the end of the data and wait until the server has stored it all."""
        self._stack.close()

    def abort(self, error: BaseException) -> None:
        """End the COPY with ``error`` (the server discards it); a failure to do so is not raised
        over the error that ends the run."""
        try:
            self._stack.__exit__(type(error), error, error.__traceback__)
        except Exception:
            pass


def copy_transactions(conn: psycopg.Connection[Any], lines: list[TransactionRow]) -> None:
    """COPY transaction rows (:func:`transaction_line`); their commands first, in the same
    distributor transaction."""
    if lines:
        with (
            conn.cursor() as cur,
            cur.copy(
                "COPY airflow_repl.transactions (publication, xact_seqno, xid, commit_time, end_lsn, command_count, "
                "article_rows, origin, schema_change) FROM STDIN"
            ) as copy,
        ):
            copy.write(b"".join(lines))


def transaction_line(
    publication: bytes,
    xact_seqno: str,
    xid: int,
    commit_time: datetime,
    end_lsn: str,
    command_count: int,
    article_rows: dict[str, int],
    origin: str | None,
    schema_change: bool,
) -> TransactionRow:
    """One row of ``airflow_repl.transactions`` as a line of COPY's text format: ``publication``
    a COPY field (:func:`copy_field`), the positions pg_lsn text (nothing to escape), the commit
    time ISO 8601 text with its offset, the article rows compact JSON (:func:`dumps_bytes`: its
    only backslashes are escapes, doubled here; it holds no newline, carriage return or tab)."""
    return b"%b\t%b\t%d\t%b\t%b\t%d\t%b\t%b\t%b\n" % (
        publication,
        xact_seqno.encode(),
        xid,
        commit_time.isoformat().encode(),
        end_lsn.encode(),
        command_count,
        dumps_bytes(article_rows).replace(b"\\", b"\\\\"),
        copy_field(origin),
        b"t" if schema_change else b"f",
    )


def stage_inserts(conn: psycopg.Connection[Any], rows: list[StagedRow], first: bool) -> None:
    """COPY (seq, article, op, data) rows into the staging table (created by the ``first``
    call of a transaction)."""
    if first:
        conn.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS {_STAGED} "
            "(seq bigint, article text, op text, data jsonb) ON COMMIT DELETE ROWS"
        )
    with conn.cursor() as cur, cur.copy(f"COPY {_STAGED} (seq, article, op, data) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


def unstage_insert(conn: psycopg.Connection[Any], image: list[Any]) -> bool:
    """Drop the last staged INSERT whose after image is ``image``; False when there is none."""
    cur = conn.execute(
        f"DELETE FROM {_STAGED} WHERE seq = (SELECT max(seq) FROM {_STAGED} WHERE data -> 'n' = %s::jsonb)",
        (dumps(image),),
    )
    return cur.rowcount > 0


def store_staged(conn: psycopg.Connection[Any], publication: str, xact_seqno: str | None, after: int) -> int:
    """Move the staged INSERTs, in staging order, into the transaction's commands, numbered
    from ``after`` + 1; returns how many."""
    cur = conn.execute(
        "INSERT INTO airflow_repl.commands (publication, xact_seqno, command_id, article, op, data) "
        f"SELECT %s, %s, %s + row_number() OVER (ORDER BY seq), article, op, data FROM {_STAGED}",
        (publication, xact_seqno, after),
    )
    conn.execute(f"TRUNCATE {_STAGED}")
    return cur.rowcount


def save_read_position(conn: psycopg.Connection[Any], publication: str, xact_seqno: str, end_lsn: str) -> None:
    """The Log Reader stored every transaction up to ``xact_seqno`` (committed by the caller,
    with them)."""
    conn.execute(
        "INSERT INTO airflow_repl.logreader_state (publication, read_xact_seqno, read_end_lsn) "
        "VALUES (%s, %s, %s) ON CONFLICT (publication) DO UPDATE SET "
        "read_xact_seqno = excluded.read_xact_seqno, read_end_lsn = excluded.read_end_lsn, "
        "updated_at = now()",
        (publication, xact_seqno, end_lsn),
    )


# ---------------------------------------------------------------------- questions of the Distribution Agent
#: SQL: the next transactions after a watermark.  Orders and compares the pg_lsn column of the
#: table (qualified: a bare ``xact_seqno`` would bind to the text output column and sort as
#: text), so the primary key's index returns them in order, with no sort of the backlog.
BATCH_QUERY = (
    "SELECT t.xact_seqno::text AS xact, t.command_count, t.article_rows, t.commit_time, t.origin, t.schema_change "
    "FROM airflow_repl.transactions AS t "
    "WHERE t.publication = %s AND t.xact_seqno > %s::pg_lsn ORDER BY t.xact_seqno LIMIT %s"
)
#: SQL: the commands of the transactions first..last, in commit order.
COMMANDS_QUERY = (
    "SELECT c.xact_seqno::text AS xact, c.command_id, c.article, c.op, c.data "
    "FROM airflow_repl.commands AS c "
    "WHERE c.publication = %s AND c.xact_seqno BETWEEN %s::pg_lsn AND %s::pg_lsn "
    "ORDER BY c.xact_seqno, c.command_id"
)

#: A stored command as the Distribution Agent reads it: (xact_seqno, command_id, article, op, data).
CommandRow = tuple[str, int, str, str, dict[str, Any]]


@dataclass(frozen=True)
class PendingTransaction:
    """A replicated transaction waiting for delivery (a row of ``airflow_repl.transactions``)."""

    xact: str  # its xact_seqno, as text
    command_count: int
    article_rows: dict[str, int]  # article -> rows the transaction changed
    commit_time: datetime
    origin: str | None = None  # the replication origin it came from (a Queue Reader's), if any
    schema_change: bool = False  # it holds a schema-change command


def subscription_articles_hash(conn: psycopg.Connection, publication: str, subscriber: str) -> str | None:
    """The hash of the article definitions the subscriber has as of its recorded delivery: those
    it was initialized with, or those a delivered schema change left (None: not recorded)."""
    row = conn.execute(
        "SELECT articles_hash FROM airflow_repl.subscriptions WHERE publication = %s AND subscriber = %s",
        (publication, subscriber),
    ).fetchone()
    return str(row[0]) if row is not None and row[0] is not None else None


def pending_transactions(
    conn: psycopg.Connection, publication: str, after: str, limit: int
) -> list[PendingTransaction]:
    """Up to ``limit`` transactions of the publication after xact_seqno ``after``, in commit
    (LSN) order (:data:`BATCH_QUERY`)."""
    with conn.cursor() as cur:
        _read_json_with(cur, _JsonLoader)
        rows = cur.execute(BATCH_QUERY, (publication, after, limit)).fetchall()
    return [
        PendingTransaction(xact, count, article_rows or {}, commit_time, origin, bool(ddl))
        for xact, count, article_rows, commit_time, origin, ddl in rows
    ]


def batch_commands(
    conn: psycopg.Connection, publication: str, first: str, last: str
) -> Generator[CommandRow, None, None]:
    """The commands of the transactions ``first``..``last`` in commit order, read through a
    server-side cursor as they are consumed (:data:`COMMANDS_QUERY`); close the generator to
    close the cursor early."""
    with conn.cursor(name="airflow_repl_cmds") as cur:
        _read_json_with(cur, _CommandLoader)
        cur.itersize = 2000
        cur.execute(COMMANDS_QUERY, (publication, first, last))
        yield from cur


def batch_commands_list(conn: psycopg.Connection, publication: str, first: str, last: str) -> list[CommandRow]:
    """The commands of :func:`batch_commands`, read in one round trip (a caller that holds the
    whole batch in memory anyway)."""
    with conn.cursor() as cur:
        _read_json_with(cur, _CommandLoader)
        return cur.execute(COMMANDS_QUERY, (publication, first, last)).fetchall()


def loads(data: Buffer) -> Any:
    """JSON text (UTF-8) as Python values, as ``json.loads`` reads it: orjson's parser, or
    ``json``'s for what orjson refuses (NaN, Infinity) or reads otherwise (an integer beyond 64
    bits, which orjson makes a float: any run of 19 digits, even inside a string, takes ``json``)."""
    if _LONG_NUMBER.search(data) is None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(bytes(data))


_LONG_NUMBER = re.compile(rb"[0-9]{19}")


def load_command(data: Buffer) -> Any:
    """A stored command's JSON (``airflow_repl.commands.data``), as :func:`loads` reads it.  Only
    a schema change's has an ``"s"`` key, and only it may hold numbers other than the pair
    flag: a row change's (no ``"s":`` anywhere in the text, the test that costs least) goes
    straight to orjson."""
    if _SCHEMA_KEY.search(data) is None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return loads(data)


_SCHEMA_KEY = re.compile(rb'"s":')


class _JsonLoader(Loader):
    """``json`` and ``jsonb`` columns (text format) through :func:`loads`."""

    load = staticmethod(loads)


def _read_json_with(cur: psycopg.Cursor[Any], loader: type[Loader]) -> None:
    """The cursor reads ``json`` columns, and the ``jsonb`` columns of a distribution database
    made by an earlier airflow-repl, with ``loader``."""
    cur.adapters.register_loader("json", loader)
    cur.adapters.register_loader("jsonb", loader)


class _CommandLoader(Loader):
    """``json`` (and ``jsonb``) columns (text format) of the stored commands through :func:`load_command`:
    psycopg's own loader is ``json.loads`` with a Python call per value around it."""

    load = staticmethod(load_command)


def origin_positions(conn: psycopg.Connection, publication: str, origin: str, xids: list[int]) -> dict[int, str]:
    """xid -> xact_seqno of the stored transactions of replication origin ``origin`` with those ids."""
    rows = conn.execute(
        "SELECT xid, xact_seqno::text FROM airflow_repl.transactions WHERE publication = %s AND origin = %s "
        "AND xid = ANY(%s)",
        (publication, origin, xids),
    ).fetchall()
    return {int(x): str(s) for x, s in rows}


def mark_delivered(conn: psycopg.Connection, publication: str, subscriber: str, xact: str) -> None:
    """Record that the subscriber has applied every transaction up to ``xact`` (the caller
    commits)."""
    conn.execute(
        "UPDATE airflow_repl.subscriptions SET delivered_xact_seqno = %s, "
        "delivered_at = now() WHERE publication = %s AND subscriber = %s",
        (xact, publication, subscriber),
    )


def catch_up_delivered(conn: psycopg.Connection, publication: str, subscriber: str, watermark: str) -> bool:
    """Move the recorded delivery up to the subscriber's committed ``watermark`` when it is behind
    it (a run stopped before recording its last commit); True when it was (the caller commits)."""
    cur = conn.execute(
        "UPDATE airflow_repl.subscriptions SET delivered_xact_seqno = %s, delivered_at = now() "
        "WHERE publication = %s AND subscriber = %s AND delivered_xact_seqno < %s::pg_lsn",
        (watermark, publication, subscriber, watermark),
    )
    return cur.rowcount > 0


# ---------------------------------------------------------------------- questions of the Queue Reader Agent
def subscription_status(conn: psycopg.Connection[Any], publication: str, subscriber: str) -> str | None:
    """The subscription's status ('pending', 'initializing', 'active', 'reinitialize'), or None."""
    row = conn.execute(
        "SELECT status FROM airflow_repl.subscriptions WHERE publication = %s AND subscriber = %s",
        (publication, subscriber),
    ).fetchone()
    return str(row[0]) if row is not None else None


def mark_reinitialize(conn: psycopg.Connection[Any], publication: str, subscriber: str) -> None:
    """The subscription must be initialized again: the next Snapshot Agent run does it (the
    caller commits)."""
    conn.execute(
        "UPDATE airflow_repl.subscriptions SET status = 'reinitialize' WHERE publication = %s AND subscriber = %s",
        (publication, subscriber),
    )


def record_conflicts(
    conn: psycopg.Connection[Any],
    publication: str,
    subscriber: str,
    xid: int,
    policy: str,
    conflicts: list[dict[str, Any]],
) -> None:
    """Record a queued transaction's conflicts (each once: a re-run records nothing twice);
    the caller commits."""
    for c in conflicts:
        conn.execute(
            "INSERT INTO airflow_repl.conflicts (publication, subscriber, article, key, kind, publisher_row, "
            "subscriber_row, policy, outcome, queued_xid, queue_id, detected_at) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
            (
                publication,
                subscriber,
                c["article"],
                json_values.jsonb(c["key"]),
                c["kind"],
                json_values.jsonb(c["publisher_row"]) if c["publisher_row"] is not None else None,
                json_values.jsonb(c["subscriber_row"]) if c["subscriber_row"] is not None else None,
                policy,
                c["outcome"],
                xid,
                c["queue_id"],
                c["detected_at"],
            ),
        )


def record_delivery_conflicts(
    conn: psycopg.Connection[Any], publication: str, subscriber: str, conflicts: list[dict[str, Any]]
) -> None:
    """Record the conflicts the Distribution Agent met at a queued subscriber (each once, keyed
    by the publisher's transaction and command); the caller commits."""
    for c in conflicts:
        conn.execute(
            "INSERT INTO airflow_repl.conflicts (publication, subscriber, article, key, kind, publisher_row, "
            "subscriber_row, policy, outcome, agent, xact_seqno, command_id, detected_at) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, 'distribution', %s, %s, %s) ON CONFLICT DO NOTHING",
            (
                publication,
                subscriber,
                c["article"],
                json_values.jsonb(c["key"]),
                c["kind"],
                json_values.jsonb(c["publisher_row"]) if c["publisher_row"] is not None else None,
                json_values.jsonb(c["subscriber_row"]) if c["subscriber_row"] is not None else None,
                c["policy"],
                c["outcome"],
                c["xact_seqno"],
                c["command_id"],
                c["detected_at"],
            ),
        )


#: The columns :func:`list_conflicts` returns, in order (``agent``: the Queue Reader's
#: conflicts name their ``queued_xid``, the Distribution Agent's their ``xact_seqno``).
CONFLICT_COLUMNS = (
    "conflict_id",
    "detected_at",
    "publication",
    "subscriber",
    "article",
    "key",
    "kind",
    "policy",
    "outcome",
    "agent",
    "queued_xid",
    "xact_seqno",
    "publisher_row",
    "subscriber_row",
)


def list_conflicts(
    conn: psycopg.Connection[Any],
    *,
    publication: str | None = None,
    subscriber: str | None = None,
    article: str | None = None,
    since: datetime | None = None,
) -> list[dict[str, Any]]:
    """The recorded conflicts, oldest first, filtered by whichever arguments are given."""
    if not _deployed(conn, "conflicts"):
        return []
    rows = conn.execute(
        f"SELECT {', '.join(c + '::text' if c == 'xact_seqno' else c for c in CONFLICT_COLUMNS)} FROM airflow_repl.conflicts "
        "WHERE (%(p)s::text IS NULL OR publication = %(p)s) AND (%(s)s::text IS NULL OR subscriber = %(s)s) "
        "AND (%(a)s::text IS NULL OR article = %(a)s) AND (%(t)s::timestamptz IS NULL OR detected_at >= %(t)s) "
        "ORDER BY detected_at, conflict_id",
        {"p": publication, "s": subscriber, "a": article, "t": since},
    ).fetchall()
    return [dict(zip(CONFLICT_COLUMNS, row, strict=True)) for row in rows]
