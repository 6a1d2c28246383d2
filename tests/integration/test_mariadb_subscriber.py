"""A MariaDB subscriber, end to end with real servers: the snapshot by the type map, delivery
through SQL statements with the watermark in the same InnoDB transaction, crashes and
restarts mid-batch, keys that differ only in case, and each bad input refused with one line."""

from __future__ import annotations

import psycopg
import pytest
from harness import AgentThread, resolved_topology, run_agent_process, spec_file, wait_for

from airflow_repl.engine.agents import distribution_agent, log_reader_agent, snapshot_agent
from airflow_repl.engine.errors import ConnectionLost, DeliveryError


def mariadb_topology(env, mariadb, articles, *, db=None, **sub_options):
    """Publication ``p`` of ``articles`` to one MariaDB subscriber ``m1`` (a fresh database)."""
    db = db or mariadb.new_database()
    servers = env.servers(subscribers=[])
    servers["subscribers"] = {"m1": mariadb.uri(db)}
    topo = resolved_topology(
        {
            **servers,
            "publications": [{"name": "p", "articles": articles}],
            "subscriptions": [{"publication": "p", "subscriber": "m1", **sub_options}],
        }
    )
    return topo, db


def deliver(topo, **options):
    log_reader_agent.run_log_reader(topo, "p")
    return distribution_agent.run_distribution(topo, "p", "m1", **options)


def test_snapshot_then_changes_reach_a_mariadb_subscriber_exactly_once(env, spark, mariadb):
    env.run(
        env.pub, "CREATE TABLE items (id int PRIMARY KEY, v text, n numeric(10,2), at timestamptz, ok boolean, b bytea)"
    )
    env.run(
        env.pub,
        "INSERT INTO items SELECT g, 'v' || g, g * 1.5, '2026-01-02 03:04:05+02', g % 2 = 0, '\\x00ff' FROM generate_series(1, 50) g",
    )
    topo, db = mariadb_topology(env, mariadb, ["public.items"])
    summary = snapshot_agent.run_snapshot(topo, "p", spark)
    assert summary["initialized"] == ["m1"]
    assert mariadb.rows(db, "SELECT COUNT(*) FROM items") == [(50,)]
    assert mariadb.rows(db, "SELECT v, n, at, ok, b FROM items WHERE id = 2")[0][1:] == (
        __import__("decimal").Decimal("3.00"),
        __import__("datetime").datetime(2026, 1, 2, 1, 4, 5),
        1,
        b"\x00\xff",
    )
    env.run(env.pub, "UPDATE items SET v = 'changed' WHERE id <= 10")
    env.run(env.pub, "DELETE FROM items WHERE id > 40")
    env.run(env.pub, "INSERT INTO items (id, v) VALUES (100, 'new')")
    env.run(env.pub, "UPDATE items SET id = 200 WHERE id = 1")  # a key change: DELETE + INSERT
    done = deliver(topo)
    assert done["transactions"] == 4
    assert mariadb.rows(db, "SELECT COUNT(*), SUM(v = 'changed') FROM items") == [(41, 10)]
    assert mariadb.rows(db, "SELECT id FROM items WHERE id IN (1, 200)") == [(200,)]
    again = deliver(topo)
    assert again["transactions"] == 0
    [(watermark,)] = mariadb.rows(db, "SELECT xact_seqno FROM airflow_repl_subscription_state WHERE publication = 'p'")
    assert watermark == done["last_xact_seqno"]


# ---------------------------------------------------------------------- crashes: exactly once
def count_applied(mariadb, db, table="items"):
    """A MariaDB trigger that logs every row the agent applies (rolled back with its batch)."""
    mariadb.run(db, "CREATE TABLE applied (op CHAR(1)) ENGINE=InnoDB")
    for op, when in (("I", "INSERT"), ("U", "UPDATE"), ("D", "DELETE")):
        mariadb.run(
            db, f"CREATE TRIGGER applied_{op} AFTER {when} ON {table} FOR EACH ROW INSERT INTO applied VALUES ('{op}')"
        )


def open_batch_rows(mariadb) -> int:
    """Rows changed by the open (uncommitted) InnoDB transactions at the server."""
    [(rows,)] = mariadb.rows("mysql", "SELECT COALESCE(SUM(trx_rows_modified), 0) FROM information_schema.INNODB_TRX")
    return int(rows)


def backlog(env, mariadb, spark, transactions, **sub_options):
    """``items`` snapshotted to a MariaDB subscriber, then ``transactions`` publisher
    transactions of 5 inserts each waiting for delivery (read by the Log Reader)."""
    env.run(env.pub, "CREATE TABLE items (id int PRIMARY KEY, v text)")
    topo, db = mariadb_topology(env, mariadb, ["public.items"], **sub_options)
    snapshot_agent.run_snapshot(topo, "p", spark)
    count_applied(mariadb, db)
    with psycopg.connect(env.pub, autocommit=True) as conn:
        for t in range(transactions):
            with conn.transaction():
                conn.execute(
                    "INSERT INTO items SELECT g, 'v' || g FROM generate_series(%s::int, %s::int) g",
                    (t * 5 + 1, t * 5 + 5),
                )
    log_reader_agent.run_log_reader(topo, "p")
    return topo, db


def assert_applied_once(mariadb, db, transactions):
    assert mariadb.rows(db, "SELECT COUNT(*), COUNT(DISTINCT id), MAX(id) FROM items") == [
        (transactions * 5, transactions * 5, transactions * 5)
    ]
    assert mariadb.rows(db, "SELECT op, COUNT(*) FROM applied GROUP BY op") == [("I", transactions * 5)]


