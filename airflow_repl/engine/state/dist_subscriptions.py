"""The distribution database's subscriptions: their options and update mode, their status
through initialization (pending, initializing, active, reinitialize), what was delivered to each
and the article definitions each has."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from airflow_repl.engine.state.dist_schema import deployed


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
    if not deployed(conn, "subscriptions"):
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


def active_subscriptions(conn: psycopg.Connection[Any], publication: str) -> dict[str, str | None]:
    """The publication's active subscribers -> the hash of the article definitions each was
    initialized with (None for a subscription initialized before hashes were kept); {} before
    the distribution database has its schema."""
    if not deployed(conn, "subscriptions"):
        return {}
    rows = conn.execute(
        "SELECT subscriber, articles_hash FROM airflow_repl.subscriptions WHERE publication = %s AND status = 'active'",
        (publication,),
    ).fetchall()
    return {str(subscriber): articles_hash for subscriber, articles_hash in rows}


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


def subscription_articles_hash(conn: psycopg.Connection, publication: str, subscriber: str) -> str | None:
    """The hash of the article definitions the subscriber has as of its recorded delivery: those
    it was initialized with, or those a delivered schema change left (None: not recorded)."""
    row = conn.execute(
        "SELECT articles_hash FROM airflow_repl.subscriptions WHERE publication = %s AND subscriber = %s",
        (publication, subscriber),
    ).fetchone()
    return str(row[0]) if row is not None and row[0] is not None else None


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


# ---------------------------------------------------------------------- pause and resume
def subscription_paused(conn: psycopg.Connection[Any], publication: str, subscriber: str) -> bool | None:
    """Is the subscription paused?  None: the distribution database does not record it."""
    if not deployed(conn, "subscriptions"):
        return None
    row = conn.execute(
        "SELECT paused FROM airflow_repl.subscriptions WHERE publication = %s AND subscriber = %s",
        (publication, subscriber),
    ).fetchone()
    return bool(row[0]) if row is not None else None


def set_paused(conn: psycopg.Connection[Any], publication: str, subscriber: str, paused: bool) -> bool:
    """Pause (or resume) the subscription; True when that changed it (the caller commits).  The
    update waits for a Distribution Agent delivering a batch to it (it holds the row,
    :func:`~airflow_repl.engine.state.retention.lock_unexpired`): no batch starts after it."""
    cur = conn.execute(
        "UPDATE airflow_repl.subscriptions SET paused = %s WHERE publication = %s AND subscriber = %s "
        "AND paused IS DISTINCT FROM %s",
        (paused, publication, subscriber, paused),
    )
    return cur.rowcount > 0


# ---------------------------------------------------------------------- what a drop needs
@dataclass(frozen=True)
class DeployedSubscription:
    """A subscription as the distribution database records it (what a drop needs)."""

    subscriber: str
    update_mode: str
    status: str
    articles_hash: str | None
    delivered: str | None  # delivered_xact_seqno, as text


def deployed_subscriptions(conn: psycopg.Connection[Any], publication: str) -> list[DeployedSubscription]:
    """The publication's recorded subscriptions, by subscriber name."""
    rows = conn.execute(
        "SELECT subscriber, update_mode, status, articles_hash, delivered_xact_seqno::text "
        "FROM airflow_repl.subscriptions WHERE publication = %s ORDER BY subscriber",
        (publication,),
    ).fetchall()
    return [DeployedSubscription(str(s), str(m), str(st), h, d) for s, m, st, h, d in rows]


def subscriber_publications(conn: psycopg.Connection[Any], subscriber: str) -> list[str]:
    """The publications the subscriber has a recorded subscription to."""
    rows = conn.execute(
        "SELECT publication FROM airflow_repl.subscriptions WHERE subscriber = %s ORDER BY 1", (subscriber,)
    ).fetchall()
    return [str(r[0]) for r in rows]


# ---------------------------------------------------------------------- what airflow-repl plan compares
def subscription_settings(
    conn: psycopg.Connection[Any], publication: str
) -> dict[str, tuple[dict[str, Any], str, bool]]:
    """subscriber -> (options, update mode, paused) of the publication's recorded subscriptions."""
    rows = conn.execute(
        "SELECT subscriber, options, update_mode, paused FROM airflow_repl.subscriptions WHERE publication = %s",
        (publication,),
    ).fetchall()
    return {str(s): (dict(o or {}), str(m), bool(p)) for s, o, m, p in rows}
