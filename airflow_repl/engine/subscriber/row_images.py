"""Rows written and read as JSON images (``to_jsonb`` of a row: column name -> value), the form
in which a queued updating subscriber records its changes.

Values are typed by the target table itself (``jsonb_populate_record(NULL::table, image)``), so
any column type that ``to_jsonb`` writes and the type's input function reads back works.  The
Queue Reader applies images at the publisher and compensates with them at the subscriber.  Images
are read with exact numbers and written as :mod:`~airflow_repl.engine.postgres.json_values` writes
them.

Owns :class:`Table` (one table: its name, the columns written, its key) and its statements.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from airflow_repl.engine.articles.commands import Values
from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.postgres import json_values

Image = dict[str, Any]


@dataclass(frozen=True)
class Table:
    """A table rows are written to by image: ``columns`` are written, ``key`` locates a row,
    ``only`` leaves out inheritance children."""

    schema: str
    name: str
    columns: list[str]
    key: list[str]
    only: bool = True

    @property
    def ident(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.name)

    @property
    def target(self) -> sql.Composable:
        return sql.SQL("ONLY {}").format(self.ident) if self.only else self.ident

    def key_of(self, image: Image) -> Image:
        """The key values of an image."""
        return {c: image.get(c) for c in self.key}

    def project(self, image: Image) -> Image:
        """The image restricted to the written columns."""
        return {c: image.get(c) for c in self.columns}

    def _record(self, alias: str) -> sql.Composed:
        return sql.SQL("jsonb_populate_record(NULL::{}, %({})s) AS {}").format(
            self.ident, sql.SQL(alias), sql.Identifier(alias)
        )

    def _match(self, alias: str) -> sql.Composed:
        return sql.SQL(" AND ").join(
            sql.SQL("t.{c} = {a}.{c}").format(c=sql.Identifier(c), a=sql.Identifier(alias)) for c in self.key
        )


def fetch(conn: psycopg.Connection[Any], table: Table, key: Image, *, lock: bool = False) -> Image | None:
    """The row at ``key`` (restricted to the written columns), locked FOR UPDATE when asked;
    None when there is none."""
    query = sql.SQL("SELECT to_jsonb(t) FROM {target} AS t, {k} WHERE {match}{lock}").format(
        target=table.target,
        k=table._record("k"),
        match=table._match("k"),
        lock=sql.SQL(" FOR UPDATE OF t") if lock else sql.SQL(""),
    )
    row = conn.execute(query, {"k": json_values.jsonb(key)}).fetchone()
    return table.project(row[0]) if row is not None else None


def insert(conn: psycopg.Connection[Any], table: Table, image: Image) -> None:
    cols = sql.SQL(", ").join(map(sql.Identifier, table.columns))
    query = sql.SQL("INSERT INTO {t} ({cols}) SELECT {cols} FROM {n}").format(
        t=table.ident, cols=cols, n=table._record("n")
    )
    conn.execute(query, {"n": json_values.jsonb(image)})


def update(conn: psycopg.Connection[Any], table: Table, key: Image, image: Image) -> int:
    """Set the row at ``key`` to ``image``; how many rows changed (0 or 1)."""
    sets = sql.SQL(", ").join(sql.SQL("{c} = n.{c}").format(c=sql.Identifier(c)) for c in table.columns)
    query = sql.SQL("UPDATE {target} AS t SET {sets} FROM {n}, {k} WHERE {match}").format(
        target=table.target, sets=sets, n=table._record("n"), k=table._record("k"), match=table._match("k")
    )
    return conn.execute(query, {"n": json_values.jsonb(image), "k": json_values.jsonb(key)}).rowcount


def delete(conn: psycopg.Connection[Any], table: Table, key: Image) -> int:
    """Delete the row at ``key``; how many rows went (0 or 1)."""
    query = sql.SQL("DELETE FROM {target} AS t USING {k} WHERE {match}").format(
        target=table.target, k=table._record("k"), match=table._match("k")
    )
    return conn.execute(query, {"k": json_values.jsonb(key)}).rowcount


def typed(conn: psycopg.Connection[Any], art: ResolvedArticle, values: Values) -> Image:
    """A command's image (its text values, in the article's column order) as ``to_jsonb``
    writes the row: each value read into its column's type, so that a value has the same JSON
    type here as in the images the subscriber records (an integer a number, not a string)."""
    columns = sql.SQL(", ").join(
        # the type text is the publisher's format_type(), which quotes what needs quoting
        sql.SQL("%s::" + column.param_type.replace("%", "%%") + " AS ") + sql.Identifier(column.name)
        for column in art.columns
    )
    row = conn.execute(sql.SQL("SELECT to_jsonb(r) FROM (SELECT {}) AS r").format(columns), values).fetchone()
    assert row is not None
    return dict(row[0])
