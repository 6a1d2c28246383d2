"""Scripting the generated procedures as T-SQL, for SQL Server subscribers (SQL Server's
``sp_scriptpublicationcustomprocs``).  Script only: nothing here runs against SQL Server.

The text follows the structure SQL Server itself generates (see the Purchasing.Vendor example
in the reference documents): ``@c1..@cn`` / ``@pkc1..`` parameters, the SCALL
``case substring(@bitmap, byte, 1) & bit`` update, and ``sp_MSreplraiserror 20598`` when an
update or delete affects no row.

Names are bracketed (``]`` doubled).  A client that runs a ``go``-separated script (sqlcmd, SSMS)
splits it into batches before SQL Server reads it, and that split does not know brackets: it
ends a batch at any line that is only ``go``, reads ``'``, ``"`` and ``/*`` as the start of a
string or comment, and replaces ``$(name)`` with a scripting variable.  A name holding any of
those would change the script's batches, so :func:`check_names` refuses the article (one line
naming it, the name and the fix) before anything is printed; so is a destination table or
procedure whose name starts with ``#``, which SQL Server takes for a temporary object.  Types and parameter counts
follow SQL Server's limits (4,000 characters for ``nchar``/``nvarchar``, 38 digits, 2,100
parameters).
"""

from __future__ import annotations

import re
from typing import Any

from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.codegen import call_syntax, dialect
from airflow_repl.engine.errors import TopologyError
from airflow_repl.engine.model.propagation import OPERATIONS, CallSyntax, Operation
from airflow_repl.engine.postgres.catalog import Column
from airflow_repl.engine.postgres.quoting import comment

#: The ``--dialect`` value.
NAME = "tsql"
#: The server the script is for (its limit on parameters: :data:`call_syntax.MAX_ARGUMENTS`).
SERVER = "SQL Server"
#: SQL Server's largest declared length of ``nchar``/``nvarchar`` (characters); larger is ``(max)``.
MAX_NCHAR = 4000

_FIXED = {
    "smallint": "smallint",
    "integer": "int",
    "bigint": "bigint",
    "boolean": "bit",
    "real": "real",
    "double precision": "float",
    "date": "date",
    "text": "nvarchar(max)",
    "bytea": "varbinary(max)",
    "uuid": "uniqueidentifier",
    "json": "nvarchar(max)",
    "jsonb": "nvarchar(max)",
    "timestamp without time zone": "datetime2",
    "timestamp with time zone": "datetimeoffset",
    "time without time zone": "time",
    "character varying": "nvarchar(max)",
    "money": "money",
}


def tsql_type(column: Column) -> str:
    """The SQL Server type for a PostgreSQL column type, within SQL Server's limits
    (nvarchar(max) when there is no match)."""
    t = column.param_type  # a domain is scripted as its base type
    if t in _FIXED:
        return _FIXED[t]
    if m := re.fullmatch(r"character varying\((\d+)\)", t):
        return f"nvarchar({m.group(1)})" if int(m.group(1)) <= MAX_NCHAR else "nvarchar(max)"
    if m := re.fullmatch(r"character\((\d+)\)", t):  # there is no nchar(max)
        return f"nchar({m.group(1)})" if int(m.group(1)) <= MAX_NCHAR else "nvarchar(max)"
    if m := re.fullmatch(r"numeric\((\d+),(-?\d+)\)", t):
        return _numeric(int(m.group(1)), int(m.group(2)))
    if t == "numeric":
        return "numeric(38,10)"
    if re.fullmatch(r"timestamp\(\d\) without time zone", t):
        return "datetime2"
    if re.fullmatch(r"timestamp\(\d\) with time zone", t):
        return "datetimeoffset"
    return "nvarchar(max)"


def _numeric(precision: int, scale: int) -> str:
    """SQL Server's numeric (precision 1 to 38, scale 0 to the precision) holding the digits of
    PostgreSQL's numeric(precision, scale), whose scale may be negative or above the precision
    (PostgreSQL 15): the same digits on each side of the point; numeric(38,10) above 38 digits."""
    whole, fraction = max(precision - scale, 0), max(scale, 0)
    if whole + fraction > 38:
        return "numeric(38,10)"
    return f"numeric({whole + fraction},{fraction})"


def bracket(name: str) -> str:
    return "[" + name.replace("]", "]]") + "]"


quote = bracket
column_type = tsql_type


_RAISE = "if @@rowcount = 0\n    if @@microsoftversion>0x07320000\n        exec sp_MSreplraiserror 20598\n"


def _proc(article: ResolvedArticle, operation: Operation) -> str | None:
    prop = article.propagation[operation]
    if not prop.generated:
        return None
    name = bracket(article.default_procs[operation])
    if operation == Operation.INSERT:
        return _insert_proc(article, name)
    if operation == Operation.DELETE:
        return _delete_proc(article, name, prop.call_syntax)
    return _update_proc(article, name, prop.call_syntax)


