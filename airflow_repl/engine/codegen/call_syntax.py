"""Call syntaxes: which parameters a procedure receives for each operation (SPEC section 1),
and the single statement each (operation, syntax) pair performs on the subscriber table.

The same statement text serves the generated PL/pgSQL procedures (placeholders ``$n``) and the
SQL-statement propagation method (placeholders ``%(pn)s::type``), so both behave identically.
"""

from __future__ import annotations

from collections.abc import Callable

from airflow_repl.engine.articles.commands import DELETE, INSERT, Command, Value, Values, bitmask
from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.errors import TopologyError
from airflow_repl.engine.model.propagation import ALLOWED_SYNTAX, OPERATIONS, CallSyntax, Method, Operation
from airflow_repl.engine.postgres.quoting import ident, qualified

Placeholder = Callable[[int], str]  # 1-based parameter position -> SQL text
Parameter = tuple[str, str]  # (name, type)
Argument = Value | bytes  # a column's text value, or the SCALL / MCALL bitmap

#: The most parameters a procedure takes, per server: PostgreSQL's FUNC_MAX_ARGS (the
#: ``max_function_args`` setting; fixed when the server is built), SQL Server's 2,100 (the
#: T-SQL script's procedures are for SQL Server subscribers) and, for MariaDB (whose procedures
#: have no limit of their own), the 65,535 placeholders a prepared statement takes.
MAX_ARGUMENTS = {"PostgreSQL": 100, "SQL Server": 2100, "MariaDB": 65535}


def parameters(article: ResolvedArticle, operation: Operation, syntax: CallSyntax) -> list[Parameter]:
    """(name, type) of each parameter, in order, SQL Server style (c1.., pkc1.., bitmap)."""
    cols = article.columns
    n = len(cols)
    pk = [article.columns[i] for i in article.pk_positions]
    all_cols = [(f"c{i + 1}", c.param_type) for i, c in enumerate(cols)]
    pk_cols = [(f"pkc{j + 1}", c.param_type) for j, c in enumerate(pk)]
    if operation == Operation.INSERT:
        return all_cols
    if operation == Operation.DELETE:
        return all_cols if syntax == CallSyntax.XCALL else pk_cols
    if syntax == CallSyntax.CALL:
        return all_cols + pk_cols
    if syntax in (CallSyntax.SCALL, CallSyntax.MCALL):
        return [*all_cols, *pk_cols, ("bitmap", "bytea")]
    if syntax == CallSyntax.XCALL:
        return all_cols + [(f"c{n + i + 1}", c.param_type) for i, c in enumerate(cols)]
    raise ValueError(f"unknown call syntax {syntax!r}")


def parameter_count(operation: Operation, syntax: CallSyntax, columns: int, key_columns: int) -> int:
    """How many parameters ``syntax`` passes for ``operation`` on a table of ``columns``
    replicated columns, ``key_columns`` of them in the primary key (the lengths of
    :func:`parameters`)."""
    if operation == Operation.INSERT:
        return columns
    if operation == Operation.DELETE:
        return columns if syntax == CallSyntax.XCALL else key_columns
    return {
        CallSyntax.CALL: columns + key_columns,
        CallSyntax.SCALL: columns + key_columns + 1,
        CallSyntax.MCALL: columns + key_columns + 1,
        CallSyntax.XCALL: 2 * columns,
    }[syntax]


def check_argument_limit(article: ResolvedArticle, server: str = "PostgreSQL") -> None:
    """Refuse an article whose procedure calls would pass more parameters than ``server``'s
    procedures take (:data:`MAX_ARGUMENTS`), naming the syntaxes that fit (SQL statements have no
    such limit)."""
    limit = MAX_ARGUMENTS[server]
    n, k = len(article.columns), len(article.primary_key)
    for operation in OPERATIONS:
        prop = article.propagation[operation]
        if prop.method != Method.PROC:
            continue
        count = parameter_count(operation, prop.call_syntax, n, k)
        if count <= limit:
            continue
        fit = [s for s in ALLOWED_SYNTAX[operation] if parameter_count(operation, s, n, k) <= limit]
        raise TopologyError(
            f"article {article.name!r} ({article.table.qualified}, {n} columns replicated): {prop.syntax} "
            f"syntax passes {count} parameters to the {operation} procedure, but {server} procedures take "
            f"at most {limit}; set {operation.option} to {' or '.join([*fit, 'SQL'])} "
            f"(SQL statements have no such limit) or replicate fewer columns"
        )


