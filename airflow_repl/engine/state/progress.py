"""Tracer tokens and delivery progress at the distribution database: the statements on
``airflow_repl.tracer_tokens`` and ``airflow_repl.tracer_history`` (their DDL is in
:data:`~airflow_repl.engine.state.dist_schema.MIGRATIONS`), and the questions the quiescing
checks ask about how far each subscription is behind a position.

A tracer token (SQL Server's MStracer_tokens / MStracer_history) is a row of
``tracer_tokens``: posted (the publisher's clock when its logical message was emitted), read by
the Log Reader at commit LSN ``xact_seqno`` (``distributor_at``: the distributor's clock when it
stored it) and, per subscriber, arrived (``tracer_history.subscriber_at``: the distributor's clock
when the Distribution Agent recorded that the subscriber's watermark passed it).

Every function leaves its connection's transaction open: the caller commits.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

#: (token, its commit LSN): what the Log Reader records for each token it read.
ReadToken = tuple["TokenMessage", str]


@dataclass(frozen=True)
class TokenMessage:
    """The content of a tracer token's logical message."""

    token_id: int
    publication: str
    posted_at: datetime


def parse_token(content: bytes) -> TokenMessage | None:
    """The token a tracer message carries; None when it is not one (garbage is ignored, not fatal)."""
    try:
        data = json.loads(content.decode())
        return TokenMessage(int(data["token_id"]), str(data["publication"]), datetime.fromisoformat(data["posted_at"]))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None


# ---------------------------------------------------------------------- posting
def insert_token(conn: psycopg.Connection[Any], publication: str) -> int:
    """A new token of ``publication``, posted now (the distributor's clock until the publisher's
    is known); returns its id."""
    row = conn.execute(
        "INSERT INTO airflow_repl.tracer_tokens (publication, posted_at) VALUES (%s, clock_timestamp()) "
        "RETURNING token_id",
        (publication,),
    ).fetchone()
    assert row is not None  # INSERT ... RETURNING returns the row
    return int(row[0])


def set_posted(conn: psycopg.Connection[Any], token_id: int, posted_at: datetime) -> None:
    """The publisher's time of the token's message."""
    conn.execute("UPDATE airflow_repl.tracer_tokens SET posted_at = %s WHERE token_id = %s", (posted_at, token_id))


def delete_token(conn: psycopg.Connection[Any], token_id: int) -> None:
    """Forget a token whose message could not be posted."""
    conn.execute("DELETE FROM airflow_repl.tracer_tokens WHERE token_id = %s", (token_id,))


# ---------------------------------------------------------------------- the agents
def record_read(conn: psycopg.Connection[Any], tokens: list[ReadToken]) -> None:
    """The Log Reader stored the tokens' transactions (in this distributor transaction): record
    where they commit and the distributor's time now.  A token whose row is missing (its
    posting failed after the publisher committed it) is entered from its message."""
    for token, xact in tokens:
        conn.execute(
            "INSERT INTO airflow_repl.tracer_tokens (token_id, publication, posted_at, xact_seqno, distributor_at) "
            "VALUES (%s, %s, %s, %s, clock_timestamp()) ON CONFLICT (token_id) DO UPDATE SET "
            "posted_at = excluded.posted_at, xact_seqno = excluded.xact_seqno, distributor_at = excluded.distributor_at",
            (token.token_id, token.publication, token.posted_at, xact),
        )


def record_arrivals(conn: psycopg.Connection[Any], publication: str, subscriber: str, xact: str) -> None:
    """The subscriber's watermark is at ``xact`` (committed there): every token of the
    publication up to it, after the subscriber's snapshot, has arrived (now, at the distributor's clock)."""
    conn.execute(
        "INSERT INTO airflow_repl.tracer_history (publication, token_id, subscriber, subscriber_at) "
        "SELECT t.publication, t.token_id, s.subscriber, clock_timestamp() "
        "FROM airflow_repl.tracer_tokens AS t JOIN airflow_repl.subscriptions AS s "
        "ON s.publication = t.publication AND s.subscriber = %s "
        "WHERE t.publication = %s AND t.xact_seqno <= %s::pg_lsn "
        "AND (s.start_xact_seqno IS NULL OR t.xact_seqno > s.start_xact_seqno) "
        "ON CONFLICT (token_id, subscriber) DO NOTHING",
        (subscriber, publication, xact),
    )


