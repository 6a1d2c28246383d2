"""Net-change application of a batch (``apply_mode``: ``auto``, the default, or ``net_change``): the batch's row
changes collapsed to their net effect per key and applied with set-based statements per article
(a DELETE ... USING, an UPDATE ... FROM per set of changed columns, an INSERT ... SELECT) whose
rows are their array parameters (``unnest``), all the batch's statements sent in one pipeline,
instead of one statement (and one procedure call) per command.

The batch commits with the watermark as one transaction either way, so nobody can see the
difference in the subscriber's tables: every row ends exactly as applying the commands one by
one leaves it.  The rules that keep it so:

* a row that existed before the batch and is updated (never deleted) is UPDATEd: every column
  for CALL, XCALL and SQL statements, and for SCALL and MCALL only the columns some UPDATE of the
  batch changed (as applying each command's bitmap in turn would);
* a row deleted (or deleted and inserted again, e.g. a key change's DELETE + INSERT pair) is
  DELETEd, before any INSERT, so unique keys never collide on the way;
* the rows the DELETEs and UPDATEs must find are counted: a row not found (SQL Server's 20598),
  a duplicate key, a command sequence that could not apply at the publisher's order (an INSERT of
  a row the batch already has) or anything the set-based path does not cover (TRUNCATE, schema
  changes, NONE or custom procedures, queued subscribers) makes the caller apply the batch as
  before, command by command: the same errors, ``skip_errors`` and messages as without it.

What differs is only what ``ENABLE ALWAYS`` and ``ENABLE REPLICA`` triggers at the subscriber
see: the net rows, not every intermediate command (ordinary triggers do not fire for replicated
changes at all).  Which articles go by net change is :func:`article_paths`' choice: under
``apply_mode: auto`` only those where nothing at the subscriber can tell (no such trigger, no
custom procedure or script, not an updatable subscriber); the others, and every batch holding
one of their commands, go command by command.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import psycopg
from psycopg import sql

from airflow_repl.engine.articles.commands import Command
from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.postgres import catalog
from airflow_repl.engine.subscriber.net_change import (  # the collapse both engines share
    CHUNK_COMMANDS,
    NET_CHANGE,
    PER_COMMAND,
    ArticlePath,
    Key,
    NotNetApplicable,
    _Key,
    article_paths,
    eligible,
    masked,
    net_changes,
    not_net_reason,
    split,
)

__all__ = [
    "CHUNK_COMMANDS",
    "NET_CHANGE",
    "PER_COMMAND",
    "ArticlePath",
    "Key",
    "NotNetApplicable",
    "_Key",
    "article_paths",
    "eligible",
    "net_changes",
    "not_net_reason",
]


def watching_triggers(
    conn: psycopg.Connection, articles: Sequence[ResolvedArticle]
) -> dict[tuple[str, str], list[str]]:
    """Lock the articles' subscriber tables (``ROW EXCLUSIVE``, as their DML would, in this
    order) and return the triggers that fire there for replicated changes (empty: none).  Under
    that lock no trigger can be created or enabled there before the transaction ends, so a batch
    applied by net change after an empty answer is seen by no trigger.  One round trip, whose
    question is whether the database has any such trigger at all (:data:`ANY_REPLICATED_TRIGGER`,
    a tenth of a millisecond against seven for the tables' own, each batch); only when it has
    are the tables' own asked, in a second."""
    tables = [(a.dest_schema, a.dest_table) for a in articles]
    with conn.pipeline():
        conn.execute(_lock_tables(articles))
        cur = conn.execute(ANY_REPLICATED_TRIGGER)
    if cur.fetchone() is None:
        return {}
    return catalog.replicated_change_triggers(conn, tables)


#: The condition of a user trigger that fires for replicated changes (``ENABLE ALWAYS`` or
#: ``ENABLE REPLICA``), as :func:`~airflow_repl.engine.postgres.catalog.replicated_change_triggers`
#: counts them, on ``pg_catalog.pg_trigger``.
_FIRES_FOR_REPLICATED = "tgenabled IN ('A', 'R') AND NOT tgisinternal"

#: SQL: a row when some table of the database has a user trigger that fires for replicated
#: changes; none is the common case, which needs no look at the tables and their partitions.
ANY_REPLICATED_TRIGGER = f"SELECT FROM pg_catalog.pg_trigger WHERE {_FIRES_FOR_REPLICATED} LIMIT 1"

#: The SQLSTATE :data:`NO_REPLICATED_TRIGGER` raises with.
TRIGGER_FIRES_SQLSTATE = "RPTRG"

#: SQL: raises (:data:`TRIGGER_FIRES_SQLSTATE`) when the database has a trigger that fires for
#: replicated changes (:data:`ANY_REPLICATED_TRIGGER`'s question, as cheap), so that a pipeline
#: sending it before a batch's statements runs none of them when it raises.
NO_REPLICATED_TRIGGER = (
    f"DO $check$ BEGIN IF EXISTS (SELECT FROM pg_catalog.pg_trigger WHERE {_FIRES_FOR_REPLICATED}) THEN "
    f"RAISE EXCEPTION USING ERRCODE = '{TRIGGER_FIRES_SQLSTATE}', "
    "MESSAGE = 'a trigger fires for replicated changes at the subscriber'; END IF; END $check$"
)


def watch_statements(articles: Sequence[ResolvedArticle]) -> list[tuple[str, Sequence[Any] | None]]:
    """The statements that watch a batch's tables in its own pipeline (for :func:`execute`'s
    ``before``): the articles' subscriber tables locked as :func:`watching_triggers` locks them,
    then :data:`NO_REPLICATED_TRIGGER`.  When it raises (:func:`trigger_fires`), the caller rolls
    back and asks :func:`watching_triggers` which tables have one."""
    return [(_lock_tables(articles), None), (NO_REPLICATED_TRIGGER, None)]  # no parameters: a % is a %


def trigger_fires(exc: BaseException) -> bool:
    """Whether ``exc`` is :data:`NO_REPLICATED_TRIGGER`'s error."""
    return isinstance(exc, psycopg.Error) and exc.sqlstate == TRIGGER_FIRES_SQLSTATE


def _lock_tables(articles: Sequence[ResolvedArticle]) -> str:
    """``LOCK TABLE`` of the articles' subscriber tables in ``ROW EXCLUSIVE`` mode (in this order)."""
    names = sql.SQL(", ").join(sql.Identifier(a.dest_schema, a.dest_table) for a in articles)
    return sql.SQL("LOCK TABLE {} IN ROW EXCLUSIVE MODE").format(names).as_string(None)


def apply(conn: psycopg.Connection, commands: Sequence[Command], articles: dict[str, ResolvedArticle]) -> int:
    """Apply the commands by net change on ``conn`` (no commit); returns how many commands they
    were.  NotNetApplicable (nothing to undo beyond the caller's rollback) when the batch must be
    applied command by command.  :func:`prepare`, then :func:`execute`."""
    return execute(conn, prepare(commands, articles))


@dataclass(frozen=True)
class Prepared:
    """A batch's net change, ready to apply: per article (in the order their commands came) its
    DELETE, UPDATE and INSERT rows as array parameters.  Made without a connection (the
    Distribution Agent's read-ahead makes it in another thread while the batch before is applied)."""

    runs: list[_PreparedRun]
    commands: int  # how many commands it nets


#: One set-based statement to run (:func:`_statement`): the article, which one (``"D"``,
#: ``"U"``, ``"I"``, or ``"M"``: an UPDATE of the columns each row's mask names), the article's
#: columns it carries (in ``s``, one array each), its parameters (a text array literal per
#: column of ``s``, :func:`array_literal`; ``"M"``'s mask array first), the rows it must find,
#: and what it is (for the message when it finds another number).
_PreparedRun = tuple[ResolvedArticle, str, tuple[int, ...], list[str], int, str]

#: SCALL and MCALL update only the columns the batch changed: one UPDATE per set of changed
#: columns, carrying only the key and those columns, for up to this many sets per article and
#: batch; a batch with more sets (rows changed in many different ways) updates them all with one
#: statement that picks each column by the row's mask.
MASK_STATEMENTS = 4


def prepare(commands: Sequence[Command], articles: dict[str, ResolvedArticle]) -> Prepared:
    """The commands' net change (NotNetApplicable when the batch must be applied command by command)."""
    plan = net_changes(commands, articles)
    return Prepared([run for name, keys in plan.items() if keys for run in _runs(articles[name], keys)], len(commands))


def execute(
    conn: psycopg.Connection,
    prepared: Prepared,
    then: Sequence[tuple[str, Sequence[Any]]] = (),
    before: Sequence[tuple[str, Sequence[Any] | None]] = (),
) -> int:
    """Apply a prepared net change on ``conn`` (no commit); returns how many commands it nets.
    Every statement is sent in one pipeline (one round trip): the statements ``before`` (e.g.
    :func:`watch_statements`; one that raises leaves the others unrun), then in article order and
    per article DELETE, UPDATE, INSERT, followed by the statements ``then`` (e.g. the watermark's
    move); the server runs them in that order, and the rows each set-based statement found are
    checked when all have run (NotNetApplicable: the caller rolls back)."""
    if prepared.runs or then or before:
        with conn.pipeline():
            for query, params in before:
                conn.execute(query, params)
            sent = [
                (psycopg.RawCursor(conn).execute(_statement(conn, art, op, columns), params), expected, what)
                for art, op, columns, params, expected, what in prepared.runs
            ]
            for query, params in then:
                conn.execute(query, params)
        for cur, expected, what in sent:
            if cur.rowcount != expected:
                raise NotNetApplicable(f"{what} affected {cur.rowcount} rows, not {expected}")
    return prepared.commands


def _runs(art: ResolvedArticle, keys: dict[Key, _Key]) -> list[_PreparedRun]:
    """The article's DELETE, UPDATEs and INSERT (those with rows), each with its rows as
    parameters: one text array per column it carries."""
    rows = split(art, keys)
    every = tuple(range(len(art.column_names)))
    deletes, inserts, updates = rows.deletes, rows.inserts, rows.updates
    out: list[_PreparedRun] = []
    if deletes:
        pk = tuple(art.pk_positions)
        out.append((art, "D", pk, _arrays(deletes, range(len(pk))), len(deletes), f"DELETE of article {art.name!r}"))
    if masked(art) and len(updates) > MASK_STATEMENTS:
        rows_ = [row for group in updates.values() for row in group]
        masks = [_mask(cols, len(every)) for cols, group in updates.items() for _ in group]
        params = [array_literal(masks), *_arrays(rows_, every)]
        out.append((art, "M", every, params, len(rows_), f"UPDATE of article {art.name!r}"))
    else:
        for cols, group in updates.items():
            params = _arrays(group, _carried(art, "U", cols))
            out.append((art, "U", cols, params, len(group), f"UPDATE of article {art.name!r}"))
    if inserts:
        out.append((art, "I", every, _arrays(inserts, every), len(inserts), f"INSERT of article {art.name!r}"))
    return out


def _arrays(rows: Sequence[Sequence[str | None]], positions: Iterable[int]) -> list[str]:
    """Per position, the rows' values there as one text array literal."""
    return [array_literal([row[i] for row in rows]) for i in positions]


def _mask(cols: tuple[int, ...], n: int) -> str:
    """The columns an UPDATE sets as a string of ``0`` and ``1`` (column k: character k)."""
    chosen = set(cols)
    return "".join("1" if i in chosen else "0" for i in range(n))


def array_literal(values: Sequence[str | None]) -> str:
    """A ``text[]`` literal of ``values`` (PostgreSQL's array input syntax), built in one piece:
    every element double-quoted, NULL unquoted.  For values without a double quote, a backslash
    or a control character (the usual case) it is orjson's JSON array with braces for brackets:
    JSON and array input then quote alike, and ``null`` is array input's NULL (case-insensitive);
    other values are escaped element by element (backslash before ``\\`` and ``"``)."""
    text = orjson.dumps(values).decode()
    if "\\" not in text:
        return "{" + text[1:-1] + "}"
    return "{" + ",".join(["NULL" if v is None else '"' + _ARRAY_ESCAPE.sub(r"\\\g<0>", v) + '"' for v in values]) + "}"


_ARRAY_ESCAPE = re.compile(r'["\\]')


def _carried(art: ResolvedArticle, op: str, columns: tuple[int, ...]) -> tuple[int, ...]:
    """The article's columns a statement's rows carry, in the order of its arrays: a DELETE's
    the key's (in key order), an UPDATE of some columns the key's and those (in table order), the
    others every column."""
    if op == "U":
        return tuple(sorted({*art.pk_positions, *columns}))
    return columns


#: At most this many composed statements are kept per connection (sets of changed columns may
#: be many over a long run).
STATEMENTS_KEPT = 512

#: Per connection, the set-based statements it ran, by article definition (digest), what they
#: do and the columns they set: composed once.
_STATEMENTS: weakref.WeakKeyDictionary[psycopg.Connection, dict[tuple[str, str, tuple[int, ...]], str]] = (
    weakref.WeakKeyDictionary()
)


def forget_tables(conn: psycopg.Connection) -> None:
    """After a rollback: forget what is known about the connection (its statements are composed again)."""
    _STATEMENTS.pop(conn, None)


def _statement(conn: psycopg.Connection, art: ResolvedArticle, op: str, columns: tuple[int, ...]) -> str:
    """The article's DELETE (``"D"``), UPDATE of ``columns`` (``"U"``), UPDATE by mask (``"M"``)
    or INSERT (``"I"``) on ``conn``; ``s`` is the statement's rows, from its array parameters."""
    made = _STATEMENTS.setdefault(conn, {})
    key = (art.digest, op, columns)
    if key not in made:
        if len(made) >= STATEMENTS_KEPT:  # rows changed in ever new sets of columns: start again
            made.clear()
        carried = _carried(art, op, columns)
        names = [sql.Identifier(f"c{i + 1}") for i in carried]
        if op == "M":
            names.insert(0, sql.Identifier("m"))
        # PostgreSQL's own placeholders ($n, :func:`execute` sends them through a RawCursor): a %
        # in a table's or a column's name is then a % (psycopg's %s would read it as a placeholder)
        arrays = sql.SQL(", ").join(sql.SQL(f"${n}::text[]") for n in range(1, len(names) + 1))
        source = sql.SQL("unnest({}) AS s({})").format(arrays, sql.SQL(", ").join(names))
        dest = sql.Identifier(art.dest_schema, art.dest_table)
        if op == "D":
            statement = sql.SQL("DELETE FROM {} AS t USING {} WHERE {}").format(dest, source, _key_match(art))
        elif op == "I":
            statement = _insert(art, dest, source)
        else:
            statement = _update(art, dest, source, columns, op == "M")
        made[key] = statement.as_string(conn)
    return made[key]


def _value(art: ResolvedArticle, i: int) -> sql.Composable:
    # the type text comes from the publisher's format_type(), which quotes what needs quoting
    return sql.SQL("s.{}::" + art.columns[i].type).format(sql.Identifier(f"c{i + 1}"))


def _key_match(art: ResolvedArticle) -> sql.Composable:
    return sql.SQL(" AND ").join(
        sql.SQL("t.{} = {}").format(sql.Identifier(art.column_names[i]), _value(art, i)) for i in art.pk_positions
    )


def _update(
    art: ResolvedArticle, dest: sql.Composable, source: sql.Composable, columns: tuple[int, ...], by_mask: bool
) -> sql.Composed:
    """SET the ``columns`` from ``s`` (none: the key to itself, so that the rows are still found
    and updated, as an UPDATE that changed nothing is at the publisher), or by mask every column
    to ``s``'s value where the row's mask has a ``1`` and to its own elsewhere."""
    sets = []
    for i in columns or art.pk_positions[:1]:
        col = sql.Identifier(art.column_names[i])
        if by_mask:
            sets.append(
                sql.SQL("{} = CASE WHEN substr(s.m, {}, 1) = '1' THEN {} ELSE t.{} END").format(
                    col, sql.Literal(i + 1), _value(art, i), col
                )
            )
        else:
            sets.append(sql.SQL("{} = {}").format(col, _value(art, i) if columns else sql.SQL("t.{}").format(col)))
    return sql.SQL("UPDATE {} AS t SET {} FROM {} WHERE {}").format(
        dest, sql.SQL(", ").join(sets), source, _key_match(art)
    )


def _insert(art: ResolvedArticle, dest: sql.Composable, source: sql.Composable) -> sql.Composed:
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in art.column_names)
    values = sql.SQL(", ").join(_value(art, i) for i in range(len(art.column_names)))
    return sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {}").format(dest, cols, values, source)
