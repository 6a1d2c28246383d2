"""The codegen's dialects behind one interface (PL/pgSQL, T-SQL, MariaDB): the registry and
``--dialect``, the call of a procedure per call syntax, the MariaDB types, literals, procedures
and schema-change DDL of each dialect."""

from __future__ import annotations

import pytest
from article_builder import article, text_article

from airflow_repl import cli
from airflow_repl.engine.articles.commands import DELETE, UPDATE, Command
from airflow_repl.engine.codegen import call_syntax, dialect, mariadb, procedures, tsql_script
from airflow_repl.engine.errors import DeliveryError, TopologyError
from airflow_repl.engine.model.propagation import OPERATIONS, CallSyntax, Operation
from airflow_repl.engine.postgres.catalog import Column, TableInfo

#: SQL Server's Purchasing.Vendor as the docs publish it (docs/propagation/index.md).
VENDOR = TableInfo(
    "Purchasing",
    "Vendor",
    1,
    [
        Column("VendorID", "integer", True, 23),
        Column("AccountNumber", "character varying(15)", True, 1043),
        Column("Name", "character varying(50)", True, 1043),
        Column("CreditRating", "smallint", True, 21),
        Column("PreferredVendorStatus", "boolean", True, 16),
        Column("ActiveFlag", "boolean", True, 16),
        Column("PurchasingWebServiceURL", "character varying(1024)", False, 1043),
        Column("ModifiedDate", "timestamp without time zone", True, 1114),
    ],
    ["VendorID"],
)
SYNTAXES = [
    {"update": upd, "delete": dele} for upd in ("CALL", "SCALL", "MCALL", "XCALL") for dele in ("CALL", "XCALL")
]


def test_every_dialect_is_registered_and_script_procs_offers_each():
    assert list(dialect.dialects()) == ["postgresql", "tsql", "mariadb"]
    assert dialect.dialect("mariadb") is mariadb and dialect.dialect("tsql") is tsql_script
    with pytest.raises(TopologyError, match=r"^unknown dialect 'oracle'; choose one of postgresql, tsql, mariadb$"):
        dialect.dialect("oracle")
    args = cli.build_parser().parse_args(["script-procs", "-t", "t.yaml", "--dialect", "mariadb"])
    assert args.dialect == "mariadb"
    for name, module in dialect.dialects().items():
        assert name == module.NAME and module.SERVER in call_syntax.MAX_ARGUMENTS


@pytest.mark.parametrize("props", SYNTAXES)
def test_each_dialect_calls_a_procedure_with_its_syntax_parameters(props):
    art = article(VENDOR, **props)
    for op in OPERATIONS:
        syntax = art.propagation[op].call_syntax
        count = call_syntax.parameter_count(op, syntax, len(art.columns), len(art.primary_key))
        name = art.default_procs[op]
        types = [t for _, t in call_syntax.parameters(art, op, syntax)]
        assert len(types) == count and types[-1] == ("bytea" if syntax in ("SCALL", "MCALL") else types[-1])
        args = ", ".join(f"${i + 1}::{t}" for i, t in enumerate(types))
        assert procedures.call_sql(art, op) == f'CALL "Purchasing"."{name}"({args})'
        assert tsql_script.call_sql(art, op) == f"{{call [Purchasing].[{name}]({', '.join(['?'] * count)})}}"
        assert mariadb.call_sql(art, op) == f"CALL `{name}`({', '.join(['%s'] * count)})"  # the subscriber's database


def test_the_postgresql_call_is_the_text_the_agent_ran_before():
    art = article(VENDOR, update="SCALL")
    assert procedures.call_sql(art, Operation.UPDATE) == (
        'CALL "Purchasing"."sp_MSupd_PurchasingVendor"($1::integer, $2::character varying(15), '
        "$3::character varying(50), $4::smallint, $5::boolean, $6::boolean, $7::character varying(1024), "
        "$8::timestamp without time zone, $9::integer, $10::bytea)"
    )


def test_a_custom_procedure_is_called_by_its_name_in_each_dialect():
    art = article(VENDOR, update="XCALL custom.upd_vendor", delete="CALL del_vendor")
    assert mariadb.call_sql(art, Operation.UPDATE) == f"CALL `custom`.`upd_vendor`({', '.join(['%s'] * 16)})"
    assert mariadb.call_sql(art, Operation.DELETE) == "CALL `del_vendor`(%s)"
    assert mariadb.procedure_sql(art, Operation.UPDATE) is None  # nothing generated for a custom one
    assert "sp_MSupd_" not in mariadb.publication_script([art]) and "sp_MSins_" in mariadb.publication_script([art])


