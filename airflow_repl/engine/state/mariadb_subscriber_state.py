"""A MariaDB subscriber's own state, in two InnoDB tables of its database (MariaDB has no
schemas): the watermark, ``airflow_repl_subscription_state`` (the last transaction applied
there, moved in the same InnoDB transaction as the changes: exactly once), and the snapshot's
ledger, ``airflow_repl_snapshot_files`` (each data file loaded once), and where a transaction
holding a schema change stands, ``airflow_repl_schema_progress`` (MariaDB's DDL commits on its
own: the commands applied of the transaction being delivered, see
:mod:`~airflow_repl.engine.subscriber.mariadb_schema_changes`).  The PostgreSQL
subscriber's counterpart is :mod:`~airflow_repl.engine.state.subscriber_state`; positions are
kept as their ``pg_lsn`` text and as an unsigned 64-bit number, which orders them."""

from __future__ import annotations

from typing import Any

import pymysql
from pymysql.constants import ER

from airflow_repl.engine.postgres.lsn import int_to_lsn, lsn_to_int
from airflow_repl.engine.state import subscriber_state

STATE = "airflow_repl_subscription_state"
FILES = "airflow_repl_snapshot_files"
PROGRESS = "airflow_repl_schema_progress"
TABLES = (STATE, FILES, PROGRESS)

DDL = (
    f"CREATE TABLE IF NOT EXISTS {STATE} ("
    "publication VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL PRIMARY KEY, "
    "snapshot_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL, "
    "xact_seqno VARCHAR(32) CHARACTER SET ascii NOT NULL, "
    "position BIGINT UNSIGNED NOT NULL, "
    "transactions BIGINT NOT NULL DEFAULT 0, "
    "articles_hash VARCHAR(128) CHARACTER SET ascii NULL, "
    "updated_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE=InnoDB",
    f"CREATE TABLE IF NOT EXISTS {FILES} ("
    "publication VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL, "
    "snapshot_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL, "
    "path VARCHAR(512) CHARACTER SET ascii COLLATE ascii_bin NOT NULL, "  # data/<safe folder>/part-N.parquet
    "`rows` BIGINT NOT NULL, "
    "PRIMARY KEY (publication, snapshot_id, path)) ENGINE=InnoDB",
    f"CREATE TABLE IF NOT EXISTS {PROGRESS} ("
    "publication VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL PRIMARY KEY, "
    "xact_seqno VARCHAR(32) CHARACTER SET ascii NOT NULL, "
    "command_id BIGINT NOT NULL) ENGINE=InnoDB",
)


def _one(conn: Any, query: str, params: tuple[Any, ...]) -> Any:
    with conn.cursor() as cur:
        cur.execute(query, params)
        return cur.fetchone()


def _run(conn: Any, query: str, params: tuple[Any, ...] = ()) -> int:
    with conn.cursor() as cur:
        return int(cur.execute(query, params))


def reset_for_snapshot(conn: Any, publication: str) -> None:
    """Create the state tables where missing and forget the publication's watermark and loaded
    files: the subscription is about to be initialized again (committed by the caller)."""
    ensure_tables(conn)
    _run(conn, f"DELETE FROM {STATE} WHERE publication = %s", (publication,))
    _run(conn, f"DELETE FROM {FILES} WHERE publication = %s", (publication,))
    _run(conn, f"DELETE FROM {PROGRESS} WHERE publication = %s", (publication,))


def claim_snapshot_file(conn: Any, publication: str, snapshot_id: str, path: str) -> bool:
    """Enter a snapshot file in the ledger, in the transaction that loads it; False when it is
    there already (loaded, or being loaded by a concurrent attempt, which this one waits for)."""
    return (
        _run(
            conn,
            f"INSERT IGNORE INTO {FILES} (publication, snapshot_id, path, `rows`) VALUES (%s, %s, %s, 0)",
            (publication, snapshot_id, path),
        )
        == 1
    )


def count_snapshot_file(conn: Any, publication: str, snapshot_id: str, path: str, rows: int) -> None:
    _run(
        conn,
        f"UPDATE {FILES} SET `rows` = %s WHERE publication = %s AND snapshot_id = %s AND path = %s",
        (rows, publication, snapshot_id, path),
    )


def loaded_rows(conn: Any, publication: str, snapshot_id: str) -> int:
    row = _one(
        conn,
        f"SELECT COALESCE(SUM(`rows`), 0) FROM {FILES} WHERE publication = %s AND snapshot_id = %s",
        (publication, snapshot_id),
    )
    return int(row[0])


def start_watermark(conn: Any, publication: str, snapshot_id: str, consistent_lsn: str) -> None:
    """The subscription holds the snapshot taken at ``consistent_lsn``: its watermark starts just
    before that point, where the publication's slot starts decoding (committed by the caller)."""
    position = lsn_to_int(consistent_lsn) - 1
    _run(
        conn,
        f"INSERT INTO {STATE} (publication, snapshot_id, xact_seqno, position) VALUES (%s, %s, %s, %s)",
        (publication, snapshot_id, int_to_lsn(position), position),
    )


