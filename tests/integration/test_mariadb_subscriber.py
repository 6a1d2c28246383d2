"""A MariaDB subscriber, end to end with real servers: the snapshot by the type map, delivery
through SQL statements with the watermark in the same InnoDB transaction, crashes and
restarts mid-batch, keys that differ only in case, and each bad input refused with one line."""

from __future__ import annotations

from harness import resolved_topology

from airflow_repl.engine.agents import distribution_agent, log_reader_agent, snapshot_agent


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
