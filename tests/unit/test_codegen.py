"""Generated text, without a server: the parameter lists of every call syntax, the procedures'
text, the snapshot's schema script and the user-type script."""

from __future__ import annotations

import pytest

from airflow_repl.engine.agents import snapshot_folder
from airflow_repl.engine.articles.commands import Command
from airflow_repl.engine.articles.resolved import ResolvedArticle, resolve_articles
from airflow_repl.engine.codegen import call_syntax, procedures
from airflow_repl.engine.errors import TopologyError
from airflow_repl.engine.model.topology import from_dict
from airflow_repl.engine.postgres.catalog import Column, GeneratedColumn, TableInfo


def test_schema_script_places_generated_columns_and_skips_those_reading_filtered_columns():
    table = TableInfo(
        "s",
        "t",
        1,
        [Column("id", "integer", True, 23), Column("a", "integer", False, 23), Column("b", "text", False, 25)],
        ["id"],
        generated=[
            GeneratedColumn("g0", "integer", "(id * 2)", 1, ("id",)),
            GeneratedColumn("g1", "integer", "(a + 1)", 2, ("a",)),
            GeneratedColumn("g2", "text", "upper(b)", 3, ("b",)),
        ],
    )
    assert TableInfo.from_dict(table.to_dict()) == table

    def script(**options) -> list[str]:
        topo = from_dict(
            {
                "publisher": "a",
                "distributor": "b",
                "publications": [{"name": "p", "articles": [{"table": "s.t", **options}]}],
            }
        )
        text = snapshot_folder.schema_script(resolve_articles(topo.publication("p"), {"t": table})[0])
        return [line.strip().split()[0] for line in text.splitlines() if line.startswith("    ")]

    assert script() == ['"id"', '"g0"', '"a"', '"g1"', '"b"', '"g2"']
    assert script(columns=["b"]) == ['"id"', '"g0"', '"b"', '"g2"']  # g1 reads filtered-out a


def test_keys_are_added_after_the_load_as_deferrable_as_at_the_publisher():
    cols = [Column("id", "integer", True, 23), Column("a", "integer", True, 23), Column("b", "text", False, 25)]
    table = TableInfo("s", "t", 1, cols, ["id"], unique_keys=[["a"], ["b", "a"]], deferrable_keys=[(["a"], True)])

    def article(**options):
        topo = from_dict(
            {
                "publisher": "a",
                "distributor": "b",
                "publications": [{"name": "p", "articles": [{"table": "s.t", **options}]}],
            }
        )
        return resolve_articles(topo.publication("p"), {"t": table})[0]

    created = snapshot_folder.schema_script(article())
    assert "PRIMARY KEY" not in created and "UNIQUE" not in created
    script = snapshot_folder.keys_script(article())
    keys = [line for line in script.splitlines() if line.startswith("ALTER TABLE")]
    assert keys == [
        'ALTER TABLE "s"."t" ADD PRIMARY KEY ("id");',
        'ALTER TABLE "s"."t" ADD UNIQUE ("a") DEFERRABLE INITIALLY DEFERRED;',
        'ALTER TABLE "s"."t" ADD UNIQUE ("b", "a");',
    ]
    # the deferrable key is checked for replicated changes too
    assert script.index("ENABLE ALWAYS TRIGGER") > script.index(keys[-1])
    # ... unless the subscriber keeps a table it partitioned its own way, with its own keys
    kept, added = script.split("\nELSE\n")
    assert kept.endswith("""pg_catalog.to_regclass('"s"."t"')) = 'p' THEN\nNULL;""") and added.startswith(keys[0])
    # a unique key on a filtered-out column is not the subscriber's
    assert [
        line for line in snapshot_folder.keys_script(article(columns=["id", "b"])).splitlines() if "ALTER" in line
    ] == ['ALTER TABLE "s"."t" ADD PRIMARY KEY ("id");']


def _table(n: int, key: int = 1) -> TableInfo:
    return TableInfo(
        "s",
        "t",
        1,
        [Column(f"c{i}", "integer", True, 23) for i in range(1, n + 1)],
        [f"c{i}" for i in range(1, key + 1)],
    )


