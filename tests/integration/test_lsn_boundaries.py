"""LSNs are numbers: positions compare and sort as pg_lsn / integers, never as text.

The publisher runs in a cluster whose WAL starts just below a position where an LSN's text
gains a digit (0/FFFFFFF -> 0/10000000, 1/FFFFFFF -> 1/10000000, F/FFFFFFFF -> 10/0): there,
text order puts later transactions first.
"""

from __future__ import annotations

import time

import psycopg
import pytest
from harness import WAL_BOUNDARIES, Env

from airflow_repl.engine.agents import distribution_agent, log_reader_agent, snapshot_agent
from airflow_repl.engine.postgres.lsn import int_to_lsn, lsn_to_int
from airflow_repl.engine.state import dist_schema, dist_transactions

# ---------------------------------------------------------------------- no server


# ---------------------------------------------------------------------- the queries
def test_batch_query_reads_the_primary_key_index_in_order_without_sorting(env):
    """With a large backlog, the next batch comes straight off the (publication, xact_seqno)
    index: no sort of the pending transactions (the old text ORDER BY sorted all of them)."""
    with psycopg.connect(env.dist) as conn:
        dist_schema.ensure_schema(conn)
        conn.execute(
            "INSERT INTO airflow_repl.transactions (publication, xact_seqno, xid, commit_time, end_lsn, "
            "command_count) SELECT 'p', ('0/0'::pg_lsn + g * 65536), g, now(), '0/0', 1 "
            "FROM generate_series(1, 20000) g"
        )
        conn.execute("ANALYZE airflow_repl.transactions")
        plan = "\n".join(
            r[0] for r in conn.execute("EXPLAIN " + dist_transactions.BATCH_QUERY, ("p", "0/F000000", 100))
        )
        assert "Index Scan using transactions_pkey" in plan and "Sort" not in plan, plan
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + dist_transactions.COMMANDS_QUERY, ("p", "0/1", "0/2")))
        assert "Sort" not in plan, plan
        xacts = [r[0] for r in conn.execute(dist_transactions.BATCH_QUERY, ("p", "0/FFE0000", 4))]
        assert xacts == ["0/FFF0000", "0/10000000", "0/10010000", "0/10020000"]


# ---------------------------------------------------------------------- the sandbox's WAL clusters
@pytest.mark.parametrize("boundary", WAL_BOUNDARIES)
def test_wal_env_starts_below_its_boundary_and_crosses_it(wal_env, boundary):
    env = wal_env(boundary)
    env.run(env.pub, "CREATE TABLE t (id int PRIMARY KEY)")
    start = lsn_to_int(env.wal_position())
    assert lsn_to_int(boundary) - (4 << 20) <= start < lsn_to_int(boundary) - (1 << 20)
    env.cross_boundary()
    env.run(env.pub, "INSERT INTO t VALUES (2)")
    after = lsn_to_int(env.wal_position())
    assert lsn_to_int(boundary) < after < lsn_to_int(boundary) + 4096
    env.sandbox.restart_cluster(env.publisher_cluster, "immediate")  # a crash: recovery replays the WAL
    assert env.rows(env.pub, "SELECT id FROM t ORDER BY id") == [(2,)]
    assert lsn_to_int(env.wal_position()) > after
    assert int_to_lsn(lsn_to_int(boundary)) == boundary.upper()


# ---------------------------------------------------------------------- a backlog across the boundary
ROWS = 300


def _transaction(conn: psycopg.Connection, k: int) -> None:
    """One publisher transaction of about 30 row changes: inserts, updates, primary-key
    updates, unique-column updates and deletes (k makes each transaction different)."""
    with conn.transaction():
        conn.execute(
            "INSERT INTO t (id, u, v) SELECT g, g, 'new ' || g FROM generate_series(%s, %s) g",
            (100_000 + 10 * k, 100_000 + 10 * k + 7),
        )
        conn.execute("UPDATE t SET v = v || '.' || %s WHERE id %% 29 = %s", (k, k % 29))
        conn.execute(
            "UPDATE t SET id = id + 1000000 WHERE id IN (SELECT id FROM t ORDER BY md5(id::text || %s) LIMIT 4)",
            (str(k),),
        )
        conn.execute(
            "UPDATE t SET u = -u WHERE id IN (SELECT id FROM t ORDER BY md5(id::text || %s) LIMIT 3)", (f"u{k}",)
        )
        conn.execute(
            "UPDATE t SET v = NULL WHERE id = (SELECT min(id) FROM t WHERE v IS NOT NULL AND id %% 7 = %s)", (k % 7,)
        )
        conn.execute("DELETE FROM t WHERE id IN (SELECT id FROM t ORDER BY md5(id::text || %s) LIMIT 3)", (f"d{k}",))
        conn.execute(
            "INSERT INTO t2 (a, b, note) VALUES (%s, %s, %s) ON CONFLICT (a, b) DO UPDATE SET note = excluded.note",
            (f"k{k % 5}", k % 3, f"note {k}"),
        )


