"""The ``airflow_repl`` tables of an immediate updating subscriber.

- ``immediate_publisher``: per publication, the connection string of the publisher the
  immediate-updating triggers connect to through ``dblink``, the subscriber's name and the
  prefix of its global transaction ids.  Readable by its owner only (REVOKE ... FROM PUBLIC):
  the triggers' functions are SECURITY DEFINER.  Never logged.
- ``immediate_gids``: the gid of every subscriber transaction prepared at the publisher,
  recorded in that same (local) transaction, so a row exists exactly when the local transaction
  committed; the resolver (:mod:`~airflow_repl.engine.subscriber.in_doubt`) commits those at the
  publisher and then forgets them.
- ``queue_taken`` (:data:`~airflow_repl.engine.state.subscriber_state.TAKEN_DDL`, shared with
  queued updating): the trigger records there every key a transaction changed, with the
  publisher transaction's id, in the same local transaction.

Owns: :data:`IMMEDIATE_DDL` and one function per question asked about these tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg

from airflow_repl.engine.postgres import advisory_locks
from airflow_repl.engine.state import subscriber_state


@dataclass(frozen=True)
class PublisherLink:
    """What an immediate subscriber's triggers need to reach the publisher."""

    subscriber: str  # the subscriber's name in the topology
    gid_prefix: str  # naming.immediate_gid_prefix(publication, subscriber)
    origin: str  # naming.queue_origin(subscriber): the origin its changes commit under
    conninfo: str = field(repr=False)  # the publisher's connection string (never logged)


IMMEDIATE_DDL = """
CREATE SCHEMA IF NOT EXISTS airflow_repl;
CREATE TABLE IF NOT EXISTS airflow_repl.immediate_publisher (
    publication  text PRIMARY KEY,
    subscriber   text NOT NULL,
    gid_prefix   text NOT NULL,
    origin       text NOT NULL,
    conninfo     text NOT NULL
);
REVOKE ALL ON airflow_repl.immediate_publisher FROM PUBLIC;
CREATE TABLE IF NOT EXISTS airflow_repl.immediate_gids (
    gid          text PRIMARY KEY,
    publication  text NOT NULL,
    xid          xid8 NOT NULL,
    prepared_at  timestamptz NOT NULL DEFAULT clock_timestamp()  -- after the PREPARE
);
REVOKE ALL ON airflow_repl.immediate_gids FROM PUBLIC;
"""


def ensure_immediate(conn: psycopg.Connection[Any]) -> str:
    """Create the tables and the ``dblink`` extension where they are missing (in the caller's
    transaction); returns the schema holding dblink's functions."""
    advisory_locks.lock_subscriber_schema(conn)
    conn.execute(IMMEDIATE_DDL)
    conn.execute(subscriber_state.TAKEN_DDL)
    conn.execute("CREATE EXTENSION IF NOT EXISTS dblink WITH SCHEMA airflow_repl")
    row = conn.execute(
        "SELECT n.nspname FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace "
        "WHERE e.extname = 'dblink'"
    ).fetchone()
    assert row is not None  # created just above
    return str(row[0])


def set_publisher(conn: psycopg.Connection[Any], publication: str, publisher: PublisherLink) -> None:
    """Record (or replace) the publisher the publication's triggers connect to."""
    conn.execute(
        "INSERT INTO airflow_repl.immediate_publisher (publication, subscriber, gid_prefix, origin, conninfo) "
        "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (publication) DO UPDATE SET subscriber = excluded.subscriber, "
        "gid_prefix = excluded.gid_prefix, origin = excluded.origin, conninfo = excluded.conninfo",
        (publication, publisher.subscriber, publisher.gid_prefix, publisher.origin, publisher.conninfo),
    )


def has_immediate(conn: psycopg.Connection[Any]) -> bool:
    """The subscriber has the immediate-updating tables."""
    row = conn.execute("SELECT to_regclass('airflow_repl.immediate_gids') IS NOT NULL").fetchone()
    return bool(row and row[0])


def transaction_outcome(conn: psycopg.Connection[Any], gid: str, xid: int) -> tuple[str | None, bool]:
    """(``pg_xact_status`` of the local transaction: committed, aborted, in progress, or None
    when too old to know; whether its gid is recorded)."""
    row = conn.execute(
        "SELECT pg_catalog.pg_xact_status(%s::text::xid8), EXISTS (SELECT 1 FROM airflow_repl.immediate_gids "
        "WHERE gid = %s)",
        (xid, gid),
    ).fetchone()
    assert row is not None
    return (None if row[0] is None else str(row[0])), bool(row[1])


def clock(conn: psycopg.Connection[Any]) -> datetime:
    """The subscriber's clock (compared with ``immediate_gids.prepared_at``)."""
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    now: datetime = row[0]
    return now


def forget_gids(
    conn: psycopg.Connection[Any], publication: str, gid_prefix: str, still_prepared: list[str], before: datetime
) -> int:
    """Forget the recorded gids no longer prepared at the publisher (finished), among those
    recorded before ``before`` (the subscriber's clock when the publisher was listed: a gid
    recorded later may be prepared still); returns how many."""
    cur = conn.execute(
        "DELETE FROM airflow_repl.immediate_gids WHERE publication = %s AND starts_with(gid, %s) "
        "AND gid <> ALL(%s) AND prepared_at < %s",
        (publication, gid_prefix, still_prepared, before),
    )
    return cur.rowcount


# ---------------------------------------------------------------------- questions of airflow-repl drop
#: The functions the immediate-updating set-up creates in schema ``airflow_repl``.
_FUNCTIONS = (
    "airflow_repl.immediate_begin(text)",
    "airflow_repl.immediate_reject(text, text, text[], jsonb, text)",
    "airflow_repl.immediate_capture()",
    "airflow_repl.immediate_prepare()",
)


def forget_publication(conn: psycopg.Connection[Any], publication: str) -> None:
    """A dropped immediate subscription: its publisher link and recorded gids (caller's transaction)."""
    if has_immediate(conn):
        conn.execute("DELETE FROM airflow_repl.immediate_publisher WHERE publication = %s", (publication,))
        conn.execute("DELETE FROM airflow_repl.immediate_gids WHERE publication = %s", (publication,))


def drop_unused(conn: psycopg.Connection[Any]) -> bool:
    """Drop the immediate-updating functions, tables and the ``dblink`` extension the set-up
    created in schema ``airflow_repl`` once no publication links this subscriber to a publisher
    and no trigger calls them (the last immediate subscription dropped); True when dropped.
    In the caller's transaction."""
    if not has_immediate(conn):
        return False
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM airflow_repl.immediate_publisher) OR EXISTS (SELECT 1 FROM "
        "pg_catalog.pg_trigger WHERE tgfoid IN (to_regprocedure(%s), to_regprocedure(%s)))",
        (_FUNCTIONS[2], _FUNCTIONS[3]),
    ).fetchone()
    if row is None or row[0]:
        return False
    conn.execute(
        "DROP FUNCTION IF EXISTS " + ", ".join(_FUNCTIONS) + "; "
        "DROP TABLE IF EXISTS airflow_repl.immediate_publisher, airflow_repl.immediate_gids"
    )
    ext = conn.execute(
        "SELECT n.nspname FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace "
        "WHERE e.extname = 'dblink'"
    ).fetchone()
    if ext is not None and ext[0] == "airflow_repl":  # the set-up's own (created WITH SCHEMA airflow_repl)
        conn.execute("DROP EXTENSION dblink")
    return True