def test_a_backlog_delivered_in_commit_order_batch_by_batch(env, spark, mariadb):
    topo, db = backlog(env, mariadb, spark, 2000, commit_batch_size=50)
    done = distribution_agent.run_distribution(topo, "p", "m1")
    assert done["transactions"] == 2000 and done["commits"] == 40
    assert_applied_once(mariadb, db, 2000)


def test_distribution_agent_killed_mid_batch_applies_everything_exactly_once(env, spark, mariadb, tmp_path):
    topo, db = backlog(env, mariadb, spark, 4000, commit_batch_size=1000, commit_batch_threshold=5000)
    spec = spec_file(topo, tmp_path)
    outcome = run_agent_process(
        "distribution", spec, {"subscriber": "m1"}, kill_when=lambda: open_batch_rows(mariadb) > 500
    )
    assert outcome.killed, outcome
    [(before,)] = mariadb.rows(db, "SELECT COUNT(*) FROM items")
    assert before % 5000 == 0 and before < 20000  # whole batches only
    again = distribution_agent.run_distribution(topo, "p", "m1")
    assert again["transactions"] == 4000 - before // 5
    assert_applied_once(mariadb, db, 4000)


def test_mariadb_restart_mid_batch_applies_everything_exactly_once(env, spark, mariadb):
    topo, db = backlog(env, mariadb, spark, 4000, commit_batch_size=1000, commit_batch_threshold=5000)
    agent = AgentThread(distribution_agent.run_distribution, topo, "p", "m1")
    agent.start()
    assert wait_for(lambda: open_batch_rows(mariadb) > 500, 120) is not None
    mariadb.restart(kill=True)  # a crash of the server: InnoDB rolls the open batch back
    agent.join(120)
    assert isinstance(agent.error, ConnectionLost), agent.error
    assert "\n" not in str(agent.error) and mariadb.server.password not in str(agent.error)
    distribution_agent.run_distribution(topo, "p", "m1")
    assert_applied_once(mariadb, db, 4000)


# ---------------------------------------------------------------------- keys and errors
def test_keys_that_differ_only_in_case_stay_distinct(env, spark, mariadb):
    env.run(env.pub, "CREATE TABLE k (k text PRIMARY KEY, u varchar(10) UNIQUE, v int)")
    env.run(env.pub, "INSERT INTO k VALUES ('a', 'x', 1), ('A', 'X', 2), ('\u00e4', 'y', 3)")
    topo, db = mariadb_topology(env, mariadb, ["public.k"])
    snapshot_agent.run_snapshot(topo, "p", spark)
    env.run(env.pub, "INSERT INTO k VALUES ('\u00c4', 'Y', 4), ('a ', 'x ', 5)")
    env.run(env.pub, "UPDATE k SET v = 10 WHERE k = 'A'")
    env.run(env.pub, "DELETE FROM k WHERE k = 'a'")
    deliver(topo)
    assert sorted(mariadb.rows(db, "SELECT k, u, v FROM k")) == sorted(
        [("A", "X", 10), ("\u00e4", "y", 3), ("\u00c4", "Y", 4), ("a ", "x ", 5)]
    )


def test_row_not_found_stops_delivery_or_is_skipped(env, spark, mariadb):
    env.run(env.pub, "CREATE TABLE items (id int PRIMARY KEY, v text)")
    env.run(env.pub, "INSERT INTO items VALUES (1, 'a'), (2, 'b')")
    topo, db = mariadb_topology(env, mariadb, ["public.items"])
    snapshot_agent.run_snapshot(topo, "p", spark)
    mariadb.run(db, "DELETE FROM items WHERE id = 1")
    env.run(env.pub, "INSERT INTO items VALUES (3, 'c')")
    env.run(env.pub, "UPDATE items SET v = 'x' WHERE id = 1")
    env.run(env.pub, "INSERT INTO items VALUES (4, 'd')")
    with pytest.raises(DeliveryError) as err:
        deliver(topo)
    assert "row not found" in str(err.value) and "key (id=1)" in str(err.value) and "\n" not in str(err.value)
    assert sorted(mariadb.rows(db, "SELECT id FROM items")) == [(2,), (3,)]  # what came before it committed
    done = distribution_agent.run_distribution(topo, "p", "m1", skip_errors=["20598"])
    assert done["skipped"] == 1
    assert sorted(mariadb.rows(db, "SELECT id, v FROM items")) == [(2, "b"), (3, "c"), (4, "d")]


def test_row_and_column_filters_and_none(env, spark, mariadb):
    env.run(env.pub, "CREATE TABLE f (id int PRIMARY KEY, region text, secret text, v int)")
    env.run(env.pub, "INSERT INTO f VALUES (1, 'eu', 's', 1), (2, 'us', 's', 2)")
    articles = [
        {"table": "public.f", "row_filter": "region = 'eu'", "columns": ["id", "region", "v"], "del_cmd": "NONE"}
    ]
    topo, db = mariadb_topology(env, mariadb, articles)
    snapshot_agent.run_snapshot(topo, "p", spark)
    assert [r[0] for r in mariadb.rows(db, "SHOW COLUMNS FROM f")] == ["id", "region", "v"]
    env.run(env.pub, "INSERT INTO f VALUES (3, 'eu', 's', 3), (4, 'us', 's', 4)")
    env.run(env.pub, "UPDATE f SET v = 10 WHERE id = 1")
    env.run(env.pub, "DELETE FROM f WHERE id = 3")  # NONE: not applied
    deliver(topo)
    assert sorted(mariadb.rows(db, "SELECT id, region, v FROM f")) == [(1, "eu", 10), (3, "eu", 3)]