# ---------------------------------------------------------------------- questions of the sensors and the CLI
@dataclass(frozen=True)
class TokenState:
    """A token at the distributor: where it commits (None: not read yet) and when it was read."""

    token_id: int
    posted_at: datetime
    xact_seqno: str | None
    distributor_at: datetime | None


def token(conn: psycopg.Connection[Any], publication: str, token_id: int) -> TokenState | None:
    """The token ``token_id`` of ``publication``; None when there is none."""
    row = conn.execute(
        "SELECT token_id, posted_at, xact_seqno::text, distributor_at FROM airflow_repl.tracer_tokens "
        "WHERE publication = %s AND token_id = %s",
        (publication, token_id),
    ).fetchone()
    return TokenState(int(row[0]), row[1], row[2], row[3]) if row is not None else None


@dataclass(frozen=True)
class HistoryRow:
    """A token and one subscriber it is meant for: when it was posted, read and arrived there."""

    token_id: int
    subscriber: str
    posted_at: datetime
    distributor_at: datetime | None
    subscriber_at: datetime | None


def history(conn: psycopg.Connection[Any], publication: str, token_id: int | None = None) -> list[HistoryRow]:
    """Each token of ``publication`` (or the one) and each subscriber it arrived at or is
    meant for (an active subscription initialized before it), oldest token first."""
    rows = conn.execute(
        "SELECT t.token_id, s.subscriber, t.posted_at, t.distributor_at, h.subscriber_at "
        "FROM airflow_repl.tracer_tokens AS t JOIN airflow_repl.subscriptions AS s ON s.publication = t.publication "
        "LEFT JOIN airflow_repl.tracer_history AS h ON h.token_id = t.token_id AND h.subscriber = s.subscriber "
        "WHERE t.publication = %s AND (%s::bigint IS NULL OR t.token_id = %s::bigint) AND (h.token_id IS NOT NULL "
        "OR (s.status = 'active' AND (t.xact_seqno IS NULL OR t.xact_seqno > s.start_xact_seqno))) "
        "ORDER BY t.token_id, s.subscriber",
        (publication, token_id, token_id),
    ).fetchall()
    return [HistoryRow(int(r[0]), str(r[1]), r[2], r[3], r[4]) for r in rows]


@dataclass(frozen=True)
class Behind:
    """An active subscription and the stored transactions up to a position it has not got yet."""

    subscriber: str
    delivered: str | None  # its delivered watermark
    transactions: int  # stored transactions after the watermark, up to the position


def delivery_behind(conn: psycopg.Connection[Any], publication: str, position: str) -> list[Behind]:
    """Every active subscription of ``publication`` and how many stored transactions committed
    at or before ``position`` it has not been delivered (0: caught up)."""
    rows = conn.execute(
        "SELECT s.subscriber, s.delivered_xact_seqno::text, (SELECT count(*) FROM airflow_repl.transactions AS t "
        "WHERE t.publication = s.publication AND t.xact_seqno <= %s::pg_lsn "
        "AND t.xact_seqno > coalesce(s.delivered_xact_seqno, '0/0'::pg_lsn)) "
        "FROM airflow_repl.subscriptions AS s WHERE s.publication = %s AND s.status = 'active' ORDER BY s.subscriber",
        (position, publication),
    ).fetchall()
    return [Behind(str(r[0]), r[1], int(r[2])) for r in rows]


# ---------------------------------------------------------------------- status (airflow-repl status)
#: SQL: per subscription of a publication (or all): its status, delivered watermark and that
#: transaction's commit time, the backlog after it, the last synchronization and the oldest
#: transaction waiting (as the cleanup's expiry computes them).
_STATUS = """
SELECT s.publication, s.subscriber, s.status, s.delivered_xact_seqno::text, d.commit_time,
       count(t.xact_seqno), coalesce(sum(t.command_count), 0), coalesce(s.delivered_at, s.initialized_at),
       min(t.entry_time), s.paused, min(t.commit_time)
FROM airflow_repl.subscriptions AS s
LEFT JOIN airflow_repl.transactions AS d ON d.publication = s.publication AND d.xact_seqno = s.delivered_xact_seqno
LEFT JOIN airflow_repl.transactions AS t ON t.publication = s.publication AND s.status <> 'expired'
    AND t.xact_seqno > coalesce(s.delivered_xact_seqno, s.start_xact_seqno, '0/0'::pg_lsn)
    AND (s.status NOT IN ('pending', 'initializing') OR s.start_xact_seqno IS NOT NULL)
WHERE %(p)s::text IS NULL OR s.publication = %(p)s::text
GROUP BY s.publication, s.subscriber, s.status, s.delivered_xact_seqno, d.commit_time, s.delivered_at, s.initialized_at,
    s.paused
ORDER BY s.publication, s.subscriber
"""


