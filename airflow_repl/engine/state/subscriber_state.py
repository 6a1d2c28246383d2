"""The ``airflow_repl`` schema at each subscriber: the watermark of the last transaction
applied (committed in the same transaction as the applied changes), the ledger of the snapshot
files loaded there, the ``row_not_found()`` function the generated procedures raise with, and
the queue of a queued updating subscription's own changes.

The queue: ``airflow_repl_queue`` row triggers on the article tables (their text is
:mod:`~airflow_repl.engine.codegen.queue_triggers`') call :data:`QUEUE_DDL`'s
``airflow_repl.queue_capture()``, which writes each changed row's old and new images and row
versions (``msrepl_tran_version``) to ``airflow_repl.queue``, tagged with the transaction's id.
A deferred constraint trigger on the queue, run at commit, takes a transaction-scoped advisory
lock and gives the transaction the next ``commit_seq`` in ``airflow_repl.queue_commits``: the
lock is held until the commit completes, so ``commit_seq`` order is commit order, and a
transaction's row there becomes visible with its queue rows.  Ordinary triggers do not fire
under ``session_replication_role = replica`` (the Distribution Agent's, the snapshot load's and
the Queue Reader's compensating writes), so only the subscriber's own changes are queued.

Owns: the subscriber's ``airflow_repl`` schema (:data:`SUBSCRIBER_DDL`) and one function per
question an agent asks of these tables; the distribution database's are in the ``dist_*``
modules of :mod:`~airflow_repl.engine.state`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from airflow_repl.engine.errors import AgentBusy, NotInitialized
from airflow_repl.engine.postgres import advisory_locks, json_values

SUBSCRIBER_DDL = """
CREATE SCHEMA IF NOT EXISTS airflow_repl;
CREATE TABLE IF NOT EXISTS airflow_repl.subscription_state (
    publication     text PRIMARY KEY,
    snapshot_id     text NOT NULL,
    xact_seqno      pg_lsn NOT NULL,
    transactions    bigint NOT NULL DEFAULT 0,
    updated_at      timestamptz NOT NULL DEFAULT now()
);
-- the hash of the article definitions the subscriber has, once a schema change was delivered
-- there (NULL: those it was initialized with); set in the commit that applies the change
ALTER TABLE airflow_repl.subscription_state ADD COLUMN IF NOT EXISTS articles_hash text;
-- The ledger of loaded snapshot files: a file's row is inserted in the transaction that COPYs
-- the file, so a retried or repeated load (Spark task retry, speculative task, re-run) finds it
-- and loads nothing.
CREATE TABLE IF NOT EXISTS airflow_repl.snapshot_files (
    publication  text NOT NULL,
    snapshot_id  text NOT NULL,
    path         text NOT NULL,
    rows         bigint NOT NULL,
    loaded_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (publication, snapshot_id, path)
);
CREATE OR REPLACE FUNCTION airflow_repl.row_not_found(what text, key_names text, key_values text)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'RP598',
        MESSAGE = format('row not found at the subscriber: %s with key (%s)=(%s) matched no row [20598]',
                         what, key_names, key_values);
