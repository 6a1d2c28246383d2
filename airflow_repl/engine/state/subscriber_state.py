"""The ``airflow_repl`` schema at each subscriber: the watermark of the last transaction
applied (committed in the same transaction as the applied changes), the ledger of the snapshot
files loaded there, and the ``row_not_found()`` function the generated procedures raise with.

Owns: the subscriber's ``airflow_repl`` schema (:data:`SUBSCRIBER_DDL`) and one function per
question an agent asks of these tables; the distribution database's are in
:mod:`~airflow_repl.engine.state.distdb`.
"""

from __future__ import annotations

from typing import Any

import psycopg

from airflow_repl.engine.errors import AgentBusy, NotInitialized

SUBSCRIBER_DDL = """
CREATE SCHEMA IF NOT EXISTS airflow_repl;
CREATE TABLE IF NOT EXISTS airflow_repl.subscription_state (
    publication     text PRIMARY KEY,
    snapshot_id     text NOT NULL,
    xact_seqno      pg_lsn NOT NULL,
    transactions    bigint NOT NULL DEFAULT 0,
    updated_at      timestamptz NOT NULL DEFAULT now()
);
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


# ---------------------------------------------------------------------- questions of the Snapshot Agent
def reset_for_snapshot(conn: psycopg.Connection[Any], publication: str) -> None:
    """Create the schema where it is missing and forget the publication's watermark and loaded
    snapshot files: the subscription is about to be initialized again (committed by the caller)."""
    conn.execute(SUBSCRIBER_DDL)
    conn.execute("DELETE FROM airflow_repl.subscription_state WHERE publication = %s", (publication,))
    conn.execute("DELETE FROM airflow_repl.snapshot_files WHERE publication = %s", (publication,))


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


def start_watermark(conn: psycopg.Connection[Any], publication: str, snapshot_id: str, consistent_lsn: str) -> None:
    """The subscription holds the snapshot taken at ``consistent_lsn``: its watermark starts just
    before that point, where the publication's slot starts decoding (committed by the caller)."""
    conn.execute(
        "INSERT INTO airflow_repl.subscription_state (publication, snapshot_id, xact_seqno) "
        "VALUES (%s, %s, %s::pg_lsn - 1)",
        (publication, snapshot_id, consistent_lsn),
    )


# ---------------------------------------------------------------------- questions of the Distribution Agent
def lock_watermark(conn: psycopg.Connection, publication: str, subscriber: str) -> str:
    """The subscriber's watermark (the last transaction applied there), its row locked until
    the transaction ends, so that a second Distribution Agent is refused (AgentBusy); a
    subscriber without one (no snapshot loaded) raises NotInitialized."""
    try:
        row = conn.execute(
            "SELECT xact_seqno::text FROM airflow_repl.subscription_state WHERE publication = %s FOR UPDATE NOWAIT",
            (publication,),
        ).fetchone()
    except psycopg.errors.LockNotAvailable:
        raise AgentBusy(
            f"another Distribution Agent is delivering publication {publication!r} to "
            f"subscriber {subscriber!r}; wait for it to finish"
        ) from None
    except psycopg.errors.UndefinedTable:
        row = None
    if row is None:
        raise NotInitialized(
            f"subscriber {subscriber!r} has no snapshot of publication {publication!r}: "
            f"run the Snapshot Agent to initialize the subscription"
        )
    return str(row[0])


def watermark(conn: psycopg.Connection, publication: str) -> str | None:
    """The subscriber's watermark as committed, without locking it; None when it has none."""
    row = conn.execute(
        "SELECT xact_seqno::text FROM airflow_repl.subscription_state WHERE publication = %s", (publication,)
    ).fetchone()
    return str(row[0]) if row is not None else None


def set_watermark(conn: psycopg.Connection, publication: str, xact: str, transactions: int) -> None:
    """Move the watermark to ``xact``, ``transactions`` more applied; in the caller's
    transaction, which commits it together with the changes applied (exactly once)."""
    conn.execute(
        "UPDATE airflow_repl.subscription_state SET xact_seqno = %s, "
        "transactions = transactions + %s, updated_at = now() WHERE publication = %s",
        (xact, transactions, publication),
    )
