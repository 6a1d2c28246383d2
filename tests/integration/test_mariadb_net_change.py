"""``apply_mode`` at a MariaDB subscriber: under the default ``auto`` a batch goes by net change
(multi-row DELETE, UPDATE JOIN, multi-row INSERT) where nothing at the subscriber can tell it
from statement by statement, and statement by statement where something can (a trigger on the
table, a custom procedure).  The property: from the same start, a MariaDB subscriber delivered
command by command and one delivered with ``auto`` end with the same rows, whatever the
publisher committed."""

from __future__ import annotations

import sys

import pytest
from harness import (
    EVERY_KIND,
    NET_CHANGE_DDL,
    PROPERTY_SETTINGS,
    Env,
    commit_on_every_table,
    count_applied,
    create_net_change_tables,
    deliver,
    mariadb_topology,
    net_change_steps,
    net_change_transactions,
    resolved_topology,
)
from hypothesis import example, given, settings

from airflow_repl.engine.agents import distribution_agent, log_reader_agent, snapshot_agent
from airflow_repl.engine.errors import DeliveryError
from airflow_repl.engine.subscriber import mariadb_net_change, validation


def _procs(table: str, *ops: str) -> dict[str, str]:
    """Options naming the article's generated procedures (MariaDB: ``<SYNTAX> sp_MS<op>_public<table>``)."""
    return {f"{op}_cmd": f"{syntax} sp_MS{op}_public{table}" for op, syntax in (o.split(":") for o in ops)}


TABLES = {  # table -> article options: every way net change covers at MariaDB
    "a_sql": {},  # SQL statements, MariaDB's default
    "a_call": _procs("a_call", "upd:CALL", "del:CALL"),
    "a_scall": _procs("a_scall", "upd:SCALL"),
    "a_mcall": _procs("a_mcall", "upd:MCALL", "ins:CALL"),
    "a_xcall": _procs("a_xcall", "upd:XCALL", "del:XCALL"),
    "a_filtered": {"row_filter": "a % 2 = 0 OR b IS NULL", "columns": ["k1", "k2", "a", "b", "u"]},
    "a_pairs": {"updates_as_delete_insert": "all"},
    "a_single": {"updates_as_delete_insert": "multi_row_key_changes"},
}


@pytest.fixture(scope="module")
def world(sandbox, spark, mariadb, tmp_path_factory):
    env = Env(sandbox, tmp_path_factory.mktemp("mariadb_net_change"))
    ddl = NET_CHANGE_DDL.replace("k2 text", "k2 varchar(16)")  # a key MariaDB can index (3072 bytes)
    create_net_change_tables(env, TABLES, ddl)
    dbs = {"m1": mariadb.new_database(), "m2": mariadb.new_database()}
    servers = env.servers(subscribers=[])
    servers["subscribers"] = {name: mariadb.uri(db) for name, db in dbs.items()}
    topo = resolved_topology(
        {
            **servers,
            "publications": [{"name": "p", "articles": [{"table": t, **o} for t, o in TABLES.items()]}],
            "subscriptions": [
                {"publication": "p", "subscriber": "m1", "apply_mode": "per_command", "commit_batch_size": 2},
                {"publication": "p", "subscriber": "m2", "commit_batch_size": 2},  # auto
            ],
        }
    )
    snapshot_agent.run_snapshot(topo, "p", spark)
    yield env, topo, dbs
    env.drop()


def _rows(mariadb, db: str) -> dict[str, list[tuple]]:
    return {t: mariadb.rows(db, f"SELECT * FROM {t} ORDER BY k1, k2") for t in TABLES}


