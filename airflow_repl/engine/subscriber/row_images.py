"""Rows written and read as JSON images (``to_jsonb`` of a row: column name -> value), the form
in which a queued updating subscriber records its changes.

Values are typed by the target table itself (``jsonb_populate_record(NULL::table, image)``), so
any column type that ``to_jsonb`` writes and the type's input function reads back works.  The
Queue Reader applies images at the publisher and compensates with them at the subscriber.

Owns :class:`Table` (one table: its name, the columns written, its key) and its statements.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from functools import partial
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb, set_json_loads

Image = dict[str, Any]

_loads = partial(json.loads, parse_float=Decimal)
_dumps = partial(json.dumps, default=str, separators=(",", ":"))


def exact_numbers(conn: psycopg.Connection[Any]) -> None:
    """Read JSON numbers with a fraction as Decimal on ``conn`` (never as float: a numeric
    column's value must survive the round trip)."""
    set_json_loads(_loads, conn)


def jsonb(value: Any) -> Jsonb:
    """A JSON parameter; Decimals are written as strings, which the column's type reads back."""
    return Jsonb(value, dumps=_dumps)


def plain(value: Any) -> Any:
    """``value`` with Decimals as strings: what :func:`jsonb` stores, for JSON kept elsewhere."""
    return json.loads(_dumps(value))


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
    row = conn.execute(query, {"k": jsonb(key)}).fetchone()
    return table.project(row[0]) if row is not None else None


def insert(conn: psycopg.Connection[Any], table: Table, image: Image) -> None:
    cols = sql.SQL(", ").join(map(sql.Identifier, table.columns))
    query = sql.SQL("INSERT INTO {t} ({cols}) SELECT {cols} FROM {n}").format(
        t=table.ident, cols=cols, n=table._record("n")
    )
    conn.execute(query, {"n": jsonb(image)})


def update(conn: psycopg.Connection[Any], table: Table, key: Image, image: Image) -> int:
    """Set the row at ``key`` to ``image``; how many rows changed (0 or 1)."""
    sets = sql.SQL(", ").join(sql.SQL("{c} = n.{c}").format(c=sql.Identifier(c)) for c in table.columns)
    query = sql.SQL("UPDATE {target} AS t SET {sets} FROM {n}, {k} WHERE {match}").format(
        target=table.target, sets=sets, n=table._record("n"), k=table._record("k"), match=table._match("k")
    )
    return conn.execute(query, {"n": jsonb(image), "k": jsonb(key)}).rowcount


def delete(conn: psycopg.Connection[Any], table: Table, key: Image) -> int:
    """Delete the row at ``key``; how many rows went (0 or 1)."""
    query = sql.SQL("DELETE FROM {target} AS t USING {k} WHERE {match}").format(
        target=table.target, k=table._record("k"), match=table._match("k")
    )
    return conn.execute(query, {"k": jsonb(key)}).rowcount
