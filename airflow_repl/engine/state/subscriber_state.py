"""The ``airflow_repl`` schema at each subscriber: the watermark of the last transaction
applied (committed in the same transaction as the applied changes), the ledger of the snapshot
files loaded there, and the ``row_not_found()`` function the generated procedures raise with.

One function per question an agent asks of these tables.
"""

from __future__ import annotations

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


# ---------------------------------------------------------------------- questions of the Distribution Agent
