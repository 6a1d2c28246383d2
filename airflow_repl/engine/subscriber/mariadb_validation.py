"""Validation of a MariaDB subscriber: the tasks of :mod:`validation`'s two passes for it
(:data:`ROUTE`), its ranges planned and its results merged there as a PostgreSQL subscriber's.

Rows compare by canonical value (:func:`~airflow_repl.engine.mariadb.types.canonical`): the
publisher's text converted as delivery converts it, the subscriber's values as the driver reads
them.  Neither server can compute that form, so the tasks do, in Python: a row's key is its
canonical key values as JSON (UTF-8), its range that key's hash range
(:func:`~airflow_repl.engine.subscriber.validation.key_range`), its hash the md5 of its canonical
values.

1. **sums**: at the publisher, one task per block range of the table, in the snapshot the
   driver exported (as for PostgreSQL subscribers); at the MariaDB subscriber, one task per
   share of the table (as many shares as block ranges a PostgreSQL table of its size would
   have: ranges of the first key column when it is an integer, read through the primary key,
   else rows by ``CRC32`` of their key), each in a consistent InnoDB snapshot of its own.
   Both stream their rows (a server-side cursor, an unbuffered one) and return each range's
   row count and hash sums.
2. **rows**: per article whose sums differ, one task reads both sides, keeps the rows of the
   differing ranges, sorts them by key bytes and merges them
   (:func:`~airflow_repl.engine.subscriber.validation.merge_rows`): memory holds those ranges'
   keys and hashes, never the table.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from psycopg import sql

from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.errors import ConnectionLost, NotInitialized, ReplError
from airflow_repl.engine.mariadb import catalog, types
from airflow_repl.engine.mariadb import connections as mariadb_connections
from airflow_repl.engine.mariadb.quoting import ident
from airflow_repl.engine.postgres import connections
from airflow_repl.engine.subscriber import validation
from airflow_repl.engine.subscriber.validation import Route, Sums, Task

#: The size of a PostgreSQL table block: a MariaDB table of N bytes is split as one of N / BLOCK blocks.
BLOCK = 8192
#: One row: (canonical key as JSON bytes, key text, md5 of the canonical values).
Row = tuple[bytes, str, bytes]


def _canonical(art: ResolvedArticle, rows: Iterable[Any], publisher: bool) -> Iterator[Row]:
    """The rows of one side as (key bytes, key text, hash)."""
    cols = art.columns
    convs = [types.conversion(c.base_type or c.type) for c in cols]
    where = f"article {art.name!r}"
    for row in rows:
        values = [
            types.canonical(
                convs[i],
                cols[i].base_type or cols[i].type,
                types.to_param(convs[i], v, cols[i].name, where) if publisher else v,
            )
            for i, v in enumerate(row)
        ]
        key = json.dumps([values[i] for i in art.pk_positions], default=str).encode()
        text = ", ".join(str(row[i]) for i in art.pk_positions)
        yield key, text, hashlib.md5(json.dumps(values, default=str).encode()).digest()


def _batches(cur: Any) -> Iterator[Any]:
    batch = cur.fetchmany(validation.FETCH_ROWS)
    while batch:
        yield from batch
        batch = cur.fetchmany(validation.FETCH_ROWS)


# ---------------------------------------------------------------------- the publisher's side
def _publisher_query(art: ResolvedArticle, chunk: list[int | None]) -> sql.Composed:
    """The article's rows passing its row filter, each column as its text, in block range ``chunk``."""
    cols = sql.SQL(", ").join(
        sql.SQL("CASE WHEN pg_catalog.num_nulls({c}) = 1 THEN NULL ELSE pg_catalog.concat({c}) END").format(
            c=sql.Identifier(c)
        )
        for c in art.column_names
    )
    where = sql.SQL(art.row_filter) if art.row_filter else sql.SQL("true")
    return sql.SQL("SELECT {} FROM {} WHERE ({}) AND {}").format(
        cols, art.source, where, validation.block_condition(chunk)
    )


