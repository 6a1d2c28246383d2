"""Net-change application of a batch at a MariaDB subscriber (``apply_mode``: ``auto``, the
default, or ``net_change``): the batch's commands collapsed to their net effect per key by the
same rules as at a PostgreSQL subscriber (:mod:`~airflow_repl.engine.subscriber.net_change`;
:mod:`~airflow_repl.engine.subscriber.bulk_apply` has them), applied per article as

* one ``DELETE ... WHERE key IN (...)`` per chunk of keys (OR'd key matches for a key of several
  columns), first, so unique keys never collide on the way;
* the rows that existed before the batch and are updated: their final images loaded into a
  temporary copy of the table (``CREATE TEMPORARY TABLE ... LIKE``, so every value is converted
  to the column's type as the statement by statement INSERT and UPDATE convert it), then one
  ``UPDATE table JOIN copy USING the key`` per set of columns it sets (every column for SQL
  statements, CALL and XCALL; for SCALL and MCALL generated procedures the columns some UPDATE
  of the batch changed);
* multi-row INSERTs of the rows inserted (each statement at most ``ROUND_TRIP_BYTES``, well
  under ``max_allowed_packet``);

many statements per round trip, in the batch's InnoDB transaction, which the caller commits
with the watermark.  Each value travels as the statement-by-statement path sends it
(:func:`mariadb_apply.conversions`).  The rows each DELETE and UPDATE finds are counted (the
connection reports rows found, not changed): another number (a row not found), a duplicate key,
a value MariaDB cannot hold, or a batch the collapse does not cover raises
:class:`NotNetApplicable` or the driver's error, and the caller rolls back and applies the
batch command by command: the same errors, ``skip_errors`` and messages as without net change.

MariaDB triggers fire for replicated changes (there is no replication role to silence them), so
under ``auto`` an article whose subscriber table has any trigger goes command by command
(:func:`article_paths`); :func:`triggers` is read again after each batch's statements, when the
batch's metadata locks keep a new trigger from being created before it commits.  Updatable
subscriptions do not exist at MariaDB.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pymysql import converters
from pymysql.constants import SERVER_STATUS

from airflow_repl.engine.articles.commands import Command, Values
from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.mariadb import types
from airflow_repl.engine.mariadb.quoting import ident
from airflow_repl.engine.model.propagation import Method, Propagation
from airflow_repl.engine.subscriber import mariadb_calls, net_change
from airflow_repl.engine.subscriber.mariadb_apply import ROUND_TRIP_BYTES, conversions
from airflow_repl.engine.subscriber.net_change import ArticlePath, NotNetApplicable

#: Keys per DELETE statement.
DELETE_KEYS = 1000


def as_applied(art: ResolvedArticle) -> ResolvedArticle:
    """``art`` with each operation's propagation as a MariaDB subscriber applies it, for the
    shared rules: a procedure named exactly as the article's generated one is the generated
    procedure (no name), the unnamed default is an SQL statement (every column updated), and a
    custom procedure and ``NONE`` stay as they are (command by command)."""
    props = {}
    for op, prop in art.propagation.items():
        if mariadb_calls.generated(art, op):
            props[op] = Propagation(op, Method.PROC, prop.syntax, None)
        elif mariadb_calls.custom(art, op) or prop.method == Method.NONE:
            props[op] = prop
        else:
            props[op] = Propagation(op, Method.SQL)
    return dataclasses.replace(art, propagation=props)


def triggers(conn: Any, database: str, articles: Iterable[ResolvedArticle]) -> dict[tuple[str, str], list[str]]:
    """The triggers on the articles' subscriber tables, by (schema, table) as the articles name
    them (:func:`net_change.article_paths`' ``triggers``): at MariaDB every trigger fires for
    replicated changes."""
    by_table = {art.dest_table: (art.dest_schema, art.dest_table) for art in articles}
    if not by_table:
        return {}
    marks = ", ".join(["%s"] * len(by_table))
    with conn.cursor() as cur:
        cur.execute(
            "SELECT EVENT_OBJECT_TABLE, TRIGGER_NAME FROM information_schema.TRIGGERS "
            f"WHERE EVENT_OBJECT_SCHEMA = %s AND EVENT_OBJECT_TABLE IN ({marks}) ORDER BY TRIGGER_NAME",
            (database, *by_table),
        )
        out: dict[tuple[str, str], list[str]] = {}
        for table, name in cur.fetchall():
            out.setdefault(by_table[table], []).append(name)
    return out


def article_paths(
    mode: str,
    articles: Iterable[ResolvedArticle],
    found: dict[tuple[str, str], list[str]],
    scripts: Iterable[str] = (),
    streams: int = 1,
) -> list[ArticlePath]:
    """Each article's path at a MariaDB subscriber (:func:`net_change.article_paths` over
    :func:`as_applied`): never updatable; ``found``: :func:`triggers`; ``streams``: the
    subscription's ``subscription_streams``."""
    return net_change.article_paths(
        mode, [as_applied(a) for a in articles], triggers=found, scripts=scripts, streams=streams
    )


