"""Command generation, call-syntax parameter layouts, bitmasks and procedure text (no server)."""

from __future__ import annotations

import pytest

from airflow_repl.engine.articles.commands import Command, bitmask, update_commands
from airflow_repl.engine.articles.resolved import resolve_articles
from airflow_repl.engine.codegen import call_syntax, procedures
from airflow_repl.engine.model import naming
from airflow_repl.engine.model.topology import from_dict
from airflow_repl.engine.postgres.catalog import Column, TableInfo


def vendor_article(**options):
    """The seed's Purchasing.Vendor table."""
    table = TableInfo(
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
        [["AccountNumber"]],
    )
    topo = from_dict(
        {
            "publisher": "a",
            "distributor": "b",
            "publications": [{"name": "p", "articles": [{"table": "Purchasing.Vendor", **options}]}],
        }
    )
    return resolve_articles(topo.publication("p"), {"Vendor": table})[0]


def test_bitmask_bytes_and_bits_follow_column_ordinals():
    assert bitmask([False, True, True]) == bytes([0b110])
    # column 9 is bit 1 of byte 2; column 16 is bit 128 of byte 2
    flags = [False] * 16
    flags[8] = flags[15] = True
    assert bitmask(flags) == bytes([0, 0b10000001])
    assert bitmask([True] * 8) == b"\xff"
    assert bitmask([]) == b""


def test_key_update_becomes_delete_insert_pair_and_plain_update_stays():
    art = vendor_article()
    old = ["1", "A1", "Acme", "1", "t", "t", None, "2026-01-01 00:00:00"]
    new_name = list(old)
    new_name[2] = "Acme Ltd"
    (cmd,) = update_commands(art, old, new_name)
    assert cmd.op == "U" and cmd.changed() == [False, False, True] + [False] * 5
    new_key = list(old)
    new_key[0] = "3"
    pair = update_commands(art, old, new_key)
    assert [c.op for c in pair] == ["D", "I"]
    assert pair[0].old == old and pair[1].new == new_key
    new_unique = list(old)
    new_unique[1] = "A2"  # AccountNumber has a unique constraint
    assert [c.op for c in update_commands(art, old, new_unique)] == ["D", "I"]


def test_parameter_layouts_of_every_call_syntax():
    art = vendor_article()
    old = ["1", "A1", "Acme", "1", "t", "t", None, "2026-01-01 00:00:00"]
    new = ["1", "A1", "Acme 2", "2", "t", "t", None, "2026-01-01 00:00:00"]
    upd = Command("U", "Vendor", old=old, new=new)
    assert call_syntax.values(art, Command("I", "Vendor", new=new), "CALL") == new
    assert call_syntax.values(art, upd, "CALL") == [*new, "1"]
    assert call_syntax.values(art, upd, "SCALL") == [
        None,
        None,
        "Acme 2",
        "2",
        None,
        None,
        None,
        None,
        "1",
        bytes([0b1100]),
    ]
    assert call_syntax.values(art, upd, "MCALL") == [*new, "1", bytes([0b1100])]
    assert call_syntax.values(art, upd, "XCALL") == old + new
    assert call_syntax.values(art, Command("D", "Vendor", old=old), "CALL") == ["1"]
    assert call_syntax.values(art, Command("D", "Vendor", old=old), "XCALL") == old
    names = [p for p, _ in call_syntax.parameters(art, "update", "SCALL")]
    assert names == [f"c{i}" for i in range(1, 9)] + ["pkc1", "bitmap"]
    assert [p for p, _ in call_syntax.parameters(art, "update", "XCALL")] == [f"c{i}" for i in range(1, 17)]


def test_generated_procedures_match_the_seed_structure():
    art = vendor_article()
    assert art.default_procs == {
        "insert": "sp_MSins_PurchasingVendor",
        "update": "sp_MSupd_PurchasingVendor",
        "delete": "sp_MSdel_PurchasingVendor",
    }
    ins = procedures.procedure_sql(art, "insert")
    assert ins.startswith(
        'CREATE OR REPLACE PROCEDURE "Purchasing"."sp_MSins_PurchasingVendor"("c1" integer, "c2" character varying(15)'
    )
    assert 'INSERT INTO "Purchasing"."Vendor" ("VendorID", "AccountNumber"' in ins
    assert "RAISE" not in ins
    upd = procedures.procedure_sql(art, "update")
    assert '"pkc1" integer, "bitmap" bytea' in upd
    assert '"Name" = CASE WHEN get_byte($10, 0) & 4 <> 0 THEN $3 ELSE "Name" END' in upd
    assert '"ModifiedDate" = CASE WHEN get_byte($10, 0) & 128 <> 0 THEN $8' in upd
    assert "ERRCODE = 'RP598'" in upd and "IF NOT FOUND" in upd
    dele = procedures.procedure_sql(art, "delete")
    assert 'DELETE FROM "Purchasing"."Vendor" WHERE "VendorID" = $1' in dele and "IF NOT FOUND" in dele


def test_scall_where_uses_the_original_key_parameter():
    art = vendor_article()
    upd = procedures.procedure_sql(art, "update")
    # c1..c8, then pkc1 ($9), then bitmap ($10)
    assert "get_byte($10, 0) & 2 <> 0 THEN $2" in upd
    assert 'WHERE "VendorID" = $9;' in upd


def test_custom_sql_and_none_methods_generate_no_procedure():
    art = vendor_article(ins_cmd="CALL my_ins", upd_cmd="SQL", del_cmd="NONE")
    assert procedures.procedure_sql(art, "insert") is None
    assert procedures.procedure_sql(art, "update") is None
    assert procedures.procedure_sql(art, "delete") is None
    assert art.procedure("insert") == ("Purchasing", "my_ins")


def test_procedure_names_are_unique_and_fit_postgres_limits():
    long = "t" * 70
    name = naming.default_procedure("ins", "public", long)
    assert len(name.encode()) <= 63 and name != naming.default_procedure("ins", "public", long + "x")
    table = lambda s, t: TableInfo(s, t, 1, [Column("id", "integer", True, 23)], ["id"])  # noqa: E731
    topo = from_dict(
        {
            "publisher": "a",
            "distributor": "b",
            "publications": [
                {"name": "p", "articles": [{"table": "ab.c", "name": "x"}, {"table": "a.bc", "name": "y"}]}
            ],
        }
    )
    x, y = resolve_articles(topo.publication("p"), {"x": table("ab", "c"), "y": table("a", "bc")})
    assert x.default_procs["insert"] != y.default_procs["insert"]
    assert x.default_procs["insert"].startswith("sp_MSins_abc_")


@pytest.mark.parametrize("syntax", ["CALL", "SCALL", "MCALL", "XCALL"])
def test_every_update_syntax_yields_as_many_values_as_parameters(syntax):
    art = vendor_article(upd_cmd=syntax)
    old = ["1", "A1", "Acme", "1", "t", "t", None, "2026-01-01 00:00:00"]
    new = list(old)
    new[6] = "http://x"
    params = call_syntax.parameters(art, "update", syntax)
    assert len(call_syntax.values(art, Command("U", "Vendor", old=old, new=new), syntax)) == len(params)