@pytest.mark.parametrize("n, key", [(1, 1), (50, 1), (99, 3), (100, 32)])
def test_parameter_count_is_the_length_of_each_layout(n, key):
    topo = from_dict({"publisher": "a", "distributor": "b", "publications": [{"name": "p", "articles": ["s.t"]}]})
    (art,) = resolve_articles(topo.publication("p"), {"t": _table(n, key)})
    for op, syntaxes in {
        "insert": ["CALL"],
        "update": ["CALL", "SCALL", "MCALL", "XCALL"],
        "delete": ["CALL", "XCALL"],
    }.items():
        for syntax in syntaxes:
            assert call_syntax.parameter_count(op, syntax, n, key) == len(call_syntax.parameters(art, op, syntax))


def test_user_type_script_guards_every_creation():
    from airflow_repl.engine.codegen.user_types import UserObject, script

    objects = [
        UserObject("collation", "o th", "ci", {}, 'CREATE COLLATION IF NOT EXISTS "o th"."ci" (x);'),
        UserObject("collation", "pg_catalog", "C", {}, "CREATE COLLATION ...", scripted=False),
        UserObject("enum", "o th", "it's", {"labels": ["a"]}, 'CREATE TYPE "o th"."it\'s" AS ENUM (\'a\');'),
        UserObject("type", "public", "citext", {}, None, hint="CREATE EXTENSION citext"),
    ]
    text = script(objects)
    assert text.startswith('CREATE SCHEMA IF NOT EXISTS "o th";\nCREATE COLLATION IF NOT EXISTS "o th"."ci" (x);')
    assert "pg_catalog" not in text.replace("pg_catalog.to_regtype", "") and "citext" not in text
    assert "IF pg_catalog.to_regtype('\"o th\".\"it''s\"') IS NULL THEN" in text
    assert script([]) == ""


# ---------------------------------------------------------------------- call syntaxes on a composite key
def _composite(**options) -> ResolvedArticle:
    """s.t (v text, k2 varchar(5), d posint, k1 int), primary key (k1, k2): the key columns are
    neither first nor in table order, and d is a domain over integer; replicated to "dst"."T 2"."""
    table = TableInfo(
        "s",
        "t",
        1,
        [
            Column("v", "text", False, 25),
            Column("k2", "character varying(5)", True, 1043),
            Column("d", "posint", False, 90001, base_type="integer"),
            Column("k1", "integer", True, 23),
        ],
        ["k1", "k2"],
    )
    article = {"table": "s.t", "destination": "dst.T 2", **options}
    topo = from_dict({"publisher": "a", "distributor": "b", "publications": [{"name": "p", "articles": [article]}]})
    return resolve_articles(topo.publication("p"), {"t": table})[0]


COLS = [("c1", "text"), ("c2", "character varying(5)"), ("c3", "integer"), ("c4", "integer")]
KEYS = [("pkc1", "integer"), ("pkc2", "character varying(5)")]  # k1, then k2: the key's own order
BITMAP = [("bitmap", "bytea")]
AFTER = [("c5", "text"), ("c6", "character varying(5)"), ("c7", "integer"), ("c8", "integer")]


@pytest.mark.parametrize(
    "operation, syntax, expected",
    [
        ("insert", "CALL", COLS),
        ("update", "CALL", COLS + KEYS),
        ("update", "SCALL", COLS + KEYS + BITMAP),
        ("update", "MCALL", COLS + KEYS + BITMAP),
        ("update", "XCALL", COLS + AFTER),
        ("delete", "CALL", KEYS),
        ("delete", "XCALL", COLS),
    ],
)
def test_parameter_lists_name_and_type_every_parameter(operation, syntax, expected):
    art = _composite()
    assert call_syntax.parameters(art, operation, syntax) == expected  # a domain travels as its base type
    assert call_syntax.parameter_count(operation, syntax, 4, 2) == len(expected)


def test_a_column_filter_keeps_the_key_and_table_order_in_the_parameters():
    art = _composite(columns=["d"])
    assert art.column_names == ["k2", "d", "k1"]
    assert call_syntax.parameters(art, "update", "CALL") == [
        ("c1", "character varying(5)"),
        ("c2", "integer"),
        ("c3", "integer"),
        ("pkc1", "integer"),
        ("pkc2", "character varying(5)"),
    ]
    assert (
        call_syntax.statement(art, "delete", "XCALL", _dollar)
        == 'DELETE FROM "dst"."T 2" WHERE "k1" = $3 AND "k2" = $1'
    )