def lock_watermark(conn: Any, publication: str, subscriber: str) -> str:
    """The watermark, its row locked until the transaction ends (a second Distribution Agent is
    refused: AgentBusy); a subscriber without one raises NotInitialized."""
    try:
        row = _one(conn, f"SELECT xact_seqno FROM {STATE} WHERE publication = %s FOR UPDATE NOWAIT", (publication,))
    except pymysql.MySQLError as exc:
        code = exc.args[0] if exc.args else None
        if code in (1205, 1213):
            raise subscriber_state.watermark_busy(publication, subscriber) from None
        if code != 1146:  # 1146: no state table, never initialized
            raise
        row = None
    if row is None:
        raise subscriber_state.not_initialized(publication, subscriber)
    return str(row[0])


#: Seconds a Distribution Agent waits for the lock of another session: the session of an agent
#: killed in the middle of a batch lives on at the server until its statement ends there.
AGENT_LOCK_WAIT = 15


def try_agent_lock(conn: Any, publication: str, wait: int = AGENT_LOCK_WAIT) -> bool:
    """Take the Distribution Agent's session lock for the publication at this subscriber
    (``GET_LOCK``, released when the connection ends, also when the process dies), waiting up
    to ``wait`` seconds; False when another session still holds it."""
    row = _one(conn, "SELECT GET_LOCK(CONCAT('airflow_repl:', DATABASE(), ':', %s), %s)", (publication, wait))
    return bool(row and row[0] == 1)


def watermark(conn: Any, publication: str) -> str | None:
    """The watermark as committed, without locking it; None when there is none."""
    try:
        row = _one(conn, f"SELECT xact_seqno FROM {STATE} WHERE publication = %s", (publication,))
    except pymysql.err.ProgrammingError:
        return None
    return None if row is None else str(row[0])


def set_watermark(conn: Any, publication: str, xact: str, transactions: int) -> None:
    """Move the watermark to ``xact``, ``transactions`` more applied; in the caller's InnoDB
    transaction, which commits it with the changes applied (exactly once)."""
    _run(
        conn,
        f"UPDATE {STATE} SET xact_seqno = %s, position = %s, transactions = transactions + %s, "
        "updated_at = CURRENT_TIMESTAMP(6) WHERE publication = %s",
        (xact, lsn_to_int(xact), transactions, publication),
    )


def articles_hash(conn: Any, publication: str) -> str | None:
    row = _one(conn, f"SELECT articles_hash FROM {STATE} WHERE publication = %s", (publication,))
    return None if row is None or row[0] is None else str(row[0])


def set_articles_hash(conn: Any, publication: str, articles_hash: str) -> None:
    """The article definitions the subscriber has now (after a schema change), in the caller's
    transaction with the watermark."""
    _run(conn, f"UPDATE {STATE} SET articles_hash = %s WHERE publication = %s", (articles_hash, publication))


def ensure_tables(conn: Any) -> None:
    """Create the state tables a subscriber initialized by an older version lacks (MariaDB
    commits a CREATE TABLE at once: call it with nothing pending)."""
    for ddl in DDL:
        _run(conn, ddl)


def schema_progress(conn: Any, publication: str, xact: str) -> int | None:
    """The last command applied of transaction ``xact`` (one holding a schema change) when it
    is partly applied; None when none of it is."""
    row = partly_applied(conn, publication)
    return row[1] if row is not None and row[0] == xact else None


def partly_applied(conn: Any, publication: str) -> tuple[str, int] | None:
    """(transaction, last command applied) of the schema-change transaction a run stopped
    partway through, or None."""
    try:
        row = _one(conn, f"SELECT xact_seqno, command_id FROM {PROGRESS} WHERE publication = %s", (publication,))
    except pymysql.err.ProgrammingError as exc:
        if exc.args[0] != ER.NO_SUCH_TABLE:  # a subscriber initialized before the table existed
            raise
        return None
    return (str(row[0]), int(row[1])) if row is not None else None


def set_schema_progress(conn: Any, publication: str, xact: str, command_id: int) -> None:
    """Transaction ``xact`` is applied up to command ``command_id`` (committed by the caller)."""
    _run(
        conn,
        f"INSERT INTO {PROGRESS} (publication, xact_seqno, command_id) VALUES (%s, %s, %s) "
        "ON DUPLICATE KEY UPDATE xact_seqno = VALUES(xact_seqno), command_id = VALUES(command_id)",
        (publication, xact, command_id),
    )


def clear_schema_progress(conn: Any, publication: str) -> None:
    """The partly applied transaction is whole (in the transaction that moves the watermark past it)."""
    _run(conn, f"DELETE FROM {PROGRESS} WHERE publication = %s", (publication,))
