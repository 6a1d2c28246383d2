"""Applying commands at a MariaDB subscriber through SQL statements, the seeds' propagation for
non-SQL Server subscribers: the PostgreSQL subscriber's :mod:`statements` and :mod:`applier`
for MariaDB.

Each (article, operation) has one statement: ``INSERT``, an ``UPDATE`` of every non-key column
by primary key, a ``DELETE`` by primary key, and a TRUNCATE as ``DELETE FROM`` (MariaDB's
TRUNCATE commits at once, outside the batch's transaction).  An UPDATE or DELETE that finds no
row fails with the row-not-found error (20598, SQLSTATE ``RP598``), a duplicate key with
``23505``, so that ``skip_errors`` means what it means at a PostgreSQL subscriber.  An article
operation propagated by ``NONE`` is not applied; the generated-procedure default is applied as
these statements.  An operation whose article names a procedure (generated or custom) is a
``CALL`` (:mod:`mariadb_calls`).

:func:`apply_fast` runs a batch without savepoints, many statements per round trip
(consecutive INSERTs of one article as one multi-row INSERT); :func:`replay` runs it command by command with a savepoint per transaction,
naming the failing command and skipping what ``skip_errors`` allows.  Neither commits: the
caller commits the changes with the watermark, in one InnoDB transaction.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pymysql

from airflow_repl.engine.articles.commands import DELETE, INSERT, SCHEMA, TRUNCATE, UPDATE, Command
from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.errors import ROW_NOT_FOUND_SQLSTATE, DeliveryError
from airflow_repl.engine.mariadb import connections, types
from airflow_repl.engine.mariadb.quoting import ident, ident_in_format
from airflow_repl.engine.model.propagation import Method, Operation
from airflow_repl.engine.state.dist_transactions import CommandRow
from airflow_repl.engine.subscriber import conflicts
from airflow_repl.engine.subscriber.applier import Applier, KeyValue, Located, ReplayOutcome, TouchedKeys

#: MariaDB's duplicate-key errors, reported as PostgreSQL's unique_violation.
_DUPLICATE_KEY = (1062, 1586)
DUPLICATE_KEY_SQLSTATE = "23505"


class RowNotFound(Exception):
    """An UPDATE or DELETE found no row at the subscriber."""


def conversions(art: ResolvedArticle) -> list[str]:
    """How each of the article's values travels to MariaDB (:func:`types.to_param`)."""
    return [types.conversion(c.base_type or c.type) for c in art.columns]


@dataclass
class _Statements:
    """An article's statements at the subscriber and how its values are bound."""

    article: ResolvedArticle
    conversions: list[str]
    insert: str
    insert_head: str
    values: str
    update: str | None
    exists: str
    delete: str
    truncate: str

    def params(self, values: list[str | None], positions: Iterable[int]) -> list[Any]:
        art = self.article
        cols = art.columns
        return [
            types.to_param(self.conversions[i], values[i], cols[i].name, f"article {art.name!r}") for i in positions
        ]


def _statements(art: ResolvedArticle) -> _Statements:
    """The article's statements: those with ``%s`` parameters quote names for the driver's
    formatting (:func:`ident_in_format`), the multi-row INSERT's head and the TRUNCATE as they are."""
    table, ftable = ident(art.dest_table), ident_in_format(art.dest_table)
    names = art.column_names
    pk = art.pk_positions
    others = [i for i in range(len(names)) if i not in pk]
    where = " AND ".join(f"{ident_in_format(names[i])} = %s" for i in pk)
    fcols = ", ".join(ident_in_format(n) for n in names)
    marks = ", ".join(["%s"] * len(names))
    update = (
        f"UPDATE {ftable} SET {', '.join(f'{ident_in_format(names[i])} = %s' for i in others)} WHERE {where}"
        if others
        else None
    )
    return _Statements(
        art,
        conversions(art),
        f"INSERT INTO {ftable} ({fcols}) VALUES ({marks})",
        f"INSERT INTO {table} ({', '.join(ident(n) for n in names)}) VALUES ",
        f"({marks})",
        update,
        f"SELECT 1 FROM {ftable} WHERE {where}",
        f"DELETE FROM {ftable} WHERE {where}",
        f"DELETE FROM {table}",
    )


