"""Scripting the generated procedures as T-SQL, for SQL Server subscribers (SQL Server's
``sp_scriptpublicationcustomprocs``).  Script only: nothing here runs against SQL Server.

The text follows the structure SQL Server itself generates (see the Purchasing.Vendor example
in the reference documents): ``@c1..@cn`` / ``@pkc1..`` parameters, the SCALL
``case substring(@bitmap, byte, 1) & bit`` update, and ``sp_MSreplraiserror 20598`` when an
update or delete affects no row.
"""

from __future__ import annotations

import re

from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.model.propagation import OPERATIONS, CallSyntax, Method, Operation
from airflow_repl.engine.postgres.catalog import Column

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
    """The SQL Server type for a PostgreSQL column type (nvarchar(max) when there is no match)."""
    t = column.param_type  # a domain is scripted as its base type
    if t in _FIXED:
        return _FIXED[t]
    if m := re.fullmatch(r"character varying\((\d+)\)", t):
        return f"nvarchar({m.group(1)})" if int(m.group(1)) <= 4000 else "nvarchar(max)"
    if m := re.fullmatch(r"character\((\d+)\)", t):
        return f"nchar({m.group(1)})"
    if m := re.fullmatch(r"numeric\((\d+),(\d+)\)", t):
        return f"numeric({m.group(1)},{m.group(2)})" if int(m.group(1)) <= 38 else "numeric(38,10)"
    if t == "numeric":
        return "numeric(38,10)"
    if re.fullmatch(r"timestamp\(\d\) without time zone", t):
        return "datetime2"
    if re.fullmatch(r"timestamp\(\d\) with time zone", t):
        return "datetimeoffset"
    return "nvarchar(max)"


def bracket(name: str) -> str:
    return "[" + name.replace("]", "]]") + "]"


_RAISE = "if @@rowcount = 0\n    if @@microsoftversion>0x07320000\n        exec sp_MSreplraiserror 20598\n"


def _proc(article: ResolvedArticle, operation: Operation) -> str | None:
    prop = article.propagation[operation]
    if prop.method != Method.PROC or prop.custom:
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
    # SCALL / MCALL: the bitmap says which columns changed
    pk_set = set(pk)
    sets = [
        f"{bracket(c.name)} = case substring(@bitmap,{i // 8 + 1},1) & {1 << (i % 8)} "
        f"when {1 << (i % 8)} then @c{i + 1} else {bracket(c.name)} end"
        for i, c in enumerate(cols)
        if i not in pk_set
    ]
    return f"create procedure {name} \n {params}\n,@bitmap binary({n // 8 + 1})\n", sets, where


def article_script(article: ResolvedArticle) -> str:
    """The article's generated procedures as a T-SQL script (``go``-separated)."""
    parts = [
        f"--{op.upper()} procedure using {article.propagation[op].syntax} syntax\n{text}"
        for op in OPERATIONS
        if (text := _proc(article, op))
    ]
    return "\n".join(parts)
