"""Net-change application of a batch (subscription option ``bulk_apply``): the batch's row
changes collapsed to their net effect per key and applied with three set-based statements per
article (DELETE ... USING, UPDATE ... FROM, INSERT ... SELECT) whose rows are their array
parameters (``unnest``), all the batch's statements sent in one pipeline, instead of one
statement (and one procedure call) per command.

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

What differs is only what ``ENABLE ALWAYS`` triggers at the subscriber see: the net rows, not
every intermediate command (ordinary triggers do not fire for replicated changes at all).
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import compress, count
from operator import ne

import orjson
import psycopg
from psycopg import sql

from airflow_repl.engine.articles.commands import DELETE, INSERT, UPDATE, Command, OpCode, Values
from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.model.propagation import CallSyntax, Method, Operation

#: Net change holds at most this many commands in memory: a larger batch (one huge transaction,
#: or a batch of big ones) is applied in chunks of this many commands, in order, in the same
#: subscriber transaction.  Each chunk's net effect, applied after the chunks before it, leaves
#: every row as its commands one by one would, so the whole batch does too.
CHUNK_COMMANDS = 100_000

#: A row's primary-key values (text), as the commands carry them.
Key = tuple[str | None, ...]


class NotNetApplicable(Exception):
    """The batch must be applied command by command (a set-based statement found another number
    of rows than the commands expect, or the batch holds what it does not cover)."""


@dataclass(slots=True)
class _Key:
    """The net effect of a batch's commands on one key."""

    existed: bool  # the first command found the row (UPDATE/DELETE): it existed before the batch
    final: Values | None  # the row at the end of the batch (None: deleted)
    deleted: bool = False  # deleted at some point (then, if final, inserted again)
    changed: set[int] = field(default_factory=set)  # columns UPDATEs changed (SCALL/MCALL)


def eligible(article: ResolvedArticle | None) -> bool:
    """Whether the article's commands may be applied by net change: inserts, updates and deletes
    by generated procedures or SQL statements (their effect is plain DML by key)."""
    if article is None or article.include_children:
        return False
    for op in (Operation.INSERT, Operation.UPDATE, Operation.DELETE):
        prop = article.propagation[op]
        if prop.method == Method.NONE or (prop.method == Method.PROC and prop.custom):
            return False
    return True


_ROW_OPS = (INSERT, UPDATE, DELETE)


def net_changes(commands: Sequence[Command], articles: dict[str, ResolvedArticle]) -> dict[str, dict[Key, _Key]]:
    """article -> key -> net effect, in the order of the commands (NotNetApplicable when a
    command is outside what the set-based path covers or could not apply in that order)."""
    out: dict[str, dict[Key, _Key]] = {}
    checked: dict[str, tuple[dict[Key, _Key], list[int]]] = {}  # the eligible articles met so far: keys, pk
    for cmd in commands:
        op = cmd.op
        entry = checked.get(cmd.article)
        if entry is None or op not in _ROW_OPS:
            art = articles.get(cmd.article)
            if op not in _ROW_OPS or art is None or not (entry is not None or eligible(art)):
                raise NotNetApplicable(f"{cmd.op} command of article {cmd.article!r}")
            entry = checked[cmd.article] = (out.setdefault(cmd.article, {}), art.pk_positions)
        keys, pk = entry
        image = cmd.new if op == INSERT else cmd.old
        assert image is not None
        key = tuple([image[i] for i in pk])
        if op == UPDATE and cmd.new is not None and (moved := tuple([cmd.new[i] for i in pk])) != key:
            # a key change kept as one UPDATE (multi_row_key_changes): the row leaves one key for another
            _step(keys, key, DELETE, cmd.old, None)
            _step(keys, moved, INSERT, None, cmd.new)
            continue
        _step(keys, key, op, cmd.old, cmd.new)
    return out