def _table(article: ResolvedArticle) -> str:
    return f"{bracket(article.dest_schema)}.{bracket(article.dest_table)}"


def _insert_proc(article: ResolvedArticle, name: str) -> str:
    cols = article.columns
    params = ",".join(f"@c{i + 1} {tsql_type(c)}" for i, c in enumerate(cols))
    return (
        f"create procedure {name} \n  {params}\nas \nbegin \ninsert into {_table(article)}("
        + "\n,".join(bracket(c.name) for c in cols)
        + ")\nvalues ( \n "
        + "\n,".join(f"@c{i + 1}" for i in range(len(cols)))
        + "\n ) \nend\ngo\n"
    )


def _delete_proc(article: ResolvedArticle, name: str, syntax: CallSyntax) -> str:
    cols, pk = article.columns, article.pk_positions
    if syntax == CallSyntax.XCALL:
        params = ",".join(f"@c{i + 1} {tsql_type(c)}" for i, c in enumerate(cols))
        where = " and ".join(f"{bracket(cols[i].name)} = @c{i + 1}" for i in pk)
    else:
        params = ",".join(f"@pkc{j + 1} {tsql_type(cols[i])}" for j, i in enumerate(pk))
        where = " and ".join(f"{bracket(cols[i].name)} = @pkc{j + 1}" for j, i in enumerate(pk))
    return (
        f"create procedure {name} \n  {params}\nas \nbegin \ndelete {_table(article)}\nwhere {where}\n"
        f"{_RAISE}end \ngo\n"
    )


def _update_proc(article: ResolvedArticle, name: str, syntax: CallSyntax) -> str:
    if syntax == CallSyntax.XCALL:
        head, sets, where = _update_xcall(article, name)
    else:
        head, sets, where = _update_by_key(article, name, syntax)
    return (
        f"{head}as\nbegin\nupdate {_table(article)} set \n " + "\n,".join(sets) + f"\nwhere {where}\n{_RAISE}end\ngo\n"
    )


def _update_xcall(article: ResolvedArticle, name: str) -> tuple[str, list[str], str]:
    """(procedure head, SET items, WHERE condition) of an XCALL update: old then new images."""
    cols, n = article.columns, len(article.columns)
    params = ",".join(
        [f"@c{i + 1} {tsql_type(c)}" for i, c in enumerate(cols)]
        + [f"@c{n + i + 1} {tsql_type(c)}" for i, c in enumerate(cols)]
    )
    sets = [f"{bracket(c.name)} = @c{n + i + 1}" for i, c in enumerate(cols)]
    where = " and ".join(f"{bracket(cols[i].name)} = @c{i + 1}" for i in article.pk_positions)
    return f"create procedure {name} \n {params}\n", sets, where


def _update_by_key(article: ResolvedArticle, name: str, syntax: CallSyntax) -> tuple[str, list[str], str]:
    """(procedure head, SET items, WHERE condition) of a CALL, SCALL or MCALL update: the new
    image, then the old key (and the changed-columns bitmap)."""
    cols, n, pk = article.columns, len(article.columns), article.pk_positions
    default = " = null" if syntax == CallSyntax.SCALL else ""
    params = ",".join(
        [f"@c{i + 1} {tsql_type(c)}{default}" for i, c in enumerate(cols)]
        + [f"@pkc{j + 1} {tsql_type(cols[i])}" for j, i in enumerate(pk)]
    )
    where = " and ".join(f"{bracket(cols[i].name)} = @pkc{j + 1}" for j, i in enumerate(pk))
    if syntax == CallSyntax.CALL:
        sets = [f"{bracket(c.name)} = @c{i + 1}" for i, c in enumerate(cols)]
        return f"create procedure {name} \n {params}\n", sets, where
    # SCALL / MCALL: the bitmap says which columns changed; as in SQL Server's script, the key
    # columns are set only when every column is in the key (T-SQL wants at least one SET item)
    pk_set = set(pk) if len(pk) < n else set()
    sets = [
        f"{bracket(c.name)} = case substring(@bitmap,{i // 8 + 1},1) & {1 << (i % 8)} "
        f"when {1 << (i % 8)} then @c{i + 1} else {bracket(c.name)} end"
        for i, c in enumerate(cols)
        if i not in pk_set
    ]
    return f"create procedure {name} \n {params}\n,@bitmap binary({n // 8 + 1})\n", sets, where


def procedure_sql(article: ResolvedArticle, operation: Operation) -> str | None:
    """The ``create procedure`` batch of the generated procedure for ``operation`` (ending in
    ``go``), or None when the operation uses no generated procedure; refused
    (:func:`check_names`) when a name would change the script's batches."""
    check_names(article)
    return _proc(article, operation)


def call_sql(article: ResolvedArticle, operation: Operation) -> str:
    """The ODBC call of the procedure ``operation`` uses, as SQL Server's Distribution Agent
    makes it: ``{call [schema].[procedure](?, ...)}``, one ``?`` per parameter."""
    schema, name = article.called_procedure(operation)
    count = len(call_syntax.parameters(article, operation, article.propagation[operation].call_syntax))
    return f"{{call {bracket(schema)}.{bracket(name)}({', '.join(['?'] * count)})}}"


