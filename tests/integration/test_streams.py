"""Several subscription streams: delivery over several streams at a real subscriber (no lock
waits, no replays; limits checked up front).  The batch planner alone is in
``tests/unit/test_stream_planning.py``."""

from __future__ import annotations

import pytest

from airflow_repl.engine.agents import distribution_agent, log_reader_agent, snapshot_agent, stream_planning
from airflow_repl.engine.errors import ReplError


# ---------------------------------------------------------------------- real subscriber
def _make_kt(env, rows: int) -> None:
    """A table with a unique column beside its primary key."""
    env.run(env.pub, "CREATE TABLE kt (id int PRIMARY KEY, code text NOT NULL UNIQUE, v int)")
    env.run(env.pub, "INSERT INTO kt SELECT g, 'c' || g, 0 FROM generate_series(1, %s) g", (rows,))


def _key_updates(env, transactions: int, per_txn: int, rows: int) -> None:
    """Key updates, ``per_txn`` rows per transaction: each becomes a DELETE + INSERT pair
    carrying the same unique value (the case that made streams wait on each other's locks
    and replay)."""
    for i in range(transactions):
        env.run(
            env.pub,
            "UPDATE kt SET id = id + %s, v = v + 1 WHERE id %% %s = %s",
            (rows * 10, rows // per_txn, i % (rows // per_txn)),
        )


def test_key_updates_with_a_unique_column_on_three_streams_never_replay(env, spark, monkeypatch):
    monkeypatch.setattr(stream_planning, "ADAPTIVE_STREAMS", False)  # spread every batch, faster or not
    _make_kt(env, 2000)
    topo = env.topology(["kt"], subscription_streams=3)
    snapshot_agent.run_snapshot(topo, "p", spark)
    _key_updates(env, transactions=40, per_txn=50, rows=2000)
    read = log_reader_agent.run_log_reader(topo, "p")
    assert (read["transactions"], read["commands"]) == (40, 4000)
    result = distribution_agent.run_distribution(topo, "p", "sub1")
    assert (result["transactions"], result["commands"], result["retries"]) == (40, 4000, 0)
    assert result["parallel_batches"] == result["commits"] >= 4  # every batch spread over the streams
    assert env.rows(env.sub, "SELECT id, code, v FROM kt ORDER BY id") == env.rows(
        env.pub, "SELECT id, code, v FROM kt ORDER BY id"
    )
    assert env.rows(env.sub, "SELECT count(*) FROM pg_prepared_xacts") == [(0,)]
    history = env.rows(
        env.dist,
        "SELECT status, (details->>'retries')::int FROM airflow_repl.agent_history WHERE agent = 'distribution'",
    )
    assert history == [("succeeded", 0)]


def test_more_streams_than_the_subscriber_allows_are_refused_up_front(env, spark):
    _make_kt(env, 100)
    topo = env.topology(["kt"], subscription_streams=64)  # the topology allows 1-64
    snapshot_agent.run_snapshot(topo, "p", spark)
    _key_updates(env, transactions=5, per_txn=10, rows=100)
    log_reader_agent.run_log_reader(topo, "p")

    def state():
        return (
            env.rows(env.sub, "SELECT id, code, v FROM kt ORDER BY id"),
            env.rows(env.sub, "SELECT xact_seqno::text, transactions FROM airflow_repl.subscription_state"),
            env.rows(env.dist, "SELECT count(*) FROM airflow_repl.agent_history"),
            env.rows(env.dist, "SELECT count(*) FROM airflow_repl.errors"),
            env.rows(env.dist, "SELECT delivered_xact_seqno::text FROM airflow_repl.subscriptions"),
        )

    before = state()
    with pytest.raises(ReplError) as info:
        distribution_agent.run_distribution(topo, "p", "sub1")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("subscription_streams = 64 is more than subscriber 'sub1' can serve: it allows 20 (")
    assert "max_prepared_transactions 20" in message and "max_connections 100" in message
    assert message.endswith(
        "set subscription_streams of publication 'p' at subscriber 'sub1' to at most 20, "
        "or raise those settings at the subscriber"
    )
    after = state()
    # nothing changed but the refusal's own record: one blocked run and one error, with its line
    assert (after[0], after[1], after[4]) == (before[0], before[1], before[4])
    assert [r[0] for r in after[2] + after[3]] == [before[2][0][0] + 1, before[3][0][0] + 1]
    assert env.rows(
        env.dist, "SELECT status, message FROM airflow_repl.agent_history ORDER BY run_id DESC LIMIT 1"
    ) == [("blocked", message)]
    # within the limit, the same backlog is delivered
    assert distribution_agent.run_distribution(topo, "p", "sub1", subscription_streams=20)["transactions"] == 5
    assert env.rows(env.sub, "SELECT id, code, v FROM kt ORDER BY id") == env.rows(
        env.pub, "SELECT id, code, v FROM kt ORDER BY id"
    )
