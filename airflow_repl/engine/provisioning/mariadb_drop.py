"""``airflow-repl drop`` at a MariaDB subscriber (:mod:`~airflow_repl.engine.provisioning.drop`
calls it): what the product installed there for a subscription goes, the subscriber's tables
and rows stay, as at a PostgreSQL subscriber.

At a MariaDB subscriber the product installs its state tables
(:mod:`~airflow_repl.engine.state.mariadb_subscriber_state`: the watermark, the snapshot's
ledger, a schema change's progress) and the articles' generated procedures.  Dropping a
subscription drops the generated procedures of its articles (``IF EXISTS``) and deletes the
publication's rows in the state tables (one InnoDB transaction), then drops the tables once no
other publication's subscription is recorded in them.  Each step is idempotent, so a drop stopped anywhere is
finished by running it again.  Dropping an article drops its generated procedures and rewrites
the subscriber's record of its article definitions (the hash a schema change left), as at a
PostgreSQL subscriber.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pymysql

from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.codegen import mariadb as mariadb_dialect
from airflow_repl.engine.errors import AgentBusy
from airflow_repl.engine.mariadb import connections as mariadb_connections
from airflow_repl.engine.model.propagation import OPERATIONS
from airflow_repl.engine.state import dist_publications
from airflow_repl.engine.state import mariadb_subscriber_state as state
from airflow_repl.engine.subscriber import mariadb_streams

#: MariaDB's error number for a table that does not exist.
_NO_TABLE = 1146


def lock(conninfo: str, subscriber: str, publication: str) -> Any:
    """Connect to the MariaDB subscriber and take the Distribution Agent's session lock for the
    publication (held until the drop's connection closes); refused while that agent runs.  A
    multi-stream batch a killed agent left prepared is finished then (its locks would hold the
    state rows the drop deletes)."""
    conn = mariadb_connections.connect(conninfo, f"MariaDB subscriber {subscriber!r}")
    if not state.try_agent_lock(conn, publication, wait=0):
        conn.close()
        raise AgentBusy(
            f"the Distribution Agent is running for publication {publication!r} at subscriber {subscriber!r}: "
            f"wait for it to finish (stop it if it runs continuously), then run the drop again; nothing was dropped "
            f"by this run"
        )
    mariadb_streams.recover_prepared(conn, mariadb_connections.database(conninfo), publication, subscriber, 1)
    return conn


def _tables(conn: Any) -> list[str]:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() "
            f"AND TABLE_NAME IN ({', '.join(['%s'] * len(state.TABLES))})",
            state.TABLES,
        )
        return sorted(str(r[0]) for r in cur.fetchall())


def drop_procedures(conn: Any, art: ResolvedArticle) -> None:
    """The article's generated procedures at the subscriber (custom ones stay); each DROP
    commits on its own."""
    with conn.cursor() as cur:
        for op in OPERATIONS:
            if art.propagation[op].generated:
                cur.execute(f"DROP PROCEDURE IF EXISTS {mariadb_dialect.procedure_name(art, op)}")  # quoted


def drop_subscription_at(conn: Any, publication: str, articles: list[ResolvedArticle]) -> list[str]:
    """The articles' generated procedures and the publication's rows in the state tables (one
    InnoDB transaction), then the tables themselves when no other publication's rows remain;
    returns the tables dropped."""
    for art in articles:
        drop_procedures(conn, art)
    present = _tables(conn)
    with conn.cursor() as cur:
        for table in present:
            cur.execute(f"DELETE FROM {table} WHERE publication = %s", (publication,))  # our own table names
        conn.commit()
        if not present:
            return []
        others = 0
        for table in present:
            cur.execute(f"SELECT COUNT(*) FROM {table}")
            others += int(cur.fetchone()[0])
        conn.commit()
        if others:
            return []
        for table in present:  # each DROP commits on its own; IF EXISTS: a second run drops the rest
            cur.execute(f"DROP TABLE IF EXISTS {table}")
    return present


def drop_article_at(
    conn: Any,
    dist: psycopg.Connection[Any],
    publication: str,
    art: ResolvedArticle,
    before: list[ResolvedArticle],
    after: list[ResolvedArticle],
) -> str | None:
    """The article's generated procedures, and the subscriber's record of its article
    definitions without it (committed); returns its watermark (None: not initialized)."""
    drop_procedures(conn, art)
    try:
        position = state.watermark(conn, publication)
        stored = state.articles_hash(conn, publication) if position is not None else None
    except pymysql.err.ProgrammingError as exc:
        if exc.args and exc.args[0] == _NO_TABLE:
            return None
        raise
    new = dist_publications.rehashed(dist, publication, stored, position, before, after)
    dist.rollback()
    if new is not None:
        state.set_articles_hash(conn, publication, new)
    conn.commit()
    return position