def _step(keys: dict[Key, _Key], key: Key, op: OpCode, old: Values | None, new: Values | None) -> None:
    """One command (``op`` with its before and after images) applied to the net effect on ``key``."""
    state = keys.get(key)
    if op == INSERT:
        if state is None:
            keys[key] = _Key(existed=False, final=new)
        elif state.final is None:
            state.final = new
        else:
            raise NotNetApplicable("an INSERT of a row the batch already has")
        return
    if state is not None and state.final is None:
        raise NotNetApplicable(f"an {op} of a row the batch deleted")
    if op == UPDATE:
        assert old is not None and new is not None
        if state is None:
            state = keys[key] = _Key(existed=True, final=new)
        state.final = new
        if len(old) != len(new):
            raise ValueError(f"an UPDATE's images have {len(old)} and {len(new)} columns")
        state.changed.update(compress(count(), map(ne, old, new)))  # the columns whose text differs (Command.changed)
        return
    if state is None:
        keys[key] = _Key(existed=True, final=None, deleted=True)
    elif not state.existed and not state.deleted:
        del keys[key]  # inserted and deleted within the batch: no net change
    else:
        state.final, state.deleted = None, True


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


#: One set-based statement to run: the article, which one (``"D"``, ``"U"``, ``"I"``), its
#: parameters (one text array literal per column of ``s``, :func:`array_literal`), the rows it
#: must find, and what it is (for the message when it finds another number).
_PreparedRun = tuple[ResolvedArticle, str, list[str], int, str]


def prepare(commands: Sequence[Command], articles: dict[str, ResolvedArticle]) -> Prepared:
    """The commands' net change (NotNetApplicable when the batch must be applied command by command)."""
    plan = net_changes(commands, articles)
    return Prepared([run for name, keys in plan.items() if keys for run in _runs(articles[name], keys)], len(commands))


def execute(conn: psycopg.Connection, prepared: Prepared) -> int:
    """Apply a prepared net change on ``conn`` (no commit); returns how many commands it nets.
    Every statement is sent in one pipeline (one round trip), in article order and per article
    DELETE, UPDATE, INSERT; the server runs them in that order, and the rows each found are
    checked when all have run (NotNetApplicable: the caller rolls back)."""
    if prepared.runs:
        with conn.pipeline():
            sent = [
                (conn.execute(_statement(conn, art, op), params), expected, what)
                for art, op, params, expected, what in prepared.runs
            ]
        for cur, expected, what in sent:
            if cur.rowcount != expected:
                raise NotNetApplicable(f"{what} affected {cur.rowcount} rows, not {expected}")
    return prepared.commands


def _runs(art: ResolvedArticle, keys: dict[Key, _Key]) -> list[_PreparedRun]:
    """The article's DELETE, UPDATE and INSERT (those with rows), each with its rows as
    parameters: per column of ``s`` (the mask, then the article's columns) one text array."""
    masked = _masked(art)
    rows: dict[str, list[list[str | None]]] = {"D": [], "U": [], "I": []}
    for key, state in keys.items():
        for op, row in _rows(key, state, art, masked):
            rows[op].append(row)
    out: list[_PreparedRun] = []
    for op, what in (("D", "DELETE"), ("U", "UPDATE"), ("I", "INSERT")):
        if rows[op]:
            columns = [array_literal(column) for column in zip(*rows[op], strict=True)]
            out.append((art, op, columns, len(rows[op]), f"{what} of article {art.name!r}"))
    return out


def _rows(key: Key, state: _Key, art: ResolvedArticle, masked: bool) -> list[tuple[str, list[str | None]]]:
    """The rows of ``s`` for one key: (op, [mask, column values...])."""
    n = len(art.column_names)
    pk_row: list[str | None] = [None] * n
    for value, i in zip(key, art.pk_positions, strict=True):
        pk_row[i] = value
    out: list[tuple[str, list[str | None]]] = []
    if state.existed and (state.deleted or state.final is None):
        out.append(("D", [None, *pk_row]))
    if state.final is not None and state.existed and not state.deleted:
        mask = "".join("1" if i in state.changed else "0" for i in range(n)) if masked else None
        out.append(("U", [mask, *state.final]))
    if state.final is not None and (not state.existed or state.deleted):
        out.append(("I", [None, *state.final]))
    return out


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


