"""The ``airflow_repl`` schema at the publisher, kept by the Queue Reader Agent: which queued
subscriber transactions the publisher has taken, and the replication origin it applies them under.

``airflow_repl.queue_applied`` gets a transaction's row in the same publisher transaction that
applies (or rejects) it, so the row exists exactly when its effect does: a Queue Reader killed
after that commit finds the row on its next run and only finishes the subscriber's side
(records the conflicts, compensates, dequeues), never applying the transaction twice.  The row
keeps the outcome needed for that (resolution, conflicts, keys to compensate).

``airflow_repl.schema_changes`` lists the schema changes (``airflow-repl schema-change``) the
Log Reader has not stored yet: ``apply`` and the Snapshot Agent refuse to record new article
definitions while one is in flight, since the changes before it still have the old columns.

Owns: :data:`PUBLISHER_DDL` and one function per question the Queue Reader, the Log Reader and
``schema-change`` ask at the publisher.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from airflow_repl.engine.postgres import advisory_locks, json_values, pgoutput

PUBLISHER_DDL = """
CREATE SCHEMA IF NOT EXISTS airflow_repl;
CREATE TABLE IF NOT EXISTS airflow_repl.queue_applied (
    publication  text NOT NULL,
    subscriber   text NOT NULL,
    xid          xid8 NOT NULL,
    applied_at   timestamptz NOT NULL DEFAULT now(),
    outcome      jsonb NOT NULL,
    PRIMARY KEY (publication, subscriber, xid)
);
-- schema changes made by airflow-repl schema-change that the Log Reader has not stored yet
-- (inserted in the change's transaction; deleted by the Log Reader once it stored the change)
CREATE TABLE IF NOT EXISTS airflow_repl.schema_changes (
    change_id    bigserial PRIMARY KEY,
    publication  text NOT NULL,
    article      text NOT NULL,
    statement    text NOT NULL,
    made_at      timestamptz NOT NULL DEFAULT now()
);
"""


def ensure_schema(conn: psycopg.Connection[Any]) -> None:
    """Create the publisher's ``airflow_repl.queue_applied`` where it is missing, and commit."""
    with conn.transaction():
        advisory_locks.lock_publisher_schema(conn)
        conn.execute(PUBLISHER_DDL)


def use_origin(conn: psycopg.Connection[Any], origin: str) -> None:
    """Create the replication origin where it is missing and make it this session's: every
    transaction the session commits is marked with it in the WAL (and so in what the Log Reader
    decodes).  An origin another session uses raises ObjectInUse."""
    with conn.transaction():
        advisory_locks.lock_origin_creation(conn)
        conn.execute(
            "SELECT pg_catalog.pg_replication_origin_create(%s) WHERE pg_catalog.pg_replication_origin_oid(%s) IS NULL",
            (origin, origin),
        )
    conn.execute("SELECT pg_catalog.pg_replication_origin_session_setup(%s)", (origin,))
    conn.commit()


def applied(conn: psycopg.Connection[Any], publication: str, subscriber: str, xid: int) -> dict[str, Any] | None:
    """The stored outcome of a queued transaction the publisher has taken, or None."""
    row = conn.execute(
        "SELECT outcome FROM airflow_repl.queue_applied WHERE publication = %s AND subscriber = %s "
        "AND xid = %s::text::xid8",
        (publication, subscriber, xid),
    ).fetchone()
    return dict(row[0]) if row is not None else None


def record_applied(
    conn: psycopg.Connection[Any], publication: str, subscriber: str, xid: int, outcome: dict[str, Any]
) -> None:
    """The publisher has taken the queued transaction (in the transaction that applies it)."""
    conn.execute(
        "INSERT INTO airflow_repl.queue_applied (publication, subscriber, xid, outcome) "
        "VALUES (%s, %s, %s::text::xid8, %s)",
        (publication, subscriber, xid, json_values.jsonb(outcome)),
    )


def stamp_commit_time(conn: psycopg.Connection[Any]) -> None:
    """The transaction in progress, committed under the session's replication origin, carries the
    publisher's clock as its origin timestamp: logical decoding reports that timestamp as the
    commit time (unset, it would be 0: 2000-01-01), so lag and ``--until`` see when it committed."""
    conn.execute("SELECT pg_catalog.pg_replication_origin_xact_setup('0/0', pg_catalog.clock_timestamp())")


def without_origin(conn: psycopg.Connection[Any]) -> None:
    """The transaction in progress commits without the session's replication origin (the
    caller sets the origin up again with :func:`use_origin` after the commit)."""
    conn.execute("SELECT pg_catalog.pg_replication_origin_session_reset()")


def forget_applied(conn: psycopg.Connection[Any], publication: str, subscriber: str, below: int | None) -> int:
    """Forget the taken transactions of the subscriber's queue with ids below ``below`` (all
    with None): they are no longer queued, so no re-run can meet them again.  Returns how many."""
    cur = conn.execute(
        "DELETE FROM airflow_repl.queue_applied WHERE publication = %s AND subscriber = %s "
        "AND (%s::bigint IS NULL OR xid < %s::text::xid8)",
        (publication, subscriber, below, below),
    )
    conn.commit()
    return cur.rowcount


def current_xid(conn: psycopg.Connection[Any]) -> int:
    """The (32-bit) id of the current transaction, as the Log Reader records it."""
    row = conn.execute(f"SELECT {pgoutput.CURRENT_XID_SQL}").fetchone()
    assert row is not None
    return int(row[0])


def record_schema_change(conn: psycopg.Connection[Any], publication: str, article: str, statement: str) -> int:
    """Note a schema change in the caller's transaction (the one that makes it); its id."""
    row = conn.execute(
        "INSERT INTO airflow_repl.schema_changes (publication, article, statement) VALUES (%s, %s, %s) "
        "RETURNING change_id",
        (publication, article, statement),
    ).fetchone()
    assert row is not None
    return int(row[0])


def forget_schema_changes(conn: psycopg.Connection[Any], ids: list[int]) -> None:
    """The Log Reader stored these schema changes (committed at the distributor)."""
    if ids and conn.execute("SELECT to_regclass('airflow_repl.schema_changes') IS NOT NULL").fetchone() == (True,):
        conn.execute("DELETE FROM airflow_repl.schema_changes WHERE change_id = ANY(%s)", (ids,))


def unread_schema_changes(conn: psycopg.Connection[Any], publication: str) -> list[tuple[str, str]]:
    """(article, statement) of the publication's schema changes the Log Reader has not stored."""
    if conn.execute("SELECT to_regclass('airflow_repl.schema_changes') IS NOT NULL").fetchone() != (True,):
        return []
    rows = conn.execute(
        "SELECT article, statement FROM airflow_repl.schema_changes WHERE publication = %s ORDER BY change_id",
        (publication,),
    ).fetchall()
    return [(str(a), str(s)) for a, s in rows]


# ---------------------------------------------------------------------- questions of airflow-repl drop
def forget_subscriber(conn: psycopg.Connection[Any], publication: str, subscriber: str) -> int:
    """A dropped subscription: the queued transactions of it the publisher took (caller's transaction)."""
    if conn.execute("SELECT to_regclass('airflow_repl.queue_applied') IS NOT NULL").fetchone() != (True,):
        return 0
    cur = conn.execute(
        "DELETE FROM airflow_repl.queue_applied WHERE publication = %s AND subscriber = %s", (publication, subscriber)
    )
    return cur.rowcount


def forget_publication(conn: psycopg.Connection[Any], publication: str) -> None:
    """A dropped publication: its rows in the publisher's ``airflow_repl`` tables (caller's transaction)."""
    for table in ("queue_applied", "schema_changes"):
        if conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"airflow_repl.{table}",)).fetchone() == (True,):
            conn.execute(
                sql.SQL("DELETE FROM airflow_repl.{} WHERE publication = %s").format(sql.Identifier(table)),
                (publication,),
            )


def drop_origin(conn: psycopg.Connection[Any], origin: str) -> bool:
    """Drop the replication origin where it exists (a session using it raises ObjectInUse);
    True when dropped.  Committed."""
    with conn.transaction():
        row = conn.execute(
            "SELECT pg_catalog.pg_replication_origin_drop(%s) FROM (SELECT 1) x "
            "WHERE pg_catalog.pg_replication_origin_oid(%s) IS NOT NULL",
            (origin, origin),
        ).fetchone()
    return row is not None


def prepared_with_prefix(conn: psycopg.Connection[Any], prefix: str) -> int:
    """How many transactions prepared at the publisher have a gid starting with ``prefix``."""
    row = conn.execute(
        "SELECT count(*) FROM pg_catalog.pg_prepared_xacts WHERE starts_with(gid, %s)", (prefix,)
    ).fetchone()
    return int(row[0]) if row else 0