@pytest.mark.parametrize(
    ("pg", "maria"),
    [
        ("integer", "INT"),
        ("boolean", "BOOLEAN"),
        ("numeric(12,2)", "DECIMAL(12,2)"),
        ("character varying(15)", "VARCHAR(15) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin"),
        ("text", "LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin"),
        ("jsonb", "JSON"),
        ("integer[]", "LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin"),
        ("bytea", "LONGBLOB"),
        ("timestamp with time zone", "DATETIME(6)"),
        # what the type map holds only by its kind (an enum, a range) or refuses travels as text
        ('"pub"."mood"', "LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin"),
        ("numeric", "LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin"),
        ("money", "LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin"),
    ],
)
def test_mariadb_parameter_types_are_the_type_maps(pg, maria):
    assert mariadb.type_of(pg) == maria


def test_a_domain_parameter_has_its_base_type_in_every_dialect():
    column = Column("d", '"pub"."posint"', False, 0, base_type="integer")
    assert (procedures.column_type(column), tsql_script.column_type(column), mariadb.column_type(column)) == (
        "integer",
        "int",
        "INT",
    )


def test_mariadb_literals_and_names_mean_the_same_whatever_sql_mode_is():
    assert mariadb.literal("it's") == "'it''s'"
    assert mariadb.literal("a\\b") == "CONVERT(X'615C62' USING utf8mb4)"  # NO_BACKSLASH_ESCAPES or not
    assert mariadb.literal("é\n") == "CONVERT(X'C3A90A' USING utf8mb4)"  # whatever the connection's charset
    assert mariadb.quote("a`b") == "`a``b`" and mariadb.qualified("s", "t`") == "`s`.`t```"


def test_the_mariadb_scall_update_tests_each_columns_bit():
    art = article(VENDOR, update="SCALL")
    text = mariadb.procedure_sql(art, Operation.UPDATE)
    assert text.startswith(
        "CREATE OR REPLACE PROCEDURE `sp_MSupd_PurchasingVendor`(IN c1 INT, "
        "IN c2 VARCHAR(15) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin, "
    )
    assert ", IN pkc1 INT, IN bitmap LONGBLOB)\nMODIFIES SQL DATA\n-- SCALL syntax: c1, c2, " in text
    assert (
        "`Vendor`.`CreditRating` = CASE WHEN ASCII(SUBSTRING(bitmap, 1, 1)) & 8 <> 0 THEN c4 "
        "ELSE `Vendor`.`CreditRating` END" in text
    )
    assert "WHERE `Vendor`.`VendorID` = pkc1;" in text
    wide = text_article([f"c{i}" for i in range(2, 11)], update="MCALL")  # 10 columns: two bytes
    assert "`t`.`c10` = CASE WHEN ASCII(SUBSTRING(bitmap, 2, 1)) & 2 <> 0 THEN c10" in (
        mariadb.procedure_sql(wide, Operation.UPDATE)
    )


def test_mariadb_procedures_raise_20598_only_when_the_key_is_missing():
    art = article(VENDOR, update="XCALL", delete="XCALL")
    update = mariadb.procedure_sql(art, Operation.UPDATE)
    assert (
        "    IF ROW_COUNT() = 0 THEN\n"
        "        IF NOT EXISTS (SELECT 1 FROM `Vendor` WHERE `Vendor`.`VendorID` = c1) THEN\n" in update
    )
    assert "SIGNAL SQLSTATE 'RP598' SET MYSQL_ERRNO = 20598, MESSAGE_TEXT = msg;" in update
    delete = mariadb.procedure_sql(art, Operation.DELETE)
    assert "NOT EXISTS" not in delete and "    IF ROW_COUNT() = 0 THEN\n        SET msg = LEFT(CONCAT(" in delete
    assert "ROW_COUNT" not in mariadb.procedure_sql(art, Operation.INSERT)


def test_mariadb_statements_double_a_percent_for_pymysql():
    art = text_article(["100%"], dest_schema="s%", dest_table="t%s")
    assert mariadb.call_sql(art, Operation.DELETE) == "CALL `sp_MSdel_s%%t%%s`(%s)"
    assert mariadb.statement_sql(art, Operation.INSERT) == "INSERT INTO `t%%s` (`id`, `100%%`) VALUES (%s, %s)"
    assert mariadb.statement_sql(art, Operation.UPDATE) == "UPDATE `t%%s` SET `id` = %s, `100%%` = %s WHERE `id` = %s"
    assert mariadb.statement_sql(art, Operation.DELETE) == "DELETE FROM `t%%s` WHERE `id` = %s"