def _publisher_rows(side: tuple[str, str | None], art: ResolvedArticle, chunk: list[int | None], use: Any) -> Any:
    """``use`` of the publisher's canonical rows of ``chunk`` (``side``: its conninfo and the
    snapshot to read in), streamed."""
    conninfo, snapshot = side
    with connections.connect(conninfo, "publisher") as pub:
        validation.use_snapshot(pub, snapshot)
        with pub.cursor(name="airflow_repl_validate") as cur:
            cur.execute(_publisher_query(art, chunk))
            return use(_canonical(art, _batches(cur), publisher=True))


# ---------------------------------------------------------------------- the subscriber's side
#: Key types whose values split a table into ranges the primary key's index reads.
INTEGERS = ("smallint", "integer", "bigint")
#: The chunk of a whole table (pass 2).
WHOLE: list[int | None] = [None, None]


def _by_range(art: ResolvedArticle) -> bool:
    """Whether the table's shares are ranges of its first key column (an integer), or else
    rows by CRC32 of their key."""
    first = art.columns[art.pk_positions[0]]
    return (first.base_type or first.type) in INTEGERS


def _share(art: ResolvedArticle, chunk: list[int | None]) -> str:
    """The condition of a share of the table: [lower, upper) of the first key column (None:
    unbounded) when it is an integer, else share ``i`` of ``n`` by CRC32 of the key."""
    if _by_range(art):
        column = ident(art.primary_key[0])
        bounds = [f"{column} {op} {int(b)}" for op, b in ((">=", chunk[0]), ("<", chunk[1])) if b is not None]
        return " AND ".join(bounds) or "TRUE"
    i, n = chunk
    if n is None or n <= 1:
        return "TRUE"
    key = ", ".join(ident(c) for c in art.primary_key)
    return f"MOD(CRC32(CONCAT_WS(0x00, {key})), {int(n)}) = {int(i or 0)}"


