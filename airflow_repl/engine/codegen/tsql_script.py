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


def _proc(article: ResolvedArticle, operation: str) -> str | None:
    prop = article.propagation[operation]
    if prop.method != "proc" or prop.custom:
        return None
    name = bracket(article.default_procs[operation])
    table = f"{bracket(article.dest_schema)}.{bracket(article.dest_table)}"
    cols = article.columns
    n = len(cols)
    pk = article.pk_positions
    pk_set = set(pk)
    syntax = prop.syntax
    if operation == "insert":
        params = ",".join(f"@c{i + 1} {tsql_type(c)}" for i, c in enumerate(cols))
        return (
            f"create procedure {name} \n  {params}\nas \nbegin \ninsert into {table}("
            + "\n,".join(bracket(c.name) for c in cols)
            + ")\nvalues ( \n "
            + "\n,".join(f"@c{i + 1}" for i in range(n))
            + "\n ) \nend\ngo\n"
        )
    if operation == "delete":
        if syntax == "XCALL":
            params = ",".join(f"@c{i + 1} {tsql_type(c)}" for i, c in enumerate(cols))
            where = " and ".join(f"{bracket(cols[i].name)} = @c{i + 1}" for i in pk)
        else:
            params = ",".join(f"@pkc{j + 1} {tsql_type(cols[i])}" for j, i in enumerate(pk))
            where = " and ".join(f"{bracket(cols[i].name)} = @pkc{j + 1}" for j, i in enumerate(pk))
        return f"create procedure {name} \n  {params}\nas \nbegin \ndelete {table}\nwhere {where}\n{_RAISE}end \ngo\n"
    # update
    if syntax == "XCALL":
        params = ",".join(
            [f"@c{i + 1} {tsql_type(c)}" for i, c in enumerate(cols)]
            + [f"@c{n + i + 1} {tsql_type(c)}" for i, c in enumerate(cols)]
        )
        sets = [f"{bracket(c.name)} = @c{n + i + 1}" for i, c in enumerate(cols)]
        where = " and ".join(f"{bracket(cols[i].name)} = @c{i + 1}" for i in pk)
        head = f"create procedure {name} \n {params}\n"
    else:
        default = " = null" if syntax == "SCALL" else ""
        params = ",".join(
            [f"@c{i + 1} {tsql_type(c)}{default}" for i, c in enumerate(cols)]
            + [f"@pkc{j + 1} {tsql_type(cols[i])}" for j, i in enumerate(pk)]
        )
        where = " and ".join(f"{bracket(cols[i].name)} = @pkc{j + 1}" for j, i in enumerate(pk))
        if syntax == "CALL":
            sets = [f"{bracket(c.name)} = @c{i + 1}" for i, c in enumerate(cols)]
            head = f"create procedure {name} \n {params}\n"
        else:  # SCALL / MCALL: the bitmap says which columns changed
            sets = [
                f"{bracket(c.name)} = case substring(@bitmap,{i // 8 + 1},1) & {1 << (i % 8)} "
                f"when {1 << (i % 8)} then @c{i + 1} else {bracket(c.name)} end"
                for i, c in enumerate(cols)
                if i not in pk_set
            ]
            head = f"create procedure {name} \n {params}\n,@bitmap binary({n // 8 + 1})\n"
    return f"{head}as\nbegin\nupdate {table} set \n " + "\n,".join(sets) + f"\nwhere {where}\n{_RAISE}end\ngo\n"


def article_script(article: ResolvedArticle) -> str:
    """The article's generated procedures as a T-SQL script (``go``-separated)."""
    parts = [
        f"--{op.upper()} procedure using {article.propagation[op].syntax} syntax\n{text}"
        for op in ("insert", "update", "delete")
        if (text := _proc(article, op))
    ]
    return "\n".join(parts)