def test_the_mariadb_script_changes_the_delimiter_to_one_no_procedure_holds():
    plain = mariadb.publication_script([text_article()])
    assert plain.startswith("SET NAMES utf8mb4;\n-- article 't': 'public.t' -> 'public.t'\nDELIMITER //\n")
    assert plain.endswith("END\n//\nDELIMITER ;\n\n") and plain.count("\n//\n") == 3
    taken = mariadb.publication_script([text_article(["a//", "b$$", "c;;"])])
    assert "DELIMITER $$1$$\n" in taken and taken.count("\n$$1$$\n") == 3


@pytest.mark.parametrize(
    ("table", "columns", "message"),
    [
        (
            "emoji\U0001f600",
            ["a"],
            "table 'emoji\U0001f600' of article 'emoji\U0001f600' ('public.emoji\U0001f600') at a MariaDB subscriber "
            "cannot be a MariaDB name (at most 64 characters, no NUL, no trailing space, tab, line break, vertical tab, "
            "form feed or carriage return, no 4-byte UTF-8 character): rename it at the publisher or leave it out of "
            "the article",
        ),
        (
            "t\nx",
            ["tail "],
            "column 'tail ' of article 't\\nx' ('public.t\\nx') at a MariaDB subscriber cannot be a MariaDB name (at "
            "most 64 characters, no NUL, no trailing space, tab, line break, vertical tab, form feed or carriage "
            "return, no 4-byte UTF-8 character): rename it at the publisher or leave it out of the article",
        ),
        (
            "t",
            ["tab\t"],
            "column 'tab\\t' of article 't' ('public.t') at a MariaDB subscriber cannot be a MariaDB name (at "
            "most 64 characters, no NUL, no trailing space, tab, line break, vertical tab, form feed or carriage "
            "return, no 4-byte UTF-8 character): rename it at the publisher or leave it out of the article",
        ),
        (
            "t",
            ["Name", "name"],
            "columns 'Name' and 'name' of article 't' ('public.t') at a MariaDB subscriber differ only in case, "
            "which MariaDB's column names ignore: rename one at the publisher or leave it out of the article (columns:)",
        ),
    ],
)
def test_mariadb_refuses_a_name_it_cannot_hold_in_one_line(table, columns, message):
    art = text_article(columns, name=table, dest_table=table)
    for generate in (mariadb.publication_script, lambda a: mariadb.procedure_sql(a[0], Operation.INSERT)):
        with pytest.raises(TopologyError) as err:
            generate([art])
        assert str(err.value) == message


def _change(kind: str, **fields) -> dict:
    return {"kind": kind, "in_article": True, **fields}


def test_mariadb_schema_change_ddl():
    art = text_article(["note"], dest_schema="dst", dest_table="T x")
    table = "`T x`"
    assert mariadb.schema_change_sql(art, _change("drop_column", column="note")) == [
        f"ALTER TABLE {table} DROP COLUMN `note`"
    ]
    assert mariadb.schema_change_sql(art, _change("rename_column", column="note", new_name="n`\n#")) == [
        f"ALTER TABLE {table} RENAME COLUMN `note` TO `n``\n#`"
    ]
    # a widening restates the column's NULL-ness, which MODIFY would otherwise reset; a key keeps
    # the type map's key type
    assert mariadb.schema_change_sql(art, _change("alter_type", column="id", type="bigint")) == [
        f"ALTER TABLE {table} MODIFY COLUMN `id` BIGINT NOT NULL"
    ]
    assert mariadb.schema_change_sql(art, _change("alter_type", column="note", type="text")) == [
        f"ALTER TABLE {table} MODIFY COLUMN `note` LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NULL"
    ]
    keyed = text_article(["note"])
    keyed.table.primary_key.append("note")
    assert mariadb.schema_change_sql(keyed, _change("alter_type", column="note", type="character varying(80)")) == [
        "ALTER TABLE `t` MODIFY COLUMN `note` VARCHAR(80) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NULL"
    ]
    # widened to text, it takes what the key's int leaves of InnoDB's 3,072 bytes (768 characters failed)
    assert mariadb.schema_change_sql(keyed, _change("alter_type", column="note", type="text")) == [
        "ALTER TABLE `t` MODIFY COLUMN `note` VARCHAR(767) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NULL"
    ]
    with pytest.raises(
        TopologyError, match=r"^column 'c' of article 't' \('dst.T x'\) .* has type money, which a Maria"
    ):
        mariadb.schema_change_sql(art, _change("add_column", column="c", type="money"))
    assert mariadb.schema_change_sql(art, _change("add_column", column="c", type="integer")) == [
        f"ALTER TABLE {table} ADD COLUMN `c` INT NULL"
    ]
    added = _change("add_column", column="c", type="boolean", existing="t", not_null=True)
    assert mariadb.schema_change_sql(art, added) == [
        f"ALTER TABLE {table} ADD COLUMN `c` BOOLEAN NOT NULL DEFAULT TRUE",
        f"ALTER TABLE {table} ALTER COLUMN `c` DROP DEFAULT",
    ]
    assert mariadb.schema_change_sql(art, {"kind": "drop_column", "column": "x", "in_article": False}) == []
    with pytest.raises(
        TopologyError, match=r"^column 'x ' of article 't' \('dst.T x'\) at a MariaDB subscriber cannot be"
    ):
        mariadb.schema_change_sql(art, _change("add_column", column="x ", type="integer"))
    for module in (procedures, tsql_script, mariadb):
        with pytest.raises(DeliveryError, match="schema change 'add_index' of article 't' is not known"):
            module.schema_change_sql(art, _change("add_index", column="x"))


