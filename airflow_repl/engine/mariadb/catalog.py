"""The subscriber's catalog: the checks that refuse a MariaDB subscriber table before anything
changes: it must exist, be transactional (InnoDB: its rows commit with the watermark), have its
primary key, and compare its text key columns byte for byte (``utf8mb4_nopad_bin``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow_repl.engine.errors import ReplError

#: Collations that compare text byte for byte, trailing spaces included (``utf8mb4_bin`` is a
#: PAD SPACE collation: ``'a'`` and ``'a '`` would collide, distinct at the publisher).
BINARY_NO_PAD = ("utf8mb4_nopad_bin", "utf8mb4_0900_bin", "binary")

#: Storage engines whose tables commit and roll back with a transaction.
TRANSACTIONAL = ("InnoDB",)


@dataclass(frozen=True)
class Expected:
    """A table the subscriber must have: its name, primary key and text key columns."""

    table: str
    primary_key: list[str]
    key_columns: list[str]


def _table_info(conn: Any, database: str, table: str, column: str) -> tuple[Any, ...] | None:
    """The table's row in ``information_schema.TABLES``, of ``column`` only (one of ours, never
    the user's); None: no such table."""
    with conn.cursor() as cur:
        cur.execute(
            f"SELECT {column} FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
            (database, table),
        )
        row = cur.fetchone()
    return None if row is None else tuple(row)


def storage_engine(conn: Any, database: str, table: str) -> str | None:
    row = _table_info(conn, database, table, "ENGINE")
    return None if row is None else str(row[0])


def table_bytes(conn: Any, database: str, table: str) -> int | None:
    """The table's data size by the server's statistics (an estimate; None: no such table)."""
    row = _table_info(conn, database, table, "COALESCE(DATA_LENGTH, 0)")
    return None if row is None else int(row[0])


def primary_key(conn: Any, database: str, table: str) -> list[str]:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s "
            "AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX",
            (database, table),
        )
        return [str(r[0]) for r in cur.fetchall()]


def collations(conn: Any, database: str, table: str) -> dict[str, str | None]:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT COLUMN_NAME, COLLATION_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s "
            "AND TABLE_NAME = %s",
            (database, table),
        )
        return {str(name): None if coll is None else str(coll) for name, coll in cur.fetchall()}


def check_table(conn: Any, database: str, expected: Expected, subscriber: str) -> None:
    """Refuse (one line, nothing changed) a table that is missing, not transactional, without its
    primary key, or whose text key columns compare other than byte for byte."""
    where = f"table {expected.table!r} of MariaDB subscriber {subscriber!r} (database {database!r})"
    engine = storage_engine(conn, database, expected.table)
    if engine is None:
        raise ReplError(f"{where} does not exist: run the Snapshot Agent for the subscriber")
    if engine not in TRANSACTIONAL:
        raise ReplError(
            f"{where} uses the {engine} storage engine, which has no transactions: its rows could not commit "
            f"with the watermark (exactly once); convert it (ALTER TABLE ... ENGINE=InnoDB) or reinitialize the subscriber"
        )
    pk = primary_key(conn, database, expected.table)
    if not pk:
        raise ReplError(
            f"{where} has no primary key: add PRIMARY KEY ({', '.join(expected.primary_key)}) or reinitialize the subscriber"
        )
    if [c.lower() for c in pk] != [c.lower() for c in expected.primary_key]:
        raise ReplError(
            f"{where} has primary key ({', '.join(pk)}), the publisher ({', '.join(expected.primary_key)}): "
            f"reinitialize the subscriber"
        )
    found = collations(conn, database, expected.table)
    for column in expected.key_columns:
        coll = found.get(column)
        if coll is not None and coll not in BINARY_NO_PAD:
            raise ReplError(
                f"key column {column!r} of {where} has collation {coll}, which compares case-, accent- or "
                f"trailing-space-insensitively: keys distinct at the publisher would collide; give it utf8mb4_nopad_bin "
                f"(ALTER TABLE ... MODIFY ... COLLATE utf8mb4_nopad_bin) or reinitialize the subscriber"
            )
