"""Tracer tokens on real servers: posted at the publisher, read by the Log Reader, delivered in
commit order by the Distribution Agent to each subscriber, with the time of every hop recorded
(point-in-time delivery honoured), and the ``tracer`` command line."""

from __future__ import annotations

import json
import re
import time

import psycopg
import pytest
from harness import items_topology_file, setup_items

from airflow_repl import cli
from airflow_repl.engine.agents import distribution_agent, log_reader_agent
from airflow_repl.engine.errors import NotInitialized
from airflow_repl.engine.model import naming
from airflow_repl.engine.monitoring import tracer
from airflow_repl.engine.provisioning import deploy


def by_subscriber(topo, token_id):
    return {r.subscriber: r for r in tracer.tracer_history(topo, "p", token_id)}


def test_latency_is_recorded_for_every_hop_and_pending_until_delivered(env2, spark):
    topo = setup_items(env2, spark)
    env2.run(env2.pub, "UPDATE items SET v = 'before' WHERE id = 1")
    token = tracer.post_tracer_token(topo, "p")
    env2.run(env2.pub, "UPDATE items SET v = 'after' WHERE id = 2")
    posted = by_subscriber(topo, token)
    assert set(posted) == {"sub1", "sub2"}
    assert all(
        r.distributor_at is None and r.publisher_to_distributor is None and r.total is None for r in posted.values()
    )
    # the token changed no table: its transaction is a logical message only
    assert env2.rows(env2.pub, "SELECT count(*) FROM items WHERE v IN ('before', 'after')") == [(2,)]

    read = log_reader_agent.run_log_reader(topo, "p")
    assert read["transactions"] == 3 and read["commands"] == 2  # the token's transaction has no command
    (xact, count) = env2.rows(
        env2.dist,
        "SELECT t.xact_seqno::text, t.command_count FROM airflow_repl.tracer_tokens AS k "
        "JOIN airflow_repl.transactions AS t ON t.xact_seqno = k.xact_seqno WHERE k.token_id = %s",
        (token,),
    )[0]
    assert count == 0
    after_read = by_subscriber(topo, token)
    assert all(r.publisher_to_distributor >= 0 and r.subscriber_at is None for r in after_read.values())

    first = distribution_agent.run_distribution(topo, "p", "sub1")
    assert first["transactions"] == 3 and first["commands"] == 2
    one = by_subscriber(topo, token)
    assert one["sub1"].distributor_to_subscriber >= 0 and one["sub2"].subscriber_at is None
    assert one["sub1"].total == pytest.approx(
        one["sub1"].publisher_to_distributor + one["sub1"].distributor_to_subscriber, abs=0.002
    )
    assert env2.rows(
        env2.subs["sub1"], "SELECT xact_seqno > %s::pg_lsn FROM airflow_repl.subscription_state", (xact,)
    ) == [(True,)]  # delivered past the token, to the change committed after it

    distribution_agent.run_distribution(topo, "p", "sub2")
    both = by_subscriber(topo, token)
    assert all(r.subscriber_at is not None and r.subscriber_at >= r.distributor_at for r in both.values())
    # recorded once: another run changes nothing
    distribution_agent.run_distribution(topo, "p", "sub1")
    assert by_subscriber(topo, token)["sub1"].subscriber_at == both["sub1"].subscriber_at


def test_a_token_alone_is_delivered_and_moves_the_watermark(env, spark):
    topo = setup_items(env, spark)
    token = tracer.post_tracer_token(topo, "p")
    log_reader_agent.run_log_reader(topo, "p")
    delivered = distribution_agent.run_distribution(topo, "p", "sub1")
    assert (delivered["transactions"], delivered["commands"]) == (1, 0)
    (xact,) = env.rows(
        env.dist, "SELECT xact_seqno::text FROM airflow_repl.tracer_tokens WHERE token_id = %s", (token,)
    )[0]
    assert env.rows(env.sub, "SELECT xact_seqno::text FROM airflow_repl.subscription_state") == [(xact,)]
    assert by_subscriber(topo, token)["sub1"].subscriber_at is not None


def test_point_in_time_delivery_does_not_record_a_later_token(env, spark):
    topo = setup_items(env, spark)
    early = tracer.post_tracer_token(topo, "p")
    time.sleep(0.05)
    cut = env.rows(env.pub, "SELECT clock_timestamp()")[0][0]
    time.sleep(0.05)
    late = tracer.post_tracer_token(topo, "p")
    log_reader_agent.run_log_reader(topo, "p")
    assert distribution_agent.run_distribution(topo, "p", "sub1", until=cut.isoformat())["transactions"] == 1
    assert by_subscriber(topo, early)["sub1"].subscriber_at is not None
    assert by_subscriber(topo, late)["sub1"].subscriber_at is None  # committed after --until: pending
    distribution_agent.run_distribution(topo, "p", "sub1")
    assert by_subscriber(topo, late)["sub1"].subscriber_at is not None


def test_a_token_of_another_publication_is_not_read_as_this_ones(env, spark):
    topo = setup_items(env, spark)
    env.run(
        env.pub,
        "SELECT pg_logical_emit_message(true, %s, json_build_object('token_id', 999, 'publication', 'other', "
        "'posted_at', now())::text)",
        (naming.TRACER_MESSAGE,),
    )
    env.run(env.pub, "SELECT pg_logical_emit_message(true, %s, 'not json')", (naming.TRACER_MESSAGE,))
    assert log_reader_agent.run_log_reader(topo, "p")["transactions"] == 0
    assert env.rows(env.dist, "SELECT count(*) FROM airflow_repl.tracer_tokens") == [(0,)]