@pytest.mark.parametrize(
    ("pg_type", "text", "literal"),
    [
        ("boolean", "t", "TRUE"),
        ("boolean", "f", "FALSE"),
        ("bytea", "\\x01ff", "X'01FF'"),
        ("timestamp with time zone", "2026-03-01 14:00:00+02", "'2026-03-01 12:00:00.000000'"),
        ("integer", "7", "'7'"),
        ("text", "it's é", "CONVERT(X'6974277320C3A9' USING utf8mb4)"),
    ],
)
def test_mariadb_value_literals_are_the_type_maps_values(pg_type, text, literal):
    assert mariadb.value_literal(pg_type, text, "c", "article 't'") == literal


def test_tsql_schema_change_script():
    art = text_article(["note"], dest_schema="dst", dest_table="T x")
    assert tsql_script.schema_change_sql(art, _change("rename_column", column="note", new_name="n")) == [
        "exec sp_rename N'[dst].[T x].[note]', N'n', 'COLUMN'"
    ]
    assert tsql_script.schema_change_sql(art, _change("alter_type", column="id", type="bigint")) == [
        "alter table [dst].[T x] alter column [id] bigint"
    ]
    added = _change("add_column", column="c", type="text", existing="it's", not_null=True)
    assert tsql_script.schema_change_sql(art, added) == [
        "alter table [dst].[T x] add [c] nvarchar(max) null",
        "update [dst].[T x] set [c] = N'it''s'",
        "alter table [dst].[T x] alter column [c] nvarchar(max) not null",
    ]
    assert tsql_script.schema_change_sql(art, _change("drop_column", column="note")) == [
        "alter table [dst].[T x] drop column [note]"
    ]
    with pytest.raises(
        TopologyError, match=r"^article 't' cannot be scripted as T-SQL: its new column 'it''s' holds '"
    ):
        tsql_script.schema_change_sql(art, _change("rename_column", column="note", new_name="it's"))


@pytest.mark.parametrize("props", SYNTAXES)
def test_mariadb_call_values_convert_each_parameter_by_its_column(props):
    art = article(VENDOR, **props)
    old = ["1", "AW1", "Old", "1", "t", "f", None, "2026-01-01 00:00:00"]
    new = ["1", "AW1", "New", "2", "f", "f", None, "2026-01-01 00:00:00"]
    cmd = Command(UPDATE, "Vendor", old=old, new=new)
    values = mariadb.call_values(art, Operation.UPDATE, cmd)
    syntax = art.propagation[Operation.UPDATE].call_syntax
    assert len(values) == len(call_syntax.parameters(art, Operation.UPDATE, syntax))
    if syntax == CallSyntax.XCALL:  # the before image, then the after image
        assert values[4:6] == [True, False] and values[12:14] == [False, False]
    else:
        flags = values[4:6]
        assert flags == ([False, None] if syntax == CallSyntax.SCALL else [False, False])  # SCALL: changed only
        assert values[8] == "1"  # pkc1: the old key
        if syntax in (CallSyntax.SCALL, CallSyntax.MCALL):
            assert values[9] == bytes([0b00011100])  # Name, CreditRating, PreferredVendorStatus
    delete = mariadb.call_values(art, Operation.DELETE, Command(DELETE, "Vendor", old=old))
    assert delete == (
        ["1", "AW1", "Old", "1", True, False, None, "2026-01-01 00:00:00"] if props["delete"] == "XCALL" else ["1"]
    )
