"""Retention in the distribution database: which stored transactions every subscription still
needs, expiring subscriptions idle past the maximum retention, and deleting what no
subscription needs (SQL Server's distribution clean-up).  The tables are
:mod:`~airflow_repl.engine.state.dist_schema`'s (``cleanup_state`` is in its migrations).

What a subscription *holds* (needs kept), by status:

* ``expired``: nothing (it must be reinitialized);
* ``pending`` / ``initializing``: every transaction after its ``start_xact_seqno`` when it has
  one, else nothing: its snapshot is taken after everything stored now (the cleanup agent holds
  the Snapshot Agent's lock, so no snapshot is being taken meanwhile);
* any other (``active``, ``reinitialize``): every transaction after ``delivered_xact_seqno``
  (or ``start_xact_seqno``; everything when it has neither).

A paused subscription (``paused``, airflow-repl pause) keeps its status: it holds what it has not
received and expires by the same rule as any other.

A transaction may be deleted when no subscription holds it and it entered the distribution
database before the minimum retention; deletion proceeds in commit order from the last position
cleaned up (``cleanup_state``) and stops at the first transaction that may not be deleted.
Transaction rows of changes that came from an updatable subscriber (``origin`` set) keep their
row (not their commands): a queued subscriber's Distribution Agent locates them by transaction
id.  Every function leaves the transaction to its caller.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg

from airflow_repl.engine.errors import ReplError

#: SQL: the position every subscription holding something has (NULL: none holds anything),
#: and the subscriptions at that position.
_HOLDS = """
WITH holds AS (
    SELECT subscriber, CASE
        WHEN status = 'expired' THEN NULL
        WHEN status IN ('pending', 'initializing') THEN start_xact_seqno
        ELSE coalesce(delivered_xact_seqno, start_xact_seqno, '0/0'::pg_lsn) END AS pos
    FROM airflow_repl.subscriptions WHERE publication = %(p)s
)
SELECT (SELECT min(pos) FROM holds)::text,
       (SELECT array_agg(subscriber ORDER BY subscriber) FROM holds WHERE pos = (SELECT min(pos) FROM holds))
"""


@dataclass(frozen=True)
class Hold:
    """What the subscriptions of a publication still need: everything after ``bound`` (None:
    nothing), and the subscriptions at that position (the ones holding the cleanup back)."""

    bound: str | None
    held_by: list[str]


@dataclass(frozen=True)
class Candidate:
    """A stored transaction after the cleaned-up position, and whether it may be deleted."""

    xact: str
    command_count: int
    deletable: bool


@dataclass(frozen=True)
class Expired:
    """A subscription the cleanup marked expired."""

    subscriber: str
    last_sync: datetime | None
    waiting_since: datetime
    paused: bool = False  # it was paused (airflow-repl pause): reinitialized, it stays paused


def hold(conn: psycopg.Connection[Any], publication: str) -> Hold:
    """Where the publication's subscriptions hold the stored transactions (see the module)."""
    row = conn.execute(_HOLDS, {"p": publication}).fetchone()
    assert row is not None  # the statement returns one row
    return Hold(row[0], list(row[1] or []))


def expire_subscriptions(conn: psycopg.Connection[Any], publication: str, max_retention: timedelta) -> list[Expired]:
    """Mark 'expired' the active subscriptions not synchronized within ``max_retention`` whose
    oldest undelivered transaction entered before it too.  A Distribution Agent delivering one
    holds its row (:func:`lock_unexpired`), and its delivery renews ``delivered_at``, which the
    update checks again after the wait."""
    rows = conn.execute(
        "WITH expiring AS (SELECT s.publication, s.subscriber, coalesce(s.delivered_at, s.initialized_at) AS last_sync, "
        "(SELECT t.entry_time FROM airflow_repl.transactions AS t WHERE t.publication = s.publication "
        "AND t.xact_seqno > coalesce(s.delivered_xact_seqno, s.start_xact_seqno, '0/0'::pg_lsn) "
        "ORDER BY t.xact_seqno LIMIT 1) AS waiting_since FROM airflow_repl.subscriptions AS s "
        "WHERE s.publication = %(p)s AND s.status = 'active') "
        "UPDATE airflow_repl.subscriptions AS s SET status = 'expired' FROM expiring AS e "
        "WHERE s.publication = e.publication AND s.subscriber = e.subscriber AND s.status = 'active' "
        "AND coalesce(s.delivered_at, s.initialized_at, '-infinity') < now() - %(max)s "
        "AND e.waiting_since < now() - %(max)s "
        "RETURNING s.subscriber, e.last_sync, e.waiting_since, s.paused",
        {"p": publication, "max": max_retention},
    ).fetchall()
    return sorted((Expired(str(s), last, waiting, bool(p)) for s, last, waiting, p in rows), key=lambda e: e.subscriber)


def cleaned_position(conn: psycopg.Connection[Any], publication: str) -> str:
    """Every transaction of the publication up to this position was cleaned up ('0/0': none)."""
    row = conn.execute(
        "SELECT cleaned_xact_seqno::text FROM airflow_repl.cleanup_state WHERE publication = %s", (publication,)
    ).fetchone()
    return str(row[0]) if row is not None else "0/0"


