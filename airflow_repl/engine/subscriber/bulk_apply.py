"""Net-change application of a batch (subscription option ``bulk_apply``): the batch's row
changes collapsed to their net effect per key and applied with three set-based statements per
article (DELETE ... USING, UPDATE ... FROM, INSERT ... SELECT) from a temporary table loaded
with COPY, instead of one statement (and one procedure call) per command.

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

import hashlib
import json
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from airflow_repl.engine.articles.commands import DELETE, INSERT, UPDATE, Command, Values
from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.model.propagation import CallSyntax, Method, Operation

#: A batch larger than this (one huge transaction) is applied command by command, streamed:
#: net change holds the batch's commands in memory.
MAX_COMMANDS = 200_000

#: A row's primary-key values (text), as the commands carry them.
Key = tuple[str | None, ...]


class NotNetApplicable(Exception):
    """The batch must be applied command by command (a set-based statement found another number
    of rows than the commands expect, or the batch holds what it does not cover)."""


@dataclass
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


def net_changes(commands: Sequence[Command], articles: dict[str, ResolvedArticle]) -> dict[str, dict[Key, _Key]]:
    """article -> key -> net effect, in the order of the commands (NotNetApplicable when a
    command is outside what the set-based path covers or could not apply in that order)."""
    out: dict[str, dict[Key, _Key]] = {}
    for cmd in commands:
        art = articles.get(cmd.article)
        if cmd.op not in (INSERT, UPDATE, DELETE) or not eligible(art):
            raise NotNetApplicable(f"{cmd.op} command of article {cmd.article!r}")
        assert art is not None
        keys = out.setdefault(cmd.article, {})
        image = cmd.new if cmd.op == INSERT else cmd.old
        assert image is not None
        key = tuple(image[i] for i in art.pk_positions)
        if cmd.op == UPDATE and cmd.new is not None and (moved := tuple(cmd.new[i] for i in art.pk_positions)) != key:
            # a key change kept as one UPDATE (multi_row_key_changes): the row leaves one key for another
            _step(keys, key, Command(DELETE, cmd.article, old=cmd.old))
            _step(keys, moved, Command(INSERT, cmd.article, new=cmd.new))
            continue
        _step(keys, key, cmd)
    return out


def _step(keys: dict[Key, _Key], key: Key, cmd: Command) -> None:
    state = keys.get(key)
    if cmd.op == INSERT:
        if state is None:
            keys[key] = _Key(existed=False, final=cmd.new)
        elif state.final is None:
            state.final = cmd.new
        else:
            raise NotNetApplicable("an INSERT of a row the batch already has")
        return
    if state is not None and state.final is None:
        raise NotNetApplicable(f"an {cmd.op} of a row the batch deleted")
    if cmd.op == UPDATE:
        if state is None:
            state = keys[key] = _Key(existed=True, final=cmd.new)
        state.final = cmd.new
        state.changed.update(i for i, c in enumerate(cmd.changed()) if c)
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
    applied command by command."""
    plan = net_changes(commands, articles)
    for name, keys in plan.items():
        if keys:
            _apply_article(conn, articles[name], keys)
    return len(commands)


def _apply_article(conn: psycopg.Connection, art: ResolvedArticle, keys: dict[Key, _Key]) -> None:
    table = _temp_table(conn, art)
    update = art.propagation[Operation.UPDATE]
    masked = update.method == Method.PROC and update.call_syntax in (CallSyntax.SCALL, CallSyntax.MCALL)
    counts = {"D": 0, "U": 0, "I": 0}
    n = len(art.column_names)
    with conn.cursor() as cur, cur.copy(sql.SQL("COPY {} FROM STDIN").format(table)) as copy:
        for key, state in keys.items():
            for op, row in _rows(key, state, art, masked):
                counts[op] += 1
                copy.write_row(row[: n + 2])
    _run(conn, _delete(art, table), counts["D"], art, "DELETE")
    _run(conn, _update(art, table, masked), counts["U"], art, "UPDATE")
    _run(conn, _insert(art, table), counts["I"], art, "INSERT")


