"""The PostgreSQL dialect (:class:`~airflow_repl.engine.codegen.dialect.Dialect`): generated
subscriber procedures (``sp_MSins_`` / ``sp_MSupd_`` / ``sp_MSdel_``) as PL/pgSQL, the ``CALL`` of
a procedure and the DDL of a replicated schema change.

The parameters keep SQL Server's names (``c1``.., ``pkc1``.., ``bitmap``), which may equal column
names of the table: the body refers to parameters only by position (``$n``) and starts with
``#variable_conflict use_column``, so a bare name in a statement is always the column.

Every name is quoted (:func:`~airflow_repl.engine.postgres.quoting.ident`, ``literal``) and a
comment shows a name only as :func:`~airflow_repl.engine.postgres.quoting.comment` writes it, on
one line: a script is safe to run with ``psql -f`` whatever the names hold.

Update and delete procedures raise :data:`~airflow_repl.engine.errors.ROW_NOT_FOUND_SQLSTATE`
(SQL Server's error 20598) when the key matched no row; the Distribution Agent relies on it.
"""

from __future__ import annotations

from typing import Any

from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.codegen import call_syntax, dialect
from airflow_repl.engine.errors import ROW_NOT_FOUND_SQLSTATE
from airflow_repl.engine.model.propagation import OPERATIONS, CallSyntax, Operation
from airflow_repl.engine.postgres.catalog import Column
from airflow_repl.engine.postgres.quoting import comment, dollar_quote, ident, literal, qualified

#: The ``--dialect`` value.
NAME = "postgresql"
#: The server the procedures are for (its limit on arguments: :data:`call_syntax.MAX_ARGUMENTS`).
SERVER = "PostgreSQL"

quote = ident


def column_type(column: Column) -> str:
    """A parameter's type: the column's own (a domain's base type, :attr:`Column.param_type`)."""
    return column.param_type


def check_names(article: ResolvedArticle) -> None:
    """Every name PostgreSQL allows is quoted safely: nothing to refuse."""


def _dollar(i: int) -> str:
    return f"${i}"


def procedure_sql(article: ResolvedArticle, operation: Operation) -> str | None:
    """CREATE OR REPLACE PROCEDURE text of the generated procedure for ``operation``, or None
    when the operation does not use a generated procedure (SQL, NONE or a custom procedure)."""
    prop = article.propagation[operation]
    if not prop.generated:
        return None
    schema, name = article.called_procedure(operation)
    syntax = prop.call_syntax
    params = call_syntax.parameters(article, operation, syntax)
    decl = ", ".join(f"{ident(p)} {t}" for p, t in params)
    stmt = call_syntax.statement(article, operation, syntax, _dollar)
    lines = [
        "#variable_conflict use_column",
        f"-- {syntax} syntax: {', '.join(p for p, _ in params)}",
        "BEGIN",
        f"    {stmt};",
    ]
    if operation != Operation.INSERT:
        lines += _row_not_found_check(article, operation, syntax)
    lines.append("END;\n")
    return (
        f"CREATE OR REPLACE PROCEDURE {qualified(schema, name)}({decl})\n"
        f"LANGUAGE plpgsql AS {dollar_quote(chr(10).join(lines))};\n"
    )


def _row_not_found_check(article: ResolvedArticle, operation: Operation, syntax: CallSyntax) -> list[str]:
    """Body lines raising SQL Server's error 20598 when the statement matched no row."""
    keys = call_syntax.key_placeholders(article, operation, syntax, _dollar)
    key_names = ", ".join(article.primary_key)
    key_values = ", ".join(f"{k}::text" for k in keys)
    return [
        "    IF NOT FOUND THEN",
        f"        RAISE EXCEPTION USING ERRCODE = {literal(ROW_NOT_FOUND_SQLSTATE)},",
        f"            MESSAGE = format('row not found at the subscriber: {operation} of %s "
        f"with key (%s)=(%s) matched no row [20598]', "
        f"{literal(article.destination)}, {literal(key_names)}, concat_ws(', ', {key_values}));",
        "    END IF;",
    ]


def call_sql(article: ResolvedArticle, operation: Operation) -> str:
    """``CALL "schema"."procedure"($1::type, ...)``: each argument cast to its parameter's type
    (values are bound as PostgreSQL's text form, the bitmap as ``bytea``)."""
    schema, name = article.called_procedure(operation)
    params = call_syntax.parameters(article, operation, article.propagation[operation].call_syntax)
    # a type is format_type() text read from the publisher's catalog, quoted where it needs to be
    return f"CALL {qualified(schema, name)}({', '.join(f'${i + 1}::{t}' for i, (_, t) in enumerate(params))})"


def schema_change_sql(before: ResolvedArticle, change: dict[str, Any]) -> list[str]:
    """The ALTER TABLE statements of a replicated schema change at a PostgreSQL subscriber (none
    when the changed column is not replicated by the article)."""
    kind = dialect.schema_change_kind(before, change)
    if kind is None:
        return []
    table = qualified(before.dest_schema, before.dest_table)
    col = ident(change["column"])
    if kind == "drop_column":
        return [f"ALTER TABLE {table} DROP COLUMN {col}"]
    if kind == "rename_column":
        return [f"ALTER TABLE {table} RENAME COLUMN {col} TO {ident(change['new_name'])}"]
    typ = change["type"]  # format_type() text read from the publisher's catalog
    if kind == "alter_type":
        return [f"ALTER TABLE {table} ALTER COLUMN {col} TYPE {typ}"]
    out = [f"ALTER TABLE {table} ADD COLUMN {col} {typ}"]
    if change.get("existing") is not None:  # the value the publisher's existing rows got
        out[0] += f" DEFAULT {literal(change['existing'])}::{typ}"
        out.append(f"ALTER TABLE {table} ALTER COLUMN {col} DROP DEFAULT")
    if change.get("not_null"):
        out.append(f"ALTER TABLE {table} ALTER COLUMN {col} SET NOT NULL")
    return out


def article_script(article: ResolvedArticle) -> str:
    """All generated procedures of one article, as one script."""
    parts = [sql for op in OPERATIONS if (sql := procedure_sql(article, op))]
    return "\n".join(parts)


def article_header(article: ResolvedArticle) -> str:
    """The comment line that opens an article's procedures in a script: its name, its table and
    its destination, each as :func:`~airflow_repl.engine.postgres.quoting.comment` writes it."""
    return f"-- article {comment(article.name)}: {comment(article.table.qualified)} -> {comment(article.destination)}\n"


def publication_script(articles: list[ResolvedArticle]) -> str:
    """The generated procedures of every article, each article's under its header
    (``airflow-repl script-procs``)."""
    return "".join(f"{article_header(a)}{article_script(a)}\n" for a in articles)