def backlog(conn: psycopg.Connection[Any], publication: str, subscriber: str) -> tuple[int, int, datetime | None]:
    """The transactions and commands stored after the subscription's delivered watermark (its
    backlog, as :data:`_STATUS` counts it), and the commit time of the oldest of them (None:
    none)."""
    row = conn.execute(
        "SELECT count(t.xact_seqno), coalesce(sum(t.command_count), 0), min(t.commit_time) "
        "FROM airflow_repl.subscriptions AS s "
        "JOIN airflow_repl.transactions AS t ON t.publication = s.publication "
        "AND t.xact_seqno > coalesce(s.delivered_xact_seqno, s.start_xact_seqno, '0/0'::pg_lsn) "
        "WHERE s.publication = %s AND s.subscriber = %s",
        (publication, subscriber),
    ).fetchone()
    return (int(row[0]), int(row[1]), row[2]) if row is not None else (0, 0, None)


def left_by_until(conn: psycopg.Connection[Any], publication: str, subscriber: str, until: datetime) -> dict[str, Any]:
    """What a run bounded by ``until`` left of the subscription's backlog: ``transactions`` and
    ``commands`` still after its watermark, ``first_commit_time`` (the oldest commit among them),
    and ``newest_commit_time_at_or_before_until`` (of every transaction of the publication still
    stored, delivered or not: None when none committed at or before the bound)."""
    row = conn.execute(
        "SELECT count(t.xact_seqno), coalesce(sum(t.command_count), 0), min(t.commit_time), "
        "(SELECT max(a.commit_time) FROM airflow_repl.transactions AS a "
        " WHERE a.publication = s.publication AND a.commit_time <= %(u)s) "
        "FROM airflow_repl.subscriptions AS s "
        "LEFT JOIN airflow_repl.transactions AS t ON t.publication = s.publication "
        "AND t.xact_seqno > coalesce(s.delivered_xact_seqno, s.start_xact_seqno, '0/0'::pg_lsn) "
        "WHERE s.publication = %(p)s AND s.subscriber = %(s)s GROUP BY s.publication",
        {"p": publication, "s": subscriber, "u": until},
    ).fetchone()
    count, commands, first, newest = row if row is not None else (0, 0, None, None)
    return {
        "until": until.isoformat(),
        "transactions": int(count),
        "commands": int(commands),
        "first_commit_time": first.isoformat() if first is not None else None,
        "newest_commit_time_at_or_before_until": newest.isoformat() if newest is not None else None,
    }


def until_message(publication: str, subscriber: str, left: dict[str, Any]) -> str:
    """The warning of a run whose ``until`` left transactions undelivered (:func:`left_by_until`)."""
    newest = left["newest_commit_time_at_or_before_until"]
    below = (
        f"the newest stored transaction at or before it committed at {newest}"
        if newest
        else ("no stored transaction committed at or before it")
    )
    return (
        f"--until {left['until']} left {left['transactions']} pending transaction(s) ({left['commands']} commands) "
        f"of publication {publication!r} undelivered to subscriber {subscriber!r}: the first committed at "
        f"{left['first_commit_time']}, after the bound ({below}); run the Distribution Agent with a later "
        f"--until, or without it, to deliver them"
    )


@dataclass(frozen=True)
class SubscriptionRow:
    """A subscription's state at the distributor (see :data:`_STATUS`)."""

    publication: str
    subscriber: str
    status: str
    delivered_xact_seqno: str | None
    delivered_commit_time: datetime | None
    backlog_transactions: int
    backlog_commands: int
    last_sync: datetime | None
    waiting_since: datetime | None
    paused: bool = False  # airflow-repl pause (the status keeps its meaning)
    oldest_pending_commit: datetime | None = None  # commit time of the oldest undelivered transaction