def schema_change_sql(before: ResolvedArticle, change: dict[str, Any]) -> list[str]:
    """The statements of a replicated schema change at a SQL Server subscriber (script only):
    ``alter table`` for ADD, DROP and a widening, ``sp_rename`` for RENAME.  A new column name
    a batch-splitting client would misread is refused as :func:`check_names` refuses others."""
    kind = dialect.schema_change_kind(before, change)
    if kind is None:
        return []
    check_names(before)
    new = change["new_name"] if kind == "rename_column" else change["column"]
    if hazard := _hazard(new):
        raise TopologyError(
            f"article {comment(before.name)} cannot be scripted as T-SQL: its new column {comment(new)} holds "
            f"{hazard}; name the column otherwise, or script the postgresql dialect"
        )
    table, col = _table(before), bracket(change["column"])
    if kind == "drop_column":
        return [f"alter table {table} drop column {col}"]
    if kind == "rename_column":
        # sp_rename reads its first argument as a (bracketed) name; no name here holds a quote
        return [f"exec sp_rename N'{table}.{col}', N'{new}', 'COLUMN'"]
    typ = tsql_type(Column(change["column"], change["type"], bool(change.get("not_null")), 0))
    if kind == "alter_type":
        return [f"alter table {table} alter column {col} {typ}"]
    out = [f"alter table {table} add {col} {typ} null"]
    if change.get("existing") is not None:  # the value the publisher's existing rows got
        out.append(f"update {table} set {col} = N'{change['existing'].replace(chr(39), chr(39) * 2)}'")
    if change.get("not_null"):
        out.append(f"alter table {table} alter column {col} {typ} not null")
    return out


def article_script(article: ResolvedArticle) -> str:
    """The article's generated procedures as a T-SQL script (``go``-separated); refused
    (:func:`check_names`) when a name would change the script's batches."""
    check_names(article)
    parts = [
        f"--{op.upper()} procedure using {article.propagation[op].syntax} syntax\n{text}"
        for op in OPERATIONS
        if (text := _proc(article, op))
    ]
    return "\n".join(parts)


def article_header(article: ResolvedArticle) -> str:
    """The comment line that opens an article's procedures: its name and its destination."""
    return f"-- article {comment(article.name)} -> {_table(article)}\n"


def publication_script(articles: list[ResolvedArticle]) -> str:
    """The generated procedures of every article, each under its header (``airflow-repl
    script-procs --dialect tsql``); every article's names are checked before any is scripted."""
    for article in articles:
        check_names(article)
    return "".join(f"{article_header(a)}{article_script(a)}\n" for a in articles)


def _hazard(name: str) -> str | None:
    """What in ``name`` a client splitting the script into batches would read differently from
    SQL Server (see the module's docstring), or None."""
    if name.splitlines() != [name]:
        return "a line break (sqlcmd and SSMS end a batch at a line that is only go, inside brackets too)"
    for text, what in (("'", "string"), ('"', "string"), ("/*", "comment")):
        if text in name:
            return f"{text} (sqlcmd reads it as the start of a {what}, inside brackets too, and misses the go lines after it)"
    if "$(" in name:
        return "$( (sqlcmd replaces $(name) with a scripting variable, inside brackets too)"
    return None


#: Why a table or procedure name starting with ``#`` is refused.
_TEMPORARY = "a leading # (SQL Server takes such a table or procedure for a temporary one, in brackets too)"


def check_names(article: ResolvedArticle) -> None:
    """Refuse an article with a name the T-SQL script would show (its name, destination, columns
    and procedure names) that a batch-splitting client would misread: one line naming the
    article, the name and the fix."""
    key = set(article.primary_key)
    fix_destination = "give the article another destination"
    names = [
        ("the article's name", article.name, "give the article another name (name:)"),
        ("its destination schema", article.dest_schema, fix_destination),
        ("its destination table", article.dest_table, fix_destination),
        *[
            (
                "its key column" if c in key else "its column",
                c,
                "rename the column" if c in key else "leave the column out (columns:) or rename it",
            )
            for c in article.column_names
        ],
        *[
            (f"its {op} procedure", article.default_procs[op], fix_destination)
            for op in OPERATIONS
            if article.propagation[op].generated
        ],
    ]
    objects = {
        article.dest_table,
        *(article.default_procs[op] for op in OPERATIONS if article.propagation[op].generated),
    }
    for what, name, fix in names:
        if hazard := _hazard(name) or (_TEMPORARY if name in objects and name.startswith("#") else None):
            raise TopologyError(
                f"article {comment(article.name)} cannot be scripted as T-SQL: {what} {comment(name)} holds "
                f"{hazard}; {fix}, or script the postgresql dialect"
            )
