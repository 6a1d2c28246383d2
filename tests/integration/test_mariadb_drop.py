"""``airflow-repl drop`` at a MariaDB subscriber, against real servers: what the product
installed there goes (its state tables), the subscriber's tables and rows stay, the PostgreSQL
subscriptions beside it keep flowing, and a drop killed halfway is finished by running it again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import yaml
from harness import assert_in_sync, cycle, deliver, mariadb_topology, resolved_topology, wait_for

from airflow_repl.engine.agents import distribution_agent, log_reader_agent, snapshot_agent
from airflow_repl.engine.codegen import mariadb as mariadb_dialect
from airflow_repl.engine.errors import AgentBusy
from airflow_repl.engine.model.propagation import OPERATIONS
from airflow_repl.engine.provisioning import drop
from airflow_repl.engine.provisioning.schema_change import schema_change
from airflow_repl.engine.state import dist_publications

ROOT = Path(__file__).resolve().parents[2]
STATE_TABLES = ["airflow_repl_schema_progress", "airflow_repl_snapshot_files", "airflow_repl_subscription_state"]


def _beside(env, mariadb, spark, publications=("p",)):
    """Publication ``p`` of ``items`` (and ``q`` of ``others``) to PostgreSQL subscriber ``sub1``
    and MariaDB subscriber ``m1`` (one database), snapshotted, with changes delivered to both."""
    env.run(
        env.pub,
        "CREATE TABLE items (id int PRIMARY KEY, v text); INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 30) g;"
        "CREATE TABLE others (id int PRIMARY KEY); INSERT INTO others VALUES (1)",
    )
    db = mariadb.new_database()
    servers = env.servers()
    servers["subscribers"]["m1"] = mariadb.uri(db)
    tables = {"p": "public.items", "q": "public.others"}
    topo = resolved_topology(
        {
            **servers,
            "publications": [{"name": p, "articles": [tables[p]]} for p in publications],
            "subscriptions": [{"publication": p, "subscriber": s} for p in publications for s in ("sub1", "m1")],
        }
    )
    for p in publications:
        snapshot_agent.run_snapshot(topo, p, spark)
    env.run(env.pub, "UPDATE items SET v = 'changed' WHERE id <= 10")
    for p in publications:
        log_reader_agent.run_log_reader(topo, p)
        for s in ("sub1", "m1"):
            distribution_agent.run_distribution(topo, p, s)
    return topo, db


def _state_tables(mariadb, db):
    return [
        r[0]
        for r in mariadb.rows(
            db,
            "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME LIKE 'airflow%%' "
            "ORDER BY TABLE_NAME",
            (db,),
        )
    ]


def _procedures(mariadb, db):
    return [
        r[0]
        for r in mariadb.rows(
            db, "SELECT ROUTINE_NAME FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = %s ORDER BY 1", (db,)
        )
    ]


def _subscriptions(env):
    return env.rows(env.dist, "SELECT publication, subscriber FROM airflow_repl.subscriptions ORDER BY 1, 2")


def test_drop_of_a_mariadb_subscription_removes_what_it_installed_and_postgresql_keeps_flowing(env, spark, mariadb):
    topo, db = _beside(env, mariadb, spark, ("p", "q"))
    assert _state_tables(mariadb, db) == STATE_TABLES
    with psycopg.connect(env.dist) as conn:  # the generated procedures of p's article there
        [art] = dist_publications.load_articles(conn, "p")
    for op in OPERATIONS:
        mariadb.run(db, mariadb_dialect.procedure_sql(art, op))
    mariadb.run(db, "CREATE PROCEDURE mine() SELECT 1")  # the user's own stays
    assert len(_procedures(mariadb, db)) == 4
    done = drop.drop_subscription(topo, "p", "m1")
    assert done["shared_objects_dropped"] == []  # publication q's subscription still uses them
    assert mariadb.rows(db, "SELECT publication FROM airflow_repl_subscription_state") == [("q",)]
    assert _procedures(mariadb, db) == ["mine"]
    assert mariadb.rows(db, "SELECT COUNT(*) FROM airflow_repl_snapshot_files WHERE publication = 'p'") == [(0,)]
    done = drop.drop_subscription(topo, "q", "m1")
    assert done["shared_objects_dropped"] == STATE_TABLES
    assert _state_tables(mariadb, db) == []
    assert mariadb.rows(db, "SELECT COUNT(*), SUM(v = 'changed') FROM items") == [(30, 10)]  # the data stays
    assert _subscriptions(env) == [("p", "sub1"), ("q", "sub1")]
    env.run(env.pub, "DELETE FROM items WHERE id > 20")
    log_reader_agent.run_log_reader(topo, "p")
    assert distribution_agent.run_distribution(topo, "p", "sub1")["transactions"] == 1
    assert env.rows(env.subs["sub1"], "SELECT count(*) FROM items") == [(20,)]
    assert mariadb.rows(db, "SELECT COUNT(*) FROM items") == [(30,)]


def test_drop_refuses_while_the_mariadb_distribution_agent_runs_changing_nothing(env, spark, mariadb):
    topo, db = _beside(env, mariadb, spark)
    holder = mariadb.connect(db)  # an agent's session lock for publication p there
    try:
        with holder.cursor() as cur:
            cur.execute("SELECT GET_LOCK(CONCAT('airflow_repl:', DATABASE(), ':', 'p'), 0)")
        with pytest.raises(AgentBusy, match=r"Distribution Agent is running .* subscriber 'm1'"):
            drop.drop_subscription(topo, "p", "m1")
    finally:
        holder.close()
    assert _state_tables(mariadb, db) == STATE_TABLES
    assert _subscriptions(env) == [("p", "m1"), ("p", "sub1")]
    assert env.rows(env.dist, "SELECT count(*) FROM airflow_repl.drops") == [(0,)]


def _drop_process(path: str, subscriber: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "airflow_repl.cli",
            "drop",
            "subscription",
            "--subscriber",
            subscriber,
            "-t",
            path,
            "-p",
            "p",
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _sessions_waiting(mariadb) -> int:
    """Sessions at the MariaDB server waiting for a lock: a row lock (InnoDB), or a table's
    metadata lock (a DROP TABLE behind the holder's open transaction)."""
    [(rows,)] = mariadb.rows(
        "mysql", "SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT'"
    )
    [(meta,)] = mariadb.rows(
        "mysql", "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE STATE LIKE 'Waiting for%lock'"
    )
    return int(rows) + int(meta)


def _others_gone(mariadb, db) -> bool:
    [(n,)] = mariadb.rows(
        "mysql", "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = %s AND ID <> CONNECTION_ID()", (db,)
    )
    return n == 0


@pytest.mark.parametrize("where", ["subscriber", "distributor"])
def test_a_drop_killed_halfway_is_finished_by_running_it_again(env, spark, mariadb, tmp_path, where):
    topo, db = _beside(env, mariadb, spark)
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topo.to_dict(with_secrets=True)))
    if where == "subscriber":  # the drop waits on the watermark's row at the MariaDB subscriber
        holder = mariadb.connect(db)
        holder.begin()
        holder.cursor().execute("SELECT 1 FROM airflow_repl_subscription_state FOR UPDATE")
    else:  # ... or on the subscription's row at the distributor, its last step
        holder = psycopg.connect(env.dist)
        holder.execute("SELECT 1 FROM airflow_repl.subscriptions WHERE subscriber = 'm1' FOR UPDATE")
    proc = _drop_process(str(path), "m1")
    try:
        if where == "subscriber":
            assert wait_for(lambda: _sessions_waiting(mariadb) > 0, 60)
        else:
            assert wait_for(
                lambda: (
                    env.rows(
                        env.dist,
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
                    )[0][0]
                    > 0
                ),
                60,
            )
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        holder.rollback()
        holder.close()
    assert proc.returncode == -signal.SIGKILL
    assert env.rows(env.dist, "SELECT kind, name FROM airflow_repl.drops") == [("subscription", "m1")]
    assert ("p", "m1") in _subscriptions(env)
    # the subscriber's step committed only when the drop was killed after it
    assert (_state_tables(mariadb, db) == []) is (where == "distributor")
    assert wait_for(lambda: _others_gone(mariadb, db), 30)  # the killed drop's session ended there
    again = _drop_process(str(path), "m1")
    _, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    assert _state_tables(mariadb, db) == []
    assert env.rows(env.dist, "SELECT count(*) FROM airflow_repl.drops") == [(0,)]
    assert _subscriptions(env) == [("p", "sub1")]
    assert mariadb.rows(db, "SELECT COUNT(*) FROM items") == [(30,)]
    env.run(env.pub, "UPDATE items SET v = 'again'")
    cycle(topo, "sub1")
    assert_in_sync(topo, "sub1")