def values(article: ResolvedArticle, cmd: Command, syntax: CallSyntax) -> list[Argument]:
    """The argument values for one command under ``syntax``."""
    pk = article.pk_positions
    if cmd.op == INSERT:
        return list(_image(cmd.new))
    old = _image(cmd.old)
    if cmd.op == DELETE:
        return list(old) if syntax == CallSyntax.XCALL else [old[i] for i in pk]
    new = _image(cmd.new)
    old_pk: list[Argument] = [old[i] for i in pk]
    if syntax == CallSyntax.CALL:
        return [*new, *old_pk]
    changed = cmd.changed()
    if syntax == CallSyntax.SCALL:
        return [*(v if c else None for v, c in zip(new, changed, strict=True)), *old_pk, bitmask(changed)]
    if syntax == CallSyntax.MCALL:
        return [*new, *old_pk, bitmask(changed)]
    if syntax == CallSyntax.XCALL:
        return [*old, *new]
    raise ValueError(f"unknown call syntax {syntax!r}")


def _image(image: Values | None) -> Values:
    if image is None:
        raise ValueError("the command lacks the row image its operation needs")
    return image


def _pg_flagged(bitmap: str, i: int) -> str:
    """PostgreSQL's test that column ``i`` (0-based) is flagged in the bitmap ``bitmap``."""
    return f"get_byte({bitmap}, {i // 8}) & {1 << (i % 8)} <> 0"


def statement(
    article: ResolvedArticle,
    operation: Operation,
    syntax: CallSyntax,
    ph: Placeholder,
    *,
    table: str | None = None,
    quote: Callable[[str], str] = ident,
    column: Callable[[str], str] | None = None,
    flagged: Callable[[str, int], str] = _pg_flagged,
) -> str:
    """The INSERT/UPDATE/DELETE that applies one command with this syntax's parameters.

    A dialect other than PostgreSQL's spells the parts: ``table`` (the quoted destination),
    ``quote`` (a column in the INSERT's column list), ``column`` (a column in an expression, by
    default as ``quote`` writes it) and ``flagged`` (the test that a column is flagged in the
    SCALL / MCALL bitmap, given the bitmap's placeholder and the column's 0-based position)."""
    table = qualified(article.dest_schema, article.dest_table) if table is None else table
    col = quote if column is None else column
    names = article.column_names
    n = len(names)
    pk = article.pk_positions
    if operation == Operation.INSERT:
        return (
            f"INSERT INTO {table} ({', '.join(quote(c) for c in names)}) "
            f"VALUES ({', '.join(ph(i + 1) for i in range(n))})"
        )
    if operation == Operation.DELETE:
        if syntax == CallSyntax.XCALL:
            where = [f"{col(names[i])} = {ph(i + 1)}" for i in pk]
        else:
            where = [f"{col(names[i])} = {ph(j + 1)}" for j, i in enumerate(pk)]
        return f"DELETE FROM {table} WHERE {' AND '.join(where)}"
    if syntax == CallSyntax.XCALL:
        sets = [f"{col(c)} = {ph(n + i + 1)}" for i, c in enumerate(names)]
        where = [f"{col(names[i])} = {ph(i + 1)}" for i in pk]
    else:
        where = [f"{col(names[i])} = {ph(n + j + 1)}" for j, i in enumerate(pk)]
        if syntax == CallSyntax.CALL:
            sets = [f"{col(c)} = {ph(i + 1)}" for i, c in enumerate(names)]
        else:  # SCALL / MCALL: only the columns flagged in the bitmap
            bm = ph(n + len(pk) + 1)
            sets = [
                f"{col(c)} = CASE WHEN {flagged(bm, i)} THEN {ph(i + 1)} ELSE {col(c)} END" for i, c in enumerate(names)
            ]
    return f"UPDATE {table} SET {', '.join(sets)} WHERE {' AND '.join(where)}"


def key_placeholders(article: ResolvedArticle, operation: Operation, syntax: CallSyntax, ph: Placeholder) -> list[str]:
    """Placeholders holding the key that locates the row (for row-not-found messages)."""
    n = len(article.column_names)
    pk = article.pk_positions
    if syntax == CallSyntax.XCALL:
        return [ph(i + 1) for i in pk]
    if operation == Operation.DELETE:
        return [ph(j + 1) for j in range(len(pk))]
    return [ph(n + j + 1) for j in range(len(pk))]
