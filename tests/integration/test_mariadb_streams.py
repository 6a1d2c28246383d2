"""Subscription streams at a MariaDB subscriber, with a real MariaDB server: a batch planned
over several streams as at a PostgreSQL subscriber, applied at once, committed with the
watermark by XA two-phase commit; a conflict the plan missed replayed on one stream; a batch
left prepared by a killed agent or a crashed server finished by the next run, exactly once."""

from __future__ import annotations

import random
import textwrap
import threading

import psycopg
import pytest
from harness import (
    AGENT_RUNNER,
    AgentThread,
    assert_applied_once,
    backlog,
    mariadb_topology,
    run_agent_process,
    spec_file,
    wait_for,
)

from airflow_repl.engine.agents import distribution_agent, log_reader_agent, snapshot_agent, stream_planning
from airflow_repl.engine.errors import ConnectionLost, ReplError
from airflow_repl.engine.mariadb import connections as mariadb_connections
from airflow_repl.engine.provisioning import drop
from airflow_repl.engine.subscriber import mariadb_streams, two_phase, validation


@pytest.fixture
def spread_every_batch(monkeypatch):
    """Every batch of at least 8 commands spread over the streams, faster or not."""
    monkeypatch.setattr(stream_planning, "ADAPTIVE_STREAMS", False)
    monkeypatch.setattr(stream_planning, "PARALLEL_MIN_COMMANDS", 8)


def prepared_xa(mariadb, db: str) -> list[str]:
    """The gids of publication ``p``'s XA transactions prepared at database ``db``
    (:func:`mariadb_streams.xid`'s parts; the server's other tests' are not counted)."""
    prefix = two_phase.gid_prefix(mariadb_streams.tag(db, "p"))
    out = []
    for _, gtrid_length, _, data in mariadb.rows("mysql", "XA RECOVER"):
        gid = f"{data[:gtrid_length].decode()}|{data[gtrid_length:].decode()}"
        if gid.startswith(prefix):
            out.append(gid)
    return out


# ---------------------------------------------------------------------- a pgbench-like workload


def pgbench_like(env, transactions: int, accounts: int) -> None:
    """pgbench's simple-update transaction (``pgbench -N``: an account updated, a history row
    inserted), seeded; every 25th transaction also moves an account to a new key, every 40th
    deletes one, every 50th changes two accounts (a transfer)."""
    rnd = random.Random(31)
    with psycopg.connect(env.pub, autocommit=True) as conn:
        for t in range(transactions):
            with conn.transaction():
                aid, delta = rnd.randint(1, accounts), rnd.randint(-5000, 5000)
                conn.execute("UPDATE accounts SET abalance = abalance + %s WHERE aid = %s", (delta, aid))
                conn.execute("INSERT INTO history (aid, delta, note) VALUES (%s, %s, %s)", (aid, delta, f"t{t} 'ä'"))
                if t % 25 == 0:
                    conn.execute("UPDATE accounts SET aid = aid + 1000000 WHERE aid = %s", (rnd.randint(1, accounts),))
                if t % 40 == 0:
                    conn.execute("DELETE FROM accounts WHERE aid = %s", (rnd.randint(1, accounts),))
                if t % 50 == 0:
                    conn.execute(
                        "UPDATE accounts SET abalance = abalance - 1 WHERE aid = %s", (rnd.randint(1, accounts),)
                    )