def subscription_rows(conn: psycopg.Connection[Any], publication: str | None) -> list[SubscriptionRow]:
    """Every subscription of ``publication`` (all publications: None), by publication and subscriber."""
    rows = conn.execute(_STATUS, {"p": publication}).fetchall()
    return [
        SubscriptionRow(r[0], r[1], r[2], r[3], r[4], int(r[5]), int(r[6]), r[7], r[8], bool(r[9]), r[10]) for r in rows
    ]


@dataclass(frozen=True)
class LastRun:
    """An agent's last finished (or running) run."""

    run_id: int
    status: str
    started_at: datetime
    finished_at: datetime | None
    message: str | None


def last_run(conn: psycopg.Connection[Any], agent: str, publication: str, subscriber: str | None) -> LastRun | None:
    """The latest run of ``agent`` for the publication (and subscriber, when given)."""
    row = conn.execute(
        "SELECT run_id, status, started_at, finished_at, message FROM airflow_repl.agent_history "
        "WHERE agent = %s AND publication = %s AND (%s::text IS NULL OR subscriber = %s::text) "
        "ORDER BY run_id DESC LIMIT 1",
        (agent, publication, subscriber, subscriber),
    ).fetchone()
    return LastRun(int(row[0]), str(row[1]), row[2], row[3], row[4]) if row is not None else None


def last_error(conn: psycopg.Connection[Any], publication: str, subscriber: str) -> tuple[datetime, str] | None:
    """The latest error recorded for the subscription (any agent): when, and its message."""
    row = conn.execute(
        "SELECT occurred_at, message FROM airflow_repl.errors WHERE publication = %s AND subscriber = %s "
        "ORDER BY error_id DESC LIMIT 1",
        (publication, subscriber),
    ).fetchone()
    return (row[0], str(row[1])) if row is not None else None


# ---------------------------------------------------------------------- the report (airflow-repl report)
#: The columns of :func:`recent_runs`, in order.
RUN_COLUMNS = (
    "run_id",
    "agent",
    "publication",
    "subscriber",
    "started_at",
    "finished_at",
    "status",
    "transactions",
    "commands",
    "rows_copied",
    "message",
    "backlog_at_start",
    "backlog_at_end",
)


def recent_runs(conn: psycopg.Connection[Any], publication: str | None, limit: int) -> list[dict[str, Any]]:
    """The latest ``limit`` agent runs of ``publication`` (all: None), oldest first; a
    Distribution Agent run's ``backlog_at_start`` and ``backlog_at_end`` (what it left
    undelivered) are ``{"transactions", "commands"}`` or None."""
    rows = conn.execute(
        "SELECT * FROM (SELECT run_id, agent, publication, subscriber, started_at, finished_at, status, "
        "transactions, commands, rows_copied, message, details->'backlog_at_start', details->'backlog_at_end' "
        "FROM airflow_repl.agent_history WHERE %(p)s::text IS NULL OR publication = %(p)s::text "
        "ORDER BY run_id DESC LIMIT %(n)s) AS r ORDER BY run_id",
        {"p": publication, "n": limit},
    ).fetchall()
    return [dict(zip(RUN_COLUMNS, row, strict=True)) for row in rows]


#: The columns of :func:`recent_errors`, in order.
ERROR_COLUMNS = (
    "occurred_at",
    "agent",
    "publication",
    "subscriber",
    "article",
    "xact_seqno",
    "sqlstate",
    "skipped",
    "message",
)


def recent_errors(conn: psycopg.Connection[Any], publication: str | None, limit: int) -> list[dict[str, Any]]:
    """The latest ``limit`` rows of ``airflow_repl.errors`` for ``publication`` (all: None), newest first."""
    rows = conn.execute(
        "SELECT occurred_at, agent, publication, subscriber, article, xact_seqno::text, sqlstate, skipped, message "
        "FROM airflow_repl.errors WHERE %(p)s::text IS NULL OR publication = %(p)s::text "
        "ORDER BY error_id DESC LIMIT %(n)s",
        {"p": publication, "n": limit},
    ).fetchall()
    return [dict(zip(ERROR_COLUMNS, row, strict=True)) for row in rows]
