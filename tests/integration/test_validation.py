"""Validation against real PostgreSQL servers and the shared SparkSession: the rows missing,
extra and different at a subscriber (NULL against a value, a toasted value), listed by key,
with row and column filters honoured; identical tables report nothing."""

from __future__ import annotations

import pytest

from airflow_repl.engine.agents import snapshot_agent
from airflow_repl.engine.errors import NotInitialized
from airflow_repl.engine.subscriber import validation
from airflow_repl.engine.subscriber.validation import DIFFERENT, EXTRA, MISSING
from airflow_repl.jobs.agent_job import run_agent

ARTICLES = [
    {"table": "public.items"},
    {"table": "public.orders", "row_filter": "region = 'eu'", "columns": ["id", "region", "qty"]},
]


def _setup(env) -> None:
    # big: ~8 kB of poorly compressible text per row, stored out of line (TOAST)
    env.run(
        env.pub,
        "CREATE TABLE items (id int PRIMARY KEY, v text, big text); "
        "INSERT INTO items SELECT g, 'v' || g, "
        "(SELECT string_agg(md5(g::text || '-' || i), '') FROM generate_series(1, 250) i) "
        "FROM generate_series(1, 3000) g; "
        "CREATE TABLE orders (id int PRIMARY KEY, region text, qty int, secret text); "
        "INSERT INTO orders SELECT g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END, g, 's' || g "
        "FROM generate_series(1, 2000) g",
    )


def _found(row: dict) -> list[tuple[str, str]]:
    return sorted((d["key"], d["difference"]) for d in row["differences"])


@pytest.fixture
def synced(env, spark):
    _setup(env)
    topo = env.topology(ARTICLES)
    snapshot_agent.run_snapshot(topo, "p", spark)
    toasted = "SELECT pg_relation_size(reltoastrelid) > 0 FROM pg_class WHERE oid = 'items'::regclass"
    assert env.rows(env.pub, toasted) == env.rows(env.sub, toasted) == [(True,)]
    return topo


def test_identical_tables_report_nothing_and_each_difference_is_found_by_key(env, spark, synced, monkeypatch):
    topo = synced
    monkeypatch.setattr(validation, "BLOCKS_PER_TASK", 4)  # each table's scan split into block ranges
    assert env.rows(env.pub, "SELECT pg_relation_size('items') / 8192 > 8") == [(True,)]
    clean = run_agent("validate", topo, "p", spark=spark)
    assert clean["match"] is True and clean["spark_application_id"] == spark.sparkContext.applicationId
    items, orders = clean["subscribers"]["sub1"]
    assert (items["publisher_rows"], orders["publisher_rows"]) == (3000, 1000)  # the row filter: eu only
    assert items["differences"] == orders["differences"] == [] and items["differing_ranges"] == 0
    # not differences: rows and columns the subscriber does not get (row filter, column filter)
    env.run(env.pub, "UPDATE orders SET secret = 'changed' WHERE id = 2; UPDATE orders SET qty = 0 WHERE id = 3")
    env.run(env.pub, "INSERT INTO orders VALUES (5001, 'us', 1, 'x')")
    # differences at the subscriber
    env.run(
        env.sub,
        "DELETE FROM items WHERE id = 10; INSERT INTO items VALUES (9999, 'extra', NULL); "
        "UPDATE items SET v = 'changed' WHERE id = 20; UPDATE items SET v = NULL WHERE id = 30; "
        "UPDATE items SET big = big || 'x' WHERE id = 40; "
        "UPDATE orders SET qty = -1 WHERE id = 4; INSERT INTO orders VALUES (7, 'us', 7)",
    )
    report = run_agent("validate", topo, "p", spark=spark, validation={"ranges": 64})
    assert report["match"] is False
    items, orders = report["subscribers"]["sub1"]
    assert _found(items) == [
        ("(10)", MISSING),
        ("(20)", DIFFERENT),
        ("(30)", DIFFERENT),  # NULL against a value
        ("(40)", DIFFERENT),  # a toasted value
        ("(9999)", EXTRA),
    ]
    assert (items["missing"], items["extra"], items["different"]) == (1, 1, 3)
    assert 1 <= items["differing_ranges"] <= 5 and items["ranges"] == 64
    assert _found(orders) == [("(4)", DIFFERENT), ("(7)", EXTRA)]  # a row the filter excludes is extra
    # the same answer without Spark and in one scan per table, and the list capped with complete counts
    monkeypatch.undo()
    local = validation.validate(topo, "p", ["sub1"], max_keys=2)["sub1"]
    assert [d["key"] for d in local[0]["differences"]] == ["(10)", "(20)"] and local[0]["different"] == 3
    text = validation.format_report(local)
    assert "    key (10): missing at the subscriber" in text and "... and 3 more key(s)" in text

    # one snapshot per server, exported as validation starts: writes made while its tasks run (here:
    # just before each pass's tasks) are not seen, and pass 2 reads the very rows pass 1 summed
    def writing(f, tasks):
        env.run(env.sub, "DELETE FROM items WHERE id BETWEEN 100 AND 199")
        env.run(env.pub, "DELETE FROM items WHERE id BETWEEN 200 AND 299")
        return validation.run_locally(f, tasks)

    during = validation.validate(topo, "p", ["sub1"], writing)["sub1"][0]
    assert (during["missing"], during["extra"], during["different"]) == (1, 1, 3), during
    after = validation.validate(topo, "p", ["sub1"])["sub1"][0]  # a new run sees them
    assert (after["missing"], after["extra"], after["different"]) == (101, 101, 3), after


def test_validation_of_an_uninitialized_subscriber_is_refused_before_spark(env):
    _setup(env)
    topo = env.topology(ARTICLES)
    from airflow_repl.engine.provisioning import deploy

    deploy.apply_topology(topo, ["p"])
    with pytest.raises(NotInitialized, match=r"subscriber 'sub1' has no table public\.items for article 'items'"):
        run_agent("validate", topo, "p")