END
$fn$;
"""

#: The keys of the subscriber's own changes the publisher took as they were, with the publisher's
#: transaction id: the rows of queued transactions the Queue Reader applied without a conflict
#: (``via`` 'queue', recorded when it dequeues them), and the rows an immediate subscriber's
#: transactions changed (``via`` 'immediate', recorded by its trigger in the same transaction).
#: Until the Distribution Agent passes that transaction, the publisher's older commands of those
#: keys must not overwrite them (:mod:`~airflow_repl.engine.subscriber.superseded`).
TAKEN_DDL = """
CREATE TABLE IF NOT EXISTS airflow_repl.queue_taken (
    publication    text NOT NULL,
    article        text NOT NULL,
    key            jsonb NOT NULL,
    publisher_xid  bigint NOT NULL,
    taken_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS queue_taken_key ON airflow_repl.queue_taken (publication, article, key);
ALTER TABLE airflow_repl.queue_taken ADD COLUMN IF NOT EXISTS via text NOT NULL DEFAULT 'queue';
"""

#: The queue of a queued updating subscriber (see the module's documentation).
QUEUE_DDL = (
    TAKEN_DDL
    + """
CREATE SCHEMA IF NOT EXISTS airflow_repl;
CREATE TABLE IF NOT EXISTS airflow_repl.queue (
    id           bigserial PRIMARY KEY,
    publication  text NOT NULL,
    xid          xid8 NOT NULL DEFAULT pg_current_xact_id(),
    article      text NOT NULL,
    op           text NOT NULL CHECK (op IN ('I', 'U', 'D')),
    old          jsonb,
    new          jsonb,
    old_version  uuid,
    new_version  uuid,
    queued_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS queue_transaction ON airflow_repl.queue (publication, xid, id);
CREATE SEQUENCE IF NOT EXISTS airflow_repl.queue_commit_seq;
CREATE TABLE IF NOT EXISTS airflow_repl.queue_commits (
    publication  text NOT NULL,
    xid          xid8 NOT NULL,
    commit_seq   bigint NOT NULL,
    PRIMARY KEY (publication, xid)
);
CREATE INDEX IF NOT EXISTS queue_commits_order ON airflow_repl.queue_commits (publication, commit_seq);
CREATE OR REPLACE FUNCTION airflow_repl.queue_capture() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
    old_image jsonb := CASE WHEN TG_OP <> 'INSERT' THEN to_jsonb(OLD) END;
    new_image jsonb := CASE WHEN TG_OP <> 'DELETE' THEN to_jsonb(NEW) END;
BEGIN
    INSERT INTO airflow_repl.queue (publication, article, op, old, new, old_version, new_version)
    VALUES (TG_ARGV[0], TG_ARGV[1], left(TG_OP, 1), old_image, new_image,
            (old_image ->> 'msrepl_tran_version')::uuid, (new_image ->> 'msrepl_tran_version')::uuid);
    RETURN NULL;
END
$fn$;
-- run at commit (deferred), once per transaction and publication: the lock, held until the
-- commit completes, makes commit_seq order the commit order
CREATE OR REPLACE FUNCTION airflow_repl.queue_commit() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM airflow_repl.queue_commits WHERE publication = NEW.publication AND xid = NEW.xid) THEN
        PERFORM pg_advisory_xact_lock(hashtext('airflow_repl.queue_commit'));
        INSERT INTO airflow_repl.queue_commits (publication, xid, commit_seq)
        VALUES (NEW.publication, NEW.xid, nextval('airflow_repl.queue_commit_seq'));
    END IF;
    RETURN NULL;
END
$fn$;
DO $do$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger
                   WHERE tgrelid = 'airflow_repl.queue'::regclass AND tgname = 'airflow_repl_queue_commit') THEN
        CREATE CONSTRAINT TRIGGER airflow_repl_queue_commit AFTER INSERT ON airflow_repl.queue
            DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION airflow_repl.queue_commit();
    END IF;
END
$do$;
"""
)


# ---------------------------------------------------------------------- questions of the Snapshot Agent
def reset_for_snapshot(conn: psycopg.Connection[Any], publication: str) -> None:
    """Create the schema where it is missing and forget the publication's watermark and loaded
    snapshot files: the subscription is about to be initialized again (committed by the caller)."""
    conn.execute(SUBSCRIBER_DDL)
    conn.execute("DELETE FROM airflow_repl.subscription_state WHERE publication = %s", (publication,))
    conn.execute("DELETE FROM airflow_repl.snapshot_files WHERE publication = %s", (publication,))
    clear_queue(conn, publication)
    if conn.execute("SELECT to_regclass('airflow_repl.queue_taken')").fetchone() != (None,):
        # the snapshot holds every change the subscriber made before it (and none after: writes stop)
        conn.execute("DELETE FROM airflow_repl.queue_taken WHERE publication = %s", (publication,))


def clear_queue(conn: psycopg.Connection[Any], publication: str) -> None:
    """Forget the publication's queued changes (the subscription is initialized again; its
    changes not yet applied at the publisher are given up), in the caller's transaction."""
    if has_queue(conn):
        conn.execute("DELETE FROM airflow_repl.queue WHERE publication = %s", (publication,))
        conn.execute("DELETE FROM airflow_repl.queue_commits WHERE publication = %s", (publication,))


def has_queue(conn: psycopg.Connection[Any]) -> bool:
    """Does the subscriber have the queue of queued updating?"""
    row = conn.execute("SELECT to_regclass('airflow_repl.queue_commits') IS NOT NULL").fetchone()
    return bool(row and row[0])


