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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import compress, count
from operator import itemgetter, ne
from typing import Any

import orjson
import psycopg
from psycopg import sql

from airflow_repl.engine.articles.commands import DELETE, INSERT, UPDATE, Command, OpCode, Values
from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.model.propagation import CallSyntax, Method, Operation
from airflow_repl.engine.postgres import catalog

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
    return article is not None and not_net_reason(article) is None


def not_net_reason(article: ResolvedArticle) -> str | None:
    """Why the article's commands cannot be applied by net change (None: they can)."""
    if article.include_children:
        return "include_children"
    for op in (Operation.INSERT, Operation.UPDATE, Operation.DELETE):
        prop = article.propagation[op]
        if prop.method == Method.NONE:
            return f"{op.value} propagated as NONE"
        if prop.method == Method.PROC and prop.custom:
            return "custom procedure"
    return None


NET_CHANGE = "net_change"
PER_COMMAND = "per_command"


@dataclass(frozen=True)
class ArticlePath:
    """How a run applies an article's commands (``net_change`` or ``per_command``), and why."""

    article: str
    apply: str
    why: str

    def to_json(self) -> dict[str, str]:
        return {"article": self.article, "apply": self.apply, "why": self.why}


def article_paths(
    mode: str,
    articles: Iterable[ResolvedArticle],
    *,
    updatable: str | None = None,
    streams: int = 1,
    triggers: dict[tuple[str, str], list[str]] | None = None,
    scripts: Iterable[str] = (),
) -> list[ArticlePath]:
    """Each article's path under the apply ``mode`` (``auto``, ``per_command``, ``net_change``):
    ``updatable``: the subscription's update mode when it is not read only; ``streams``: its
    ``subscription_streams`` (more than one: batches spread over them, command by command); ``triggers``: the
    subscriber tables' user triggers that fire for replicated changes (``ENABLE ALWAYS`` or
    ``ENABLE REPLICA``), by (schema, table); ``scripts``: the articles with a registered custom
    script.  ``net_change`` takes every article the set-based path covers; ``auto`` only those
    whose result nothing at the subscriber can tell apart from command by command."""
    custom = set(scripts)
    out = []
    for art in articles:
        why = not_net_reason(art)
        if mode == PER_COMMAND:
            why = "apply_mode per_command"
        elif why is None and mode != NET_CHANGE:
            fired = (triggers or {}).get((art.dest_schema, art.dest_table))
            if updatable is not None:
                why = f"updatable subscriber ({updatable})"
            elif streams > 1:
                why = f"subscription_streams {streams} (batches spread over the streams)"
            elif fired:
                why = "trigger(s) firing for replicated changes at the subscriber: " + ", ".join(fired)
            elif art.name in custom:
                why = "custom script registered"
        if why is not None:
            out.append(ArticlePath(art.name, PER_COMMAND, why))
        else:
            reason = "apply_mode net_change" if mode == NET_CHANGE else "nothing at the subscriber can tell"
            out.append(ArticlePath(art.name, NET_CHANGE, reason))
    return out


def watching_triggers(
    conn: psycopg.Connection, articles: Sequence[ResolvedArticle]
) -> dict[tuple[str, str], list[str]]:
    """Lock the articles' subscriber tables (``ROW EXCLUSIVE``, as their DML would, in this
    order) and return the triggers that fire there for replicated changes (empty: none).  Under
    that lock no trigger can be created or enabled there before the transaction ends, so a batch
    applied by net change after an empty answer is seen by no trigger.  One round trip."""
    tables = [(a.dest_schema, a.dest_table) for a in articles]
    with conn.pipeline():
        names = sql.SQL(", ").join(sql.Identifier(schema, table) for schema, table in tables)
        conn.execute(sql.SQL("LOCK TABLE {} IN ROW EXCLUSIVE MODE").format(names))
        return catalog.replicated_change_triggers(conn, tables)


_ROW_OPS = (INSERT, UPDATE, DELETE)