def test_a_pgbench_like_workload_on_three_streams_equals_the_publisher_row_by_row(
    env, spark, mariadb, spread_every_batch
):
    env.run(
        env.pub,
        """
        CREATE TABLE accounts (aid int PRIMARY KEY, abalance int NOT NULL, filler text);
        CREATE TABLE history (hid bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, aid int, delta int, note text);
        INSERT INTO accounts SELECT g, 0, 'filler ' || g FROM generate_series(1, 500) g;""",
    )
    topo, db = mariadb_topology(
        env, mariadb, ["public.accounts", "public.history"], subscription_streams=3, commit_batch_size=100
    )
    snapshot_agent.run_snapshot(topo, "p", spark)
    pgbench_like(env, 600, 500)
    log_reader_agent.run_log_reader(topo, "p")
    done = distribution_agent.run_distribution(topo, "p", "m1")
    assert (done["transactions"], done["retries"], done["commits"]) == (600, 0, 6), done
    assert done["parallel_batches"] == 6  # every batch over the streams (accounts hit twice stay together)
    for query in (
        "SELECT aid, abalance, filler FROM accounts ORDER BY aid",
        "SELECT hid, aid, delta, note FROM history ORDER BY hid",
    ):
        assert mariadb.rows(db, query) == env.rows(env.pub, query), query
    assert all(line["match"] for line in validation.compare(topo, "p", "m1"))
    assert prepared_xa(mariadb, db) == []


def test_independent_transactions_are_spread_over_three_streams_exactly_once(env, spark, mariadb, spread_every_batch):
    topo, db = backlog(env, mariadb, spark, 400, subscription_streams=3, commit_batch_size=100)
    done = distribution_agent.run_distribution(topo, "p", "m1")
    assert (done["transactions"], done["retries"]) == (400, 0)
    assert done["parallel_batches"] == done["commits"] == 4  # every batch over the three streams
    assert_applied_once(mariadb, db, 400)
    assert prepared_xa(mariadb, db) == []
    assert distribution_agent.run_distribution(topo, "p", "m1")["transactions"] == 0


# ---------------------------------------------------------------------- a conflict the plan missed


def by_transaction(commands, touched, streams):
    """A plan that ignores the keys: each transaction's commands on a stream of their own."""
    shares: dict[str, list] = {}
    for located in commands:
        shares.setdefault(located[0], []).append(located)
    return list(shares.values())[:streams] if len(shares) <= streams else [list(commands)]


def test_a_key_swap_split_over_two_streams_is_replayed_on_one(env, spark, mariadb, monkeypatch):
    """pk 2 -> 3 then pk 1 -> 2, planned (wrongly) on two streams: the second waits for or
    collides with the first's row 2; the batch is rolled back on both streams and replayed on
    one, in commit order."""
    monkeypatch.setattr(stream_planning, "ADAPTIVE_STREAMS", False)
    monkeypatch.setattr(stream_planning, "plan_batch", by_transaction)
    monkeypatch.setattr(mariadb_streams, "STREAM_LOCK_WAIT", 2)
    env.run(env.pub, "CREATE TABLE items (id int PRIMARY KEY, v text)")
    env.run(env.pub, "INSERT INTO items VALUES (1, 'one'), (2, 'two')")
    topo, db = mariadb_topology(env, mariadb, ["public.items"], subscription_streams=2)
    snapshot_agent.run_snapshot(topo, "p", spark)
    env.run(env.pub, "UPDATE items SET id = 3 WHERE id = 2")
    env.run(env.pub, "UPDATE items SET id = 2 WHERE id = 1")
    log_reader_agent.run_log_reader(topo, "p")
    done = distribution_agent.run_distribution(topo, "p", "m1")
    assert (done["transactions"], done["retries"], done["parallel_batches"]) == (2, 1, 0), done
    assert mariadb.rows(db, "SELECT id, v FROM items ORDER BY id") == [(2, "one"), (3, "two")]
    assert prepared_xa(mariadb, db) == []


# ---------------------------------------------------------------------- between PREPARE and COMMIT

HELD_RUNNER = textwrap.dedent(
    """
    import runpy, sys, time
    from pathlib import Path
    from airflow_repl.engine.agents import stream_planning
    from airflow_repl.engine.subscriber import mariadb_streams

    stream_planning.ADAPTIVE_STREAMS = False
    stream_planning.PARALLEL_MIN_COMMANDS = 8
    batches = [0]

    def hold():  # the second batch: prepared on every stream, then held until killed
        batches[0] += 1
        if batches[0] == 2:
            Path({flag!r}).write_text("held")
            time.sleep(120)

    mariadb_streams.before_commit = hold
    sys.argv[0] = {runner!r}
    runpy.run_path({runner!r}, run_name="__main__")
    """
)