def ensure_queue(conn: psycopg.Connection[Any]) -> None:
    """Create the queue, its capture function and its commit-order trigger where they are
    missing (idempotent; committed by the caller)."""
    advisory_locks.lock_subscriber_schema(conn)
    conn.execute(QUEUE_DDL)


def claim_snapshot_file(
    conn: psycopg.Connection[Any], publication: str, snapshot_id: str, path: str, rows: int
) -> bool:
    """Enter a snapshot file in the ledger, in the transaction that will load it; False when it
    is there already (loaded, or being loaded by a concurrent attempt, which this one waits for)."""
    row = conn.execute(
        "INSERT INTO airflow_repl.snapshot_files (publication, snapshot_id, path, rows) VALUES (%s, %s, %s, %s) "
        "ON CONFLICT DO NOTHING RETURNING 1",
        (publication, snapshot_id, path, rows),
    ).fetchone()
    return row is not None


def count_snapshot_file(
    conn: psycopg.Connection[Any], publication: str, snapshot_id: str, path: str, rows: int
) -> None:
    """The rows of a file claimed before its rows were known (loaded while it was read), in the
    transaction that loaded it."""
    conn.execute(
        "UPDATE airflow_repl.snapshot_files SET rows = %s WHERE publication = %s AND snapshot_id = %s AND path = %s",
        (rows, publication, snapshot_id, path),
    )


def start_watermark(conn: psycopg.Connection[Any], publication: str, snapshot_id: str, consistent_lsn: str) -> None:
    """The subscription holds the snapshot taken at ``consistent_lsn``: its watermark starts just
    before that point, where the publication's slot starts decoding (committed by the caller)."""
    conn.execute(
        "INSERT INTO airflow_repl.subscription_state (publication, snapshot_id, xact_seqno) "
        "VALUES (%s, %s, %s::pg_lsn - 1)",
        (publication, snapshot_id, consistent_lsn),
    )


# ---------------------------------------------------------------------- questions of the Distribution Agent
_LOCK_WATERMARK = (
    "SELECT xact_seqno::text FROM airflow_repl.subscription_state WHERE publication = %s FOR UPDATE NOWAIT"
)


def lock_watermark(conn: psycopg.Connection, publication: str, subscriber: str) -> str:
    """The subscriber's watermark (the last transaction applied there), its row locked until
    the transaction ends, so that a second Distribution Agent is refused (AgentBusy); a
    subscriber without one (no snapshot loaded) raises NotInitialized."""
    try:
        row = conn.execute(_LOCK_WATERMARK, (publication,)).fetchone()
    except psycopg.errors.LockNotAvailable:
        raise watermark_busy(publication, subscriber) from None
    except psycopg.errors.UndefinedTable:
        row = None
    if row is None:
        raise not_initialized(publication, subscriber)
    return str(row[0])


def commit_and_lock(conn: psycopg.Connection, publication: str) -> str | None:
    """Commit the transaction and lock the watermark again in the next (as
    :func:`lock_watermark`), in one round trip; returns the watermark, or None when it could not
    be locked (the transaction committed, the next rolled back: :func:`lock_watermark` says why
    when asked again).  A failed commit raises as ``conn.commit()`` does (nothing after it ran)."""
    commit = None
    try:
        with conn.pipeline():
            commit = conn.execute("COMMIT")
            conn.execute("BEGIN")  # the lock held in a transaction of its own, not in the pipeline's implicit one
            cur = conn.execute(_LOCK_WATERMARK, (publication,))
        row = cur.fetchone()
    except psycopg.Error:
        if commit is None or commit.pgresult is None or commit.pgresult.status != psycopg.pq.ExecStatus.COMMAND_OK:
            raise  # the COMMIT failed (or was never sent): the pipeline ran nothing after it
        row = None
    if row is None:
        conn.rollback()
        return None
    return str(row[0])


def watermark_busy(publication: str, subscriber: str) -> AgentBusy:
    """The watermark is locked: another Distribution Agent delivers there (any subscriber engine)."""
    return AgentBusy(
        f"another Distribution Agent is delivering publication {publication!r} to "
        f"subscriber {subscriber!r}; wait for it to finish"
    )


def not_initialized(publication: str, subscriber: str) -> NotInitialized:
    """The subscriber has no watermark: no snapshot was loaded there (any subscriber engine)."""
    return NotInitialized(
        f"subscriber {subscriber!r} has no snapshot of publication {publication!r}: "
        f"run the Snapshot Agent to initialize the subscription"
    )


