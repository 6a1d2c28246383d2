"""Immediate updating's generated SQL, without a server: the publisher statements' quoting (odd
names, ``%`` in names), the trigger script, and the gid prefix."""

from __future__ import annotations

import pytest

from airflow_repl.engine.articles.resolved import ResolvedArticle, resolve_articles
from airflow_repl.engine.codegen import immediate_triggers
from airflow_repl.engine.errors import TopologyError
from airflow_repl.engine.model import naming
from airflow_repl.engine.model.topology import from_dict
from airflow_repl.engine.postgres.catalog import Column, TableInfo


def _article(table: str, columns: list[str], key: list[str]) -> ResolvedArticle:
    info = TableInfo(
        "my schema",
        table,
        1,
        [Column(c, "text", c in key, 25) for c in columns] + [Column("msrepl_tran_version", "uuid", True, 2950)],
        key,
    )
    topo = from_dict(
        {
            "publisher": "a",
            "distributor": "b",
            "publications": [{"name": "p", "articles": [{"table": f"my schema.{table}"}], "allow_sync_tran": True}],
        }
    )
    return resolve_articles(topo.publication("p"), {table: info})[0]


def test_remote_statements_quote_names_and_double_percent_signs():
    art = _article('50% "off"', ["id", "v"], ["id"])
    insert, update, delete = immediate_triggers.remote_statements(art)
    table = '"my schema"."50%% ""off"""'
    assert insert.startswith(f'WITH i AS (INSERT INTO {table} ("id", "v", "msrepl_tran_version") SELECT ')
    assert f"jsonb_populate_record(NULL::{table}, %1$L::jsonb)" in insert
    assert f'UPDATE {table} t SET "id" = n."id", "v" = n."v" FROM o, n' in update
    assert 't."id" = o."id" AND t."msrepl_tran_version" = o."msrepl_tran_version"' in update
    assert "%2$L::jsonb" in update and "%2$L" not in delete
    for text in (insert, update, delete):  # only the placeholders are single percent signs
        assert text.replace("%%", "").replace("%1$L", "").replace("%2$L", "").count("%") == 0


def test_install_script_names_both_triggers_and_refuses_a_table_without_key():
    art = _article("items", ["id", "v"], ["id"])
    text = immediate_triggers.install(art, enabled=False).as_string(None)
    assert 'CREATE TRIGGER "airflow_repl_two_phase" BEFORE INSERT OR UPDATE OR DELETE' in text
    assert 'CREATE CONSTRAINT TRIGGER "airflow_repl_two_phase_commit" AFTER' in text
    assert "DEFERRABLE INITIALLY DEFERRED" in text and "DISABLE TRIGGER" in text
    assert immediate_triggers.ROW_TRIGGER > "airflow_repl_tran_version"  # fires after the row-version trigger
    with pytest.raises(TopologyError, match="immediate updating needs a primary key"):
        immediate_triggers.remote_statements(_article("nokey", ["id"], []))


def test_functions_script_uses_the_dblink_schema_and_no_placeholder_is_left():
    text = immediate_triggers.functions_script("ext")
    assert '"ext".dblink_exec' in text and "@" not in text.replace("@@", "")
    assert text.count("SECURITY DEFINER SET search_path = pg_catalog, pg_temp") == 4


def test_gid_prefix_fits_and_differs_per_subscriber_and_publication():
    a, b, c = (naming.immediate_gid_prefix(p, s) for p, s in (("p", "s1"), ("p", "s2"), ("q", "s1")))
    assert len({a, b, c}) == 3 and all(len(x) < 40 and x.startswith("airflow_repl_i_") for x in (a, b, c))
