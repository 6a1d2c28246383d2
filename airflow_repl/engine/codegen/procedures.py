"""Generated subscriber procedures (``sp_MSins_`` / ``sp_MSupd_`` / ``sp_MSdel_``) as PL/pgSQL.

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

from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.codegen import call_syntax
from airflow_repl.engine.errors import ROW_NOT_FOUND_SQLSTATE
from airflow_repl.engine.model.propagation import OPERATIONS, CallSyntax, Operation
from airflow_repl.engine.postgres.quoting import comment, dollar_quote, ident, literal, qualified

#: The server the procedures are for (its limit on arguments: :data:`call_syntax.MAX_ARGUMENTS`).
SERVER = "PostgreSQL"


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