def watermark(conn: psycopg.Connection, publication: str) -> str | None:
    """The subscriber's watermark as committed, without locking it; None when it has none."""
    row = conn.execute(
        "SELECT xact_seqno::text FROM airflow_repl.subscription_state WHERE publication = %s", (publication,)
    ).fetchone()
    return str(row[0]) if row is not None else None


def set_watermark(conn: psycopg.Connection, publication: str, xact: str, transactions: int) -> None:
    """Move the watermark to ``xact``, ``transactions`` more applied; in the caller's
    transaction, which commits it together with the changes applied (exactly once)."""
    conn.execute(*watermark_move(publication, xact, transactions))


def watermark_move(publication: str, xact: str, transactions: int) -> tuple[str, tuple[str, int, str]]:
    """The statement of :func:`set_watermark` and its parameters, for a caller that sends it
    with others (in one pipeline)."""
    return (
        "UPDATE airflow_repl.subscription_state SET xact_seqno = %s, "
        "transactions = transactions + %s, updated_at = now() WHERE publication = %s",
        (xact, transactions, publication),
    )


def articles_hash(conn: psycopg.Connection, publication: str) -> str | None:
    """The hash of the article definitions the subscriber has since its last schema change
    (None: it has those it was initialized with)."""
    row = conn.execute(
        "SELECT pg_catalog.to_jsonb(s)->>'articles_hash' FROM airflow_repl.subscription_state s WHERE publication = %s",
        (publication,),
    ).fetchone()
    return str(row[0]) if row is not None and row[0] is not None else None


def set_articles_hash(conn: psycopg.Connection, publication: str, value: str) -> None:
    """Record the definitions a delivered schema change left (in the delivering transaction)."""
    conn.execute("ALTER TABLE airflow_repl.subscription_state ADD COLUMN IF NOT EXISTS articles_hash text")
    conn.execute(
        "UPDATE airflow_repl.subscription_state SET articles_hash = %s WHERE publication = %s", (value, publication)
    )


# ---------------------------------------------------------------------- questions of the Queue Reader Agent
@dataclass(frozen=True)
class QueuedCommand:
    """One row change a subscriber's application made, as its queue trigger recorded it; the
    images are the article's columns as JSON (destination names, ``msrepl_tran_version`` among
    them)."""

    id: int
    article: str
    op: str  # 'I', 'U' or 'D'
    old: dict[str, Any] | None
    new: dict[str, Any] | None
    old_version: str | None
    new_version: str | None


@dataclass(frozen=True)
class QueuedTransaction:
    """A subscriber transaction whose changes are queued, in commit order."""

    xid: int
    commit_seq: int


def queued_transactions(conn: psycopg.Connection[Any], publication: str, limit: int) -> list[QueuedTransaction]:
    """The publication's first ``limit`` queued transactions, in commit order ([] without a queue)."""
    if not has_queue(conn):
        return []
    rows = conn.execute(
        "SELECT xid::text::bigint, commit_seq FROM airflow_repl.queue_commits WHERE publication = %s "
        "ORDER BY commit_seq LIMIT %s",
        (publication, limit),
    ).fetchall()
    return [QueuedTransaction(int(xid), int(seq)) for xid, seq in rows]


def queued_commands(conn: psycopg.Connection[Any], publication: str, xid: int) -> list[QueuedCommand]:
    """The row changes of one queued transaction, in the order they were made."""
    rows = conn.execute(
        "SELECT id, article, op, old, new, old_version::text, new_version::text FROM airflow_repl.queue "
        "WHERE publication = %s AND xid = %s::text::xid8 ORDER BY id",
        (publication, xid),
    ).fetchall()
    return [QueuedCommand(*row) for row in rows]


def queued_later(conn: psycopg.Connection[Any], publication: str, xid: int, article: str, key: dict[str, Any]) -> bool:
    """Does another queued transaction change the row with this key (its old or new image)?"""
    row = conn.execute(
        "SELECT 1 FROM airflow_repl.queue WHERE publication = %s AND article = %s AND xid <> %s::text::xid8 "
        "AND (old @> %s OR new @> %s) LIMIT 1",
        (publication, article, xid, json_values.jsonb(key), json_values.jsonb(key)),
    ).fetchone()
    return row is not None