def _rows(key: Key, state: _Key, art: ResolvedArticle, masked: bool) -> list[tuple[str, list[str | None]]]:
    """The temporary table's rows for one key: (op, [op, mask, column values...])."""
    n = len(art.column_names)
    pk_row: list[str | None] = [None] * n
    for value, i in zip(key, art.pk_positions, strict=True):
        pk_row[i] = value
    out: list[tuple[str, list[str | None]]] = []
    if state.existed and (state.deleted or state.final is None):
        out.append(("D", ["D", None, *pk_row]))
    if state.final is not None and state.existed and not state.deleted:
        mask = "".join("1" if i in state.changed else "0" for i in range(n)) if masked else None
        out.append(("U", ["U", mask, *state.final]))
    if state.final is not None and (not state.existed or state.deleted):
        out.append(("I", ["I", None, *state.final]))
    return out


#: The temporary tables each connection has (created once per session; a rolled-back creation
#: is forgotten by :func:`forget_tables`).
_TEMP_TABLES: weakref.WeakKeyDictionary[psycopg.Connection, set[str]] = weakref.WeakKeyDictionary()


def forget_tables(conn: psycopg.Connection) -> None:
    """After a rollback: tables created in the rolled-back transaction are gone."""
    _TEMP_TABLES.pop(conn, None)


def _temp_table(conn: psycopg.Connection, art: ResolvedArticle) -> sql.Identifier:
    """A session temporary table for the article's rows (emptied at each commit)."""
    digest = hashlib.sha1(json.dumps(art.to_dict(), sort_keys=True).encode()).hexdigest()[:16]
    name = f"airflow_repl_net_{digest}"
    made = _TEMP_TABLES.setdefault(conn, set())
    if name in made:
        return sql.Identifier(name)  # emptied by the last commit (ON COMMIT DELETE ROWS) or rollback
    columns = sql.SQL(", ").join(
        sql.SQL("{} text").format(sql.Identifier(f"c{i + 1}")) for i in range(len(art.columns))
    )
    conn.execute(
        sql.SQL("CREATE TEMP TABLE IF NOT EXISTS {} (op text NOT NULL, m text, {}) ON COMMIT DELETE ROWS").format(
            sql.Identifier(name), columns
        )
    )
    made.add(name)
    return sql.Identifier(name)


def _value(art: ResolvedArticle, i: int) -> sql.Composable:
    # the type text comes from the publisher's format_type(), which quotes what needs quoting
    return sql.SQL("s.{}::" + art.columns[i].type).format(sql.Identifier(f"c{i + 1}"))


def _key_match(art: ResolvedArticle) -> sql.Composable:
    return sql.SQL(" AND ").join(
        sql.SQL("t.{} = {}").format(sql.Identifier(art.column_names[i]), _value(art, i)) for i in art.pk_positions
    )


def _delete(art: ResolvedArticle, tmp: sql.Identifier) -> sql.Composed:
    dest = sql.Identifier(art.dest_schema, art.dest_table)
    return sql.SQL("DELETE FROM {} AS t USING {} AS s WHERE s.op = 'D' AND {}").format(dest, tmp, _key_match(art))


def _update(art: ResolvedArticle, tmp: sql.Identifier, masked: bool) -> sql.Composed:
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
    return sql.SQL("UPDATE {} AS t SET {} FROM {} AS s WHERE s.op = 'U' AND {}").format(
        dest, sql.SQL(", ").join(sets), tmp, _key_match(art)
    )


def _insert(art: ResolvedArticle, tmp: sql.Identifier) -> sql.Composed:
    dest = sql.Identifier(art.dest_schema, art.dest_table)
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in art.column_names)
    values = sql.SQL(", ").join(_value(art, i) for i in range(len(art.column_names)))
    return sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} AS s WHERE s.op = 'I'").format(dest, cols, values, tmp)


def _run(conn: psycopg.Connection, stmt: sql.Composed, expected: int, art: ResolvedArticle, what: str) -> None:
    if not expected:
        return
    found = conn.execute(stmt).rowcount  # composed from identifiers and the catalog's type names
    if found != expected:
        raise NotNetApplicable(f"{what} of article {art.name!r} affected {found} rows, not {expected}")