def _dollar(i: int) -> str:
    return f"${i}"


def _case(column: str, bit: int, param: int) -> str:
    return f'"{column}" = CASE WHEN get_byte($7, 0) & {bit} <> 0 THEN ${param} ELSE "{column}" END'


SCALL_SET = ", ".join(_case(c, 1 << i, i + 1) for i, c in enumerate(["v", "k2", "d", "k1"]))


@pytest.mark.parametrize(
    "operation, syntax, statement, keys",
    [
        ("insert", "CALL", 'INSERT INTO "dst"."T 2" ("v", "k2", "d", "k1") VALUES ($1, $2, $3, $4)', None),
        (
            "update",
            "CALL",
            'UPDATE "dst"."T 2" SET "v" = $1, "k2" = $2, "d" = $3, "k1" = $4 WHERE "k1" = $5 AND "k2" = $6',
            ["$5", "$6"],
        ),
        ("update", "SCALL", f'UPDATE "dst"."T 2" SET {SCALL_SET} WHERE "k1" = $5 AND "k2" = $6', ["$5", "$6"]),
        ("update", "MCALL", f'UPDATE "dst"."T 2" SET {SCALL_SET} WHERE "k1" = $5 AND "k2" = $6', ["$5", "$6"]),
        (
            "update",
            "XCALL",
            'UPDATE "dst"."T 2" SET "v" = $5, "k2" = $6, "d" = $7, "k1" = $8 WHERE "k1" = $4 AND "k2" = $2',
            ["$4", "$2"],
        ),
        ("delete", "CALL", 'DELETE FROM "dst"."T 2" WHERE "k1" = $1 AND "k2" = $2', ["$1", "$2"]),
        ("delete", "XCALL", 'DELETE FROM "dst"."T 2" WHERE "k1" = $4 AND "k2" = $2', ["$4", "$2"]),
    ],
)
def test_each_syntax_applies_one_statement_locating_the_row_by_its_old_key(operation, syntax, statement, keys):
    art = _composite()
    assert call_syntax.statement(art, operation, syntax, _dollar) == statement
    if keys is not None:
        assert call_syntax.key_placeholders(art, operation, syntax, _dollar) == keys


def test_the_sql_method_uses_the_same_statement_with_its_own_placeholders():
    art = _composite()
    typed = {i + 1: t for i, (_, t) in enumerate(COLS + KEYS)}
    text = call_syntax.statement(art, "update", "CALL", lambda i: f"%(p{i})s::{typed[i]}")
    assert text == (
        'UPDATE "dst"."T 2" SET "v" = %(p1)s::text, "k2" = %(p2)s::character varying(5), "d" = %(p3)s::integer, '
        '"k1" = %(p4)s::integer WHERE "k1" = %(p5)s::integer AND "k2" = %(p6)s::character varying(5)'
    )


def test_values_of_a_key_update_carry_the_old_key_in_key_order():
    art = _composite()
    old, new = ["a", "x", "3", "1"], ["b", "y", "3", "2"]
    cmd = Command("U", "t", old=old, new=new)
    assert call_syntax.values(art, cmd, "CALL") == [*new, "1", "x"]
    assert call_syntax.values(art, cmd, "SCALL") == ["b", "y", None, "2", "1", "x", bytes([0b1011])]
    assert call_syntax.values(art, cmd, "MCALL") == [*new, "1", "x", bytes([0b1011])]
    assert call_syntax.values(art, cmd, "XCALL") == old + new
    assert call_syntax.values(art, Command("D", "t", old=old), "CALL") == ["1", "x"]


def test_an_unknown_syntax_is_an_error_not_a_guess():
    art = _composite()
    with pytest.raises(ValueError, match="unknown call syntax 'VCALL'"):
        call_syntax.parameters(art, "update", "VCALL")
    with pytest.raises(ValueError, match="unknown call syntax 'VCALL'"):
        call_syntax.values(art, Command("U", "t", old=["a", "x", "3", "1"], new=["a", "x", "3", "1"]), "VCALL")