def ensure_taken(conn: psycopg.Connection[Any]) -> None:
    """Create ``airflow_repl.queue_taken`` where it is missing or older (a queue made before
    it, or before its ``via``); committed."""
    if not has_taken(conn):
        advisory_locks.lock_subscriber_schema(conn)
        conn.execute(TAKEN_DDL)
    conn.commit()


def has_taken(conn: psycopg.Connection[Any]) -> bool:
    """Does the subscriber have ``airflow_repl.queue_taken`` as it is now (with ``via``)?"""
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute WHERE attrelid = to_regclass('airflow_repl.queue_taken') "
        "AND attname = 'via' AND NOT attisdropped)"
    ).fetchone()
    return bool(row and row[0])


def record_taken(
    conn: psycopg.Connection[Any], publication: str, queue_id: int, key_names: list[str], publisher_xid: int
) -> None:
    """Remember the keys (old and new image, as the queue stored them) of queued command
    ``queue_id`` as taken by the publisher's transaction ``publisher_xid`` (in the caller's
    transaction, before the dequeue)."""
    conn.execute(
        "INSERT INTO airflow_repl.queue_taken (publication, article, key, publisher_xid) "
        "SELECT q.publication, q.article, "
        "(SELECT jsonb_object_agg(e.key, e.value) FROM jsonb_each(i.img) AS e WHERE e.key = ANY(%s)), %s "
        "FROM airflow_repl.queue AS q, LATERAL (VALUES (q.old), (q.new)) AS i(img) "
        "WHERE q.publication = %s AND q.id = %s AND i.img IS NOT NULL",
        (key_names, publisher_xid, publication, queue_id),
    )


def taken_xids(conn: psycopg.Connection[Any], publication: str) -> list[int]:
    """The publisher transactions whose taken rows are remembered."""
    rows = conn.execute(
        "SELECT DISTINCT publisher_xid FROM airflow_repl.queue_taken WHERE publication = %s", (publication,)
    ).fetchall()
    return [int(r[0]) for r in rows]


def taken_rows(
    conn: psycopg.Connection[Any], publication: str, article: str, table: tuple[str, str], key: list[str]
) -> list[tuple[int, str, Any, list[str]]]:
    """The taken keys of ``article`` (its subscriber ``table``: schema and name; ``key``: its
    primary key's columns): (publisher_xid, via, the key as JSON, the key's values as text).  The
    text is each value's output (``format('%s', ...)``) once read into the table's column type,
    under the session's pinned settings: the text form the publisher's commands carry."""
    query = sql.SQL(
        "SELECT t.publisher_xid, t.via, t.key, ARRAY[{}] FROM airflow_repl.queue_taken t, "
        "pg_catalog.jsonb_populate_record(NULL::{}, t.key) AS r WHERE t.publication = %s AND t.article = %s"
    ).format(
        sql.SQL(", ").join(sql.SQL("pg_catalog.format('%%s', r.{})").format(sql.Identifier(c)) for c in key),
        sql.Identifier(*table),
    )
    rows = conn.execute(query, (publication, article)).fetchall()
    return [(int(x), str(via), k, list(text)) for x, via, k, text in rows]


def taken_articles(conn: psycopg.Connection[Any], publication: str) -> list[str]:
    """The articles with taken keys."""
    rows = conn.execute(
        "SELECT DISTINCT article FROM airflow_repl.queue_taken WHERE publication = %s", (publication,)
    ).fetchall()
    return [str(r[0]) for r in rows]


def forget_taken(conn: psycopg.Connection[Any], publication: str, xids: list[int]) -> None:
    """Forget the taken rows of transactions the Distribution Agent has passed (caller's transaction)."""
    conn.execute(
        "DELETE FROM airflow_repl.queue_taken WHERE publication = %s AND publisher_xid = ANY(%s)", (publication, xids)
    )


def dequeue(conn: psycopg.Connection[Any], publication: str, xid: int) -> None:
    """Remove a queued transaction that the publisher has taken (in the caller's transaction)."""
    conn.execute("DELETE FROM airflow_repl.queue WHERE publication = %s AND xid = %s::text::xid8", (publication, xid))
    conn.execute(
        "DELETE FROM airflow_repl.queue_commits WHERE publication = %s AND xid = %s::text::xid8", (publication, xid)
    )


def oldest_queued_xid(conn: psycopg.Connection[Any], publication: str) -> int | None:
    """The smallest transaction id in the publication's queue (None: the queue is empty)."""
    if not has_queue(conn):
        return None
    row = conn.execute(
        "SELECT min(xid::text::bigint) FROM airflow_repl.queue_commits WHERE publication = %s", (publication,)
    ).fetchone()
    return int(row[0]) if row is not None and row[0] is not None else None