def candidates(
    conn: psycopg.Connection[Any], publication: str, after: str, bound: Hold, min_retention: timedelta, limit: int
) -> list[Candidate]:
    """Up to ``limit`` stored transactions after ``after``, in commit order, each saying whether
    no subscription holds it and it is older than ``min_retention``."""
    rows = conn.execute(
        "SELECT t.xact_seqno::text, t.command_count, "
        "(%(bound)s::pg_lsn IS NULL OR t.xact_seqno <= %(bound)s::pg_lsn) AND t.entry_time < now() - %(min)s "
        "FROM airflow_repl.transactions AS t WHERE t.publication = %(p)s AND t.xact_seqno > %(after)s::pg_lsn "
        "ORDER BY t.xact_seqno LIMIT %(limit)s",
        {"p": publication, "after": after, "bound": bound.bound, "min": min_retention, "limit": limit},
    ).fetchall()
    return [Candidate(str(x), int(n), bool(ok)) for x, n, ok in rows]


def delete_commands(conn: psycopg.Connection[Any], publication: str, first: str, last: str, limit: int) -> int:
    """Delete up to ``limit`` commands of the transactions ``first``..``last``; how many."""
    cur = conn.execute(
        "DELETE FROM airflow_repl.commands WHERE (publication, xact_seqno, command_id) IN ("
        "SELECT publication, xact_seqno, command_id FROM airflow_repl.commands WHERE publication = %s "
        "AND xact_seqno BETWEEN %s::pg_lsn AND %s::pg_lsn LIMIT %s)",
        (publication, first, last, limit),
    )
    return cur.rowcount


def delete_transactions(conn: psycopg.Connection[Any], publication: str, first: str, last: str) -> tuple[int, int]:
    """Delete the transactions ``first``..``last`` (their commands deleted first), keeping the
    rows of those that came from an updatable subscriber; returns (deleted, kept), and records
    ``last`` as cleaned up."""
    cur = conn.execute(
        "DELETE FROM airflow_repl.transactions WHERE publication = %s AND xact_seqno BETWEEN %s::pg_lsn "
        "AND %s::pg_lsn AND origin IS NULL",
        (publication, first, last),
    )
    deleted = cur.rowcount
    row = conn.execute(
        "SELECT count(*) FROM airflow_repl.transactions WHERE publication = %s "
        "AND xact_seqno BETWEEN %s::pg_lsn AND %s::pg_lsn",
        (publication, first, last),
    ).fetchone()
    conn.execute(
        "INSERT INTO airflow_repl.cleanup_state (publication, cleaned_xact_seqno) VALUES (%s, %s) "
        "ON CONFLICT (publication) DO UPDATE SET cleaned_xact_seqno = excluded.cleaned_xact_seqno, updated_at = now()",
        (publication, last),
    )
    return deleted, int(row[0]) if row is not None else 0


def lock_unexpired(conn: psycopg.Connection[Any], publication: str, subscriber: str) -> bool:
    """Refuse an expired subscription; otherwise hold its row until the transaction ends, so
    that the cleanup cannot expire it (and delete what it needs), nor ``pause`` pause it, while
    a batch is delivered.  Returns whether it is paused."""
    return unexpired(conn.execute(UNEXPIRED_QUERY, (publication, subscriber)).fetchone(), publication, subscriber)


#: SQL (publication, subscriber): the subscription's status and pause, its row held (FOR SHARE)
#: until the transaction ends (:func:`lock_unexpired`; a caller sending it in a pipeline gives
#: its row to :func:`unexpired`).
UNEXPIRED_QUERY = (
    "SELECT status, paused FROM airflow_repl.subscriptions WHERE publication = %s AND subscriber = %s FOR SHARE"
)


def unexpired(row: tuple[Any, ...] | None, publication: str, subscriber: str) -> bool:
    """:data:`UNEXPIRED_QUERY`'s row: refuse an expired subscription; whether it is paused."""
    if row is not None and row[0] == "expired":
        raise ReplError(expired_message(publication, subscriber, bool(row[1])))
    return row is not None and bool(row[1])


def expired_message(publication: str, subscriber: str, paused: bool = False) -> str:
    """What an expired subscription's refusal says: its name and the fix (``paused``: it expired
    while paused, and stays paused once reinitialized)."""
    why = "it was paused and" if paused else "it was"
    after = "; it stays paused: resume it then (airflow-repl resume)" if paused else ""
    return (
        f"the subscription of subscriber {subscriber!r} to publication {publication!r} expired: {why} not "
        f"synchronized within the publication's maximum retention, and the commands it missed may be cleaned up; "
        f"reinitialize it: run the Snapshot Agent with reinitialize for it ({reinitialize_command(publication, subscriber)})"
        f"{after}"
    )


def reinitialize_command(publication: str, subscriber: str) -> str:
    """The command line that reinitializes the subscription (names quoted for a POSIX shell)."""
    return f"airflow-repl snapshot -p {shlex.quote(publication)} --subscriber {shlex.quote(subscriber)} --reinitialize"
