"""The T-SQL script (``airflow-repl script-procs --dialect tsql``) within SQL Server's rules: a
SET item in every update, types within SQL Server's sizes, SQL Server's parameter limit, and the
names a batch-splitting client (sqlcmd, SSMS) would misread refused in one line."""

from __future__ import annotations

import pglast
import pytest
from article_builder import article

from airflow_repl.engine.codegen import call_syntax, procedures, tsql_script
from airflow_repl.engine.errors import TopologyError
from airflow_repl.engine.postgres.catalog import Column, TableInfo


def _link(**props: str):
    """public.link (a int, b text), primary key (a, b): every column is a key column."""
    table = TableInfo(
        "public", "link", 1, [Column("a", "integer", True, 23), Column("b", "text", True, 25)], ["a", "b"]
    )
    return article(table, **props)


@pytest.mark.parametrize("syntax", ["SCALL", "MCALL"])
def test_an_update_of_a_table_whose_columns_are_all_key_columns_sets_them(syntax):
    art = _link(update=syntax)
    default = " = null" if syntax == "SCALL" else ""
    assert tsql_script._proc(art, "update") == (
        "create procedure [sp_MSupd_publiclink] \n"
        f" @c1 int{default},@c2 nvarchar(max){default},@pkc1 int,@pkc2 nvarchar(max)\n"
        ",@bitmap binary(1)\n"
        "as\nbegin\n"
        "update [public].[link] set \n"
        " [a] = case substring(@bitmap,1,1) & 1 when 1 then @c1 else [a] end\n"
        ",[b] = case substring(@bitmap,1,1) & 2 when 2 then @c2 else [b] end\n"
        "where [a] = @pkc1 and [b] = @pkc2\n"
        f"{tsql_script._RAISE}end\ngo\n"
    )
    # the PL/pgSQL procedure sets every column under every syntax: its UPDATE parses, SET included
    body = pglast.parse_plpgsql(procedures.procedure_sql(art, "update"))[0]["PLpgSQL_function"]["action"]
    query = body["PLpgSQL_stmt_block"]["body"][0]["PLpgSQL_stmt_execsql"]["sqlstmt"]["PLpgSQL_expr"]["query"]
    (stmt,) = pglast.parse_sql(query)
    assert [t.name for t in stmt.stmt.targetList] == ["a", "b"]


def test_a_table_with_other_columns_keeps_sql_servers_set_list_without_the_key():
    table = TableInfo("public", "t", 1, [*_link().columns, Column("v", "text", False, 25)], ["a"])
    script = tsql_script._proc(article(table, update="SCALL"), "update")
    assert "update [public].[t] set \n [b] = case" in script and "[a] = case" not in script


@pytest.mark.parametrize(
    "pg_type, tsql_type",
    [
        ("character(4000)", "nchar(4000)"),
        ("character(4001)", "nvarchar(max)"),  # SQL Server's nchar holds 4,000 at most; no nchar(max)
        ("character(5000)", "nvarchar(max)"),
        ("character varying(4000)", "nvarchar(4000)"),
        ("character varying(4001)", "nvarchar(max)"),
        ("numeric(38,10)", "numeric(38,10)"),
        ("numeric(39,2)", "numeric(38,10)"),
        ("numeric(3,5)", "numeric(5,5)"),  # PostgreSQL 15: a scale above the precision
        ("numeric(5,-2)", "numeric(7,0)"),  # PostgreSQL 15: a negative scale
        ("numeric(37,-2)", "numeric(38,10)"),
        ("numeric", "numeric(38,10)"),
        ("timestamp(3) without time zone", "datetime2"),
        ("bytea", "varbinary(max)"),
        ("bit(9000)", "nvarchar(max)"),
    ],
)
def test_types_stay_within_sql_servers_limits(pg_type, tsql_type):
    assert tsql_script.tsql_type(Column("c", pg_type, False, 0)) == tsql_type


def _wide(n: int):
    table = TableInfo("public", "wide", 1, [Column(f"c{i}", "integer", True, 23) for i in range(n)], ["c0"])
    return article(table, update="XCALL", delete="XCALL")


