"""Queued updating subscriptions end to end on real servers: the subscriber's queue, the Queue
Reader Agent (exactly once, in commit order, killed and re-run), conflicts under each policy,
and loop prevention (a change never comes back to the subscriber it came from)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import psycopg
import pytest
from harness import QUEUED_ROWS, assert_in_sync, item_rows, queue_counts, resolved_topology, setup_queued

from airflow_repl.engine.agents import distribution_agent, log_reader_agent, queue_reader_agent, snapshot_agent
from airflow_repl.engine.model import naming
from airflow_repl.engine.state import dist_conflicts, dist_subscriptions
from airflow_repl.jobs.agent_job import run_agent


def cycle(topo, *subscribers):
    read = log_reader_agent.run_log_reader(topo, "p")
    return read, [distribution_agent.run_distribution(topo, "p", s) for s in subscribers]


def conflicts(env):
    with psycopg.connect(env.dist, autocommit=True) as conn:
        return dist_conflicts.list_conflicts(conn, publication="p")


# ---------------------------------------------------------------------- the queue and loop prevention
def test_queued_change_reaches_publisher_and_other_subscriber_once_and_not_its_origin(env2, spark):
    topo = setup_queued(env2, spark)
    sub1, sub2 = env2.subs["sub1"], env2.subs["sub2"]
    with psycopg.connect(sub1) as conn:  # one subscriber transaction of three changes
        conn.execute("UPDATE items SET v = 'from sub1' WHERE id = 1")
        conn.execute("INSERT INTO items (id, v, n) VALUES (1000, 'new at sub1', 0)")
        conn.execute("DELETE FROM items WHERE id = 2")
    env2.run(sub1, "UPDATE items SET n = n + 1 WHERE id = 3")
    assert queue_counts(sub1) == (2, 4)
    assert queue_counts(sub2) == (0, 0)

    result = queue_reader_agent.run_queue_reader(topo, "p", "sub1")
    assert (result["transactions"], result["commands"], result["conflicts"], result["queued"]) == (2, 4, 0, 0)
    assert queue_counts(sub1) == (0, 0)
    assert item_rows(env2.pub) == item_rows(sub1)  # values and row versions
    assert item_rows(env2.pub, "id = 1")[1][0] == "from sub1" and 2 not in item_rows(env2.pub)

    read, (back, other) = cycle(topo, "sub1", "sub2")
    assert read["transactions"] == 2
    origins = env2.rows(env2.dist, "SELECT origin FROM airflow_repl.transactions ORDER BY xact_seqno")
    assert origins == [(naming.queue_origin("sub1"),)] * 2
    # each carries its own commit time at the publisher (not one stale origin timestamp for both,
    # nor PostgreSQL's epoch 2000-01-01 of an unset one)
    times = [
        t for (t,) in env2.rows(env2.dist, "SELECT commit_time FROM airflow_repl.transactions ORDER BY xact_seqno")
    ]
    [(now,)] = env2.rows(env2.pub, "SELECT now()")
    assert now - timedelta(minutes=10) < times[0] < times[1] <= now, times
    assert (back["transactions"], back["own_queued"]) == (0, 2)  # not applied at its origin
    assert (other["transactions"], other["own_queued"]) == (2, 0)  # applied once at the other subscriber
    assert_in_sync(topo, "sub1")
    assert_in_sync(topo, "sub2")
    assert result["forgotten"] == 2  # the queue is empty: the publisher's record of it is pruned
    assert env2.rows(env2.pub, "SELECT count(*) FROM airflow_repl.queue_applied")[0][0] == 0
    again = queue_reader_agent.run_queue_reader(topo, "p", "sub1")
    assert again["transactions"] == 0 and again["message"] == "the queue is empty; nothing to apply"
    # a publisher change after the queued ones still reaches both
    env2.run(env2.pub, "UPDATE items SET v = 'pub' WHERE id = 5")
    _, delivered = cycle(topo, "sub1", "sub2")
    assert [d["transactions"] for d in delivered] == [1, 1]
    assert item_rows(sub1) == item_rows(sub2) == item_rows(env2.pub)


def test_replicated_and_snapshot_rows_are_not_queued(env, spark):
    topo = setup_queued(env, spark)
    assert queue_counts(env.sub) == (0, 0)  # the snapshot load
    env.run(env.pub, "UPDATE items SET v = 'x' WHERE id <= 10")
    cycle(topo, "sub1")
    assert queue_counts(env.sub) == (0, 0)  # the Distribution Agent's applies
    env.run(env.sub, "UPDATE items SET v = 'local' WHERE id = 1")
    assert queue_counts(env.sub) == (1, 1)


def test_queue_order_is_commit_order(env, spark):
    topo = setup_queued(env, spark)
    first, second = psycopg.connect(env.sub), psycopg.connect(env.sub)
    try:
        first.execute("UPDATE items SET v = 'first' WHERE id = 1")  # started first ...
        second.execute("UPDATE items SET v = 'second' WHERE id = 2")
        second.commit()  # ... committed last
        first.commit()
    finally:
        first.close()
        second.close()
    order = env.rows(
        env.sub,
        "SELECT q.article, q.new->>'v' FROM airflow_repl.queue q JOIN airflow_repl.queue_commits c "
        "USING (publication, xid) ORDER BY c.commit_seq",
    )
    assert [v for _, v in order] == ["second", "first"]
    queue_reader_agent.run_queue_reader(topo, "p", "sub1")
    assert item_rows(env.pub, "id <= 2") == item_rows(env.sub, "id <= 2")


# ---------------------------------------------------------------------- conflicts, per policy
#: kind -> (change at the subscriber, change at the publisher)
CONFLICTS = {
    "update/update": ("UPDATE items SET v = 'sub' WHERE id = 1", "UPDATE items SET v = 'pub' WHERE id = 1"),
    "update/delete": ("UPDATE items SET v = 'sub' WHERE id = 1", "DELETE FROM items WHERE id = 1"),
    "delete/update": ("DELETE FROM items WHERE id = 1", "UPDATE items SET v = 'pub' WHERE id = 1"),
    "insert/insert": (
        "INSERT INTO items (id, v, n) VALUES (1, 'sub', 0)",
        "INSERT INTO items (id, v) VALUES (1, 'pub')",
    ),
}
#: (kind, policy) -> row 1's v everywhere at the end (None: no row)
FINAL = {
    ("update/update", "pub wins"): "pub",
    ("update/update", "sub wins"): "sub",
    ("update/delete", "pub wins"): None,
    ("update/delete", "sub wins"): "sub",
    ("delete/update", "pub wins"): "pub",
    ("delete/update", "sub wins"): None,
    ("insert/insert", "pub wins"): "pub",
    ("insert/insert", "sub wins"): "sub",
}


@pytest.mark.parametrize("policy", ["pub wins", "sub wins", "sub reinit"])
@pytest.mark.parametrize("kind", list(CONFLICTS))
def test_conflict_is_detected_recorded_and_resolved_by_the_policy(env, spark, kind, policy):
    # the publisher's own change may reach the subscriber after the queued one was decided: it
    # then meets a missing row or a duplicate key there, and converges (no skip_errors needed)
    topo = setup_queued(env, spark, policy)
    if kind == "insert/insert":
        env.run(env.pub, "DELETE FROM items WHERE id = 1")
        cycle(topo, "sub1")
    at_sub, at_pub = CONFLICTS[kind]
    env.run(env.sub, at_sub)
    env.run(env.pub, at_pub)
    before_pub = item_rows(env.pub, "id = 1")

    result = queue_reader_agent.run_queue_reader(topo, "p", "sub1")
    assert result["conflicts"] == 1
    (found,) = [c for c in conflicts(env) if c["agent"] == "queuereader"]
    assert (found["subscriber"], found["article"], found["key"], found["kind"]) == ("sub1", "items", {"id": 1}, kind)
    assert found["policy"] == policy
    assert (found["publisher_row"] or {}).get("v") == (before_pub[1][0] if before_pub else None)
    assert (found["subscriber_row"] or {}).get("v") == ("sub" if kind != "delete/update" else None)

    if policy == "sub reinit":
        assert "reinitialize" in found["outcome"] and result["reinitialize"] is True
        with psycopg.connect(env.dist, autocommit=True) as conn:
            assert dist_subscriptions.subscription_status(conn, "p", "sub1") == "reinitialize"
        assert item_rows(env.pub, "id = 1") == before_pub  # not applied
        idle = queue_reader_agent.run_queue_reader(topo, "p", "sub1")
        assert idle["transactions"] == 0 and "reinitialization" in idle["message"]
        log_reader_agent.run_log_reader(topo, "p")
        snap = snapshot_agent.run_snapshot(topo, "p", spark)  # the next snapshot run reinitializes it
        assert snap["initialized"] == ["sub1"]
        assert queue_counts(env.sub) == (0, 0)
        assert_in_sync(topo)
        return
    assert found["outcome"].startswith("publisher wins" if policy == "pub wins" else "subscriber wins")
    cycle(topo, "sub1")
    expected = FINAL[(kind, policy)]
    for conninfo in (env.pub, env.sub):
        final = item_rows(conninfo, "id = 1")
        assert (final[1][0] if final else None) == expected
    assert_in_sync(topo)


# ---------------------------------------------------------------------- delivery to a queued subscriber
def delivered_conflicts(env):
    return [(c["kind"], c["key"], c["outcome"]) for c in conflicts(env) if c["agent"] == "distribution"]


@pytest.mark.parametrize("policy", ["pub wins", "sub wins"])
def test_a_row_with_a_queued_change_is_kept_and_decided_by_the_queue_reader(env, spark, policy):
    topo = setup_queued(env, spark, policy)
    env.run(env.sub, "INSERT INTO items (id, v, n) VALUES (1000, 'sub', 0)")  # queued
    env.run(env.pub, "INSERT INTO items (id, v) VALUES (1000, 'pub')")
    env.run(env.pub, "DELETE FROM items WHERE id = 1000")  # the publisher ends without the row
    env.run(env.sub, "UPDATE items SET v = 'sub' WHERE id = 1")  # queued
    env.run(env.pub, "UPDATE items SET v = 'pub' WHERE id = 1")
    env.run(env.pub, "UPDATE items SET v = 'pub' WHERE id = 2")  # no queued change: delivered as usual
    _, (delivered,) = cycle(topo, "sub1")  # before the Queue Reader: the queued rows are kept
    assert delivered["conflicts"] == 3 and delivered["skipped"] == 0
    kept = delivered_conflicts(env)
    assert [(k, key) for k, key, _ in kept] == [("queued at the subscriber", {"id": 1000})] * 2 + [
        ("queued at the subscriber", {"id": 1})
    ]
    assert all(outcome.startswith("the subscriber's row was kept") for _, _, outcome in kept)
    assert item_rows(env.sub, "id IN (1, 2, 1000)")[1000][0] == "sub" and item_rows(env.sub, "id = 2")[2][0] == "pub"
    assert item_rows(env.sub, "id = 1")[1][0] == "sub"
    result = queue_reader_agent.run_queue_reader(topo, "p", "sub1")
    assert result["conflicts"] == 1  # row 1 (update/update); the insert of 1000 meets no row there
    cycle(topo, "sub1")
    assert item_rows(env.pub, "id = 1000")[1000][0] == "sub"
    assert item_rows(env.pub, "id = 1")[1][0] == ("pub" if policy == "pub wins" else "sub")
    assert item_rows(env.sub) == item_rows(env.pub)
    assert_in_sync(topo)


def test_a_row_whose_own_change_the_publisher_took_later_is_kept(env, spark):
    topo = setup_queued(env, spark)  # pub wins
    env.run(env.pub, "INSERT INTO items (id, v) VALUES (1000, 'pub')")
    env.run(env.sub, "INSERT INTO items (id, v, n) VALUES (1000, 'sub', 0)")  # queued
    env.run(env.pub, "DELETE FROM items WHERE id = 1000")
    result = queue_reader_agent.run_queue_reader(topo, "p", "sub1")  # the key is free there again
    assert (result["transactions"], result["conflicts"]) == (1, 0) and queue_counts(env.sub) == (0, 0)
    _, (delivered,) = cycle(topo, "sub1")  # the publisher's insert and delete, then its own insert
    assert (delivered["transactions"], delivered["own_queued"], delivered["conflicts"]) == (2, 1, 2)
    assert [k for k, _, _ in delivered_conflicts(env)] == ["taken from the subscriber's queue"] * 2
    assert item_rows(env.sub, "id = 1000")[1000][0] == "sub"
    assert item_rows(env.sub) == item_rows(env.pub)
    assert_in_sync(topo)


def test_a_row_taken_before_the_log_reader_read_its_transaction_is_kept(env, spark):
    topo = setup_queued(env, spark)
    env.run(env.sub, "INSERT INTO items (id, v, n) VALUES (1000, 'sub', 0)")  # queued
    env.run(env.pub, "INSERT INTO items (id, v) VALUES (1000, 'pub')")
    env.run(env.pub, "DELETE FROM items WHERE id = 1000")
    log_reader_agent.run_log_reader(topo, "p")  # stores the publisher's two transactions only
    queue_reader_agent.run_queue_reader(topo, "p", "sub1")  # the publisher takes the insert
    assert env.rows(env.sub, "SELECT count(*) FROM airflow_repl.queue_taken")[0][0] == 1
    delivered = distribution_agent.run_distribution(topo, "p", "sub1")
    assert (delivered["transactions"], delivered["conflicts"]) == (2, 2)
    assert [k for k, _, _ in delivered_conflicts(env)] == ["taken from the subscriber's queue"] * 2
    assert item_rows(env.sub, "id = 1000")[1000][0] == "sub"
    _, (last,) = cycle(topo, "sub1")  # passes its own transaction and forgets the taken row
    assert last["own_queued"] == 1
    distribution_agent.run_distribution(topo, "p", "sub1")
    assert item_rows(env.sub) == item_rows(env.pub)
    assert_in_sync(topo)


def test_the_publishers_older_change_converges_at_the_subscriber_and_is_recorded(env, spark):
    topo = setup_queued(env, spark, "sub wins")
    env.run(env.pub, "DELETE FROM items WHERE id = 1")
    cycle(topo, "sub1")
    env.run(env.sub, "INSERT INTO items (id, v, n) VALUES (1, 'sub', 0)")
    env.run(env.sub, "DELETE FROM items WHERE id = 2")
    env.run(env.sub, "DELETE FROM items WHERE id = 3")
    with psycopg.connect(env.pub) as conn:  # one publisher transaction meeting all three, and a fourth row
        conn.execute("INSERT INTO items (id, v) VALUES (1, 'pub')")
        conn.execute("UPDATE items SET v = 'pub' WHERE id = 2")
        conn.execute("DELETE FROM items WHERE id = 3")
        conn.execute("UPDATE items SET v = 'pub' WHERE id = 4")
    result = queue_reader_agent.run_queue_reader(topo, "p", "sub1")  # the subscriber wins all three first
    assert (result["conflicts"], result["rejected"]) == (3, 0)
    _, (delivered,) = cycle(topo, "sub1")  # the publisher's transaction, then the winners sent back
    assert (delivered["skipped"], delivered["conflicts"]) == (0, 3)
    assert sorted(delivered_conflicts(env)) == [
        ("delete of a missing row", {"id": 3}, "nothing to do: the row is not at the subscriber"),
        ("duplicate key", {"id": 1}, "the subscriber's row was set to the publisher's"),
        ("update of a missing row", {"id": 2}, "the subscriber's row was set to the publisher's"),
    ]
    assert item_rows(env.sub, "id <= 4") == item_rows(env.pub, "id <= 4")
    assert {i: r[0] for i, r in item_rows(env.pub, "id <= 4").items()} == {1: "sub", 4: "pub"}
    assert_in_sync(topo)


@pytest.mark.parametrize("policy", ["pub wins", "sub wins"])
def test_a_publisher_truncate_keeps_the_rows_with_a_queued_change(env, spark, policy):
    topo = setup_queued(env, spark, policy)
    env.run(env.pub, "TRUNCATE items")
    env.run(env.sub, "INSERT INTO items (id, v, n) VALUES (1000, 'sub', 0)")  # queued
    env.run(env.sub, "UPDATE items SET v = 'sub' WHERE id = 1")  # queued: a row the publisher no longer has
    cycle(topo, "sub1")  # the truncate first: the queued rows stay
    assert set(item_rows(env.sub)) == {1, 1000}
    queue_reader_agent.run_queue_reader(topo, "p", "sub1")
    cycle(topo, "sub1")
    assert item_rows(env.sub) == item_rows(env.pub)
    assert set(item_rows(env.pub)) == (
        {1000} if policy == "pub wins" else {1, 1000}
    )  # update/delete: the policy decides
    assert_in_sync(topo)


@pytest.mark.parametrize(("policy", "winner"), [("pub wins", "one"), ("sub wins", "two")])
def test_two_subscribers_updating_one_row_end_equal_everywhere(env2, spark, policy, winner):
    topo = setup_queued(env2, spark, policy)
    env2.run(env2.subs["sub1"], "UPDATE items SET v = 'one' WHERE id = 1")
    env2.run(env2.subs["sub2"], "UPDATE items SET v = 'two' WHERE id = 1")
    first = queue_reader_agent.run_queue_reader(topo, "p", "sub1")  # applied: the publisher had not changed
    second = queue_reader_agent.run_queue_reader(topo, "p", "sub2")  # meets sub1's change
    assert (first["conflicts"], second["conflicts"]) == (0, 1)
    (found,) = [c for c in conflicts(env2) if c["agent"] == "queuereader"]
    assert (found["subscriber"], found["kind"], found["publisher_row"]["v"]) == ("sub2", "update/update", "one")
    cycle(topo, "sub1", "sub2")
    assert item_rows(env2.pub, "id = 1")[1][0] == winner
    assert item_rows(env2.subs["sub1"]) == item_rows(env2.subs["sub2"]) == item_rows(env2.pub)


def test_sub_wins_refuses_a_conflicting_primary_key_update(env, spark):
    topo = setup_queued(env, spark, "sub wins")
    env.run(env.sub, "UPDATE items SET id = 500 WHERE id = 1")
    env.run(env.pub, "UPDATE items SET v = 'pub' WHERE id = 1")
    result = queue_reader_agent.run_queue_reader(topo, "p", "sub1")
    (found,) = conflicts(env)
    assert found["kind"] == "update/update" and "does not support primary-key updates" in found["outcome"]
    assert result["rejected"] == 1
    assert set(item_rows(env.sub)) == set(item_rows(env.pub))  # compensated: id 1 back, 500 gone
    cycle(topo, "sub1")
    assert_in_sync(topo)


@pytest.mark.parametrize("policy", ["pub wins", "sub wins"])
def test_a_change_the_publisher_refuses_is_rejected_whole_and_compensated(env, spark, policy):
    topo = setup_queued(env, spark, policy)
    env.run(env.pub, "CREATE UNIQUE INDEX items_v ON items (v)")  # a constraint only the publisher has
    with psycopg.connect(env.sub) as conn:
        conn.execute("UPDATE items SET n = 7 WHERE id = 3")
        conn.execute("UPDATE items SET v = 'v2' WHERE id = 1")  # the publisher's row 2 has v2
    env.run(env.sub, "UPDATE items SET n = 8 WHERE id = 4")  # the next transaction still goes through
    result = queue_reader_agent.run_queue_reader(topo, "p", "sub1")
    assert (result["transactions"], result["rejected"], result["queued"]) == (2, 1, 0)
    (found,) = conflicts(env)
    assert found["kind"] == "constraint violation" and found["key"] == {"id": 1}
    assert found["outcome"].startswith("rejected") and "duplicate key value" in found["outcome"]
    assert "public.items" in found["outcome"]
    assert item_rows(env.sub) == item_rows(env.pub)  # row 3's change went with the rejected transaction
    assert item_rows(env.pub, "id = 3")[3][1] == 0 and item_rows(env.pub, "id = 4")[4][1] == 8
    cycle(topo, "sub1")
    assert_in_sync(topo)


@pytest.mark.parametrize(
    "statement",
    [
        "INSERT INTO items (id, v, n) VALUES (1024, 'v2', 0)",  # an insert has no old image
        "UPDATE items SET id = 1024, v = 'v2' WHERE id = 1",  # the row the publisher refused is at the new key
    ],
)
def test_a_refused_change_is_recorded_with_the_key_of_the_row_the_publisher_refused(env, spark, statement):
    topo = setup_queued(env, spark)
    env.run(env.pub, "CREATE UNIQUE INDEX items_v ON items (v)")  # the publisher's row 2 has v2
    env.run(env.sub, statement)
    assert queue_reader_agent.run_queue_reader(topo, "p", "sub1")["rejected"] == 1
    (found,) = conflicts(env)
    assert found["kind"] == "constraint violation"
    assert found["key"] == {"id": 1024} == {"id": found["subscriber_row"]["id"]}
    assert 'key {"id": 1024}' in found["outcome"]
    assert item_rows(env.sub) == item_rows(env.pub)


def test_both_agents_record_the_same_rows_key_with_the_same_json_types(env, spark):
    env.run(
        env.pub,
        "CREATE TABLE prices (sku int, at timestamptz, price numeric(10,2), label text, PRIMARY KEY (sku, at, price))",
    )
    env.run(env.pub, "INSERT INTO prices VALUES (7, '2026-01-02 03:04:05+00', 12.50, 'old')")
    data = {
        **env.servers(),
        "publications": [{"name": "p", "articles": ["public.prices"], "allow_queued_tran": True}],
        "subscriptions": [{"publication": "p", "subscriber": "sub1", "update_mode": "queued tran"}],
    }
    topo = resolved_topology(data)
    snapshot_agent.run_snapshot(topo, "p", spark)
    env.run(env.sub, "UPDATE prices SET label = 'sub'")  # queued
    env.run(env.pub, "UPDATE prices SET label = 'pub'")
    _, (delivered,) = cycle(topo, "sub1")  # the Distribution Agent keeps the queued row: a conflict
    assert delivered["conflicts"] == 1
    assert queue_reader_agent.run_queue_reader(topo, "p", "sub1")["conflicts"] == 1  # update/update
    found = env.rows(
        env.dist,
        "SELECT agent, kind, key::text, jsonb_typeof(key -> 'sku'), jsonb_typeof(key -> 'price'), key ->> 'price', "
        "key ->> 'at', publisher_row::text FROM airflow_repl.conflicts ORDER BY agent",
    )
    assert [(a, k) for a, k, *_ in found] == [
        ("distribution", "queued at the subscriber"),
        ("queuereader", "update/update"),
    ]
    (_, _, key, *rest, at, _), (_, _, same_key, *same_rest, _, _) = found
    assert key == same_key and rest == same_rest == ["number", "number", "12.50"]
    assert at == "2026-01-02T03:04:05+00:00"  # as to_jsonb writes a timestamptz, not the command's text
    assert found[0][-1] == found[1][-1]  # the publisher's row too: the same JSON from either agent
    cycle(topo, "sub1")
    assert env.rows(env.sub, "SELECT label FROM prices") == env.rows(env.pub, "SELECT label FROM prices") == [("pub",)]


def test_conflicts_cli_lists_and_filters(env, spark, tmp_path, capsys):
    from airflow_repl import cli

    topo = setup_queued(env, spark)
    env.run(env.sub, "UPDATE items SET v = 'sub' WHERE id = 1")
    env.run(env.pub, "UPDATE items SET v = 'pub' WHERE id = 1")
    queue_reader_agent.run_queue_reader(topo, "p", "sub1")
    path = tmp_path / "topology.yaml"
    path.write_text(json.dumps(topo.to_dict(with_secrets=True)))
    assert cli.main(["conflicts", "-t", str(path), "--subscriber", "sub1", "--article", "items", "-o", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(c["kind"], c["key"]) for c in listed] == [("update/update", {"id": 1})]
    assert cli.main(["conflicts", "-t", str(path), "--since", "2999-01-01", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    # a text table by default: a header, a line per conflict
    assert cli.main(["conflicts", "-t", str(path)]) == 0
    header, *lines = capsys.readouterr().out.splitlines()
    assert header.split()[:4] == ["detected", "publication", "subscriber", "article"], header
    assert len(lines) == 1 and lines[0].split()[1:4] == ["p", "sub1", "items"], lines
    assert '{"id": 1}' in lines[0] and "update/update" in lines[0]
    assert cli.main(["conflicts", "-t", str(path), "--since", "2999-01-01"]) == 0
    assert capsys.readouterr().out.strip() == "no conflicts recorded"


# ---------------------------------------------------------------------- exactly once
RUNNER = """
import json, sys
from airflow_repl.engine.agents import queue_reader_agent
from airflow_repl.engine.model.topology import from_dict
topo = from_dict(json.loads(open(sys.argv[1]).read()))
print(json.dumps(queue_reader_agent.run_queue_reader(topo, "p", "sub1"), default=str))
"""


def test_queue_reader_killed_mid_run_rerun_applies_nothing_twice(env, spark, tmp_path):
    topo = setup_queued(env, spark)
    with psycopg.connect(env.sub, autocommit=True) as conn:
        for i in range(300):  # 300 queued transactions: every row's n goes up by 6
            conn.execute("UPDATE items SET n = n + 1 WHERE id = %s", (i % QUEUED_ROWS + 1,))
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(topo.to_dict(with_secrets=True)))
    applied = lambda: env.rows(env.pub, "SELECT count(*) FROM airflow_repl.queue_applied")[0][0]  # noqa: E731
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, str(spec)], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if applied() >= 20:
                break
        except psycopg.errors.UndefinedTable:
            pass
        time.sleep(0.01)
    assert proc.poll() is None, "the Queue Reader finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    taken = applied()
    assert 20 <= taken < 300
    assert queue_counts(env.sub)[0] >= 300 - taken  # the queue keeps what the publisher has not taken
    result = queue_reader_agent.run_queue_reader(topo, "p", "sub1")
    assert result["queued"] == 0 and result["forgotten"] == 300 and applied() == 0
    assert result["transactions"] in (300 - taken, 300 - taken + 1)  # + the one killed after its publisher commit
    assert {n for _, n, _ in item_rows(env.pub).values()} == {6}
    assert item_rows(env.pub) == item_rows(env.sub)
    read, (back,) = cycle(topo, "sub1")
    assert back["own_queued"] == read["transactions"] == 300 and back["transactions"] == 0
    assert_in_sync(topo)


def test_queue_reader_runs_through_the_job_for_every_queued_subscriber(env2, spark):
    topo = setup_queued(env2, spark)
    env2.run(env2.subs["sub1"], "UPDATE items SET v = 'one' WHERE id = 1")
    env2.run(env2.subs["sub2"], "UPDATE items SET v = 'two' WHERE id = 2")
    result = run_agent("queuereader", topo, "p", spark=spark)
    assert sorted(r["subscriber"] for r in result["subscriptions"]) == ["sub1", "sub2"]
    assert result["transactions"] == 2 and result["conflicts"] == 0
    cycle(topo, "sub1", "sub2")
    assert item_rows(env2.subs["sub1"]) == item_rows(env2.subs["sub2"]) == item_rows(env2.pub)


# ---------------------------------------------------------------------- Airflow
def test_the_updatable_example_dag_parses_queue_reader_then_log_reader_then_distribution(monkeypatch):
    from airflow_repl import demo
    from airflow_repl.operators.agents import QueueReaderAgentOperator

    monkeypatch.syspath_prepend(str(demo.DAGS))  # the DAGs import repl_common, as in the DAGs folder
    dag = demo.load_dag("repl_updatable.py")
    assert dag.dag_id == "airflow_repl_updatable"
    reader = dag.get_task("queue_reader")
    assert isinstance(reader, QueueReaderAgentOperator) and reader.agent == "queuereader"
    assert {"topology", "publication", "subscribers"} <= set(reader.template_fields)
    assert reader.downstream_task_ids == {"log_reader"}
    assert dag.get_task("log_reader").downstream_task_ids == {"distribution"}


def test_queue_reader_operator_spark_submits_the_agent_and_returns_its_summary(env, spark, tmp_path, monkeypatch):
    from airflow_repl.operators.agents import QueueReaderAgentOperator

    monkeypatch.setenv("AIRFLOW_CONN_REPL_QUEUED_SPARK", json.dumps({"conn_type": "spark", "host": "local[1]"}))
    topo = setup_queued(env, spark)
    env.run(env.sub, "UPDATE items SET v = 'via airflow' WHERE id = 1")
    path = tmp_path / "topology.yaml"
    path.write_text(json.dumps(topo.to_dict(with_secrets=True)))
    op = QueueReaderAgentOperator(
        task_id="queue_reader", topology=str(path), publication="p", conn_id="repl_queued_spark"
    )
    summary = op.execute({})
    assert summary["transactions"] == 1 and summary["subscriptions"][0]["subscriber"] == "sub1"
    assert item_rows(env.pub, "id = 1")[1][0] == "via airflow"