class MariaDBApplier:
    """Applies the commands of a publication's articles at one MariaDB subscriber."""

    def __init__(self, articles: dict[str, ResolvedArticle]) -> None:
        self.articles = articles
        self._order = Applier(articles)  # the commands in order, pairs merged back as at PostgreSQL
        self._stmts: dict[str, _Statements] = {}
        self._keys = TouchedKeys(articles)

    def commands(self, rows: Iterable[CommandRow], article_rows: Mapping[str, Mapping[str, int]]) -> Iterator[Located]:
        return self._order.commands(rows, article_rows)

    def describe(self, cmd: Command) -> str:
        return self._order.describe(cmd)

    def redefine(self, article: ResolvedArticle) -> None:
        """The article's definition after a schema change: the commands after it use it."""
        self.articles[article.name] = article
        self._stmts.pop(article.name, None)
        self._keys.forget(article.name)

    def touched(self, cmd: Command) -> list[KeyValue] | None:
        """Every key value the command touches at the subscriber, for the stream planner, as
        at a PostgreSQL subscriber (:class:`TouchedKeys`)."""
        return self._keys.of(cmd, lambda: self.applies(cmd))

    def _of(self, article: str) -> _Statements | None:
        art = self.articles.get(article)
        if art is None:
            return None
        if article not in self._stmts:
            self._stmts[article] = _statements(art)
        return self._stmts[article]

    def applies(self, cmd: Command) -> bool:
        """Whether the command runs a statement (its article is applied and its operation not NONE)."""
        if cmd.op == SCHEMA:
            return True
        st = self._of(cmd.article)
        if st is None:
            return False
        if cmd.op == TRUNCATE:
            return True
        return st.article.propagation[_operation(cmd)].method != Method.NONE

    def statement(self, cmd: Command) -> tuple[str, list[Any], bool] | None:
        """``cmd``'s statement, its parameters, and whether it must match a row (an UPDATE or
        DELETE: none matched is row not found); None when nothing runs."""
        if cmd.op == SCHEMA:
            raise DeliveryError(
                f"a schema change of article {cmd.article!r} cannot be applied at a MariaDB subscriber yet: "
                f"reinitialize the subscriber (Snapshot Agent with reinitialize) after the change"
            )
        if not self.applies(cmd):
            return None
        st = self._of(cmd.article)
        assert st is not None
        art = st.article
        if cmd.op == TRUNCATE:
            return st.truncate, [], False
        if cmd.op == INSERT:
            assert cmd.new is not None
            return st.insert, st.params(cmd.new, range(len(cmd.new))), False
        assert cmd.old is not None
        key = st.params(cmd.old, art.pk_positions)
        if cmd.op == DELETE:
            return st.delete, key, True
        assert cmd.new is not None
        if st.update is None:  # only key columns, unchanged: the row must be there
            return st.exists, key, True
        others = [i for i in range(len(cmd.new)) if i not in art.pk_positions]
        return st.update, [*st.params(cmd.new, others), *key], True

    def execute(self, cur: Any, cmd: Command) -> bool:
        """Run ``cmd``'s statement; False when nothing ran.  An UPDATE or DELETE without its row
        raises :class:`RowNotFound`."""
        found = self.statement(cmd)
        if found is None:
            return False
        query, params, must_match = found
        if not cur.execute(query, params) and must_match:
            raise RowNotFound(f"the row to {_operation(cmd)} was not found at the subscriber (row not found, 20598)")
        return True

    def joins(self, cmd: Command) -> bool:
        """Whether ``cmd`` is an INSERT statement that may join a multi-row INSERT."""
        return cmd.op == INSERT

    def ends_round_trip(self, cmd: Command) -> bool:
        """Whether nothing may follow ``cmd``'s statement in its round trip (a statement that may
        return result sets of its own)."""
        return False

    def insert_values(self, cur: Any, cmd: Command) -> str:
        """An INSERT's row as ``(v1, v2, ...)``, each value escaped by the driver."""
        st = self._of(cmd.article)
        assert st is not None and cmd.new is not None
        return str(cur.mogrify(st.values, st.params(cmd.new, range(len(cmd.new)))))

    def insert_head(self, article: str) -> str:
        st = self._of(article)
        assert st is not None
        return st.insert_head


def _operation(cmd: Command) -> Operation:
    return {INSERT: Operation.INSERT, UPDATE: Operation.UPDATE, DELETE: Operation.DELETE}[cmd.op]


def sqlstate_of(exc: BaseException) -> tuple[str | None, str]:
    """A failure's PostgreSQL SQLSTATE (``RP598``, ``23505``, or MariaDB's own error number)
    and its message."""
    if isinstance(exc, RowNotFound):
        return ROW_NOT_FOUND_SQLSTATE, str(exc)
    if isinstance(exc, pymysql.MySQLError) and len(exc.args) >= 2:
        code, message = exc.args[0], str(exc.args[1])
        if code in _DUPLICATE_KEY:
            return DUPLICATE_KEY_SQLSTATE, message
        return f"MY{code}", connections.error_text(exc)
    return None, connections.error_text(exc)


#: Statements sent in one round trip by :func:`apply_fast` (a multi-statement query), and the
#: most text one holds.
ROUND_TRIP_STATEMENTS = 500
ROUND_TRIP_BYTES = 1 << 20


