"""Applying commands at a subscriber: the statement each (article, operation) runs and the
parameters it binds.  Used by the Distribution Agent."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from airflow_repl.engine.articles.commands import Command, OpCode
from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.codegen import call_syntax, procedures
from airflow_repl.engine.model.propagation import CallSyntax, Method, Operation
from airflow_repl.engine.postgres import raw_sql

ParamsOf = Callable[[Command], Sequence[Any]]


@dataclass
class Statement:
    """A statement with PostgreSQL's native ``$n`` placeholders: its text (which embeds the
    article's identifiers) is never scanned by psycopg; run it with :meth:`execute`."""

    query: raw_sql.Query
    params_of: ParamsOf

    def execute(self, cur: psycopg.Cursor, cmd: Command) -> None:
        raw_sql.execute(cur, self.query, self.params_of(cmd))


def statement(article: ResolvedArticle, op: OpCode, *, keep_own: bool = False) -> Statement | None:
    """The statement applying ``op`` (I, U, D, T) commands of ``article``; None when the
    article's option for that operation is NONE.  ``keep_own``: a TRUNCATE that keeps the rows
    the subscriber's own later changes hold (:func:`truncate_keeping_own`)."""
    if op == OpCode.TRUNCATE:
        if keep_own:
            return truncate_keeping_own(article, queued=False)
        table = sql.Identifier(article.dest_schema, article.dest_table)
        return Statement(sql.SQL("TRUNCATE {}").format(table), lambda cmd: [])
    operation = OpCode(op).operation
    method = article.propagation[operation].method
    if method == Method.NONE:
        return None
    if method == Method.PROC:
        return _procedure_call(article, operation)
    return _sql_statement(article, operation)


def truncate_keeping_own(article: ResolvedArticle, *, queued: bool) -> Statement:
    """A TRUNCATE of the article at an updatable subscriber: a DELETE of every row but those at a
    key the subscriber's own change took after it (``airflow_repl.queue_taken``: the Distribution
    Agent keeps only those later than what it delivers) and, at a queued subscriber (``queued``),
    those with a change in its queue, which the Queue Reader decides."""
    key = sql.SQL("pg_catalog.jsonb_build_object({})").format(
        sql.SQL(", ").join(sql.SQL("{}, t.{}").format(sql.Literal(c), sql.Identifier(c)) for c in article.primary_key)
    )
    query = sql.SQL(
        "DELETE FROM {} AS t WHERE NOT EXISTS (SELECT 1 FROM airflow_repl.queue_taken k WHERE k.publication = $1 "
        "AND k.article = $2 AND k.key = {})"
    ).format(sql.Identifier(article.dest_schema, article.dest_table), key)
    if queued:
        query += sql.SQL(
            " AND NOT EXISTS (SELECT 1 FROM airflow_repl.queue q WHERE q.publication = $1 AND q.article = $2 "
            "AND (q.old @> {k} OR q.new @> {k}))"
        ).format(k=key)
    return Statement(query, lambda cmd: [article.publication, article.name])


def _procedure_call(article: ResolvedArticle, operation: Operation) -> Statement:
    """CALL of the article's procedure for ``operation``, with its call syntax's arguments."""
    syntax = article.propagation[operation].call_syntax
    return Statement(
        sql.SQL(procedures.call_sql(article, operation)),  # generated text, identifiers quoted
        lambda cmd: call_syntax.values(article, cmd, syntax),
    )


def _sql_statement(article: ResolvedArticle, operation: Operation) -> Statement:
    """The CALL-syntax statement with typed placeholders; for updates and deletes a server-side
    check raises the row-not-found error like the generated procedures do."""
    params = call_syntax.parameters(article, operation, CallSyntax.CALL)
    body = call_syntax.statement(article, operation, CallSyntax.CALL, lambda i: f"${i}::{params[i - 1][1]}")
    if operation == Operation.INSERT:
        # body placeholders are $n in parameter order, which is the CALL layout
        return Statement(sql.SQL(body), lambda cmd: call_syntax.values(article, cmd, CallSyntax.CALL))
    n = len(params)
    text = (
        f"WITH applied AS ({body} RETURNING 1) SELECT airflow_repl.row_not_found(${n + 1}, ${n + 2}, "
        f"${n + 3}) WHERE NOT EXISTS (SELECT 1 FROM applied)"
    )
    names = ", ".join(article.primary_key)

    def params_of(cmd: Command) -> list[Any]:
        return [
            *call_syntax.values(article, cmd, CallSyntax.CALL),
            f"{operation} of {article.destination}",
            names,
            ", ".join("" if v is None else str(v) for v in cmd.key(article)),
        ]

    return Statement(sql.SQL(text), params_of)


def describe_command(article: ResolvedArticle | None, cmd: Command) -> str:
    if cmd.op == OpCode.SCHEMA and cmd.schema is not None:
        return f"schema change of article {cmd.article!r} ({cmd.schema.get('statement')})"
    if article is None or cmd.op == OpCode.TRUNCATE:
        return f"{cmd.op} on article {cmd.article!r}"
    key = ", ".join(f"{c}={v}" for c, v in zip(article.primary_key, cmd.key(article), strict=True))
    return f"{OpCode(cmd.op).operation} on article {cmd.article!r} ({article.destination}) key ({key})"