def _shares(conn: Any, art: ResolvedArticle, n: int) -> list[list[int | None]]:
    """``n`` shares of the table: ranges of its first key column between its least and greatest
    values (the first and last open, as :func:`~airflow_repl.engine.subscriber.validation.block_chunks`'),
    or shares by CRC32."""
    if n <= 1:
        return [list(WHOLE)]
    if not _by_range(art):
        return [[i, n] for i in range(n)]
    column = ident(art.primary_key[0])
    with conn.cursor() as cur:
        cur.execute(f"SELECT MIN({column}), MAX({column}) FROM {ident(art.dest_table)}")
        low, high = cur.fetchone()
    if low is None:
        return [list(WHOLE)]
    span = int(high) - int(low) + 1
    return [
        [None if a is None else a + int(low), None if b is None else b + int(low)]
        for a, b in validation.block_chunks(span, -(-span // n), n)
    ]


def _subscriber_rows(side: tuple[str, str], art: ResolvedArticle, chunk: list[int | None], use: Any) -> Any:
    """``use`` of the subscriber's canonical rows of share ``chunk`` (``side``: its conninfo and
    name), streamed in a consistent InnoDB snapshot."""
    import pymysql

    conninfo, name = side
    with _at(conninfo, name, art) as conn, conn.cursor(pymysql.cursors.SSCursor) as cur:
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
        # FLOAT's text in MariaDB's protocol has 6 digits; as a DOUBLE it is the value stored, exactly
        names = ", ".join(
            f"CAST({ident(c.name)} AS DOUBLE)"
            if types.conversion(c.base_type or c.type) == types.REAL
            else ident(c.name)
            for c in art.columns
        )
        cur.execute(f"SELECT {names} FROM {ident(art.dest_table)} WHERE {_share(art, chunk)}")
        return use(_canonical(art, _batches(cur), publisher=False))


@contextmanager
def _at(conninfo: str, name: str, art: ResolvedArticle | None = None) -> Iterator[Any]:
    """A connection to MariaDB subscriber ``name``, closed after the block; a driver's error in
    the block as the engine's: lost is ConnectionLost (retryable), a missing table of ``art``
    NotInitialized, another a one-line ReplError, its text redacted."""
    import pymysql

    role = f"MariaDB subscriber {name!r}"
    conn = mariadb_connections.connect(conninfo, role)
    try:
        yield conn
    except pymysql.MySQLError as exc:
        text = mariadb_connections.error_text(exc, conninfo)
        if mariadb_connections.is_lost(exc):
            raise ConnectionLost(f"lost connection to the {role} during validation ({text}); run it again") from None
        if art is not None and exc.args and exc.args[0] == 1146:
            raise _not_initialized(name, art) from None
        raise ReplError(f"validation at the {role} failed: {text}") from None
    finally:
        conn.close()


def _not_initialized(subscriber: str, art: ResolvedArticle) -> NotInitialized:
    return NotInitialized(
        f"MariaDB subscriber {subscriber!r} has no table {art.dest_table!r} for article {art.name!r} of "
        f"publication {art.publication!r}: run the Snapshot Agent for it before validating"
    )


# ---------------------------------------------------------------------- the tasks
def _sums(ranges: int) -> Any:
    def add(rows: Iterator[Row]) -> Sums:
        out: Sums = {}
        for key, _, digest in rows:
            validation.add_row(out, validation.key_range(key, ranges), digest)
        return out

    return add


def range_sums(task: Task) -> Sums:
    """Pass 1, one chunk of one article at the publisher or at the MariaDB subscriber."""
    art = ResolvedArticle.from_dict(task["article"])
    if task["publisher"]:
        sums: Sums = _publisher_rows((task["conninfo"], task["snapshot"]), art, task["chunk"], _sums(task["ranges"]))
    else:
        sums = _subscriber_rows((task["conninfo"], task["side"]), art, task["chunk"], _sums(task["ranges"]))
    return sums


def range_rows(task: Task) -> dict[str, Any]:
    """Pass 2, one article: both sides' rows of the differing ranges, sorted and merged by key."""
    art = ResolvedArticle.from_dict(task["article"])
    ranges, bad = task["ranges"], set(task["bad"])

    def kept(rows: Iterator[Row]) -> list[Row]:
        return sorted(row for row in rows if validation.key_range(row[0], ranges) in bad)

    with ThreadPoolExecutor(2) as pool:  # both servers scan at the same time
        at_pub = pool.submit(_publisher_rows, (task["publisher"], task["publisher_snapshot"]), art, [None, None], kept)
        at_sub = pool.submit(_subscriber_rows, (task["subscriber"], task["name"]), art, WHOLE, kept)
        return validation.merge_rows(at_pub.result(), at_sub.result(), task["max_keys"])


def table_chunks(conninfo: str, side: str, articles: list[ResolvedArticle]) -> dict[str, list[list[int | None]]]:
    """article -> pass 1's chunks: the publisher's block ranges (side ""), or shares of the
    MariaDB subscriber's table (:func:`_shares`), as many as block ranges of a PostgreSQL table
    of its size; a subscriber without the table is not initialized."""
    if not side:
        return validation.table_chunks(conninfo, side, articles)
    out: dict[str, list[list[int | None]]] = {}
    with _at(conninfo, side) as conn:
        for art in articles:
            size = catalog.table_bytes(conn, mariadb_connections.database(conninfo), art.dest_table)
            if size is None:
                raise _not_initialized(side, art)
            n = len(validation.block_chunks(-(-size // BLOCK), validation.BLOCKS_PER_TASK, validation.MAX_CHUNKS))
            out[art.name] = _shares(conn, art, n)
    return out


#: MariaDB subscribers: canonical values hashed in the tasks, each subscriber task in a snapshot of its own.
ROUTE = Route(table_chunks, range_sums, range_rows, snapshots=False)