def test_a_token_whose_row_was_lost_is_entered_by_the_log_reader(env, spark):
    topo = setup_items(env, spark)
    token = tracer.post_tracer_token(topo, "p")
    posted_at = env.rows(env.dist, "SELECT posted_at FROM airflow_repl.tracer_tokens")[0][0]
    env.run(env.dist, "DELETE FROM airflow_repl.tracer_tokens")  # as if the posting's clean-up had run
    log_reader_agent.run_log_reader(topo, "p")
    distribution_agent.run_distribution(topo, "p", "sub1")
    row = by_subscriber(topo, token)["sub1"]
    assert row.posted_at == posted_at and row.subscriber_at is not None


def test_posting_needs_a_slot_and_changes_nothing_without_one(env):
    env.run(env.pub, "CREATE TABLE items (id int PRIMARY KEY, v text)")
    topo = env.topology(["public.items"])
    with pytest.raises(NotInitialized, match="not deployed"):
        tracer.post_tracer_token(topo, "p")
    deploy.apply_topology(topo)
    with pytest.raises(NotInitialized, match=r"no replication slot .* run the Snapshot Agent"):
        tracer.post_tracer_token(topo, "p")
    assert env.rows(env.dist, "SELECT count(*) FROM airflow_repl.tracer_tokens") == [(0,)]


def test_tracer_cli_posts_and_shows_history(env2, spark, tmp_path, capsys):
    setup_items(env2, spark)
    path = items_topology_file(env2, tmp_path)
    assert cli.main(["tracer", "post", "-t", path, "-p", "p"]) == 0
    token = int(capsys.readouterr().out.strip())
    assert cli.main(["logreader", "-t", path]) == 0
    assert cli.main(["distribution", "-t", path, "--subscriber", "sub1"]) == 0
    capsys.readouterr()
    assert cli.main(["tracer", "history", "-t", path, "-p", "p"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == [
        "token",
        "subscriber",
        "posted",
        "at",
        "publisher->distributor",
        "distributor->subscriber",
        "total",
    ]
    sub1 = next(line for line in table if " sub1 " in line)
    sub2 = next(line for line in table if " sub2 " in line)
    assert sub1.startswith(str(token)) and len(re.findall(r"\b\d+\.\d{3} s\b", sub1)) == 3 and "pending" not in sub1
    assert sub2.count("pending") == 2  # read, not delivered to sub2 yet
    assert cli.main(["tracer", "history", "-t", path, "--token", str(token), "-o", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["token_id"], r["subscriber"]) for r in rows] == [(token, "sub1"), (token, "sub2")]
    assert rows[1]["distributor_to_subscriber"] is None and rows[0]["total"] >= 0
    assert cli.main(["tracer", "history", "-t", path, "--token", "424242"]) == 3
    assert "has no tracer token 424242" in capsys.readouterr().err
    assert cli.main(["tracer", "post", "-t", path, "-p", "nope"]) == 2
    assert capsys.readouterr().err.startswith("airflow-repl: error: ")
    assert cli.main(["tracer", "post", "-t", path, "--token", "1"]) == 2
    assert "options of 'tracer history'" in capsys.readouterr().err
    assert env2.rows(env2.dist, "SELECT count(*) FROM airflow_repl.tracer_tokens") == [(1,)]  # nothing posted


def test_a_failed_posting_leaves_no_token_behind(env, spark, monkeypatch):
    topo = setup_items(env, spark)

    def publisher_goes_away(pub, token_id, publication):
        assert env.rows(env.dist, "SELECT token_id FROM airflow_repl.tracer_tokens") == [(token_id,)]  # row first
        pub.close()
        pub.execute("SELECT 1")  # the publisher connection is gone: psycopg raises

    monkeypatch.setattr(tracer, "_emit", publisher_goes_away)
    with pytest.raises(psycopg.OperationalError):
        tracer.post_tracer_token(topo, "p")
    assert env.rows(env.dist, "SELECT count(*) FROM airflow_repl.tracer_tokens") == [(0,)]
    monkeypatch.undo()
    token = tracer.post_tracer_token(topo, "p")  # the next one works
    log_reader_agent.run_log_reader(topo, "p")
    assert by_subscriber(topo, token)["sub1"].distributor_at is not None


def test_a_delivery_left_unrecorded_is_recorded_by_the_next_run(env, spark):
    topo = setup_items(env, spark)
    token = tracer.post_tracer_token(topo, "p")
    log_reader_agent.run_log_reader(topo, "p")
    distribution_agent.run_distribution(topo, "p", "sub1")
    # as if the run had stopped after the subscriber's commit, before the distributor's record
    env.run(
        env.dist,
        "DELETE FROM airflow_repl.tracer_history; "
        "UPDATE airflow_repl.subscriptions SET delivered_xact_seqno = start_xact_seqno",
    )
    assert by_subscriber(topo, token)["sub1"].subscriber_at is None
    assert distribution_agent.run_distribution(topo, "p", "sub1")["transactions"] == 0  # nothing applied again
    assert by_subscriber(topo, token)["sub1"].subscriber_at is not None
    assert env.rows(env.dist, "SELECT delivered_xact_seqno::text FROM airflow_repl.subscriptions") == env.rows(
        env.sub, "SELECT xact_seqno::text FROM airflow_repl.subscription_state"
    )
