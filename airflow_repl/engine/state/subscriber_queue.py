"""Questions about a queued subscriber's queue that ``set-update-mode`` asks (the queue itself,
``airflow_repl.queue``, and its triggers are created by the queued-updating set-up)."""

from __future__ import annotations

from typing import Any

import psycopg


def queued_rows(conn: psycopg.Connection[Any], publication: str) -> int:
    """Rows waiting in the subscriber's ``airflow_repl.queue`` for ``publication`` (all rows when
    the queue does not record publications); 0 when there is no queue."""
    columns = {
        str(name)
        for (name,) in conn.execute(
            "SELECT attname FROM pg_catalog.pg_attribute WHERE attrelid = to_regclass('airflow_repl.queue') "
            "AND attnum > 0 AND NOT attisdropped"
        )
    }
    if not columns:
        return 0
    if "publication" in columns:
        row = conn.execute("SELECT count(*) FROM airflow_repl.queue WHERE publication = %s", (publication,)).fetchone()
    else:
        row = conn.execute("SELECT count(*) FROM airflow_repl.queue").fetchone()
    return int(row[0]) if row is not None else 0