@settings(max_examples=20, **PROPERTY_SETTINGS)
@given(net_change_transactions)
@example(EVERY_KIND)
def test_auto_and_statement_by_statement_end_with_the_same_rows(world, mariadb, txns):
    env, topo, dbs = world
    commit_on_every_table(env.pub, txns, TABLES, net_change_steps)
    log_reader_agent.run_log_reader(topo, "p")
    literal = distribution_agent.run_distribution(topo, "p", "m1")
    auto = distribution_agent.run_distribution(topo, "p", "m2")
    assert literal.get("net_batches", 0) == 0 and auto["transactions"] == literal["transactions"]
    assert {p["apply"] for p in literal["apply"]} == {"per_command"}
    assert {p["apply"] for p in auto["apply"]} == {"net_change"}
    assert _rows(mariadb, dbs["m2"]) == _rows(mariadb, dbs["m1"])


def test_the_property_run_went_by_net_change_and_matches_the_publisher(world):
    """The examples above did go by net change at ``m2`` (deletes, updates and inserts
    included), and ``m2`` holds the publisher's rows by value."""
    env, topo, _ = world
    [(net,)] = env.rows(
        env.dist,
        "SELECT sum(coalesce((details->>'net_batches')::int, 0)) FROM airflow_repl.agent_history "
        "WHERE agent = 'distribution' AND status = 'succeeded' AND subscriber = 'm2'",
    )
    assert net >= 10
    seen = set(env.rows(env.dist, "SELECT DISTINCT op FROM airflow_repl.commands"))
    assert {("I",), ("U",), ("D",)} <= seen
    report = validation.compare(topo, "p", "m2")
    assert report and all(r["match"] for r in report), validation.format_report(report)


# ---------------------------------------------------------------------- what makes auto go command by command
def _items(env, mariadb, spark, **options):
    env.run(env.pub, "CREATE TABLE items (id int PRIMARY KEY, v text)")
    env.run(env.pub, "INSERT INTO items VALUES (1, 'a'), (2, 'b'), (3, 'c')")
    topo, db = mariadb_topology(env, mariadb, ["public.items"], **options)
    snapshot_agent.run_snapshot(topo, "p", spark)
    return topo, db


def _churn(env) -> None:
    """One transaction whose net effect is one INSERT and one DELETE, through six commands."""
    env.run(
        env.pub,
        "BEGIN; INSERT INTO items VALUES (10, 'x'); UPDATE items SET v = 'y' WHERE id = 10; "
        "UPDATE items SET v = 'z' WHERE id = 10; DELETE FROM items WHERE id = 2; UPDATE items SET v = 'w' WHERE id = 3; "
        "DELETE FROM items WHERE id = 3; COMMIT",
    )


EVERY_COMMAND = [("D", 2), ("I", 1), ("U", 3)]


@pytest.mark.parametrize("when", ["before the run", "during the run"])
def test_a_trigger_at_mariadb_makes_auto_apply_statement_by_statement_and_sees_every_command(
    env, spark, mariadb, monkeypatch, when
):
    topo, db = _items(env, mariadb, spark)
    count_applied(mariadb, db)
    if when == "during the run":  # created after the run chose its paths: found after the batch's statements
        real, calls = mariadb_net_change.triggers, []

        def first_blind(*args):
            calls.append(args)
            return {} if len(calls) == 1 else real(*args)

        monkeypatch.setattr(mariadb_net_change, "triggers", first_blind)
    _churn(env)
    done = deliver(topo)
    assert done["transactions"] == 1 and "net_batches" not in done
    assert done["apply"] == [
        {
            "article": "items",
            "apply": "per_command",
            "why": "trigger(s) firing for replicated changes at the subscriber: applied_D, applied_I, applied_U",
        }
    ]
    assert mariadb.rows(db, "SELECT op, COUNT(*) FROM applied GROUP BY op ORDER BY op") == EVERY_COMMAND
    assert mariadb.rows(db, "SELECT id, v FROM items ORDER BY id") == [(1, "a"), (10, "z")]


