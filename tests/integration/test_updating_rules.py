"""The "Rules and limits" of updatable subscriptions (docs/updatable-subscriptions.md) on real
servers, for immediate and queued subscribers: rows only the subscriber has (a horizontally
filtered subscription), set updates of a unique key, and subscriptions not active in the
distribution database.  (A column filter dropping a NOT NULL column of an immediate-updating
publication is refused by apply: test_updating_setup.py.)"""

from __future__ import annotations

import psycopg
import pytest

from airflow_repl.engine.agents import queue_reader_agent, snapshot_agent
from airflow_repl.engine.model.topology import from_dict
from airflow_repl.engine.postgres.connections import resolve_topology
from airflow_repl.engine.state import dist_conflicts
from airflow_repl.engine.subscriber import in_doubt

ROWS = 50
FILTER = "id <= 40"  # rows 41..50 stay at the publisher


def setup(env, spark, mode: str, unique: str = "UNIQUE"):
    """``items`` (id, v, n, k ``unique``) with ROWS rows, k = id, published with both kinds of
    updating and a row filter, and snapshotted to ``sub1`` in update mode ``mode``."""
    env.run(env.pub, f"CREATE TABLE items (id int PRIMARY KEY, v text, n int NOT NULL DEFAULT 0, k int {unique})")
    env.run(env.pub, "INSERT INTO items (id, v, k) SELECT g, 'v' || g, g FROM generate_series(1, %s) g", (ROWS,))
    data = {
        **env.servers(["sub1"]),
        "publications": [
            {
                "name": "p",
                "articles": [{"table": "items", "row_filter": FILTER}],
                "allow_sync_tran": True,
                "allow_queued_tran": True,
            }
        ],
        "subscriptions": [{"publication": "p", "subscriber": "sub1", "update_mode": mode}],
    }
    topo = resolve_topology(from_dict(data))
    snapshot_agent.run_snapshot(topo, "p", spark)
    return topo