def test_the_tsql_script_takes_sql_servers_parameter_limit():
    art = _wide(60)  # XCALL updates pass 120 parameters
    with pytest.raises(TopologyError, match="PostgreSQL procedures take at most 100"):
        call_syntax.check_argument_limit(art)
    call_syntax.check_argument_limit(art, tsql_script.SERVER)
    assert "@c120 int" in tsql_script.article_script(art)
    call_syntax.check_argument_limit(_wide(1050), tsql_script.SERVER)  # exactly 2,100
    with pytest.raises(TopologyError) as err:
        call_syntax.check_argument_limit(_wide(1051), tsql_script.SERVER)
    assert str(err.value) == (
        "article 'wide' (public.wide, 1051 columns replicated): XCALL syntax passes 2102 parameters to the update "
        "procedure, but SQL Server procedures take at most 2100; set upd_cmd to CALL or SCALL or MCALL or SQL "
        "(SQL statements have no such limit) or replicate fewer columns"
    )


def _named(column: str = "v", *, name: str = "t", schema: str = "public", table: str = "t"):
    cols = [Column("id", "integer", True, 23), Column(column, "text", False, 25)]
    return article(TableInfo(schema, table, 1, cols, ["id"]), name=name)


@pytest.mark.parametrize(
    "art, message",
    [
        (
            _named("a\ngo\nb"),
            "article 't' cannot be scripted as T-SQL: its column E'a\\ngo\\nb' holds a line break (sqlcmd and SSMS "
            "end a batch at a line that is only go, inside brackets too); leave the column out (columns:) or "
            "rename it, or script the postgresql dialect",
        ),
        (
            _named("it's"),
            "article 't' cannot be scripted as T-SQL: its column 'it''s' holds ' (sqlcmd reads it as the start of a "
            "string, inside brackets too, and misses the go lines after it); leave the column out (columns:) or "
            "rename it, or script the postgresql dialect",
        ),
        (
            _named(name='say "hi"'),
            "article 'say \"hi\"' cannot be scripted as T-SQL: the article's name 'say \"hi\"' holds \" (sqlcmd "
            "reads it as the start of a string, inside brackets too, and misses the go lines after it); give the "
            "article another name (name:), or script the postgresql dialect",
        ),
        (
            _named(name="ok", schema="s/", table="*t"),  # only the procedure names hold "/*"
            "article 'ok' cannot be scripted as T-SQL: its insert procedure 'sp_MSins_s/*t' holds /* (sqlcmd reads "
            "it as the start of a comment, inside brackets too, and misses the go lines after it); give the article "
            "another destination, or script the postgresql dialect",
        ),
        (
            _named(name="ok", schema="$(x)"),
            "article 'ok' cannot be scripted as T-SQL: its destination schema '$(x)' holds $( (sqlcmd replaces "
            "$(name) with a scripting variable, inside brackets too); give the article another destination, or "
            "script the postgresql dialect",
        ),
        (
            _named(name="ok", table="t\u2028"),
            "article 'ok' cannot be scripted as T-SQL: its destination table E't\\u2028' holds a line break (sqlcmd "
            "and SSMS end a batch at a line that is only go, inside brackets too); give the article another "
            "destination, or script the postgresql dialect",
        ),
    ],
)
def test_a_name_a_batch_splitter_misreads_is_refused_in_one_line(art, message):
    with pytest.raises(TopologyError) as err:
        tsql_script.publication_script([_named(), art])  # refused before anything is scripted
    assert str(err.value) == message


def test_names_sql_server_brackets_alone_are_scripted():
    art = _named("a]b -- go */ ;", name="ok", schema="名", table="x]")
    script = tsql_script.publication_script([art])
    assert script.startswith("-- article 'ok' -> [名].[x]]]\n--INSERT procedure using CALL syntax\n")
    assert "create procedure [sp_MSins_名x]]] \n" in script and ",[a]]b -- go */ ;])" in script


def test_the_postgresql_header_shows_each_name_on_one_line():
    art = _named(name="nl\nSELECT 'injected'; --", schema="a\\b")
    header = procedures.article_header(art)
    assert header == "-- article E'nl\\nSELECT ''injected''; --': E'a\\\\b.t' -> E'a\\\\b.t'\n"
    assert procedures.publication_script([art]) == header + procedures.article_script(art) + "\n"
