"""Property: whatever the publisher and two queued updating subscribers commit, and in whatever
order the Queue Reader (per subscriber), the Log Reader and the Distribution Agent (per
subscriber) run meanwhile, a final drain leaves the three databases equal, row versions
included, under publisher wins and under subscriber wins.  Subscribers change primary keys only
under publisher wins (subscriber wins does not support it); the publisher changes them under both.

Seeded random workloads (each round's seed is its policy and number, so a failure replays);
the rows live on few keys, so that the subscribers and the publisher meet each other's changes:
every kind of conflict, at the Queue Reader and at delivery."""

from __future__ import annotations

import random

import psycopg
import pytest
from harness import Env, drain, item_rows

from airflow_repl.engine.agents import distribution_agent, log_reader_agent, queue_reader_agent, snapshot_agent
from airflow_repl.engine.model.topology import from_dict
from airflow_repl.engine.postgres.connections import resolve_topology
from airflow_repl.engine.state import dist_conflicts

ROUNDS = 8
STEPS = 24  # random steps per round, before its final drain
KEYS = range(1, 7)
SUBSCRIBERS = ("sub1", "sub2")


@pytest.fixture(scope="module", params=["pub wins", "sub wins"])
def world(request, sandbox, spark, tmp_path_factory):
    env = Env(sandbox, tmp_path_factory.mktemp("queued_property"), n_subscribers=2)
    env.run(env.pub, "CREATE TABLE items (id int PRIMARY KEY, v text, n int NOT NULL DEFAULT 0)")
    env.run(env.pub, "INSERT INTO items (id, v) SELECT g, 'v' || g FROM generate_series(1, 4) g")
    data = {
        **env.servers(),
        "publications": [
            {"name": "p", "articles": ["public.items"], "allow_queued_tran": True, "conflict_policy": request.param}
        ],
        "subscriptions": [{"publication": "p", "subscriber": s, "update_mode": "queued tran"} for s in SUBSCRIBERS],
    }
    topo = resolve_topology(from_dict(data))
    snapshot_agent.run_snapshot(topo, "p", spark)
    yield env, topo, request.param
    env.drop()


def _operation(rng: random.Random, rekeys: bool) -> tuple[str, tuple]:
    kind = rng.choice(["insert", "update", "update", "delete"] + (["rekey"] if rekeys else []))
    key = rng.choice(KEYS)
    if kind == "insert":
        return "INSERT INTO items (id, v, n) VALUES (%s, %s, 0)", (key, f"i{rng.randrange(100)}")
    if kind == "update":
        return "UPDATE items SET v = %s, n = n + 1 WHERE id = %s", (f"u{rng.randrange(100)}", key)
    if kind == "delete":
        return "DELETE FROM items WHERE id = %s", (key,)
    return "UPDATE items SET id = %s WHERE id = %s", (rng.choice(KEYS), key)


def _transaction(conninfo: str, rng: random.Random, rekeys: bool) -> None:
    """One application transaction of 1-3 changes (one the database refuses is rolled back whole)."""
    with psycopg.connect(conninfo) as conn:
        try:
            for _ in range(rng.randint(1, 3)):
                conn.execute(*_operation(rng, rekeys))
            conn.commit()
        except psycopg.errors.UniqueViolation:
            conn.rollback()


def _step(env: Env, topo, policy: str, rng: random.Random) -> None:
    what = rng.choice(["pub", "sub", "sub", "queuereader", "logreader", "distribution"])
    sub = rng.choice(SUBSCRIBERS)
    if what == "pub":
        _transaction(env.pub, rng, rekeys=True)
    elif what == "sub":
        _transaction(env.subs[sub], rng, rekeys=policy == "pub wins")
    elif what == "queuereader":
        queue_reader_agent.run_queue_reader(topo, "p", sub)
    elif what == "logreader":
        log_reader_agent.run_log_reader(topo, "p")
    else:
        distribution_agent.run_distribution(topo, "p", sub)


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_random_workloads_and_agent_orders_end_with_three_equal_databases(world, round_):
    env, topo, policy = world
    rng = random.Random(f"{policy}/{round_}")
    for _ in range(STEPS):
        _step(env, topo, policy, rng)
    drain(topo)
    publisher = item_rows(env.pub)
    for sub in SUBSCRIBERS:
        assert item_rows(env.subs[sub]) == publisher, f"{sub} differs from the publisher ({policy}, round {round_})"


def test_the_rounds_met_conflicts_at_the_queue_reader_and_at_delivery(world):
    env, _, _ = world
    with psycopg.connect(env.dist, autocommit=True) as conn:
        found = dist_conflicts.list_conflicts(conn, publication="p")
    agents = {c["agent"] for c in found}
    assert agents == {"queuereader", "distribution"}, agents
    assert len({c["kind"] for c in found}) >= 4