@dataclass(frozen=True)
class Prepared:
    """A batch's net change as MariaDB statements, ready to run: each with the rows it must find
    (None: any) and what it is; the articles whose temporary copies they use.  Made without the
    connection (the read-ahead makes it in another thread while the batch before is applied)."""

    statements: list[tuple[str, int | None, str]]
    copies: list[ResolvedArticle]
    commands: int  # how many commands it nets


def copy_name(art: ResolvedArticle) -> str:
    """The name of the article's temporary copy (one per article, for the session)."""
    return "airflow_repl_net_" + hashlib.sha256(art.name.encode()).hexdigest()[:16]


class NetChange:
    """Applies batches by net change on one MariaDB connection (its temporary copies of the
    tables kept for the session)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self._copies: set[str] = set()  # the temporary copies made in this session
        # the session's sql_mode is the agent's own: how quotes are escaped does not change
        self._no_backslash = bool(conn.server_status & SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES)

    def forget(self) -> None:
        """After a schema change: drop the temporary copies (made again from the new tables)."""
        if self._copies:
            with self.conn.cursor() as cur:
                cur.execute("DROP TEMPORARY TABLE IF EXISTS " + ", ".join(ident(c) for c in sorted(self._copies)))
            self._copies.clear()

    def apply(self, commands: Sequence[Command], articles: dict[str, ResolvedArticle]) -> int:
        """Apply ``commands`` by net change, no commit (:meth:`prepare`, then :meth:`execute`)."""
        return self.execute(self.prepare(commands, articles))

    def prepare(self, commands: Sequence[Command], articles: dict[str, ResolvedArticle]) -> Prepared:
        """The net change of ``commands`` (of the articles ``articles``, as :func:`as_applied`
        gives them) as statements; NotNetApplicable (or a value MariaDB cannot hold) when the
        batch must be applied command by command.  Does not use the connection."""
        plan = net_change.net_changes(commands, articles)
        statements: list[tuple[str, int | None, str]] = []
        copies = []
        for name, keys in plan.items():
            if keys:
                rows = net_change.split(articles[name], keys)
                statements += _statements(articles[name], rows, self._no_backslash)
                if rows.updates:
                    copies.append(articles[name])
        return Prepared(statements, copies, len(commands))

    def execute(self, prepared: Prepared) -> int:
        """Run a prepared net change, no commit; how many commands it nets.  NotNetApplicable or
        the driver's error: the caller rolls back and applies the batch command by command."""
        for art in prepared.copies:
            name = copy_name(art)
            if name not in self._copies:
                with self.conn.cursor() as cur:  # no implicit commit: it is TEMPORARY
                    cur.execute(f"CREATE TEMPORARY TABLE IF NOT EXISTS {ident(name)} LIKE {ident(art.dest_table)}")
                self._copies.add(name)
        _run(self.conn, prepared.statements)
        return prepared.commands


def _escaper(art: ResolvedArticle, no_backslash: bool) -> Callable[[Values, Iterable[int]], list[str]]:
    """The article's values at ``positions`` as MariaDB literals: each converted as the
    statement-by-statement path converts it (:func:`types.to_param`), then escaped as the
    driver escapes it."""
    conv = conversions(art)
    names = art.column_names
    where = f"article {art.name!r}"

    def literal(value: Any) -> str:
        if value is None:
            return "NULL"
        if isinstance(value, str):
            return "'" + (value.replace("'", "''") if no_backslash else converters.escape_string(value)) + "'"
        if isinstance(value, bool):
            return "1" if value else "0"
        if isinstance(value, bytes):
            return "_binary X'" + value.hex() + "'"
        if isinstance(value, float):  # a real's exact single-precision value (finite: to_param checked)
            return repr(value)
        raise TypeError(f"a value of type {type(value).__name__} for MariaDB")

    def literals(values: Values, positions: Iterable[int]) -> list[str]:
        return [
            literal(
                v
                if (v := values[i]) is None or conv[i] == types.AS_TEXT
                else types.to_param(conv[i], v, names[i], where)
            )
            for i in positions
        ]

    return literals


