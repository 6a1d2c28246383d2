"""The agents' runs (``airflow_repl.agent_history``) and the errors they met
(``airflow_repl.errors``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from airflow_repl.engine.state.dist_schema import one_row


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


def start_run(conn: psycopg.Connection, agent: str, publication: str | None, subscriber: str | None = None) -> int:
    row = one_row(
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


def record_run_details(conn: psycopg.Connection, run_id: int, details: dict[str, Any]) -> None:
    """Details a running run knows from its start (e.g. the Distribution Agent's apply paths),
    merged into its history row's; committed."""
    conn.execute(
        "UPDATE airflow_repl.agent_history SET details = coalesce(details, '{}'::jsonb) || %s WHERE run_id = %s",
        (Jsonb(details), run_id),
    )
    conn.commit()


def last_apply_paths(conn: psycopg.Connection, publication: str, subscriber: str) -> list[dict[str, str]] | None:
    """The apply path of each article (``{"article", "apply", "why"}``) of the subscription's
    latest Distribution Agent run that chose them (running or finished), or None."""
    row = conn.execute(
        "SELECT details->'apply' FROM airflow_repl.agent_history WHERE agent = 'distribution' "
        "AND publication = %s AND subscriber = %s AND details ? 'apply' ORDER BY run_id DESC LIMIT 1",
        (publication, subscriber),
    ).fetchone()
    return list(row[0]) if row is not None and row[0] is not None else None


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
