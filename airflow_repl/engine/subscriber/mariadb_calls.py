"""Procedure calls at a MariaDB subscriber: the generated procedures of MariaDB's dialect
(:mod:`~airflow_repl.engine.codegen.mariadb`) when an article chooses them, and custom procedures
(MariaDB stored procedures the user created), each with the parameters of its call syntax.

At a MariaDB subscriber SQL statements are the default (:mod:`mariadb_apply`): an operation left
at its default (``SCALL``, ``CALL`` without a name) is applied as an INSERT, UPDATE or DELETE.
An article *chooses* the generated procedure by naming it, as SQL Server writes its own
defaults (``upd_cmd: SCALL sp_MSupd_PurchasingVendor``): a procedure named exactly as the
article's generated one (``sp_MS<ins|upd|del>_<schema><table>``, unqualified) is created at the
subscriber by the Snapshot Agent (:func:`create_procedures`); any other name is a custom
procedure, which must exist there before the Snapshot or Distribution Agent runs
(:func:`check_procedures`).

:class:`CallApplier` turns such a command into ``CALL `procedure`(...)`` (:func:`codegen.mariadb.call_sql`
and :func:`codegen.mariadb.call_values`: the same parameter lists and bitmask as at a
PostgreSQL subscriber), inside the batch's InnoDB transaction, so the watermark still commits
with the changes.  A procedure reports a row not found with ``SIGNAL SQLSTATE 'RP598' SET
MYSQL_ERRNO = 20598``; the driver gives the error number, which becomes :class:`RowNotFound`
(``skip_errors: [row_not_found]`` skips it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import pymysql

from airflow_repl.engine.articles.commands import INSERT, SCHEMA, TRUNCATE, Command
from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.codegen import mariadb as dialect
from airflow_repl.engine.errors import ReplError
from airflow_repl.engine.mariadb import connections as mariadb_connections
from airflow_repl.engine.mariadb import quoting
from airflow_repl.engine.model.propagation import OPERATIONS, Method, Operation, Propagation
from airflow_repl.engine.subscriber.mariadb_apply import MariaDBApplier, RowNotFound, _operation

#: The error number a procedure raises (with SQLSTATE ``RP598``) when its key matched no row.
ROW_NOT_FOUND_ERRNO = dialect.ROW_NOT_FOUND_ERRNO


def calls(article: ResolvedArticle, operation: Operation) -> bool:
    """Whether a MariaDB subscriber calls a procedure for ``operation``: one the article names
    (generated or custom); the unnamed default is applied as a statement."""
    prop = article.propagation[operation]
    return prop.method == Method.PROC and prop.procedure is not None


def generated(article: ResolvedArticle, operation: Operation) -> bool:
    """Whether the procedure ``operation`` calls is the article's generated one, by its name."""
    return calls(article, operation) and article.propagation[operation].procedure == article.default_procs[operation]


def custom(article: ResolvedArticle, operation: Operation) -> bool:
    return calls(article, operation) and not generated(article, operation)


def _as_generated(article: ResolvedArticle) -> ResolvedArticle:
    """``article`` with its named generated procedures as the dialect generates them (and every
    other operation as SQL, for which nothing is generated)."""
    props = {
        op: Propagation(op, Method.PROC, prop.syntax, None) if generated(article, op) else Propagation(op, Method.SQL)
        for op, prop in article.propagation.items()
    }
    return dataclasses.replace(article, propagation=props)


def _where(article: ResolvedArticle, subscriber: str) -> str:
    return f"article {article.name!r} ({article.destination!r}) at MariaDB subscriber {subscriber!r}"


def check_propagation(articles: Iterable[ResolvedArticle], subscriber: str) -> None:
    """Refuse, before anything changes, a procedure MariaDB cannot hold or call: a generated one
    whose table or columns MariaDB cannot name (:func:`codegen.mariadb.check_names`), a custom
    one whose name is not a MariaDB name."""
    for art in articles:
        if any(generated(art, op) for op in OPERATIONS):
            dialect.check_names(_as_generated(art))
        for op in OPERATIONS:
            if custom(art, op):
                for part in str(art.propagation[op].procedure).split("."):
                    quoting.check_name(f"{op} procedure", part, _where(art, subscriber))


def procedure_statements(articles: Iterable[ResolvedArticle]) -> list[str]:
    """``CREATE OR REPLACE PROCEDURE`` of every generated procedure the articles name."""
    out = []
    for art in articles:
        gen = _as_generated(art)
        out += [sql for op in OPERATIONS if generated(art, op) and (sql := dialect.procedure_sql(gen, op))]
    return out


