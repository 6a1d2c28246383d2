"""The Queue Reader and the Distribution Agent take turns at a queued subscriber (one batch, one
queued transaction: ``subscriber_writer``), so either can run continuously beside the other;
the Queue Reader's continuous mode, on real servers."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from harness import (
    AGENT_RUNNER,
    AgentThread,
    assert_in_sync,
    item_rows,
    queue_counts,
    setup_queued,
    spec_file,
    wait_for,
)

from airflow_repl.engine.agents import distribution_agent, log_reader_agent, queue_reader_agent, snapshot_agent
from airflow_repl.engine.errors import ReplError
from airflow_repl.jobs import agent_job

POLL = 0.1
#: what an agent holds during its turn at the subscriber (a batch, a queued transaction)
WRITER_LOCK = "SELECT pg_advisory_lock(hashtext('airflow_repl.subscriber_writer.p'))"
#: what a Distribution Agent holds for its whole run (also between batches of a continuous run)
DISTRIBUTION_RUN_LOCK = "SELECT pg_advisory_lock(hashtext('airflow_repl.distribution.p'))"


def _history(env, agent: str) -> list[tuple]:
    return env.rows(
        env.dist,
        "SELECT status, transactions FROM airflow_repl.agent_history WHERE agent = %s ORDER BY run_id",
        (agent,),
    )


def test_the_queue_reader_waits_for_a_distribution_batch_and_is_not_kept_out_by_a_running_agent(env, spark):
    topo = setup_queued(env, spark)
    env.run(env.sub, "UPDATE items SET v = 'sub' WHERE id = 1")
    with psycopg.connect(env.sub, autocommit=True) as other:
        other.execute(DISTRIBUTION_RUN_LOCK)  # a (continuous) Distribution Agent's run: no longer refuses
        other.execute(WRITER_LOCK)  # ... in the middle of a batch: the Queue Reader waits for its commit
        reader = AgentThread(queue_reader_agent.run_queue_reader, topo, "p", "sub1")
        reader.start()
        time.sleep(1.5)
        assert reader.is_alive() and reader.error is None
        assert queue_counts(env.sub) == (1, 1)  # nothing taken while the batch is being applied
        assert env.rows(env.pub, "SELECT v FROM items WHERE id = 1") == [("v1",)]
        other.execute("SELECT pg_advisory_unlock(hashtext('airflow_repl.subscriber_writer.p'))")  # committed
        reader.join(30)
    assert reader.error is None and reader.summary is not None
    assert (reader.summary["transactions"], reader.summary["queued"]) == (1, 0)
    assert env.rows(env.pub, "SELECT v FROM items WHERE id = 1") == [("sub",)]
    assert _history(env, "queuereader") == [("succeeded", 1)]


def test_a_distribution_batch_waits_for_the_queue_readers_transaction(env, spark):
    topo = setup_queued(env, spark)
    env.run(env.pub, "UPDATE items SET v = 'pub' WHERE id = 2")
    assert log_reader_agent.run_log_reader(topo, "p")["transactions"] == 1
    with psycopg.connect(env.sub, autocommit=True) as other:
        other.execute(WRITER_LOCK)  # the Queue Reader in the middle of a queued transaction
        delivery = AgentThread(distribution_agent.run_distribution, topo, "p", "sub1")
        delivery.start()
        time.sleep(1.5)
        assert delivery.is_alive() and delivery.error is None
        assert env.rows(env.sub, "SELECT v FROM items WHERE id = 2") == [("v2",)]  # not applied meanwhile
        other.execute("SELECT pg_advisory_unlock(hashtext('airflow_repl.subscriber_writer.p'))")
        delivery.join(30)
    assert delivery.error is None and delivery.summary is not None and delivery.summary["transactions"] == 1
    assert env.rows(env.sub, "SELECT v FROM items WHERE id = 2") == [("pub",)]
    assert_in_sync(topo)


def test_an_agent_starting_next_to_running_ones_takes_no_table_lock_for_a_current_schema(env):
    """A Queue Reader starting while a Distribution Agent is inside a batch (its transaction holds
    the subscription's row) ran the distribution schema's DDL, whose ALTER TABLEs take ACCESS
    EXCLUSIVE locks even when they change nothing: it waited for that transaction, and could
    deadlock with it (seen in CI).  A current schema (its recorded version) now runs nothing; an
    outdated one is brought up to date and recorded."""
    from airflow_repl.engine.state import dist_schema

    latest = len(dist_schema.MIGRATIONS)
    with psycopg.connect(env.dist, autocommit=True) as conn:
        dist_schema.ensure_schema(conn)
        assert env.rows(env.dist, "SELECT max(version) FROM airflow_repl.schema_version") == [(latest,)]
        with psycopg.connect(env.dist) as batch:  # a Distribution Agent inside a batch
            batch.execute("SELECT status FROM airflow_repl.subscriptions FOR SHARE")
            conn.execute("SET lock_timeout = '2s'")
            dist_schema.ensure_schema(conn)  # returns at once
            with pytest.raises(psycopg.errors.LockNotAvailable):
                conn.execute(dist_schema.MIGRATIONS[0].sql)  # the DDL itself waits for the batch
            batch.rollback()
        conn.execute("DELETE FROM airflow_repl.schema_version WHERE version >= 5")  # an older version
        conn.execute("ALTER TABLE airflow_repl.subscriptions DROP COLUMN initialized_at")
        dist_schema.ensure_schema(conn)
    assert env.rows(env.dist, "SELECT max(version) FROM airflow_repl.schema_version") == [(latest,)]
    assert env.rows(
        env.dist,
        "SELECT count(*) FROM information_schema.columns WHERE table_schema = 'airflow_repl' "
        "AND table_name = 'subscriptions' AND column_name = 'initialized_at'",
    ) == [(1,)]


def test_every_agent_continuous_at_once_converges_with_writers_at_the_publisher_and_both_subscribers(env2, spark):
    """Log Reader, a Distribution Agent per subscriber and a Queue Reader per subscriber, all
    continuous in one window, while the publisher and both subscribers write, one row on all
    three: everything ends equal everywhere, with every queue empty, before the window ends."""
    topo = setup_queued(env2, spark, "pub wins")
    subs = env2.subs
    window = {"continuous": True, "poll_interval": POLL, "max_run_seconds": 12}
    agents = [AgentThread(log_reader_agent.run_log_reader, topo, "p", **window)]
    for name in subs:
        agents.append(AgentThread(distribution_agent.run_distribution, topo, "p", name, **window))
        agents.append(AgentThread(queue_reader_agent.run_queue_reader, topo, "p", name, **window))
    for agent in agents:
        agent.start()
    time.sleep(1)
    for i in range(10):  # interleaved waves: publisher rows 1-10, sub1's 11-20, sub2's 21-30, and row 40 on all three
        env2.run(env2.pub, "UPDATE items SET v = 'pub', n = n + 1 WHERE id = %s", (1 + i,))
        env2.run(subs["sub1"], "UPDATE items SET v = 'one', n = n + 1 WHERE id = %s", (11 + i,))
        env2.run(subs["sub2"], "UPDATE items SET v = 'two', n = n + 1 WHERE id = %s", (21 + i,))
        env2.run(subs["sub2"], "INSERT INTO items (id, v, n) VALUES (%s, 'new', 0)", (100 + i,))
        env2.run([env2.pub, subs["sub1"], subs["sub2"]][i % 3], "UPDATE items SET v = %s WHERE id = 40", (f"w{i}",))
        time.sleep(0.05)

    def converged() -> bool:
        data = [
            {k: v[:2] for k, v in item_rows(c).items()} for c in (env2.pub, subs["sub1"], subs["sub2"])
        ]  # (v, n): the row versions are the publisher's business
        return data[0] == data[1] == data[2] and queue_counts(subs["sub1"]) == queue_counts(subs["sub2"]) == (0, 0)

    took = wait_for(converged, 10)
    for agent in agents:
        agent.join(40)
    assert all(a.error is None and a.summary is not None for a in agents), [a.error for a in agents]
    assert took is not None, "the subscribers did not converge while every agent ran continuously"
    assert all(a.summary["continuous"]["ended_by"] == "max_run_seconds" for a in agents)  # type: ignore[index]
    published = item_rows(env2.pub)
    assert {published[i][0] for i in range(1, 11)} == {"pub"}
    assert {published[i][0] for i in range(11, 21)} == {"one"}
    assert {published[i][0] for i in range(21, 31)} == {"two"} and len(published) == 60
    readers = [a.summary for a in agents if a.func is queue_reader_agent.run_queue_reader]
    # sub1: rows 11-20 and 3 of row 40's; sub2: rows 21-30, 10 inserts and 3 of row 40's
    assert sum(r["transactions"] for r in readers) == 36  # type: ignore[index]
    for name in subs:
        assert_in_sync(topo, name)


def test_sigterm_ends_a_continuous_queue_reader_cleanly_and_nothing_is_taken_twice(env, spark, tmp_path):
    topo = setup_queued(env, spark)
    kwargs = json.dumps({"continuous": True, "poll_interval": POLL, "max_run_seconds": 120})
    proc = subprocess.Popen(
        [sys.executable, AGENT_RUNNER, "queuereader", spec_file(topo, tmp_path), kwargs],
        stdout=subprocess.PIPE,
        text=True,
    )
    for i in range(1, 6):
        env.run(env.sub, "UPDATE items SET n = n + 1 WHERE id = %s", (i,))
    taken = lambda: queue_counts(env.sub) == (0, 0)  # noqa: E731
    assert wait_for(taken, 60) is not None
    env.run(env.sub, "UPDATE items SET n = n + 1 WHERE id = 1")
    assert wait_for(taken, 60) is not None  # a later change, taken by the same run
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    summary = json.loads(out)
    assert summary["continuous"]["ended_by"] == "SIGTERM"
    assert (summary["transactions"], summary["conflicts"], summary["queued"]) == (6, 0, 0)
    assert summary["continuous"]["rounds"] >= 1
    assert {i: r[1] for i, r in item_rows(env.pub, "id <= 5").items()} == {1: 2, 2: 1, 3: 1, 4: 1, 5: 1}
    assert _history(env, "queuereader") == [("succeeded", 6)]
    again = queue_reader_agent.run_queue_reader(topo, "p", "sub1")
    assert again["transactions"] == 0 and again["message"] == "the queue is empty; nothing to apply"


def test_the_job_runs_a_continuous_queue_reader_to_its_maximum_run_time(env, spark, tmp_path):
    """What the operator runs: ``agent_job.py queuereader --continuous ...`` (spark-submit's
    Python driver, here started directly)."""
    topo = setup_queued(env, spark)
    env.run(env.sub, "UPDATE items SET v = 'sub' WHERE id = 4")
    result = tmp_path / "result.json"
    argv = [
        sys.executable,
        str(Path(agent_job.__file__).resolve()),
        "queuereader",
        "--spec",
        spec_file(topo, tmp_path),
    ]
    argv += ["--result", str(result), "--publication", "p", "--continuous", "--poll-interval", str(POLL)]
    done = subprocess.run([*argv, "--max-run-seconds", "3"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    outcome = json.loads(result.read_text())
    assert outcome["status"] == "succeeded" and outcome["transactions"] == 1
    (sub,) = outcome["subscriptions"]
    assert sub["subscriber"] == "sub1" and sub["continuous"]["ended_by"] == "max_run_seconds"
    assert env.rows(env.pub, "SELECT v FROM items WHERE id = 4") == [("sub",)]


def test_a_continuous_queue_reader_ends_when_the_articles_change(env, spark):
    topo = setup_queued(env, spark)
    reader = AgentThread(queue_reader_agent.run_queue_reader, topo, "p", "sub1", continuous=True, poll_interval=POLL)
    reader.start()
    env.run(env.sub, "UPDATE items SET v = 'sub' WHERE id = 3")
    assert wait_for(lambda: queue_counts(env.sub) == (0, 0), 30) is not None
    # what `airflow-repl apply` stores when the article gets a row filter
    env.run(
        env.dist, "UPDATE airflow_repl.articles SET definition = jsonb_set(definition, '{row_filter}', '\"id > 0\"')"
    )
    reader.join(30)
    assert not reader.is_alive(), "the continuous run did not notice the changed articles"
    assert reader.error is None and reader.summary is not None
    assert reader.summary["continuous"]["ended_by"] == "article definitions changed"
    assert reader.summary["transactions"] == 1


def test_continuous_queue_reader_options_are_checked_before_anything_runs(env, spark):
    topo = setup_queued(env, spark)
    with pytest.raises(ReplError, match="max_transactions and continuous cannot be combined"):
        queue_reader_agent.run_queue_reader(topo, "p", "sub1", continuous=True, max_transactions=1)
    with pytest.raises(ReplError, match="poll_interval apply to continuous runs only"):
        queue_reader_agent.run_queue_reader(topo, "p", "sub1", poll_interval=1)
    assert _history(env, "queuereader") == []


def test_a_snapshot_of_a_queued_subscriber_takes_the_turn_before_its_consistent_point(env, spark):
    """A queued transaction applied at the publisher after the snapshot's consistent point would
    be lost to the reinitialized subscriber (not in the snapshot, and its own change is never
    delivered back): the Snapshot Agent waits for the turn before it creates its slot."""
    topo = setup_queued(env, spark)
    before = env.rows(env.dist, "SELECT snapshot_id, status FROM airflow_repl.subscriptions")
    with psycopg.connect(env.sub, autocommit=True) as other:
        other.execute(WRITER_LOCK)  # a Queue Reader in the middle of a queued transaction
        snap = AgentThread(snapshot_agent.run_snapshot, topo, "p", spark, reinitialize=True)
        snap.start()
        time.sleep(1.5)
        assert snap.is_alive() and snap.error is None
        assert env.rows(env.dist, "SELECT snapshot_id, status FROM airflow_repl.subscriptions") == before
        other.execute("SELECT pg_advisory_unlock(hashtext('airflow_repl.subscriber_writer.p'))")
        snap.join(120)
    assert snap.error is None and snap.summary is not None and snap.summary["initialized"] == ["sub1"]
    (after,) = env.rows(env.dist, "SELECT snapshot_id, status FROM airflow_repl.subscriptions")
    assert after != before[0] and after[1] == "active"
    assert_in_sync(topo)


def test_reinitializing_beside_a_continuous_queue_reader_loses_nothing(env, spark):
    """Queued transactions waiting while a reinitialization starts: each is either applied at
    the publisher before the snapshot's consistent point (and so in the snapshot) or given up
    with the queue; the subscriber ends equal to the publisher either way."""
    topo = setup_queued(env, spark)
    window = {"continuous": True, "poll_interval": POLL, "max_run_seconds": 12}
    with psycopg.connect(env.sub, autocommit=True) as other:
        other.execute(WRITER_LOCK)  # hold the queue back until the reinitialization starts too
        for i in range(1, 6):
            env.run(env.sub, "UPDATE items SET v = 'sub', n = n + 1 WHERE id = %s", (i,))
        agents = [
            AgentThread(queue_reader_agent.run_queue_reader, topo, "p", "sub1", **window),
            AgentThread(log_reader_agent.run_log_reader, topo, "p", **window),
            AgentThread(distribution_agent.run_distribution, topo, "p", "sub1", **window),
        ]
        for agent in agents:
            agent.start()
        snap = AgentThread(snapshot_agent.run_snapshot, topo, "p", spark, reinitialize=True)
        snap.start()
        time.sleep(0.5)
        other.execute("SELECT pg_advisory_unlock(hashtext('airflow_repl.subscriber_writer.p'))")
        snap.join(120)
    assert snap.error is None, snap.error

    def converged() -> bool:
        return {k: v[:2] for k, v in item_rows(env.sub).items()} == {k: v[:2] for k, v in item_rows(env.pub).items()}

    took = wait_for(lambda: converged() and queue_counts(env.sub) == (0, 0), 10)
    for agent in agents:
        agent.join(40)
    assert all(a.error is None for a in agents), [a.error for a in agents]
    assert took is not None, "the reinitialized subscriber and the publisher differ"
    assert_in_sync(topo)
