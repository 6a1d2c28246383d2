"""The conflicts the Queue Reader met applying queued subscriber transactions at the publisher,
and those the Distribution Agent met delivering to a queued subscriber
(``airflow_repl.conflicts``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg

from airflow_repl.engine.postgres import json_values
from airflow_repl.engine.state.dist_schema import deployed


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
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO airflow_repl.conflicts (publication, subscriber, article, key, kind, publisher_row, "
            "subscriber_row, policy, outcome, queued_xid, queue_id, detected_at) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
            [
                (publication, subscriber, *_images(c), policy, c["outcome"], xid, c["queue_id"], c["detected_at"])
                for c in conflicts
            ],
        )


def record_delivery_conflicts(
    conn: psycopg.Connection[Any], publication: str, subscriber: str, conflicts: list[dict[str, Any]]
) -> None:
    """Record the conflicts the Distribution Agent met at a queued subscriber (each once, keyed
    by the publisher's transaction and command); the caller commits."""
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO airflow_repl.conflicts (publication, subscriber, article, key, kind, publisher_row, "
            "subscriber_row, policy, outcome, agent, xact_seqno, command_id, detected_at) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, 'distribution', %s, %s, %s) ON CONFLICT DO NOTHING",
            [
                (
                    publication,
                    subscriber,
                    *_images(c),
                    c["policy"],
                    c["outcome"],
                    c["xact_seqno"],
                    c["command_id"],
                    c["detected_at"],
                )
                for c in conflicts
            ],
        )


def _images(c: dict[str, Any]) -> tuple[Any, ...]:
    """A conflict's article, key, kind and both row images, as the conflicts table stores them
    (JSON whose numbers stay exact)."""
    publisher_row, subscriber_row = c["publisher_row"], c["subscriber_row"]
    return (
        c["article"],
        json_values.jsonb(c["key"]),
        c["kind"],
        json_values.jsonb(publisher_row) if publisher_row is not None else None,
        json_values.jsonb(subscriber_row) if subscriber_row is not None else None,
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
    if not deployed(conn, "conflicts"):
        return []
    rows = conn.execute(
        f"SELECT {', '.join(c + '::text' if c == 'xact_seqno' else c for c in CONFLICT_COLUMNS)} FROM airflow_repl.conflicts "
        "WHERE (%(p)s::text IS NULL OR publication = %(p)s) AND (%(s)s::text IS NULL OR subscriber = %(s)s) "
        "AND (%(a)s::text IS NULL OR article = %(a)s) AND (%(t)s::timestamptz IS NULL OR detected_at >= %(t)s) "
        "ORDER BY detected_at, conflict_id",
        {"p": publication, "s": subscriber, "a": article, "t": since},
    ).fetchall()
    return [dict(zip(CONFLICT_COLUMNS, row, strict=True)) for row in rows]