def rows(conninfo, where="true"):
    """id -> (v, k, row version)."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        found = conn.execute(f"SELECT id, v, k, msrepl_tran_version::text FROM items WHERE {where}").fetchall()
    return {r[0]: r[1:] for r in found}


def subscriber_only_row(env, key: int = 1000):
    """A row the publisher never had, written at the subscriber the way replication writes (no
    trigger fires): what an insert before the subscription, or outside the filter, leaves."""
    with psycopg.connect(env.sub, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")
        conn.execute("INSERT INTO items (id, v, n, k) VALUES (%s, 'local', 0, %s)", (key, key))


def queued(conninfo) -> int:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM airflow_repl.queue").fetchone()[0]


def prepared(env) -> list[str]:
    return [r[0] for r in env.rows(env.pub, "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()")]


def conflicts(env):
    with psycopg.connect(env.dist, autocommit=True) as conn:
        return dist_conflicts.list_conflicts(conn, publication="p")


def set_status(env, status: str):
    env.run(env.dist, "UPDATE airflow_repl.subscriptions SET status = %s WHERE subscriber = 'sub1'", (status,))


# ---------------------------------------------------------------------- horizontally filtered subscribers
def test_immediate_subscriber_cannot_change_a_row_only_it_has(env, spark):
    setup(env, spark, "sync tran")
    subscriber_only_row(env)
    before_pub, before_sub = rows(env.pub), rows(env.sub)
    assert 1000 not in before_pub and 41 not in before_sub
    with psycopg.connect(env.sub, autocommit=True) as conn:
        for statement in ("UPDATE items SET v = 'sub' WHERE id = 1000", "DELETE FROM items WHERE id = 1000"):
            with pytest.raises(psycopg.errors.SerializationFailure) as err:
                conn.execute(statement)
            assert str(err.value).startswith(
                'immediate updating: the row of table "public"."items" with key {"id": 1000} '
                "does not exist at the publisher: the change is rejected at the publisher and at the subscriber"
            )
    assert rows(env.pub) == before_pub and rows(env.sub) == before_sub and prepared(env) == []


@pytest.mark.parametrize(("statement", "kind"), [("UPDATE", "update/delete"), ("DELETE", "row missing")])
def test_queued_subscriber_change_to_a_row_only_it_has_is_a_conflict(env, spark, statement, kind):
    topo = setup(env, spark, "queued tran")
    subscriber_only_row(env)
    before_pub = rows(env.pub)
    change = (
        "UPDATE items SET v = 'sub' WHERE id = 1000" if statement == "UPDATE" else "DELETE FROM items WHERE id = 1000"
    )
    env.run(env.sub, change)  # committed locally and queued
    assert queued(env.sub) == 1
    result = queue_reader_agent.run_queue_reader(topo, "p", "sub1")
    assert (result["transactions"], result["conflicts"], result["queued"]) == (1, 1, 0)
    (found,) = conflicts(env)
    assert (found["article"], found["key"], found["kind"], found["policy"]) == ("items", {"id": 1000}, kind, "pub wins")
    assert found["publisher_row"] is None and found["outcome"].startswith("publisher wins")
    # pub wins: the publisher is untouched and the subscriber is brought back to it (no row 1000)
    assert rows(env.pub) == before_pub
    assert 1000 not in rows(env.sub) and rows(env.sub) == rows(env.pub, FILTER)


# ---------------------------------------------------------------------- set updates of a unique key
#: k 1, 2, 3 -> 2, 3, 1: valid at the end, but row 1 (k 1 -> 2) meets row 2 before it moves
SET_UPDATE = "UPDATE items SET k = k % 3 + 1 WHERE id <= 3"
DEFERRED = "UNIQUE DEFERRABLE INITIALLY DEFERRED"


@pytest.mark.parametrize("mode", ["sync tran", "queued tran"])
def test_set_update_whose_intermediate_row_collides_fails_at_the_subscriber(env, spark, mode):
    setup(env, spark, mode)
    before_pub, before_sub = rows(env.pub), rows(env.sub)
    with pytest.raises(psycopg.errors.UniqueViolation, match=r"duplicate key value violates unique constraint"):
        env.run(env.sub, SET_UPDATE)
    assert rows(env.pub) == before_pub and rows(env.sub) == before_sub
    assert prepared(env) == [] and (mode != "queued tran" or queued(env.sub) == 0)


@pytest.mark.parametrize("mode", ["sync tran", "queued tran"])
def test_set_update_of_a_deferrable_key_is_checked_at_commit_and_reaches_the_publisher(env, spark, mode):
    topo = setup(env, spark, mode, DEFERRED)  # the snapshot keeps the key deferrable at the subscriber
    env.run(env.sub, SET_UPDATE)
    if mode == "queued tran":
        result = queue_reader_agent.run_queue_reader(topo, "p", "sub1")
        assert (result["transactions"], result["conflicts"], result["rejected"]) == (1, 0, 0)
    else:
        in_doubt.resolve_in_doubt(topo, "p")
    assert [rows(env.pub, "id <= 3")[i][1] for i in (1, 2, 3)] == [2, 3, 1]
    assert rows(env.pub, FILTER) == rows(env.sub)


SHIFT = "UPDATE items SET k = k + 10 WHERE id > 30"  # k 31..40 -> 41..50: free here, taken at the publisher


def test_immediate_set_update_colliding_at_the_publisher_is_rejected_at_both(env, spark):
    topo = setup(env, spark, "sync tran")
    before_pub, before_sub = rows(env.pub), rows(env.sub)
    with pytest.raises(psycopg.errors.UniqueViolation) as err:
        env.run(env.sub, SHIFT)
    assert 'duplicate key value violates unique constraint "items_k_key"' in str(err.value)
    in_doubt.resolve_in_doubt(topo, "p")
    assert rows(env.pub) == before_pub and rows(env.sub) == before_sub and prepared(env) == []


def test_queued_set_update_colliding_at_the_publisher_is_a_constraint_violation(env, spark):
    topo = setup(env, spark, "queued tran")
    before_pub = rows(env.pub)
    env.run(env.sub, SHIFT)  # one transaction of ten row updates, accepted here
    assert queued(env.sub) == 10
    result = queue_reader_agent.run_queue_reader(topo, "p", "sub1")
    assert (result["transactions"], result["rejected"], result["queued"]) == (1, 1, 0)
    (found,) = conflicts(env)
    assert (found["kind"], found["key"]) == ("constraint violation", {"id": 31})
    assert found["outcome"].startswith("rejected") and "duplicate key value" in found["outcome"]
    # rejected whole: no row changed at the publisher; the subscriber is compensated
    assert rows(env.pub) == before_pub and rows(env.sub) == rows(env.pub, FILTER)


def test_queued_set_update_colliding_with_a_deferrable_key_at_the_publisher_is_a_constraint_violation(env, spark):
    topo = setup(env, spark, "queued tran", DEFERRED)
    env.run(env.sub, SHIFT)
    result = queue_reader_agent.run_queue_reader(topo, "p", "sub1")
    assert not env.rows(env.pub, "SELECT k FROM items GROUP BY k HAVING count(*) > 1")  # no duplicate keys
    assert result["rejected"] == 1 and conflicts(env)[0]["kind"] == "constraint violation"


# ---------------------------------------------------------------------- subscriptions not active
@pytest.mark.parametrize("status", ["pending", "initializing"])
def test_queued_change_of_an_inactive_subscription_reaches_the_publisher(env, spark, status):
    topo = setup(env, spark, "queued tran")
    set_status(env, status)
    env.run(env.sub, "UPDATE items SET v = 'while inactive' WHERE id = 1")
    result = queue_reader_agent.run_queue_reader(topo, "p", "sub1")
    assert (result["transactions"], result["conflicts"], result["queued"]) == (1, 0, 0)
    assert rows(env.pub, "id = 1") == rows(env.sub, "id = 1") and rows(env.pub, "id = 1")[1][0] == "while inactive"


def test_queued_change_of_a_subscription_marked_for_reinitialization_waits(env, spark):
    topo = setup(env, spark, "queued tran")
    set_status(env, "reinitialize")
    env.run(env.sub, "UPDATE items SET v = 'while reinit' WHERE id = 1")
    result = queue_reader_agent.run_queue_reader(topo, "p", "sub1")
    assert result["transactions"] == 0 and "marked for reinitialization" in result["message"]
    assert queued(env.sub) == 1 and rows(env.pub, "id = 1")[1][0] == "v1"


@pytest.mark.parametrize("status", ["pending", "reinitialize"])
def test_immediate_change_of_an_inactive_subscription_reaches_the_publisher_at_once(env, spark, status):
    topo = setup(env, spark, "sync tran")
    set_status(env, status)
    env.run(env.sub, "UPDATE items SET v = 'while inactive' WHERE id = 1")
    assert len(prepared(env)) == 1  # sent and prepared with the subscriber's commit
    assert in_doubt.resolve_in_doubt(topo, "p")["sub1"]["committed"] == 1
    assert rows(env.pub, "id = 1") == rows(env.sub, "id = 1") and rows(env.pub, "id = 1")[1][0] == "while inactive"
