"""Applying commands at a subscriber: the statement each (article, operation) runs and the
parameters it binds.  Used by the Distribution Agent."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from airflow_repl.engine.articles.commands import Command
from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.codegen import call_syntax
from airflow_repl.engine.postgres import raw_sql

_OPS = {"I": "insert", "U": "update", "D": "delete"}


@dataclass
class Statement:
    """A statement with PostgreSQL's native ``$n`` placeholders: its text (which embeds the
    article's identifiers) is never scanned by psycopg; run it with :meth:`execute`."""

    query: sql.Composable
    params_of: object  # Callable[[Command], list]

    def execute(self, cur: psycopg.Cursor, cmd: Command) -> None:
        raw_sql.execute(cur, self.query, self.params_of(cmd))


def _typed(ph: str, type_text: str) -> sql.Composable:
    # type_text comes from the publisher's format_type(), which quotes what needs quoting.
    return sql.SQL(ph + "::" + type_text)


def statement(article: ResolvedArticle, op: str) -> Statement | None:
    """The statement applying ``op`` (I, U, D, T) commands of ``article``; None when the
    article's option for that operation is NONE."""
    if op == "T":
        return Statement(
            sql.SQL("TRUNCATE {}").format(sql.Identifier(article.dest_schema, article.dest_table)), lambda cmd: []
        )
    operation = _OPS[op]
    prop = article.propagation[operation]
    if prop.method == "none":
        return None
    if prop.method == "proc":
        schema, name = article.procedure(operation)
        params = call_syntax.parameters(article, operation, prop.syntax)
        args = sql.SQL(", ").join(_typed(raw_sql.dollar(i + 1), t) for i, (_, t) in enumerate(params))
        syntax = prop.syntax
        return Statement(
            sql.SQL("CALL {}({})").format(sql.Identifier(schema, name), args),
            lambda cmd: call_syntax.values(article, cmd, syntax),
        )
    # SQL statements: the CALL-syntax statement with typed placeholders; a server-side check
    # raises the row-not-found error like the generated procedures do.
    params = call_syntax.parameters(article, operation, "CALL")
    body = call_syntax.statement(article, operation, "CALL", lambda i: f"${i}::{params[i - 1][1]}")
    if operation == "insert":
        text = body
    else:
        n = len(params)
        text = (
            f"WITH applied AS ({body} RETURNING 1) SELECT airflow_repl.row_not_found(${n + 1}, ${n + 2}, "
            f"${n + 3}) WHERE NOT EXISTS (SELECT 1 FROM applied)"
        )
    names = ", ".join(article.primary_key)

    def params_of(cmd: Command, _op=operation) -> list:
        values = call_syntax.values(article, cmd, "CALL")
        if _op == "insert":
            return values
        return values + [
            f"{_op} of {article.destination}",
            names,
            ", ".join("" if v is None else str(v) for v in cmd.key(article)),
        ]

    # body placeholders are $n in parameter order, which is the CALL layout
    return Statement(sql.SQL(text), params_of)


def describe_command(article: ResolvedArticle | None, cmd: Command) -> str:
    if article is None or cmd.op == "T":
        return f"{cmd.op} on article {cmd.article!r}"
    key = ", ".join(f"{c}={v}" for c, v in zip(article.primary_key, cmd.key(article)))
    return f"{_OPS[cmd.op]} on article {cmd.article!r} ({article.destination}) key ({key})"