def test_drop_article_after_a_schema_change_keeps_the_mariadb_subscription_flowing(env, spark, mariadb):
    env.run(
        env.pub,
        "CREATE TABLE items (id int PRIMARY KEY, v text); INSERT INTO items VALUES (1, 'a');"
        "CREATE TABLE others (id int PRIMARY KEY); INSERT INTO others VALUES (1)",
    )
    topo, db = mariadb_topology(env, mariadb, ["public.items", "public.others"])
    snapshot_agent.run_snapshot(topo, "p", spark)
    with psycopg.connect(env.dist) as conn:
        [others] = [a for a in dist_publications.load_articles(conn, "p") if a.name == "others"]
    for op in OPERATIONS:
        mariadb.run(db, mariadb_dialect.procedure_sql(others, op))
    schema_change(topo, "p", "ALTER TABLE items ADD COLUMN w int")  # the subscriber's definitions change
    env.run(env.pub, "INSERT INTO items VALUES (2, 'b', 2)")
    assert deliver(topo)["schema_changes"] == 1
    drop.drop_article(topo, "p", "others")
    assert _procedures(mariadb, db) == []
    assert mariadb.rows(db, "SELECT COUNT(*) FROM others") == [(1,)]  # the table stays
    env.run(env.pub, "INSERT INTO items VALUES (3, 'c', 3); INSERT INTO others VALUES (2)")
    assert deliver(topo)["transactions"] == 1  # no reinitialize asked for
    assert mariadb.rows(db, "SELECT id, v, w FROM items ORDER BY id") == [(1, "a", None), (2, "b", 2), (3, "c", 3)]
    assert mariadb.rows(db, "SELECT COUNT(*) FROM others") == [(1,)]