def test_a_syntax_over_the_argument_limit_is_refused_with_the_syntaxes_that_fit():
    wide = TableInfo("public", "wide", 1, [Column(f"c{i}", "integer", True, 23) for i in range(51)], ["c0"])
    topo = from_dict(
        {
            "publisher": "a",
            "distributor": "b",
            "publications": [{"name": "p", "articles": [{"table": "wide", "upd_cmd": "XCALL"}]}],
        }
    )
    (art,) = resolve_articles(topo.publication("p"), {"wide": wide})
    with pytest.raises(TopologyError) as err:
        call_syntax.check_argument_limit(art)
    assert str(err.value) == (
        "article 'wide' (public.wide, 51 columns replicated): XCALL syntax passes 102 parameters to the update "
        "procedure, but PostgreSQL procedures take at most 100; set upd_cmd to CALL or SCALL or MCALL or SQL "
        "(SQL statements have no such limit) or replicate fewer columns"
    )
    (fits,) = resolve_articles(
        topo.publication("p"), {"wide": TableInfo("public", "wide", 1, wide.columns[:50], ["c0"])}
    )
    call_syntax.check_argument_limit(fits)  # 50 columns: XCALL passes exactly 100


# ---------------------------------------------------------------------- procedure text
NOT_FOUND = (
    "    IF NOT FOUND THEN\n"
    "        RAISE EXCEPTION USING ERRCODE = 'RP598',\n"
    "            MESSAGE = format('row not found at the subscriber: {op} of %s with key (%s)=(%s) matched no row "
    "[20598]', 'dst.T 2', 'k1, k2', concat_ws(', ', {keys}));\n"
    "    END IF;\n"
)


def _procedure(name: str, params: str, syntax: str, body: str) -> str:
    return (
        f'CREATE OR REPLACE PROCEDURE "dst"."{name}"({params})\n'
        "LANGUAGE plpgsql AS $airflow_repl$\n"
        "#variable_conflict use_column\n"
        f"-- {syntax}\n"
        "BEGIN\n"
        f"{body}"
        "END;\n"
        "$airflow_repl$;\n"
    )


def test_procedure_text_of_every_operation():
    art = _composite(del_cmd="XCALL")
    params = '"c1" text, "c2" character varying(5), "c3" integer, "c4" integer'
    insert = _procedure(
        "sp_MSins_dstT 2",
        params,
        "CALL syntax: c1, c2, c3, c4",
        '    INSERT INTO "dst"."T 2" ("v", "k2", "d", "k1") VALUES ($1, $2, $3, $4);\n',
    )
    update = _procedure(
        "sp_MSupd_dstT 2",
        params + ', "pkc1" integer, "pkc2" character varying(5), "bitmap" bytea',
        "SCALL syntax: c1, c2, c3, c4, pkc1, pkc2, bitmap",
        f'    UPDATE "dst"."T 2" SET {SCALL_SET} WHERE "k1" = $5 AND "k2" = $6;\n'
        + NOT_FOUND.format(op="update", keys="$5::text, $6::text"),
    )
    delete = _procedure(
        "sp_MSdel_dstT 2",
        params,
        "XCALL syntax: c1, c2, c3, c4",
        '    DELETE FROM "dst"."T 2" WHERE "k1" = $4 AND "k2" = $2;\n'
        + NOT_FOUND.format(op="delete", keys="$4::text, $2::text"),
    )
    assert procedures.procedure_sql(art, "insert") == insert
    assert procedures.procedure_sql(art, "update") == update
    assert procedures.procedure_sql(art, "delete") == delete
    assert procedures.article_script(art) == "\n".join([insert, update, delete])


def test_only_generated_procedures_have_text():
    art = _composite(ins_cmd="SQL", upd_cmd="CALL audit.upd_t", del_cmd="NONE")
    assert [procedures.procedure_sql(art, op) for op in ("insert", "update", "delete")] == [None, None, None]
    assert procedures.article_script(art) == ""
    assert art.procedure("update") == ("audit", "upd_t") and art.procedure("insert") is None
