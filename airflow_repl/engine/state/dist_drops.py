"""The distribution database's record of drops under way (``airflow-repl drop``): a row from a
drop's first change to its last, so that a drop stopped halfway is known and finished by running
it again, and the distributor's last step of each drop."""

from __future__ import annotations

import shlex
from typing import Any

import psycopg
from psycopg import sql

from airflow_repl.engine.state.dist_schema import deployed


def begin_drop(conn: psycopg.Connection[Any], publication: str, kind: str, name: str) -> bool:
    """Record that the drop of ``kind`` ``name`` of the publication is under way (its first
    change; the caller commits); False when it was already (a drop run again)."""
    cur = conn.execute(
        "INSERT INTO airflow_repl.drops (publication, kind, name) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
        (publication, kind, name),
    )
    return cur.rowcount > 0


def drop_under_way(conn: psycopg.Connection[Any], publication: str, kind: str, name: str) -> bool:
    """Has a drop of ``kind`` ``name`` of the publication started and not finished?"""
    if not deployed(conn, "drops"):
        return False
    row = conn.execute(
        "SELECT 1 FROM airflow_repl.drops WHERE publication = %s AND kind = %s AND name = %s",
        (publication, kind, name),
    ).fetchone()
    return row is not None


def unfinished_drop(conn: psycopg.Connection[Any], publication: str, subscriber: str) -> str | None:
    """Why the subscriber's delivery must wait: a drop of an article or of the publication, or of
    this subscription, started and did not finish (its objects may be half gone); None if not."""
    if not deployed(conn, "drops"):
        return None
    row = conn.execute(
        "SELECT kind, name FROM airflow_repl.drops WHERE publication = %s "
        "AND (kind <> 'subscription' OR name = %s) ORDER BY started_at LIMIT 1",
        (publication, subscriber),
    ).fetchone()
    if row is None:
        return None
    kind, name = str(row[0]), str(row[1])
    option = {"article": " --article ", "subscription": " --subscriber "}.get(kind)
    command = f"airflow-repl drop {kind} -p {shlex.quote(publication)}" + (option + shlex.quote(name) if option else "")
    return (
        f"the drop of {kind} {name!r} of publication {publication!r} did not finish: run '{command}' again to finish it"
    )


def forget_article(conn: psycopg.Connection[Any], publication: str, article: str) -> int:
    """The distributor's last step of an article's drop: its stored commands (never delivered
    now), its registered script, its row and the drop's record; returns the commands deleted
    (the caller commits, with the subscriptions' new article hashes)."""
    cur = conn.execute(
        "DELETE FROM airflow_repl.commands WHERE publication = %s AND article = %s", (publication, article)
    )
    conn.execute(
        "DELETE FROM airflow_repl.custom_scripts WHERE publication = %s AND article = %s", (publication, article)
    )
    if deployed(conn, "subscription_articles"):
        conn.execute(
            "DELETE FROM airflow_repl.subscription_articles WHERE publication = %s AND article = %s",
            (publication, article),
        )
    conn.execute("DELETE FROM airflow_repl.articles WHERE publication = %s AND name = %s", (publication, article))
    conn.execute(
        "DELETE FROM airflow_repl.drops WHERE publication = %s AND kind = 'article' AND name = %s",
        (publication, article),
    )
    return cur.rowcount


def forget_subscription(conn: psycopg.Connection[Any], publication: str, subscriber: str) -> None:
    """The distributor's last step of a subscription's drop: its row, errors, conflicts, tracer
    arrivals and the drop's record (its runs stay in ``agent_history``; the caller commits)."""
    for table in ("conflicts", "tracer_history", "errors", "subscriptions"):
        conn.execute(
            sql.SQL("DELETE FROM airflow_repl.{} WHERE publication = %s AND subscriber = %s").format(
                sql.Identifier(table)
            ),
            (publication, subscriber),
        )
    conn.execute(
        "DELETE FROM airflow_repl.drops WHERE publication = %s AND kind = 'subscription' AND name = %s",
        (publication, subscriber),
    )


#: The distribution database's tables holding a publication's rows, deleted when it is dropped
#: (children before parents; ``agent_history`` keeps its runs).
_PUBLICATION_TABLES = (
    ("commands", "publication"),
    ("transactions", "publication"),
    ("snapshots", "publication"),
    ("logreader_state", "publication"),
    ("cleanup_state", "publication"),
    ("custom_scripts", "publication"),
    ("tracer_history", "publication"),
    ("tracer_tokens", "publication"),
    ("conflicts", "publication"),
    ("errors", "publication"),
    ("drops", "publication"),
    ("publications", "name"),  # articles and subscriptions: ON DELETE CASCADE
)


def forget_publication(conn: psycopg.Connection[Any], publication: str) -> dict[str, int]:
    """The distributor's last step of a publication's drop: every row of it, and the drop's
    record; returns the rows deleted per table (the caller commits)."""
    out: dict[str, int] = {}
    for table, column in _PUBLICATION_TABLES:
        cur = conn.execute(
            sql.SQL("DELETE FROM airflow_repl.{} WHERE {} = %s").format(sql.Identifier(table), sql.Identifier(column)),
            (publication,),
        )
        out[table] = cur.rowcount
    return out