#: An article's set-based statements by what they do (``"D"``, ``"U"``, ``"I"``), composed once per
#: connection and article definition.
_Statements = dict[str, str]


#: Per connection, the statements of each article (by definition digest) it applied.
_STATEMENTS: weakref.WeakKeyDictionary[psycopg.Connection, dict[str, _Statements]] = weakref.WeakKeyDictionary()


def forget_tables(conn: psycopg.Connection) -> None:
    """After a rollback: forget what is known about the connection (its statements are composed again)."""
    _STATEMENTS.pop(conn, None)


def _masked(art: ResolvedArticle) -> bool:
    """UPDATEs set only the columns the batch changed (SCALL and MCALL), as each command's bitmap would."""
    update = art.propagation[Operation.UPDATE]
    return update.method == Method.PROC and update.call_syntax in (CallSyntax.SCALL, CallSyntax.MCALL)


def _statement(conn: psycopg.Connection, art: ResolvedArticle, op: str) -> str:
    """The article's DELETE (``"D"``), UPDATE (``"U"``) or INSERT (``"I"``) on ``conn``; ``s`` is
    the statement's rows, from its array parameters."""
    made = _STATEMENTS.setdefault(conn, {})
    if art.digest in made:
        return made[art.digest][op]
    names = sql.SQL(", ").join(sql.Identifier(f"c{i + 1}") for i in range(len(art.columns)))
    arrays = sql.SQL(", ").join(sql.SQL("%s::text[]") for _ in range(len(art.columns) + 1))
    source = sql.SQL("unnest({}) AS s(m, {})").format(arrays, names)
    made[art.digest] = {
        "D": _delete(art, source).as_string(conn),
        "U": _update(art, source, _masked(art)).as_string(conn),
        "I": _insert(art, source).as_string(conn),
    }
    return made[art.digest][op]


def _value(art: ResolvedArticle, i: int) -> sql.Composable:
    # the type text comes from the publisher's format_type(), which quotes what needs quoting
    return sql.SQL("s.{}::" + art.columns[i].type).format(sql.Identifier(f"c{i + 1}"))


def _key_match(art: ResolvedArticle) -> sql.Composable:
    return sql.SQL(" AND ").join(
        sql.SQL("t.{} = {}").format(sql.Identifier(art.column_names[i]), _value(art, i)) for i in art.pk_positions
    )


def _delete(art: ResolvedArticle, source: sql.Composable) -> sql.Composed:
    dest = sql.Identifier(art.dest_schema, art.dest_table)
    return sql.SQL("DELETE FROM {} AS t USING {} WHERE {}").format(dest, source, _key_match(art))


def _update(art: ResolvedArticle, source: sql.Composable, masked: bool) -> sql.Composed:
    dest = sql.Identifier(art.dest_schema, art.dest_table)
    sets = []
    for i, name in enumerate(art.column_names):
        col = sql.Identifier(name)
        if masked:
            sets.append(
                sql.SQL("{} = CASE WHEN substr(s.m, {}, 1) = '1' THEN {} ELSE t.{} END").format(
                    col, sql.Literal(i + 1), _value(art, i), col
                )
            )
        else:
            sets.append(sql.SQL("{} = {}").format(col, _value(art, i)))
    return sql.SQL("UPDATE {} AS t SET {} FROM {} WHERE {}").format(
        dest, sql.SQL(", ").join(sets), source, _key_match(art)
    )


def _insert(art: ResolvedArticle, source: sql.Composable) -> sql.Composed:
    dest = sql.Identifier(art.dest_schema, art.dest_table)
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in art.column_names)
    values = sql.SQL(", ").join(_value(art, i) for i in range(len(art.column_names)))
    return sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {}").format(dest, cols, values, source)