def killed_between_prepare_and_commit(env, spark, mariadb, tmp_path):
    """300 transactions pending for 3 streams, 100 a batch; the agent killed with its second
    batch prepared on every stream (the first committed, 500 rows).  The killed session's XA
    transactions stay prepared."""
    topo, db = backlog(env, mariadb, spark, 300, subscription_streams=3, commit_batch_size=100)
    flag = tmp_path / "held"
    runner = tmp_path / "held_runner.py"
    runner.write_text(HELD_RUNNER.format(flag=str(flag), runner=AGENT_RUNNER))
    outcome = run_agent_process(
        "distribution", spec_file(topo, tmp_path), {"subscriber": "m1"}, kill_when=flag.exists, runner=str(runner)
    )
    assert outcome.killed, outcome
    held = wait_for(lambda: len(prepared_xa(mariadb, db)) == 3 or None, 30)
    assert held, prepared_xa(mariadb, db)
    return topo, db


def test_an_agent_killed_between_prepare_and_commit_commits_the_batch_on_the_next_run(
    env, spark, mariadb, tmp_path, spread_every_batch
):
    topo, db = killed_between_prepare_and_commit(env, spark, mariadb, tmp_path)
    assert {two_phase.parse(g).stream for g in prepared_xa(mariadb, db)} == {0, 1, 2}
    assert mariadb.rows(db, "SELECT COUNT(*) FROM items") == [(500,)]
    again = distribution_agent.run_distribution(topo, "p", "m1")
    assert again["transactions"] == 100  # the third batch only: the second was committed by recovery
    assert_applied_once(mariadb, db, 300)
    assert prepared_xa(mariadb, db) == []


def test_a_reinitialize_after_an_agent_killed_between_prepare_and_commit_replaces_the_batch(
    env, spark, mariadb, tmp_path, spread_every_batch
):
    """The Snapshot Agent finishes the batch first (its locks would hold the watermark it resets)."""
    topo, db = killed_between_prepare_and_commit(env, spark, mariadb, tmp_path)
    snapshot_agent.run_snapshot(topo, "p", spark, reinitialize=True)  # no lock wait on the batch's watermark row
    assert prepared_xa(mariadb, db) == []
    assert mariadb.rows(db, "SELECT COUNT(*), MAX(id) FROM items") == [(1500, 1500)]  # the publisher's rows, once
    assert distribution_agent.run_distribution(topo, "p", "m1")["transactions"] == 0


def test_a_drop_after_an_agent_killed_between_prepare_and_commit_finishes_the_batch_first(
    env, spark, mariadb, tmp_path, spread_every_batch
):
    topo, db = killed_between_prepare_and_commit(env, spark, mariadb, tmp_path)
    drop.drop_subscription(topo, "p", "m1")  # no lock wait on the batch's watermark row
    assert prepared_xa(mariadb, db) == []
    assert mariadb.rows(db, "SELECT COUNT(*) FROM items") == [(1000,)]  # the rows stay, the batch committed
    assert mariadb.rows(db, "SHOW TABLES LIKE 'airflow_repl%'") == []


def test_a_mariadb_crash_with_a_batch_prepared_commits_it_on_the_next_run(
    env, spark, mariadb, monkeypatch, spread_every_batch
):
    topo, db = backlog(env, mariadb, spark, 200, subscription_streams=3, commit_batch_size=100)
    held, release = threading.Event(), threading.Event()

    def hold():
        if not held.is_set():
            held.set()
            release.wait(120)

    monkeypatch.setattr(mariadb_streams, "before_commit", hold)
    agent = AgentThread(distribution_agent.run_distribution, topo, "p", "m1")
    agent.start()
    assert held.wait(120)
    mariadb.restart(kill=True)  # a crash of the server with the first batch prepared on 3 streams
    release.set()
    agent.join(120)
    assert isinstance(agent.error, ConnectionLost), agent.error
    assert mariadb.server.password not in str(agent.error)
    assert len(prepared_xa(mariadb, db)) == 3  # InnoDB kept them through the crash
    assert mariadb.rows(db, "SELECT COUNT(*) FROM items") == [(0,)]
    again = distribution_agent.run_distribution(topo, "p", "m1")
    assert again["transactions"] == 100  # the first batch was committed by recovery
    assert_applied_once(mariadb, db, 200)
    assert prepared_xa(mariadb, db) == []