def _statements(art: ResolvedArticle, rows: net_change.Split, no_backslash: bool) -> list[tuple[str, int | None, str]]:
    """The article's DELETEs, UPDATEs (through its temporary copy) and INSERTs."""
    literals = _escaper(art, no_backslash)
    table = ident(art.dest_table)
    names = art.column_names
    out: list[tuple[str, int | None, str]] = []
    pk = art.pk_positions
    for start in range(0, len(rows.deletes), DELETE_KEYS):
        chunk = rows.deletes[start : start + DELETE_KEYS]
        # a key's values are in key order: placed at the key's positions to be converted
        found = [literals(dict(zip(pk, k, strict=True)), pk) for k in chunk]  # type: ignore[arg-type]
        if len(pk) == 1:
            match = f"{ident(names[pk[0]])} IN ({', '.join(v[0] for v in found)})"
        else:
            match = " OR ".join(
                "(" + " AND ".join(f"{ident(names[p])} = {x}" for p, x in zip(pk, v, strict=True)) + ")" for v in found
            )
        out.append((f"DELETE FROM {table} WHERE {match}", len(chunk), f"DELETE of article {art.name!r}"))
    every = range(len(names))
    columns = ", ".join(ident(n) for n in names)
    if rows.updates:
        copy = ident(copy_name(art))
        on = " AND ".join(f"t.{ident(names[i])} = s.{ident(names[i])}" for i in pk)
        for cols, finals in rows.updates.items():
            # emptied before it is filled (its rows stay until then: a temporary table is the session's own)
            out.append((f"DELETE FROM {copy}", None, f"UPDATE of article {art.name!r}"))
            out += [(f"INSERT INTO {copy} ({columns}) VALUES {v}", None, "") for v in _values(finals, every, literals)]
            # no column changed (SCALL, MCALL): the key set to itself, so that the rows are still found
            sets = ", ".join(f"t.{ident(names[i])} = {'s' if cols else 't'}.{ident(names[i])}" for i in cols or pk[:1])
            what = f"UPDATE of article {art.name!r}"
            out.append((f"UPDATE {table} AS t JOIN {copy} AS s ON {on} SET {sets}", len(finals), what))
    out += [
        (f"INSERT INTO {table} ({columns}) VALUES {v}", None, f"INSERT of article {art.name!r}")
        for v in _values(rows.inserts, every, literals)
    ]
    return out


def _values(rows: Sequence[Values], positions: range, literals: Any) -> list[str]:
    """The rows as the VALUES lists of multi-row INSERTs, each at most ``ROUND_TRIP_BYTES``."""
    out: list[str] = []
    chunk: list[str] = []
    size = 0
    for row in rows:
        text = "(" + ", ".join(literals(row, positions)) + ")"
        if chunk and size + len(text) > ROUND_TRIP_BYTES:
            out.append(", ".join(chunk))
            chunk, size = [], 0
        chunk.append(text)
        size += len(text) + 2
    if chunk:
        out.append(", ".join(chunk))
    return out


def _run(conn: Any, statements: list[tuple[str, int | None, str]]) -> None:
    """Run the statements in order, many per round trip (the connection allows
    multi-statements and reports rows found); NotNetApplicable when one found another number
    of rows than it must."""
    with conn.cursor() as cur:
        start = 0
        while start < len(statements):
            end, size = start, 0
            while end < len(statements) and (end == start or size + len(statements[end][0]) <= ROUND_TRIP_BYTES):
                size += len(statements[end][0])
                end += 1
            trip = statements[start:end]
            cur.execute(";\n".join(text for text, _, _ in trip))
            wrong: str | None = None
            for i, (_, expected, what) in enumerate(trip):
                if i:
                    cur.nextset()
                if wrong is None and expected is not None and cur.rowcount != expected:
                    wrong = f"{what} affected {cur.rowcount} rows, not {expected}"
            if wrong is not None:
                raise NotNetApplicable(wrong)
            start = end
