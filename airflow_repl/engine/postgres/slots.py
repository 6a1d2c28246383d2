"""A publication's logical replication slot at the publisher (pgoutput): whether it exists,
creating it with an exported snapshot (and joining that snapshot), and its positions.  Its changes
are read over the streaming replication protocol (:mod:`~airflow_repl.engine.postgres.replication_stream`).

Positions are passed as pg_lsn text and compared by the server as ``pg_lsn``, never as text.
Transactions are the caller's: each function leaves its connection's transaction open.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql


def exists(conn: psycopg.Connection[Any], slot: str) -> bool:
    """Is there a replication slot named ``slot`` at the server?"""
    row = conn.execute("SELECT 1 FROM pg_catalog.pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    return row is not None


def drop(conn: psycopg.Connection[Any], slot: str) -> bool:
    """Drop the slot where it exists, releasing the WAL it kept; True when dropped.  A slot a
    session is reading (a running Log Reader) raises ObjectInUse."""
    row = conn.execute(
        "SELECT pg_catalog.pg_drop_replication_slot(slot_name) FROM pg_catalog.pg_replication_slots "
        "WHERE slot_name = %s",
        (slot,),
    ).fetchone()
    return row is not None


def retained_wal_bytes(conn: psycopg.Connection[Any], slot: str) -> int | None:
    """How much WAL (bytes) the slot keeps at the server: from its ``restart_lsn`` to the current
    write position; None when there is no such slot (0 before it has a restart position)."""
    row = conn.execute(
        "SELECT coalesce((pg_catalog.pg_current_wal_lsn() - restart_lsn)::bigint, 0) "
        "FROM pg_catalog.pg_replication_slots WHERE slot_name = %s",
        (slot,),
    ).fetchone()
    return int(row[0]) if row is not None else None


def current_flush_lsn(conn: psycopg.Connection[Any]) -> str:
    """Where the server's WAL is flushed up to now."""
    row = conn.execute("SELECT pg_catalog.pg_current_wal_flush_lsn()::text").fetchone()
    assert row is not None  # the function always returns one row
    return str(row[0])


def create_with_snapshot(repl_conn: psycopg.Connection[Any], slot: str, permanent: bool) -> tuple[str, str]:
    """Create a logical slot on a replication connection (``replication="database"``,
    autocommit) and export its snapshot; returns the consistent point and the snapshot's name.
    The connection must stay open, and idle, while readers use the snapshot; a temporary slot
    is dropped when it closes."""
    kind = "" if permanent else " TEMPORARY"
    row = repl_conn.execute(
        sql.SQL("CREATE_REPLICATION_SLOT {}{} LOGICAL pgoutput (SNAPSHOT 'export')").format(
            sql.Identifier(slot), sql.SQL(kind)
        )
    ).fetchone()
    assert row is not None  # the command returns one row: slot, consistent point, snapshot, plugin
    return str(row[1]), str(row[2])


def join_snapshot(conn: psycopg.Connection[Any], snapshot_name: str) -> None:
    """Start, on an autocommit connection, a read-only transaction that sees the database as the
    exported snapshot does (end it with ``COMMIT``)."""
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_name)))


def confirmed_flush_lsn(conn: psycopg.Connection[Any], slot: str) -> str | None:
    """Where the slot was advanced to (everything committed before it was read); None without the slot."""
    row = conn.execute(
        "SELECT confirmed_flush_lsn::text FROM pg_catalog.pg_replication_slots WHERE slot_name = %s", (slot,)
    ).fetchone()
    return str(row[0]) if row is not None and row[0] is not None else None


def current_wal_lsn(conn: psycopg.Connection[Any]) -> str:
    """The server's current WAL write position: every transaction committed so far ends before it."""
    row = conn.execute("SELECT pg_catalog.pg_current_wal_lsn()::text").fetchone()
    assert row is not None  # the function always returns one row
    return str(row[0])
