"""Reading a query's rows as Arrow record batches, inside an exported snapshot: the Snapshot
Agent's block ranges.

ADBC's PostgreSQL driver runs the query as ``COPY (...) TO STDOUT (FORMAT binary)`` and decodes
the rows into Arrow columns in C++, with no Python object per value: about three times less
CPU than fetching rows through psycopg and building the columns from them.  The connection
has the engine's session settings (:data:`~airflow_repl.engine.postgres.connections.SESSION_SETTINGS`:
text in UTF8 whatever the database's encoding, dates in ISO, ...), as every other connection.

Owns: :func:`snapshot_batches`.  Errors become one line naming the server and what was read
(:class:`~airflow_repl.engine.errors.ConnectionFailed` when the server cannot be reached,
:class:`~airflow_repl.engine.errors.ReplError` otherwise); the password never appears in them.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import adbc_driver_manager
import adbc_driver_postgresql
import pyarrow as pa
from psycopg import conninfo as pg_conninfo
from psycopg import sql

from airflow_repl.engine.errors import ReplError
from airflow_repl.engine.postgres import connections

#: Seconds to wait for the server, as :func:`~airflow_repl.engine.postgres.connections.connect` does.
CONNECT_TIMEOUT = 10


@contextmanager
def snapshot_batches(conninfo: str, role: str, snapshot_name: str, query: str, what: str) -> Iterator[Any]:
    """The record batches (an iterable with the ``schema``) of ``query``'s rows as the exported snapshot
    ``snapshot_name`` sees the database (a read-only repeatable-read transaction, ended when
    the block ends).  ``what`` names what is read in an error."""
    timeout = (
        {} if "connect_timeout" in pg_conninfo.conninfo_to_dict(conninfo) else {"connect_timeout": CONNECT_TIMEOUT}
    )
    settings = connections.with_session_settings(pg_conninfo.make_conninfo(conninfo, **timeout))

    def failed(exc: Exception) -> ReplError:
        return ReplError(f"cannot read {what} at the {role} ({connections.describe(conninfo)}): {_server_message(exc)}")

    try:
        conn = adbc_driver_manager.AdbcConnection(_database(settings))  # autocommit: statements below are explicit
    except adbc_driver_manager.Error as exc:
        _forget(settings)  # the next attempt starts afresh (the server may have restarted)
        raise connections.connect_failed(role, conninfo, _server_message(exc)) from None
    try:
        with adbc_driver_manager.AdbcStatement(conn) as statement:
            try:
                _run(statement, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                _run(
                    statement, sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_name)).as_string(None)
                )
                statement.set_sql_query(query)
                stream, _ = statement.execute_query()
                yield _Batches(pa.RecordBatchReader._import_from_c(stream.address), failed)
                _run(statement, "COMMIT")
            except adbc_driver_manager.Error as exc:
                raise failed(exc) from None
    finally:
        conn.close()


# ADBC's low-level API: its DB-API module imports pandas (about 56 MiB more per process).  An
# ADBC database object connects once and loads the server's types when it is made (about
# 60 ms); each read task of a thread (or of a Spark worker process) reuses its thread's.  ADBC
# objects allow serialized use only: one per thread, never shared.
_databases = threading.local()


def _database(settings: str) -> Any:
    """This thread's ADBC database for the connection string ``settings``, made on first use."""
    cache: dict[str, Any] = _databases.__dict__.setdefault("by_conninfo", {})
    if settings not in cache:
        cache[settings] = adbc_driver_postgresql.connect(settings)
    return cache[settings]


def _forget(settings: str) -> None:
    """Close and drop this thread's database for ``settings`` (after a failure)."""
    database = _databases.__dict__.get("by_conninfo", {}).pop(settings, None)
    if database is not None:
        database.close()


class _Batches:
    """The record batches of a read; a failure while they arrive (the server went away, the
    connection broke) is a :class:`ReplError` naming what was read, not the driver's error."""

    def __init__(self, reader: Any, failed: Callable[[Exception], ReplError]) -> None:
        self.reader, self.failed, self.schema = reader, failed, reader.schema

    def __iter__(self) -> Iterator[Any]:
        while True:
            try:
                batch = self.reader.read_next_batch()
            except StopIteration:
                return
            except (OSError, pa.ArrowException, adbc_driver_manager.Error) as exc:
                raise self.failed(exc) from None
            yield batch


def _run(statement: Any, text: str) -> None:
    """A statement without rows."""
    statement.set_sql_query(text)
    statement.execute_update()


def _server_message(exc: Exception) -> str:
    """The server's (or libpq's) own message of an ADBC error, on one line: ADBC's text also
    holds the statement, which may be long."""
    text = str(exc)
    found = re.search(r"(?:ERROR|FATAL):\s+(.+)", text)
    if found:
        return found.group(1).strip()
    for line in text.splitlines():
        if line.strip():
            return re.sub(r"^[A-Z_]+: (\[libpq\] )?", "", line.strip())
    return type(exc).__name__