def net_changes(commands: Sequence[Command], articles: dict[str, ResolvedArticle]) -> dict[str, dict[Key, _Key]]:
    """article -> key -> net effect, in the order of the commands (NotNetApplicable when a
    command is outside what the set-based path covers or could not apply in that order).  Runs
    once per command of every batch: the common steps (:func:`_step`'s) are inline."""
    out: dict[str, dict[Key, _Key]] = {}
    #: the eligible articles met so far: their keys and their key's values of an image
    checked: dict[str, tuple[dict[Key, _Key], Callable[[Values], Key]]] = {}
    for cmd in commands:
        op, old, new = cmd.op, cmd.old, cmd.new
        entry = checked.get(cmd.article)
        if entry is None or op not in _ROW_OPS:
            entry = _check(cmd, articles, checked, out)
        keys, key_of = entry
        if op == UPDATE:
            assert old is not None and new is not None
            key = key_of(old)
            state = keys.get(key)
            if (moved := key_of(new)) != key:
                # a key change kept as one UPDATE (multi_row_key_changes): the row leaves one key for another
                _step(keys, key, DELETE, old, None)
                _step(keys, moved, INSERT, None, new)
            elif state is None:
                if len(old) != len(new):
                    raise ValueError(f"an UPDATE's images have {len(old)} and {len(new)} columns")
                keys[key] = _Key(True, new, False, set(compress(count(), map(ne, old, new))))
            elif state.final is not None and len(old) == len(new):
                state.final = new
                state.changed.update(compress(count(), map(ne, old, new)))  # the columns whose text differs
            else:
                _step(keys, key, op, old, new)
        elif op == INSERT:
            assert new is not None
            key = key_of(new)
            if key not in keys:
                keys[key] = _Key(False, new)
            else:
                _step(keys, key, op, old, new)
        else:
            assert old is not None
            _step(keys, key_of(old), op, old, new)
    return out


def _check(
    cmd: Command,
    articles: dict[str, ResolvedArticle],
    checked: dict[str, tuple[dict[Key, _Key], Callable[[Values], Key]]],
    out: dict[str, dict[Key, _Key]],
) -> tuple[dict[Key, _Key], Callable[[Values], Key]]:
    """A command of an article not met yet, or not a row change: its article's entry of
    :func:`net_changes` (NotNetApplicable when the set-based path does not cover it)."""
    art = articles.get(cmd.article)
    if cmd.op not in _ROW_OPS or art is None or not (cmd.article in checked or eligible(art)):
        raise NotNetApplicable(f"{cmd.op} command of article {cmd.article!r}")
    entry = checked[cmd.article] = (out.setdefault(cmd.article, {}), _key_of(art.pk_positions))
    return entry


def _key_of(pk: Sequence[int]) -> Callable[[Values], Key]:
    """The primary key's values of an image, as a tuple (C's itemgetter, one per article)."""
    if len(pk) == 1:
        get = itemgetter(pk[0])
        return lambda image: (get(image),)
    if not pk:
        return lambda image: ()
    return itemgetter(*pk)


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


def execute(conn: psycopg.Connection, prepared: Prepared, then: Sequence[tuple[str, Sequence[Any]]] = ()) -> int:
    """Apply a prepared net change on ``conn`` (no commit); returns how many commands it nets.
    Every statement is sent in one pipeline (one round trip), in article order and per article
    DELETE, UPDATE, INSERT, followed by the statements ``then`` (e.g. the watermark's move); the
    server runs them in that order, and the rows each set-based statement found are checked when
    all have run (NotNetApplicable: the caller rolls back)."""
    if prepared.runs or then:
        with conn.pipeline():
            sent = [
                (conn.execute(_statement(conn, art, op, columns), params), expected, what)
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
    masked = _masked(art)
    every = tuple(range(len(art.column_names)))
    deletes: list[Key] = []
    inserts: list[Values] = []
    updates: dict[tuple[int, ...], list[Values]] = {}  # the columns they set -> final images
    for key, state in keys.items():
        final = state.final
        if state.existed and (state.deleted or final is None):
            deletes.append(key)
        if final is None:
            continue
        if not state.existed or state.deleted:
            inserts.append(final)
        else:
            updates.setdefault(tuple(sorted(state.changed)) if masked else every, []).append(final)
    out: list[_PreparedRun] = []
    if deletes:
        pk = tuple(art.pk_positions)
        out.append((art, "D", pk, _arrays(deletes, range(len(pk))), len(deletes), f"DELETE of article {art.name!r}"))
    if masked and len(updates) > MASK_STATEMENTS:
        rows = [row for group in updates.values() for row in group]
        masks = [_mask(cols, len(every)) for cols, group in updates.items() for _ in group]
        params = [array_literal(masks), *_arrays(rows, every)]
        out.append((art, "M", every, params, len(rows), f"UPDATE of article {art.name!r}"))
    else:
        for cols, rows in updates.items():
            params = _arrays(rows, _carried(art, "U", cols))
            out.append((art, "U", cols, params, len(rows), f"UPDATE of article {art.name!r}"))
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


def _masked(art: ResolvedArticle) -> bool:
    """UPDATEs set only the columns the batch changed (SCALL and MCALL), as each command's bitmap would."""
    update = art.propagation[Operation.UPDATE]
    return update.method == Method.PROC and update.call_syntax in (CallSyntax.SCALL, CallSyntax.MCALL)


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
        arrays = sql.SQL(", ").join(sql.SQL("%s::text[]") for _ in names)
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