def test_net_change_mode_applies_the_net_rows_even_under_a_trigger(env, spark, mariadb):
    """``apply_mode: net_change`` takes the table with a trigger too: the trigger sees the net rows."""
    topo, db = _items(env, mariadb, spark, apply_mode="net_change")
    count_applied(mariadb, db)
    _churn(env)
    interval = sys.getswitchinterval()
    done = deliver(topo)
    assert done["net_batches"] == 1 and done["apply"][0]["apply"] == "net_change"
    assert sys.getswitchinterval() == interval  # shortened while it read ahead, restored
    assert mariadb.rows(db, "SELECT op, COUNT(*) FROM applied GROUP BY op ORDER BY op") == [("D", 2), ("I", 1)]
    assert mariadb.rows(db, "SELECT id, v FROM items ORDER BY id") == [(1, "a"), (10, "z")]


def test_a_custom_procedure_article_goes_statement_by_statement(env, spark, mariadb):
    env.run(env.pub, "CREATE TABLE items (id int PRIMARY KEY, v text)")
    db = mariadb.new_database()
    mariadb.run(db, "CREATE PROCEDURE my_del(IN k INT) DELETE FROM items WHERE id = k")
    topo, _ = mariadb_topology(env, mariadb, [{"table": "public.items", "del_cmd": "CALL my_del"}], db=db)
    snapshot_agent.run_snapshot(topo, "p", spark)
    env.run(env.pub, "INSERT INTO items VALUES (1, 'a'), (2, 'b')")
    done = deliver(topo)
    assert "net_batches" not in done
    assert done["apply"] == [{"article": "items", "apply": "per_command", "why": "custom procedure"}]
    assert mariadb.rows(db, "SELECT id FROM items ORDER BY id") == [(1,), (2,)]


# ---------------------------------------------------------------------- falling back: the same errors
@pytest.mark.parametrize("operation", ["UPDATE items SET v = 'x' WHERE id = 1", "DELETE FROM items WHERE id = 1"])
def test_row_not_found_falls_back_with_the_same_error_and_skip(env, spark, mariadb, operation):
    topo, db = _items(env, mariadb, spark)
    mariadb.run(db, "DELETE FROM items WHERE id = 1")
    env.run(env.pub, "INSERT INTO items VALUES (4, 'd')")
    env.run(env.pub, operation)
    env.run(env.pub, "INSERT INTO items VALUES (5, 'e'); UPDATE items SET v = 'bb' WHERE id = 2")
    with pytest.raises(DeliveryError) as err:
        deliver(topo)
    assert "row not found" in str(err.value) and "key (id=1)" in str(err.value) and "\n" not in str(err.value)
    assert mariadb.rows(db, "SELECT id FROM items ORDER BY id") == [(2,), (3,), (4,)]  # what came before it committed
    done = distribution_agent.run_distribution(topo, "p", "m1", skip_errors=["20598"])
    assert done["skipped"] == 1 and done["apply"][0]["apply"] == "net_change"
    assert mariadb.rows(db, "SELECT id, v FROM items ORDER BY id") == [(2, "bb"), (3, "c"), (4, "d"), (5, "e")]
    env.run(env.pub, "UPDATE items SET v = 'after' WHERE id = 3")  # the next batch goes by net change again
    again = deliver(topo)
    assert again["net_batches"] == 1
    assert mariadb.rows(db, "SELECT v FROM items WHERE id = 3") == [("after",)]


def test_a_duplicate_key_falls_back_and_stops_as_statement_by_statement(env, spark, mariadb):
    topo, db = _items(env, mariadb, spark)
    mariadb.run(db, "INSERT INTO items VALUES (7, 'already')")
    env.run(env.pub, "INSERT INTO items VALUES (6, 'f'), (7, 'g')")
    with pytest.raises(DeliveryError) as err:
        deliver(topo)
    assert "23505" in str(err.value) or "duplicate" in str(err.value).lower()
    assert mariadb.rows(db, "SELECT id, v FROM items WHERE id >= 6 ORDER BY id") == [(7, "already")]
    done = distribution_agent.run_distribution(topo, "p", "m1", skip_errors=["duplicate_key"])
    assert done["skipped"] == 1 and done["apply"][0]["apply"] == "net_change"
    assert mariadb.rows(db, "SELECT id, v FROM items WHERE id >= 6 ORDER BY id") == [(7, "already")]  # skipped whole
