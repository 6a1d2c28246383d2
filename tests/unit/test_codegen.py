"""Generated text, without a server: the parameter lists of every call syntax, the procedures'
text, the snapshot's schema script and the user-type script."""

from __future__ import annotations

import pytest

from airflow_repl.engine.agents import snapshot_agent
from airflow_repl.engine.articles.resolved import resolve_articles
from airflow_repl.engine.codegen import call_syntax
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
        text = snapshot_agent.schema_script(resolve_articles(topo.publication("p"), {"t": table})[0])
        return [line.strip().split()[0] for line in text.splitlines() if line.startswith("    ")]

    assert script() == ['"id"', '"g0"', '"a"', '"g1"', '"b"', '"g2"', "PRIMARY"]
    assert script(columns=["b"]) == ['"id"', '"g0"', '"b"', '"g2"', "PRIMARY"]  # g1 reads filtered-out a


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
