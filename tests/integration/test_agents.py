"""Integration tests of the Snapshot, Log Reader and Distribution Agents against real
PostgreSQL clusters and a real (local) SparkSession."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timezone
from pathlib import Path

import psycopg
import pyarrow.parquet as pq
import pytest
from harness import AGENT_RUNNER, assert_in_sync, count_applied_rows, cycle, make_items, snapshotted_items, spec_file

from airflow_repl.engine.agents import distribution_agent, log_reader_agent, snapshot_agent, stream_planning
from airflow_repl.engine.errors import ROW_NOT_FOUND_SQLSTATE, DeliveryError, NotInitialized, ReplError
from airflow_repl.engine.subscriber.streams import recover_prepared
from airflow_repl.jobs.agent_job import run_agent


class Writer(threading.Thread):
    """Keeps writing to the publisher (inserts, updates, key updates, deletes) until stopped."""

    def __init__(self, conninfo: str, table: str = "items") -> None:
        super().__init__(daemon=True)
        self.conninfo, self.table = conninfo, table
        self.stop_event = threading.Event()
        self.commits = 0
        self.commit_times: list[float] = []

    def run(self) -> None:
        i = 0
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            while not self.stop_event.is_set():
                i += 1
                with conn.transaction():
                    conn.execute(
                        "INSERT INTO items (id, grp, payload) VALUES (%s, %s, %s)", (1_000_000 + i, i % 10, f"new {i}")
                    )
                    conn.execute("UPDATE items SET payload = payload || '+' WHERE id = %s", (1 + (i * 37) % 50000,))
                    conn.execute("UPDATE items SET id = id + 2000000 WHERE id = %s", (1 + (i * 101) % 50000,))
                    conn.execute("DELETE FROM items WHERE id = %s", (1 + (i * 53) % 50000,))
                self.commits += 1
                self.commit_times.append(time.monotonic())


def test_snapshot_during_concurrent_writes_loses_and_doubles_nothing(env, spark):
    make_items(env)
    topo = env.topology(["public.items"])
    writer = Writer(env.pub)
    writer.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    summary = snapshot_agent.run_snapshot(topo, "p", spark, max_partitions=4)
    t1 = time.monotonic()
    time.sleep(0.3)
    writer.stop_event.set()
    writer.join()
    during = [t for t in writer.commit_times if t0 <= t <= t1]
    assert len(during) > 5, "the writer must have committed while the snapshot ran"
    assert summary["partitions"] == 2 and summary["initialized"] == ["sub1"]
    folder = Path(summary["folder"])
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["consistent_lsn"] == summary["consistent_lsn"]
    files = manifest["articles"][0]["files"]
    assert len(files) == 2 and sum(f["rows"] for f in files) == summary["rows"]
    table = pq.read_table(folder / files[0]["path"])
    assert table.schema.field("id").type == "int64" and table.schema.field("amount").type == "string"
    assert 'CREATE TABLE "public"."items"' in (folder / "schema.sql").read_text()
    assert "sp_MSupd_publicitems" in (folder / "procedures.sql").read_text()
    # the subscriber holds the snapshot; the log reader + distribution deliver the rest exactly
    read, delivered = cycle(topo)
    assert read["transactions"] >= 1 and delivered["transactions"] == read["transactions"]
    assert_in_sync(topo)


def test_snapshot_rerun_is_a_no_op_and_reinitialize_rebuilds(env, spark):
    topo = snapshotted_items(env, spark, 500)
    again = snapshot_agent.run_snapshot(topo, "p", spark)
    assert again["initialized"] == [] and again["snapshot_id"] is None
    env.run(env.sub, "DELETE FROM items WHERE id < 100")  # damage the copy
    env.run(env.pub, "UPDATE items SET grp = 42 WHERE id = 7")
    log_reader_agent.run_log_reader(topo, "p")
    rebuilt = snapshot_agent.run_snapshot(topo, "p", spark, reinitialize=True)
    assert rebuilt["initialized"] == ["sub1"]
    distribution_agent.run_distribution(topo, "p", "sub1")  # the update is older than the new snapshot: skipped
    assert_in_sync(topo)


def test_key_updates_deletes_and_types_replicate(env, spark):
    env.run(env.pub, 'CREATE SCHEMA "Odd Schema"')
    env.run(
        env.pub,
        """CREATE TABLE "Odd Schema"."Mixed ""Case"" Table" (
        k1 int, k2 text, "select" text, n numeric, f float8, r real, b boolean, d date, ts timestamptz,
        iv interval, j jsonb, arr int[], by bytea, u uuid, big text, PRIMARY KEY (k1, k2))""",
    )
    env.run(
        env.pub,
        """INSERT INTO "Odd Schema"."Mixed ""Case"" Table" VALUES
        (1, 'a', 'it''s', 1.000000000000000000001, 'NaN', 1.5, true, '2024-02-29', '2024-01-01 10:00+02',
         '1 day 2 hours', '{"a": [1, null, "x"]}', '{1,2,NULL}', '\\x00ff', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
         repeat('big', 5000)),
        (2, 'b', NULL, NULL, '-Infinity', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)""",
    )
    topo = env.topology([{"table": 'Odd Schema.Mixed "Case" Table'}])
    snap = snapshot_agent.run_snapshot(topo, "p", spark)
    assert snap["tables"] == {'Odd Schema.Mixed "Case" Table': 2}  # rows per subscriber table (asset events)
    assert_in_sync(topo)
    table = '"Odd Schema"."Mixed ""Case"" Table"'
    env.run(env.pub, f"UPDATE {table} SET \"select\" = 'upd', n = n * 2 WHERE k1 = 1")  # big is unchanged TOAST
    env.run(env.pub, f"UPDATE {table} SET k2 = 'z' WHERE k1 = 2")  # key update -> DELETE + INSERT
    env.run(env.pub, f"INSERT INTO {table} (k1, k2, big) VALUES (3, 'c', repeat('x', 100000))")
    env.run(env.pub, f"UPDATE {table} SET k1 = k1 + 10")  # every key changes, in one statement
    env.run(env.pub, f"DELETE FROM {table} WHERE k1 = 13")
    _read, delivered = cycle(topo)
    ops = env.rows(env.dist, "SELECT op, count(*) FROM airflow_repl.commands GROUP BY op ORDER BY op")
    assert dict(ops) == {"D": 5, "I": 5, "U": 1}
    # per subscriber table: 5 transactions, 7 row changes (a key update's DELETE + INSERT is one)
    assert delivered["tables"] == {
        'Odd Schema.Mixed "Case" Table': {
            "transactions": 5,
            "commands": 7,
            "last_xact_seqno": delivered["last_xact_seqno"],
        }
    }
    assert_in_sync(topo)
    assert env.rows(env.sub, f'SELECT k1, k2, "select", length(big) FROM {table} ORDER BY k1') == [
        (11, "a", "upd", 15000),
        (12, "z", None, None),
    ]


def test_row_not_found_stops_delivery_and_names_the_command(env, spark):
    topo = snapshotted_items(env, spark, 100)
    env.run(env.pub, "UPDATE items SET payload = 'first' WHERE id = 1")
    env.run(env.sub, "DELETE FROM items WHERE id = 5")  # the subscriber lost a row
    env.run(env.pub, "UPDATE items SET payload = 'changed' WHERE id = 5")
    env.run(env.pub, "UPDATE items SET payload = 'later' WHERE id = 6")
    log_reader_agent.run_log_reader(topo, "p")
    with pytest.raises(DeliveryError) as err:
        distribution_agent.run_distribution(topo, "p", "sub1", commit_batch_size=100)
    message = str(err.value)
    assert "update on article 'items' (public.items) key (id=5)" in message
    assert "row not found at the subscriber" in message and "reinitialize" in message
    assert err.value.sqlstate == ROW_NOT_FOUND_SQLSTATE
    # the transaction before the failing one committed, nothing from the failing one on did
    assert env.rows(env.sub, "SELECT id, payload FROM items WHERE id IN (1, 6) ORDER BY id") == [
        (1, "first"),
        (6, env.rows(env.pub, "SELECT md5('6')")[0][0]),
    ]
    assert env.rows(env.sub, "SELECT transactions FROM airflow_repl.subscription_state") == [(1,)]
    errors = env.rows(env.dist, "SELECT article, sqlstate, command_id, message FROM airflow_repl.errors")
    assert len(errors) == 1 and errors[0][:3] == ("items", ROW_NOT_FOUND_SQLSTATE, 1)
    assert env.rows(env.dist, "SELECT status FROM airflow_repl.agent_history WHERE agent = 'distribution'") == [
        ("failed",)
    ]
    # repair the subscriber and re-run: everything applies once, in order
    env.run(env.sub, "INSERT INTO items (id, grp, payload, amount, at) SELECT 5, 5, 'x', 1.5, now()")
    env.run(
        env.sub,
        "UPDATE items SET (payload, amount, at) = (%s, %s, %s) WHERE id = 5",
        env.rows(env.pub, "SELECT md5('5'), amount, at FROM items WHERE id = 5")[0],
    )
    env.run(env.sub, "UPDATE items SET at = (SELECT at FROM items WHERE id = 5) WHERE id = 5")
    distribution_agent.run_distribution(topo, "p", "sub1")
    assert env.rows(env.sub, "SELECT id, payload FROM items WHERE id IN (1, 5, 6) ORDER BY id") == [
        (1, "first"),
        (5, "changed"),
        (6, "later"),
    ]


def test_agents_refuse_uninitialized_publication_and_subscription(env, spark):
    make_items(env, 10)
    topo = env.topology(["public.items"])
    with pytest.raises(NotInitialized, match="run the Snapshot Agent"):
        log_reader_agent.run_log_reader(topo, "p")
    with pytest.raises(NotInitialized, match="run the Snapshot Agent"):
        distribution_agent.run_distribution(topo, "p", "sub1")


def test_user_triggers_do_not_fire_and_always_triggers_count_each_command_once(env, spark):
    topo = snapshotted_items(env, spark, 1000, commit_batch_size=3)
    env.run(
        env.sub,
        """
        CREATE TABLE audit (op text);
        CREATE FUNCTION log_op() RETURNS trigger LANGUAGE plpgsql AS
            $$BEGIN INSERT INTO audit VALUES (TG_OP); RETURN NULL; END$$;
        CREATE TRIGGER user_trigger AFTER INSERT OR UPDATE OR DELETE ON items FOR EACH ROW EXECUTE FUNCTION log_op();""",
    )
    count_applied_rows(env)
    for i in range(20):
        env.run(env.pub, "UPDATE items SET grp = grp + 1 WHERE id %% 20 = %s", (i,))
    read, delivered = cycle(topo)
    assert delivered["commits"] == 7 and delivered["transactions"] == 20
    assert env.rows(env.sub, "SELECT count(*) FROM audit")[0][0] == 0
    assert env.rows(env.sub, "SELECT count(*) FROM applied")[0][0] == 1000 == read["commands"]
    assert_in_sync(topo)


def _kill_when(proc: subprocess.Popen, condition, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if condition():
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.01)
    raise AssertionError("condition never met")


def test_distribution_killed_mid_batch_rerun_applies_everything_exactly_once(env, spark, tmp_path):
    topo = snapshotted_items(env, spark, 5000, commit_batch_size=4)
    count_applied_rows(env)
    for i in range(200):  # 200 transactions x 25 updates = 5000 commands
        env.run(env.pub, "UPDATE items SET grp = grp + 1, payload = payload || 'x' WHERE id %% 200 = %s", (i,))
    read = log_reader_agent.run_log_reader(topo, "p")
    assert (read["transactions"], read["commands"]) == (200, 5000)
    proc = subprocess.Popen([sys.executable, AGENT_RUNNER, "distribution", spec_file(topo, tmp_path)])
    state = lambda: env.rows(env.sub, "SELECT transactions FROM airflow_repl.subscription_state")[0][0]  # noqa: E731
    killed = _kill_when(proc, lambda: state() >= 8)
    assert killed, "the agent finished before it could be killed"
    partial = state()
    assert 8 <= partial < 200
    # applied rows and watermark moved together: every committed batch is complete, nothing more
    assert env.rows(env.sub, "SELECT count(*) FROM applied")[0][0] == partial * 25
    distribution_agent.run_distribution(topo, "p", "sub1")
    assert state() == 200
    assert env.rows(env.sub, "SELECT count(*) FROM applied")[0][0] == 5000
    assert_in_sync(topo)


def test_log_reader_killed_mid_run_rerun_loses_and_duplicates_nothing(env, spark, tmp_path):
    topo = snapshotted_items(env, spark, 2000)
    for i in range(300):
        env.run(env.pub, "UPDATE items SET grp = grp + 1 WHERE id %% 300 = %s", (i,))
    count = lambda: env.rows(env.dist, "SELECT count(*) FROM airflow_repl.transactions")[0][0]  # noqa: E731
    proc = subprocess.Popen(
        [sys.executable, AGENT_RUNNER, "logreader", spec_file(topo, tmp_path), json.dumps({"batch_changes": 200})]
    )
    killed = _kill_when(proc, lambda: count() >= 20)
    stored = count()
    assert killed and 20 <= stored < 300
    again = log_reader_agent.run_log_reader(topo, "p", batch_changes=200)
    assert again["transactions"] == 300 - stored  # exactly the rest: nothing lost, nothing stored twice
    assert count() == 300
    assert env.rows(
        env.dist, "SELECT count(*), count(DISTINCT (xact_seqno, command_id)) FROM airflow_repl.commands"
    ) == [(2000, 2000)]
    assert log_reader_agent.run_log_reader(topo, "p")["transactions"] == 0  # nothing left, nothing repeated
    distribution_agent.run_distribution(topo, "p", "sub1")
    assert_in_sync(topo)


def test_log_reader_batches_keep_whole_transactions_exactly_once(env, spark):
    """Batches of one replication stream (the server describes each table once per stream) hold
    whole transactions in commit order, each stored once, across a stopped run and a re-run;
    transaction rows are written every `chunk` rows."""
    topo = snapshotted_items(env, spark, 2000)
    for i in range(300):
        env.run(env.pub, "UPDATE items SET grp = grp + 1 WHERE id %% 300 = %s", (i,))
    first = log_reader_agent.run_log_reader(topo, "p", batch_changes=100, max_batches=3)
    assert first["batches"] == 3 and 0 < first["transactions"] < 300
    rest = log_reader_agent.run_log_reader(topo, "p", batch_changes=100, chunk=7)
    assert first["transactions"] + rest["transactions"] == 300
    # a transaction is 8 or 9 messages (Begin, 6 or 7 updates, Commit): 12 or 13 of them fill a
    # batch of 100 messages (the last batch may hold fewer)
    n = rest["transactions"]
    assert -(-n // 13) <= rest["batches"] <= -(-n // 12)
    xacts = [r[0] for r in env.rows(env.dist, "SELECT xid FROM airflow_repl.transactions ORDER BY xact_seqno")]
    assert len(xacts) == 300 and xacts == sorted(xacts)  # one committer: commit order is xid order
    assert env.rows(
        env.dist,
        "SELECT count(*), count(DISTINCT (xact_seqno, command_id)), "
        "(SELECT sum(command_count) FROM airflow_repl.transactions) FROM airflow_repl.commands",
    ) == [(2000, 2000, 2000)]
    assert log_reader_agent.run_log_reader(topo, "p")["transactions"] == 0
    distribution_agent.run_distribution(topo, "p", "sub1")
    assert_in_sync(topo)


def test_large_transaction_is_stored_atomically_in_chunks(env, spark):
    topo = snapshotted_items(env, spark, 10)
    env.run(env.pub, "INSERT INTO items (id, grp, payload) SELECT g, 1, 'bulk' FROM generate_series(100, 30099) g")
    read = log_reader_agent.run_log_reader(topo, "p", batch_changes=1000, chunk=700)
    assert (read["transactions"], read["commands"]) == (1, 30000)
    assert env.rows(env.dist, "SELECT command_count FROM airflow_repl.transactions") == [(30000,)]
    distribution_agent.run_distribution(topo, "p", "sub1", commit_batch_threshold=10)
    assert_in_sync(topo)


def test_point_in_time_delivery_stops_at_until(env, spark, caplog):
    topo = snapshotted_items(env, spark, 10)
    env.run(env.pub, "UPDATE items SET payload = 'one' WHERE id = 1")
    cut = env.rows(env.pub, "SELECT clock_timestamp()")[0][0]
    time.sleep(0.05)
    env.run(env.pub, "UPDATE items SET payload = 'two' WHERE id = 2")
    log_reader_agent.run_log_reader(topo, "p")
    # a bound before every pending transaction delivers nothing, and says so: in the summary, and a warning line
    caplog.set_level("WARNING", logger="airflow_repl.engine.agents.distribution_agent")
    past = distribution_agent.run_distribution(topo, "p", "sub1", until="2020-01-01T00:00:00")
    assert past["transactions"] == 0
    left = past["left_by_until"]
    assert (left["until"], left["transactions"], left["commands"]) == ("2020-01-01T00:00:00+00:00", 2, 2)
    assert left["newest_commit_time_at_or_before_until"] is None and left["first_commit_time"] < cut.isoformat()
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning.startswith("--until 2020-01-01T00:00:00+00:00 left 2 pending transaction(s) (2 commands)")
    assert "no stored transaction committed at or before it" in warning and "with a later --until" in warning
    caplog.clear()
    first = distribution_agent.run_distribution(topo, "p", "sub1", until=cut.isoformat())
    assert first["transactions"] == 1
    left = first["left_by_until"]
    assert left["transactions"] == 1 and left["first_commit_time"] > cut.isoformat()
    assert left["newest_commit_time_at_or_before_until"] < cut.isoformat()  # the transaction it delivered
    assert env.rows(env.sub, "SELECT id, payload FROM items WHERE id IN (1, 2) ORDER BY id") == [
        (1, "one"),
        (2, env.rows(env.pub, "SELECT md5('2')")[0][0]),
    ]
    naive_utc = cut.astimezone(timezone.utc).replace(tzinfo=None).isoformat()  # no offset: read as UTC
    assert distribution_agent.run_distribution(topo, "p", "sub1", until=naive_utc)["transactions"] == 0
    last = distribution_agent.run_distribution(topo, "p", "sub1")
    assert last["transactions"] == 1 and "left_by_until" not in last
    assert_in_sync(topo)


def test_slot_moves_past_unpublished_work_so_the_publisher_keeps_no_wal_for_it(env, spark):
    make_items(env, 10)
    env.run(env.pub, "CREATE TABLE not_published (id int, pad text)")
    topo = env.topology(["public.items"])
    snapshot_agent.run_snapshot(topo, "p", spark)
    env.run(env.pub, "INSERT INTO not_published SELECT g, repeat('x', 500) FROM generate_series(1, 20000) g")
    after_writes = env.rows(env.pub, "SELECT pg_current_wal_flush_lsn()")[0][0]
    slot_lsn = "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE database = current_database()"
    assert env.rows(env.pub, slot_lsn)[0][0] < after_writes
    assert log_reader_agent.run_log_reader(topo, "p")["transactions"] == 0
    assert env.rows(env.pub, slot_lsn)[0][0] >= after_writes
    env.run(env.pub, "UPDATE items SET grp = 99 WHERE id = 1")  # published work after that still flows
    read, delivered = cycle(topo)
    assert read["transactions"] == delivered["transactions"] == 1
    assert_in_sync(topo)


def test_truncate_is_replicated(env, spark):
    topo = snapshotted_items(env, spark, 100)
    env.run(env.pub, "TRUNCATE items")
    env.run(env.pub, "INSERT INTO items (id, grp) VALUES (1, 1)")
    cycle(topo)
    assert env.rows(env.sub, "SELECT id FROM items") == [(1,)]
    assert_in_sync(topo)


def test_two_subscribers_are_delivered_in_parallel_spark_tasks(env2, spark):
    make_items(env2, 3000)
    topo = env2.topology(["public.items"])
    result = run_agent("snapshot", topo, "p", spark=spark)
    assert sorted(result["initialized"]) == ["sub1", "sub2"]
    env2.run(env2.pub, "UPDATE items SET grp = -1 WHERE id <= 500")
    run_agent("logreader", topo, "p")
    delivered = run_agent("distribution", topo, "p", spark=spark)
    assert [s["subscriber"] for s in delivered["subscriptions"]] == ["sub1", "sub2"]
    assert delivered["commands"] == 1000 and delivered["spark_application_id"]
    for sub in delivered["subscriptions"]:  # per-table counts come back from the Spark tasks too
        assert sub["tables"] == {
            "public.items": {"transactions": 1, "commands": 500, "last_xact_seqno": sub["last_xact_seqno"]}
        }
    assert_in_sync(topo, "sub1")
    assert_in_sync(topo, "sub2")


def test_multi_stream_agent_killed_repeatedly_applies_everything_exactly_once(env, spark, tmp_path, monkeypatch):
    import random

    topo = snapshotted_items(env, spark, 3000)
    count_applied_rows(env)
    for i in range(300):  # 300 transactions x 10 updates
        env.run(env.pub, "UPDATE items SET grp = grp + 1 WHERE id %% 300 = %s", (i,))
    log_reader_agent.run_log_reader(topo, "p")
    spec = spec_file(topo, tmp_path)
    state = lambda: env.rows(env.sub, "SELECT transactions FROM airflow_repl.subscription_state")[0][0]  # noqa: E731
    rng = random.Random(3)
    kills = 0
    for _ in range(6):
        before = state()
        proc = subprocess.Popen(
            [
                sys.executable,
                AGENT_RUNNER,
                "distribution",
                spec,
                json.dumps({"subscription_streams": 3, "commit_batch_size": 8}),
            ]
        )

        # once a batch committed, let the agent run on a random moment more
        def progressed(before: int = before) -> bool:
            if state() <= before:
                return False
            time.sleep(rng.uniform(0, 0.15))
            return True

        if not _kill_when(proc, progressed):
            break
        kills += 1
        # whatever the moment, the subscriber holds whole batches only (prepared ones aside)
        assert env.rows(env.sub, "SELECT count(*) FROM applied")[0][0] <= state() * 10 + 8 * 10
    assert kills >= 1
    # the killed runs may have delivered everything: 16 more transactions give this run work of
    # its own, and even a small last batch is spread, so that it too commits through two-phase commit
    for i in range(16):
        env.run(env.pub, "UPDATE items SET grp = grp + 1 WHERE id %% 300 = %s", (i,))
    log_reader_agent.run_log_reader(topo, "p")
    monkeypatch.setattr(stream_planning, "PARALLEL_MIN_COMMANDS", 2)
    monkeypatch.setattr(stream_planning, "ADAPTIVE_STREAMS", False)  # spread even if an earlier run found it slower
    result = distribution_agent.run_distribution(topo, "p", "sub1", subscription_streams=3, commit_batch_size=8)
    assert state() == 316
    assert env.rows(env.sub, "SELECT count(*) FROM applied")[0][0] == 3160
    assert env.rows(env.sub, "SELECT count(*) FROM pg_prepared_xacts") == [(0,)]
    assert 16 <= result["transactions"] < 316  # the killed runs had delivered the rest
    assert result["parallel_batches"] > 0  # batches of up to 80 commands on as many rows: spread, two-phase commit
    assert_in_sync(topo)


def test_recovery_of_prepared_stream_transactions(env, spark):
    """The watermark already reached the batch (stream 0 committed): the rest commit.  All
    streams prepared: commit.  Otherwise (prepare cut short, or a rollback of the batch cut
    short, stream 0 gone but the watermark behind): roll back."""
    snapshotted_items(env, spark, 10)
    env.run(env.sub, "UPDATE airflow_repl.subscription_state SET xact_seqno = '0/5000'")
    env.run(env.sub, "CREATE TABLE marks (batch text, stream int)")
    plan = {
        "x": ("0/5000", [1, 2], 3),
        "z": ("0/6000", [0, 1, 2], 3),
        "y": ("0/6000", [0, 1], 3),
        "w": ("0/7000", [1], 3),
    }
    for batch, (last, streams, total) in plan.items():
        for s in streams:
            with psycopg.connect(env.sub, autocommit=True) as conn:
                conn.execute("BEGIN")
                conn.execute("INSERT INTO marks VALUES (%s, %s)", (batch, s))
                conn.execute(f"PREPARE TRANSACTION 'airflow_repl|p|{batch}|{last}|{s}|{total}'")
    with psycopg.connect(env.sub, autocommit=True) as conn:  # another publication's: left alone
        conn.execute("BEGIN")
        conn.execute("INSERT INTO marks VALUES ('other', 0)")
        conn.execute("PREPARE TRANSACTION 'airflow_repl|q|v|0/1|0|2'")
    with psycopg.connect(env.sub) as conn:
        assert recover_prepared(conn, "p") == 8
    assert env.rows(env.sub, "SELECT batch, count(*) FROM marks GROUP BY batch ORDER BY batch") == [("x", 2), ("z", 3)]
    assert env.rows(env.sub, "SELECT gid FROM pg_prepared_xacts") == [("airflow_repl|q|v|0/1|0|2",)]


def test_a_second_distribution_agent_is_refused_while_one_runs(env, spark):
    topo = snapshotted_items(env, spark, 10)
    with psycopg.connect(env.sub, autocommit=True) as other:  # what a running agent holds
        other.execute("SELECT pg_advisory_lock(hashtext('airflow_repl.distribution.p'))")
        with pytest.raises(Exception, match="another Distribution Agent is delivering publication 'p'"):
            distribution_agent.run_distribution(topo, "p", "sub1")
    assert distribution_agent.run_distribution(topo, "p", "sub1")["transactions"] == 0


def test_a_lost_slot_is_never_silently_recreated(env, spark):
    topo = snapshotted_items(env, spark, 100)
    cycle(topo)
    env.run(
        env.pub,
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database()",
    )
    env.run(env.pub, "UPDATE items SET grp = -5 WHERE id <= 10")  # lost: no slot saw it
    with pytest.raises(NotInitialized, match="if the slot was dropped, its subscriptions must be reinitialized"):
        log_reader_agent.run_log_reader(topo, "p")
    with pytest.raises(ReplError, match=r"slot .* is missing at the publisher .* reinitialize for every subscription"):
        snapshot_agent.run_snapshot(topo, "p", spark)
    snapshot_agent.run_snapshot(topo, "p", spark, reinitialize=True)
    env.run(env.pub, "UPDATE items SET grp = -6 WHERE id <= 5")
    cycle(topo)
    assert_in_sync(topo)


def test_values_survive_different_session_settings_on_each_server(env, spark):
    """Text forms of dates, intervals and floats depend on session settings; the agents pin them."""
    for db, style in ((env.pub, "SQL, DMY"), (env.sub, "German, MDY")):
        name = env.rows(db, "SELECT current_database()")[0][0]
        env.run(db, f"ALTER DATABASE {name} SET DateStyle = '{style}'")
        env.run(db, f"ALTER DATABASE {name} SET IntervalStyle = 'sql_standard'")
        env.run(db, f"ALTER DATABASE {name} SET extra_float_digits = -3")
        env.run(db, f"ALTER DATABASE {name} SET TimeZone = 'Asia/Kolkata'")
    env.run(env.pub, "CREATE TABLE v (id int PRIMARY KEY, d date, ts timestamp, tz timestamptz, iv interval, f float8)")
    env.run(
        env.pub,
        "INSERT INTO v VALUES (1, '2024-01-02', '2024-01-02 03:04:05.678', '2024-01-02 03:04:05+02', "
        "'-1 day +02:03:04', 0.1::float8 + 0.2::float8)",
    )
    topo = env.topology(["v"])
    snapshot_agent.run_snapshot(topo, "p", spark)
    env.run(
        env.pub,
        "INSERT INTO v VALUES (2, '2024-12-31', '1999-02-03 00:00:01', '2024-07-08 09:10:11-05', "
        "'1 year -2 months 3 days -04:05:06', 1e-300)",
    )
    cycle(topo)
    assert_in_sync(topo)
    fmt = "SELECT id, d::text, ts::text, (tz AT TIME ZONE 'UTC')::text, iv = %s::interval, f FROM v ORDER BY id"
    for db in (env.pub, env.sub):
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("SET DateStyle = ISO; SET IntervalStyle = postgres; SET extra_float_digits = 3")
            rows = conn.execute(fmt.replace("%s", "'-1 day +02:03:04'")).fetchall()
        assert rows[0][:4] == (1, "2024-01-02", "2024-01-02 03:04:05.678", "2024-01-02 01:04:05") and rows[0][4]
        assert rows[0][5] == 0.1 + 0.2 and rows[1][1] == "2024-12-31" and rows[1][5] == 1e-300


def test_lost_replica_identity_full_stops_the_log_reader_with_the_fix(env, spark):
    topo = snapshotted_items(env, spark, 10)
    env.run(env.pub, "ALTER TABLE items REPLICA IDENTITY DEFAULT")
    env.run(env.pub, "DELETE FROM items WHERE id = 1")
    with pytest.raises(ReplError, match=r"table public.items .* without REPLICA IDENTITY FULL.*'airflow-repl apply'"):
        log_reader_agent.run_log_reader(topo, "p")
    assert env.rows(env.dist, "SELECT count(*) FROM airflow_repl.commands") == [(0,)]


def test_changing_an_article_of_a_live_publication_requires_reinitializing(env, spark):
    make_items(env, 20)
    env.run(env.pub, "CREATE TABLE extra (id int PRIMARY KEY)")
    snapshot_agent.run_snapshot(env.topology(["public.items"]), "p", spark)
    # an article added alone is copied on its own (test_add_article); a changed one needs everything again
    bigger = env.topology([{"table": "public.items", "row_filter": "id <> 2"}, "public.extra"])
    with pytest.raises(
        ReplError,
        match=r"articles of publication 'p' changed since subscriber\(s\) sub1 were "
        r"initialized: run the Snapshot Agent with reinitialize",
    ):
        snapshot_agent.run_snapshot(bigger, "p", spark)
    with pytest.raises(ReplError, match="changed since subscriber 'sub1' was initialized"):
        distribution_agent.run_distribution(bigger, "p", "sub1")
    snapshot_agent.run_snapshot(bigger, "p", spark, reinitialize=True)
    env.run(env.pub, "INSERT INTO extra VALUES (1); UPDATE items SET grp = 0 WHERE id = 3")
    cycle(bigger)
    assert_in_sync(bigger)
