"""Running statements whose text embeds identifiers, without psycopg's placeholder scanning.

psycopg scans a query's text for ``%s`` / ``%%`` whenever parameters are passed, even an empty
tuple; a table or column named ``a%s`` or ``50%`` then breaks the statement (``query has 1
placeholders but 0 parameters``) or, worse, shifts its parameters.  Statements built by the
engine therefore follow one rule: **text is never scanned**.  They go through :func:`execute`,
which uses PostgreSQL's own ``$n`` placeholders (a raw cursor) when there are parameters and
passes ``params=None`` when there are none.  Values that are part of a composed statement
without parameters are embedded with :class:`psycopg.sql.Literal`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

Query = str | bytes | sql.Composable


def execute(
    target: psycopg.Connection | psycopg.Cursor, query: Query, params: Sequence[Any] | None = None
) -> psycopg.Cursor:
    """Execute ``query`` on a connection or on the connection of a cursor.  Placeholders are
    ``$1``, ``$2``, ... and the text itself is sent as it is."""
    if isinstance(target, psycopg.RawCursor):
        cur: psycopg.Cursor = target
    else:  # hot paths pass a cursor from cursor(): a new cursor per statement is slower in a pipeline
        cur = cursor(target if isinstance(target, psycopg.Connection) else target.connection)
    if not isinstance(query, (str, bytes, sql.SQL, sql.Composed)):
        query = sql.Composed([query])  # a lone Identifier or Literal
    return cur.execute(query, list(params) if params else None)


def cursor(conn: psycopg.Connection) -> psycopg.RawCursor:
    """A cursor for :func:`execute` to reuse (statements without parameters run on it as usual)."""
    return psycopg.RawCursor(conn)


def dollar(i: int) -> str:
    """The ``i``-th (1-based) native placeholder."""
    return f"${i}"


def one_row(cur: psycopg.Cursor) -> tuple[Any, ...]:
    """The row of a statement that always returns one (``SELECT count(*) ...``, a setting):
    none is a broken invariant, reported as such rather than as ``None`` is not subscriptable."""
    row = cur.fetchone()
    if row is None:
        raise LookupError("a statement that returns one row returned none")
    return row