def queue_depth(conn: psycopg.Connection[Any], publication: str) -> int:
    """How many transactions of the publication wait in the queue."""
    if not has_queue(conn):
        return 0
    row = conn.execute(
        "SELECT count(*) FROM airflow_repl.queue_commits WHERE publication = %s", (publication,)
    ).fetchone()
    return int(row[0]) if row else 0


# ---------------------------------------------------------------------- questions of airflow-repl drop
def forget_publication(conn: psycopg.Connection[Any], publication: str) -> None:
    """A dropped subscription: its watermark, snapshot ledger rows and queued changes (with the
    queue's taken rows) at the subscriber, in the caller's transaction."""
    for table in ("subscription_state", "snapshot_files", "queue", "queue_commits", "queue_taken"):
        if conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"airflow_repl.{table}",)).fetchone() == (True,):
            conn.execute(
                sql.SQL("DELETE FROM airflow_repl.{} WHERE publication = %s").format(sql.Identifier(table)),
                (publication,),
            )


def forget_queued_article(conn: psycopg.Connection[Any], publication: str, article: str) -> int:
    """A dropped article: its queued changes, and the queued transactions left without any,
    in the caller's transaction; returns the queued changes deleted."""
    if not has_queue(conn):
        return 0
    cur = conn.execute("DELETE FROM airflow_repl.queue WHERE publication = %s AND article = %s", (publication, article))
    conn.execute(
        "DELETE FROM airflow_repl.queue_commits c WHERE c.publication = %s AND NOT EXISTS "
        "(SELECT 1 FROM airflow_repl.queue q WHERE q.publication = c.publication AND q.xid = c.xid)",
        (publication,),
    )
    if has_taken(conn):
        conn.execute(
            "DELETE FROM airflow_repl.queue_taken WHERE publication = %s AND article = %s", (publication, article)
        )
    return cur.rowcount


def drop_unused_queue(conn: psycopg.Connection[Any]) -> bool:
    """Drop the queue, its tables, sequence and functions when no table's trigger captures into
    it any more and it holds nothing (the last queued subscription dropped); True when dropped.
    In the caller's transaction."""
    if not has_queue(conn) or _function_in_use(conn, "airflow_repl.queue_capture()"):
        return False
    if conn.execute("SELECT EXISTS (SELECT 1 FROM airflow_repl.queue)").fetchone() == (True,):
        return False
    conn.execute(
        "DROP TABLE IF EXISTS airflow_repl.queue, airflow_repl.queue_commits, airflow_repl.queue_taken; "
        "DROP SEQUENCE IF EXISTS airflow_repl.queue_commit_seq; "
        "DROP FUNCTION IF EXISTS airflow_repl.queue_capture(), airflow_repl.queue_commit()"
    )
    return True


def _function_in_use(conn: psycopg.Connection[Any], signature: str) -> bool:
    """Does a trigger of any table call the function ``signature`` (None: it does not exist)?"""
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger WHERE tgfoid = to_regprocedure(%s))", (signature,)
    ).fetchone()
    return bool(row and row[0])


def drop_unused_row_version_function(conn: psycopg.Connection[Any]) -> bool:
    """Drop ``airflow_repl.tran_version()`` (the row-version trigger's function of updatable
    subscriptions) when no trigger calls it any more; True when dropped (caller's transaction)."""
    signature = "airflow_repl.tran_version()"
    row = conn.execute("SELECT to_regprocedure(%s) IS NOT NULL", (signature,)).fetchone()
    if not (row and row[0]) or _function_in_use(conn, signature):
        return False
    conn.execute("DROP FUNCTION airflow_repl.tran_version()")
    return True


def has_state(conn: psycopg.Connection[Any]) -> bool:
    """Does the subscriber have ``airflow_repl.subscription_state`` (a snapshot was ever loaded)?"""
    row = conn.execute("SELECT to_regclass('airflow_repl.subscription_state') IS NOT NULL").fetchone()
    return bool(row and row[0])


def table_exists(conn: psycopg.Connection[Any], schema: str, table: str) -> bool:
    """Does the table ``schema.table`` exist at the subscriber?"""
    row = conn.execute(
        "SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s",
        (schema, table),
    ).fetchone()
    return row is not None