def _routine(article: ResolvedArticle, operation: Operation, database: str) -> tuple[str, str]:
    """(database, name) of the procedure ``operation`` calls (``schema.name`` is in ``schema``)."""
    schema, _, name = str(article.propagation[operation].procedure).rpartition(".")
    return (schema or database, name)


def check_procedures(
    conn: Any, database: str, articles: Iterable[ResolvedArticle], subscriber: str, *, custom_only: bool = False
) -> None:
    """Every procedure the articles call exists at the subscriber (only the custom ones with
    ``custom_only``, before the snapshot creates the generated ones): one line naming the first
    missing one and the fix; nothing is changed."""
    with conn.cursor() as cur:
        for art in articles:
            for op in OPERATIONS:
                if not (custom(art, op) if custom_only else calls(art, op)):
                    continue
                schema, name = _routine(art, op, database)
                cur.execute(
                    "SELECT 1 FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = %s AND ROUTINE_NAME = %s "
                    "AND ROUTINE_TYPE = 'PROCEDURE'",
                    (schema, name),
                )
                if cur.fetchone() is None:
                    fix = (
                        "run the Snapshot Agent with reinitialize for it, which creates it"
                        if generated(art, op)
                        else "create it there (CREATE PROCEDURE) or set the option to SQL or NONE"
                    )
                    raise ReplError(
                        f"{art.propagation[op].call_syntax} procedure {quoting.qualified(schema, name)} that "
                        f"{_where(art, subscriber)} calls for its {op}s ({op.option}) does not exist there: {fix}"
                    )


def create_procedures(conninfo: str, subscriber: str, articles: list[ResolvedArticle]) -> int:
    """The Snapshot Agent's part: create (or replace) the generated procedures the articles name
    at the MariaDB subscriber; how many."""
    statements = procedure_statements(articles)
    if not statements:
        return 0
    conn = mariadb_connections.connect(conninfo, f"MariaDB subscriber {subscriber!r}")
    try:
        with conn.cursor() as cur:
            for sql in statements:
                cur.execute(sql)
        conn.commit()
    finally:
        conn.close()
    return len(statements)


class CallApplier(MariaDBApplier):
    """:class:`MariaDBApplier` with the operations the articles call procedures for as ``CALL``s."""

    def __init__(self, articles: dict[str, ResolvedArticle]) -> None:
        super().__init__(articles)
        self._calls: dict[tuple[str, Operation], str] = {}

    def _call(self, cmd: Command) -> tuple[ResolvedArticle, Operation, str] | None:
        if cmd.op in (SCHEMA, TRUNCATE) or cmd.article not in self.articles:
            return None
        art, op = self.articles[cmd.article], _operation(cmd)
        if not calls(art, op):
            return None
        key = (art.name, op)
        if key not in self._calls:
            self._calls[key] = dialect.call_sql(art, op)
        return art, op, self._calls[key]

    def statement(self, cmd: Command) -> tuple[str, list[Any], bool] | None:
        found = self._call(cmd)
        if found is None:
            return super().statement(cmd)
        art, op, sql = found
        return sql, dialect.call_values(art, op, cmd), False  # the procedure checks its row itself

    def joins(self, cmd: Command) -> bool:
        """An INSERT applied as a statement may join the INSERTs of a multi-row INSERT."""
        return cmd.op == INSERT and self._call(cmd) is None

    def ends_round_trip(self, cmd: Command) -> bool:
        """A custom procedure may return result sets of its own: its CALL ends a round trip, so
        that the result of each statement after it is read as its own."""
        found = self._call(cmd)
        return found is not None and custom(found[0], found[1])

    def execute(self, cur: Any, cmd: Command) -> bool:
        try:
            return super().execute(cur, cmd)
        except pymysql.err.MySQLError as exc:
            raise row_not_found(exc) or exc from None


def row_not_found(exc: BaseException) -> RowNotFound | None:
    """A procedure's row-not-found error (error number 20598) as :class:`RowNotFound`."""
    if isinstance(exc, pymysql.err.MySQLError) and exc.args and exc.args[0] == ROW_NOT_FOUND_ERRNO:
        return RowNotFound(" ".join(str(exc.args[1]).split()) if len(exc.args) > 1 else "row not found (20598)")
    return None


def applier(conn: Any, database: str, articles: list[ResolvedArticle], subscriber: str) -> MariaDBApplier:
    """The applier of a MariaDB subscription: procedures checked (:func:`check_propagation`,
    :func:`check_procedures`) when any operation calls one, otherwise SQL statements alone."""
    check_propagation(articles, subscriber)
    if not any(calls(a, op) for a in articles for op in OPERATIONS):
        return MariaDBApplier({a.name: a for a in articles})
    check_procedures(conn, database, articles, subscriber)
    return CallApplier({a.name: a for a in articles})