def test_recovery_commits_only_batches_prepared_on_every_stream_or_already_committed(env, spark, mariadb):
    """XA transactions as a dead agent leaves them, and one of the same publication at another
    database of the server (left alone)."""
    topo, db = backlog(env, mariadb, spark, 2)
    distribution_agent.run_distribution(topo, "p", "m1")
    [(watermark,)] = mariadb.rows(db, "SELECT xact_seqno FROM airflow_repl_subscription_state")
    mariadb.run(db, "CREATE TABLE marks (batch VARCHAR(8), stream INT) ENGINE=InnoDB")
    other = mariadb.new_database()
    mariadb.run(other, "CREATE TABLE marks (batch VARCHAR(8), stream INT) ENGINE=InnoDB")
    plan = {  # batch: (last, streams prepared, streams)
        "x": ("FFFF/5000", [1, 2], 3),  # stream 0 never prepared: rolled back
        "z": ("FFFF/6000", [0, 1, 2], 3),  # prepared everywhere: committed
        "y": ("FFFF/6000", [0, 1], 3),  # rolled back
        "w": (watermark, [1], 3),  # stream 0 committed (the watermark is there): committed
    }
    for name, database in ((db, db), ("other", other)):
        tag = mariadb_streams.tag(database, "p")
        for batch, (last, streams, total) in plan.items() if name == db else [("o", ("0/1", [0], 2))]:
            for s in streams:
                conn = mariadb.connect(database)
                xid = mariadb_streams.xid(two_phase.gid(tag, batch, last, s, total))
                with conn.cursor() as cur:
                    cur.execute(f"XA START {xid}")
                    cur.execute("INSERT INTO marks VALUES (%s, %s)", (batch, s))
                    cur.execute(f"XA END {xid}")
                    cur.execute(f"XA PREPARE {xid}")
                conn.close()
    conn = mariadb_connections.connect(mariadb.uri(db), "MariaDB subscriber 'm1'")
    try:
        assert mariadb_streams.recover_prepared(conn, db, "p", "m1", 3) == 8
    finally:
        conn.close()
    assert mariadb.rows(db, "SELECT batch, COUNT(*) FROM marks GROUP BY batch ORDER BY batch") == [("w", 1), ("z", 3)]
    assert prepared_xa(mariadb, db) == []
    [left] = prepared_xa(mariadb, other)  # the other database's, left alone
    mariadb.run(other, f"XA ROLLBACK {mariadb_streams.xid(left)}")


# ---------------------------------------------------------------------- capacity


def test_more_streams_than_the_server_has_connections_for_are_refused_up_front(env, spark, mariadb):
    topo, db = backlog(env, mariadb, spark, 3, subscription_streams=20)
    [(max_connections,)] = mariadb.rows("mysql", "SELECT @@max_connections")
    [(in_use,)] = mariadb.rows(
        "mysql", "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'THREADS_CONNECTED'"
    )
    mariadb.run("mysql", f"SET GLOBAL max_connections = {int(in_use) + 4}")  # at least 10: MariaDB's minimum
    try:
        with pytest.raises(
            ReplError, match=r"subscription_streams = 20 is more than MariaDB subscriber 'm1'"
        ) as refused:
            distribution_agent.run_distribution(topo, "p", "m1")
    finally:
        mariadb.run("mysql", f"SET GLOBAL max_connections = {int(max_connections)}")
    assert "\n" not in str(refused.value) and "raise max_connections" in str(refused.value)
    assert mariadb.rows(db, "SELECT COUNT(*) FROM items") == [(0,)]  # nothing delivered
