"""The Snapshot Agent's one pass: each read task writes its Parquet file and loads the same rows
into every subscriber being initialized as it reads them.  Exactly once per subscriber and file
(a task run again loads nothing twice), nothing half-loaded when a task fails, and a subscriber
that goes away mid-load is one line naming it."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import psycopg
import pyarrow.parquet as pq
import pytest
from harness import ended_sessions, sessions_ended_since

from airflow_repl.engine.agents import snapshot_agent, snapshot_folder
from airflow_repl.engine.errors import ConnectionLost
from airflow_repl.engine.provisioning import deploy
from airflow_repl.jobs import local_tasks


def _files(summary: dict) -> list[dict]:
    manifest = json.loads((Path(summary["folder"]) / "manifest.json").read_text())
    return [f for art in manifest["articles"] for f in art["files"]]


def test_every_subscriber_is_loaded_in_the_read_and_a_task_run_again_loads_nothing_twice(env2, spark, monkeypatch):
    env = env2
    env.run(
        env.pub,
        "CREATE TABLE t (id int PRIMARY KEY, v text, b bytea); "
        "INSERT INTO t SELECT g, CASE WHEN g % 7 = 0 THEN NULL ELSE 'row ' || g || ' é\t\\' END, "
        "CASE WHEN g % 5 = 0 THEN NULL ELSE int4send(g) END FROM generate_series(1, 30000) g",
    )
    monkeypatch.setattr(snapshot_folder, "ROWS_PER_PARTITION", 5000)
    topo = env.topology(["t"])
    summary = snapshot_agent.run_snapshot(topo, "p", spark, max_partitions=4)
    files = _files(summary)
    assert summary["partitions"] == len(files) == 4 and summary["rows"] == 30000
    publisher = env.rows(env.pub, "SELECT id, v, b FROM t ORDER BY id")
    for sub in env.subs.values():
        assert env.rows(sub, "SELECT id, v, b FROM t ORDER BY id") == publisher
        # the ledger has every file once, with its rows (claimed before they were known)
        ledger = env.rows(sub, "SELECT path, rows FROM airflow_repl.snapshot_files ORDER BY path")
        assert ledger == sorted((f["path"], f["rows"]) for f in files)
    assert env.rows(env.dist, "SELECT status FROM airflow_repl.subscriptions ORDER BY subscriber") == [
        ("active",),
        ("active",),
    ]
    # each data file holds exactly what was loaded
    assert sum(pq.read_metadata(Path(summary["folder"]) / f["path"]).num_rows for f in files) == 30000

    # a read task run again (a Spark task retry) rewrites its file and loads nothing twice
    art = deploy.apply_topology(topo, ["p"])["p"][0]
    first = files[0]
    task = {
        "article": art.to_dict(),
        "index": int(Path(first["path"]).stem.removeprefix("part-")),
        "lower": first["lower"],
        "upper": first["upper"],
        "estimated_rows": first["rows"],
    }
    with psycopg.connect(env.pub) as pub:
        pub.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        exported = pub.execute("SELECT pg_export_snapshot()").fetchone()[0]
        again = snapshot_folder.read_partition(
            env.pub, exported, summary["folder"], task, list(env.subs.items()), summary["snapshot_id"]
        )
    assert again["path"] == first["path"] and again["rows"] == first["rows"]
    for sub in env.subs.values():
        assert env.rows(sub, "SELECT count(*), count(DISTINCT id) FROM t") == [(30000, 30000)]
        assert env.rows(sub, "SELECT rows FROM airflow_repl.snapshot_files WHERE path = %s", (first["path"],)) == [
            (first["rows"],)
        ]


def test_a_task_that_fails_mid_read_leaves_no_rows_of_its_file_at_any_subscriber(env2, spark):
    """sub2 cannot store a character of the last rows: the task's loads roll back at both
    subscribers (sub1's COPY too), the subscriptions stay 'initializing', and the next run
    loads everything once."""
    env = env2
    env.run(
        env.pub,
        "CREATE TABLE t (id int PRIMARY KEY, v text); "
        "INSERT INTO t SELECT g, CASE WHEN g = 20000 THEN '€' ELSE 'x' || g END FROM generate_series(1, 20000) g",
    )
    env.run(env.subs["sub2"], "SELECT 1")
    cluster, name = env.databases[3]
    env.sandbox.drop_database(cluster, name)
    with psycopg.connect(env.sandbox.conninfo(cluster), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE \"{name}\" TEMPLATE template0 ENCODING 'LATIN1' LOCALE 'C'")
    topo = env.topology(["t"])
    with pytest.raises(Exception, match=r"subscriber 'sub2' \(encoding LATIN1\) cannot store a character"):
        snapshot_agent.run_snapshot(topo, "p", spark, max_partitions=1)
    for sub in env.subs.values():
        assert env.rows(sub, "SELECT count(*) FROM t") == [(0,)]
        assert env.rows(sub, "SELECT count(*) FROM airflow_repl.snapshot_files") == [(0,)]
    assert env.rows(env.dist, "SELECT DISTINCT status FROM airflow_repl.subscriptions") == [("initializing",)]
    env.run(env.pub, "UPDATE t SET v = 'e' WHERE id = 20000")
    snapshot_agent.run_snapshot(topo, "p", spark, max_partitions=1)
    for sub in env.subs.values():
        assert env.rows(sub, "SELECT count(*), count(DISTINCT id), max(v) FILTER (WHERE id = 20000) FROM t") == [
            (20000, 20000, "e")
        ]


def test_a_subscriber_that_goes_away_mid_load_is_one_line_naming_it(env, spark, monkeypatch):
    env.run(
        env.pub,
        "CREATE TABLE big (id int PRIMARY KEY, pad text); "
        "INSERT INTO big SELECT g, repeat('p', 200) FROM generate_series(1, 400000) g",
    )
    monkeypatch.setattr(snapshot_folder, "ROWS_PER_PARTITION", 50000)
    topo = env.topology(["big"])
    outcome: dict = {}

    def snapshot() -> None:
        try:
            outcome["summary"] = snapshot_agent.run_snapshot(topo, "p", spark, max_partitions=8)
        except Exception as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=snapshot)
    thread.start()
    killed = 0
    deadline = time.monotonic() + 120
    while not killed and thread.is_alive() and time.monotonic() < deadline:
        killed = env.rows(
            env.sub,
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND query LIKE 'COPY%%'",
        )[0][0]
        time.sleep(0.005)
    thread.join(180)
    assert killed, "no COPY was seen at the subscriber"
    error = outcome.get("error")
    port = psycopg.conninfo.conninfo_to_dict(env.sub)["port"]
    assert isinstance(error, ConnectionLost), outcome
    assert str(error) == (
        f"lost connection to the subscriber 'sub1' (127.0.0.1:{port}) during the read of the snapshot and the data "
        "load of subscriber 'sub1'; the run is recorded as failed; run it again"
    )
    assert env.rows(env.dist, "SELECT status FROM airflow_repl.agent_history WHERE agent = 'snapshot'") == [("failed",)]
    summary = snapshot_agent.run_snapshot(topo, "p", spark, max_partitions=8)
    assert summary["rows"] == 400000
    assert env.rows(env.sub, "SELECT count(*), count(DISTINCT id) FROM big") == [(400000, 400000)]


def test_a_snapshot_run_checks_and_plans_on_one_connection_to_the_publisher(env):
    """The slot's check, the types' check and the plan share one connection to the publisher (a
    connection is a password exchange, at both ends): a run copying one article in one task ends
    four sessions there, where it ended six with a connection for each.  The copy is whole."""
    env.run(
        env.pub,
        'CREATE TABLE "o\'1" (id int PRIMARY KEY, v text); '
        "INSERT INTO \"o'1\" SELECT g, 'v' || g FROM generate_series(1, 500) g",
    )
    topo = env.topology([{"table": "public.o'1"}])
    assert snapshot_agent.run_snapshot(topo, "p", local_tasks.LocalTasks(1))["rows"] == 500
    with psycopg.connect(env.pub, autocommit=True) as conn:
        time.sleep(0.5)
        before = ended_sessions(conn)
        summary = snapshot_agent.run_snapshot(topo, "p", local_tasks.LocalTasks(1), reinitialize=True)
        ended = sessions_ended_since(conn, before, 4)
    assert summary["rows"] == 500 and summary["partitions"] == 1
    assert env.rows(env.sub, 'SELECT count(*), sum(length(v)) FROM "o\'1"') == env.rows(
        env.pub, 'SELECT count(*), sum(length(v)) FROM "o\'1"'
    )
    assert ended == 4