def _workload(env, first: int, count: int) -> None:
    with psycopg.connect(env.pub, autocommit=True) as conn:
        for k in range(first, first + count):
            _transaction(conn, k)


def _table_rows(conninfo: str) -> dict[str, list[tuple]]:
    return {
        "t": Env.rows(conninfo, "SELECT id, u, v FROM t ORDER BY id"),
        "t2": Env.rows(conninfo, "SELECT a, b, note FROM t2 ORDER BY a, b"),
    }


def _assert_rows_equal(expected: dict[str, list[tuple]], conninfo: str, what: str) -> None:
    got = _table_rows(conninfo)
    for table, rows in expected.items():
        assert len(got[table]) == len(rows), f"{what}: {table} has {len(got[table])} rows, expected {len(rows)}"
        for want, have in zip(rows, got[table], strict=True):
            assert have == want, f"{what}: {table} row {have} differs from the publisher's {want}"


@pytest.mark.parametrize("boundary", WAL_BOUNDARIES)
def test_backlog_across_lsn_boundary_is_delivered_in_order(wal_env, spark, boundary):
    """Snapshot below the boundary, a backlog on both sides of it, then the Log Reader (small
    batches, so that its own batches cross the boundary) and the Distribution Agent with one
    stream, three streams and point-in-time delivery stopping past the boundary: every
    subscriber equals the publisher row by row, and further work keeps flowing."""
    env = wal_env(boundary, n_subscribers=4)
    env.run(
        env.pub,
        "CREATE TABLE t (id int PRIMARY KEY, u int NOT NULL UNIQUE, v text); "
        "CREATE TABLE t2 (a text, b int, note text, PRIMARY KEY (a, b))",
    )
    env.run(env.pub, "INSERT INTO t SELECT g, g, 'row ' || g FROM generate_series(1, %s) g", (ROWS,))
    topo = env.topology(["t", "t2"], commit_batch_size=4)
    snap = snapshot_agent.run_snapshot(topo, "p", spark)
    limit = lsn_to_int(boundary)
    assert lsn_to_int(snap["consistent_lsn"]) < limit
    _workload(env, 0, 10)  # before the boundary
    assert lsn_to_int(env.wal_position()) < limit
    env.cross_boundary()
    _workload(env, 10, 6)  # after it
    cut = env.rows(env.pub, "SELECT clock_timestamp()")[0][0]
    at_cut = _table_rows(env.pub)
    time.sleep(0.02)
    _workload(env, 16, 6)

    read = log_reader_agent.run_log_reader(topo, "p", batch_changes=100)
    assert read["transactions"] == 22 and read["batches"] > 2
    lsns = [r[0] for r in env.rows(env.dist, "SELECT xact_seqno::text FROM airflow_repl.transactions")]
    below = [x for x in lsns if lsn_to_int(x) < limit]
    assert len(below) == 10 and len(lsns) == 22  # the backlog spans the boundary
    newest = max(lsns, key=lsn_to_int)
    assert env.rows(env.dist, "SELECT read_xact_seqno::text FROM airflow_repl.logreader_state") == [(newest,)]

    final = _table_rows(env.pub)
    one = distribution_agent.run_distribution(topo, "p", "sub1", subscription_streams=1)
    three = distribution_agent.run_distribution(topo, "p", "sub2", subscription_streams=3, commit_batch_size=8)
    for result in (one, three):
        assert (result["transactions"], result["retries"], result["last_xact_seqno"]) == (22, 0, newest)
    assert three["parallel_batches"] > 0  # the three-stream run did spread batches
    _assert_rows_equal(final, env.subs["sub1"], "one stream")
    _assert_rows_equal(final, env.subs["sub2"], "three streams")

    for name, streams in (("sub3", 1), ("sub4", 3)):
        partial = distribution_agent.run_distribution(topo, "p", name, until=cut, subscription_streams=streams)
        assert partial["transactions"] == 16
        _assert_rows_equal(at_cut, env.subs[name], f"until, {streams} stream(s)")
        assert distribution_agent.run_distribution(topo, "p", name, subscription_streams=streams)["transactions"] == 6
        _assert_rows_equal(final, env.subs[name], f"after until, {streams} stream(s)")

    for name in env.subs:
        state = env.rows(env.subs[name], "SELECT xact_seqno::text, transactions FROM airflow_repl.subscription_state")
        assert state == [(newest, 22)]
    assert env.rows(env.dist, "SELECT DISTINCT delivered_xact_seqno::text FROM airflow_repl.subscriptions") == [
        (newest,)
    ]

    _workload(env, 22, 3)  # and the next runs keep delivering
    assert log_reader_agent.run_log_reader(topo, "p")["transactions"] == 3
    for name in env.subs:
        assert distribution_agent.run_distribution(topo, "p", name, subscription_streams=3)["transactions"] == 3
        _assert_rows_equal(_table_rows(env.pub), env.subs[name], f"{name}, second round")