class _RoundTrips:
    """Statements of a batch sent many per round trip (the connection allows multi-statements):
    the driver escapes every value; each UPDATE and DELETE must match a row, checked on its own
    result."""

    def __init__(self, cur: Any) -> None:
        self.cur = cur
        self.texts: list[str] = []
        self.checks: list[tuple[bool, Command]] = []
        self.size = 0
        self.run: tuple[str, str, list[str], Command] | None = None  # INSERTs of one article, to join

    def add(self, text: str, must_match: bool, cmd: Command) -> None:
        self.end_run()
        self._push(text, must_match, cmd)

    def insert(self, head: str, values: str, cmd: Command) -> None:
        """One INSERT's row, joined with the rows of the INSERTs of the same article just before it."""
        if self.run is not None and self.run[0] != cmd.article:
            self.end_run()
        if self.run is None:
            self.run = (cmd.article, head, [], cmd)
        self.run[2].append(values)
        self.size += len(values)
        if self.size >= ROUND_TRIP_BYTES:
            self.flush()

    def end_run(self) -> None:
        if self.run is not None:
            _, head, rows, cmd = self.run
            self.run = None
            self._push(head + ", ".join(rows), False, cmd)

    def _push(self, text: str, must_match: bool, cmd: Command) -> None:
        self.texts.append(text)
        self.checks.append((must_match, cmd))
        self.size += 0 if text.startswith("INSERT") else len(text)  # a run's rows are counted already
        if len(self.texts) >= ROUND_TRIP_STATEMENTS or self.size >= ROUND_TRIP_BYTES:
            self.flush()

    def flush(self) -> None:
        self.end_run()
        if not self.texts:
            return
        texts, checks = self.texts, self.checks
        self.texts, self.checks, self.size = [], [], 0
        self.cur.execute(";\n".join(texts))
        for i, (must_match, cmd) in enumerate(checks):
            if i:
                self.cur.nextset()
            if must_match and not self.cur.rowcount:
                while self.cur.nextset():  # read the rest before the caller rolls back
                    pass
                raise RowNotFound(
                    f"the row to {_operation(cmd)} was not found at the subscriber (row not found, 20598)"
                )


def apply_fast(
    conn: Any, applier: MariaDBApplier, commands: Iterable[Located], stop: threading.Event | None = None
) -> int:
    """Apply the batch's commands in order without savepoints, many statements per round trip
    (consecutive INSERTs of one article as one multi-row INSERT); how many commands ran; it
    stops early once ``stop`` is set (another stream failed).  Any error propagates (the
    caller rolls back and replays)."""
    n = 0
    with conn.cursor() as cur:
        trips = _RoundTrips(cur)
        for _, _, cmd in commands:
            if stop is not None and stop.is_set():
                break
            found = applier.statement(cmd)
            if found is None:
                continue
            n += 1
            if applier.joins(cmd):
                trips.insert(applier.insert_head(cmd.article), applier.insert_values(cur, cmd), cmd)
            else:
                query, params, must_match = found
                trips.add(cur.mogrify(query, params) if params else query, must_match, cmd)
                if applier.ends_round_trip(cmd):
                    trips.flush()
        trips.flush()
    return n


def replay(conn: Any, applier: MariaDBApplier, commands: Iterable[Located], skip: set[str]) -> ReplayOutcome:
    """One command at a time, a savepoint per transaction: a transaction failing with a
    skippable error (SQLSTATEs ``skip``) is rolled back to its savepoint and skipped; any other
    error stops (``out.failure``)."""
    out = ReplayOutcome()
    current: str | None = None
    failed_txn: str | None = None
    with conn.cursor() as cur:
        for xact, cid, cmd in commands:
            if xact != current:
                if current is not None:
                    out.last_good = current
                    cur.execute("RELEASE SAVEPOINT airflow_repl_txn")
                cur.execute("SAVEPOINT airflow_repl_txn")
                current = xact
            if failed_txn == xact:
                continue
            try:
                out.commands += int(applier.execute(cur, cmd))
            except DeliveryError as exc:  # a value MariaDB cannot hold, or a schema change
                cur.execute("ROLLBACK TO SAVEPOINT airflow_repl_txn")
                out.failure = exc
                return out
            except (
                RowNotFound,
                pymysql.err.IntegrityError,
                pymysql.err.DataError,
                pymysql.err.OperationalError,
            ) as exc:
                if isinstance(exc, pymysql.err.OperationalError) and not _is_data_error(exc):
                    raise  # a lost server: nothing to skip
                cur.execute("ROLLBACK TO SAVEPOINT airflow_repl_txn")
                sqlstate, message = sqlstate_of(exc)
                failed = conflicts.FailedCommand(xact, cid, cmd, applier.describe(cmd))
                resolution = conflicts.resolve_failure(sqlstate, message, failed, skip)
                if isinstance(resolution, DeliveryError):
                    out.failure = resolution
                    return out
                out.skipped.append(resolution)
                failed_txn = xact
        if current is not None:
            cur.execute("RELEASE SAVEPOINT airflow_repl_txn")
            out.last_good = current
    return out


def _is_data_error(exc: pymysql.err.OperationalError) -> bool:
    """Operational errors about the value (out of range, truncated), not the connection."""
    return bool(exc.args) and isinstance(exc.args[0], int) and 1000 <= exc.args[0] < 2000
