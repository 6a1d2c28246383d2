"""Validation of a MariaDB subscriber on Spark, with real servers: key-hash ranges summed by
tasks that each read one share of a side, the rows of the differing ranges merged by key; the
driver gets only per-range sums and the differing keys.  Hostile names, and the command line."""

from __future__ import annotations

import itertools
import json

import pytest
from harness import mariadb_topology, resolved_topology, topology_file
from psycopg import sql

from airflow_repl.engine.agents import snapshot_agent
from airflow_repl.engine.errors import SubscribersFailed
from airflow_repl.engine.postgres import connections
from airflow_repl.engine.state import dist_publications
from airflow_repl.engine.subscriber import mariadb_validation, validation
from airflow_repl.engine.subscriber.validation import DIFFERENT, EXTRA, MISSING
from airflow_repl.jobs import agent_job
from airflow_repl.jobs.agent_job import run_agent


def _found(row: dict) -> list[tuple[str, str]]:
    return sorted((d["key"], d["difference"]) for d in row["differences"])


@pytest.fixture
def spark_calls(monkeypatch):
    """Every map of tasks on Spark: (the tasks, what came back to the driver)."""
    calls: list[tuple[list, list]] = []
    on_spark = agent_job._map_on_spark

    def recorded(spark, f, tasks):
        results = on_spark(spark, f, tasks)
        calls.append((tasks, results))
        return results

    monkeypatch.setattr(agent_job, "_map_on_spark", recorded)
    return calls


def test_a_large_table_is_validated_in_shares_and_ranges_on_spark(env, spark, mariadb, monkeypatch, spark_calls):
    env.run(
        env.pub,
        "CREATE TABLE big (id int PRIMARY KEY, k text, v numeric(12,2), at timestamptz, b bytea); "
        "INSERT INTO big SELECT g, 'k' || g || repeat('x', 40), g / 7.0, "
        "'2026-01-01 00:00:00+00'::timestamptz + g * interval '1 second', decode(md5(g::text), 'hex') "
        "FROM generate_series(1, 20000) g; "
        "CREATE TABLE named (k text PRIMARY KEY, n int); "
        "INSERT INTO named SELECT 'n' || g || repeat('y', 50), g FROM generate_series(1, 6000) g",
    )
    topo, db = mariadb_topology(env, mariadb, ["public.big", "public.named"])
    snapshot_agent.run_snapshot(topo, "p", spark)
    mariadb.run(db, "ANALYZE TABLE big, named")  # the planner's sizes (the server's statistics catch up by themselves)
    monkeypatch.setattr(validation, "BLOCKS_PER_TASK", 8)
    clean = run_agent("validate", topo, "p", spark=spark, validation={"ranges": 256})
    [line, named] = clean["subscribers"]["m1"]
    assert clean["match"] is True and line["publisher_rows"] == line["subscriber_rows"] == 20000, line
    assert line["publisher_checksum"] == line["subscriber_checksum"] and line["differing_ranges"] == 0
    assert named["match"] and named["subscriber_rows"] == 6000
    [(tasks, sums)] = spark_calls  # one pass only: nothing differs
    arts = topo_articles(env)
    pub_chunks = mariadb_validation.table_chunks(env.pub, "", arts)
    sub_chunks = mariadb_validation.table_chunks(topo.subscriber_conninfo("m1"), "m1", arts)
    assert len(pub_chunks["big"]) > 3 and len(sub_chunks["big"]) > 3, (pub_chunks, sub_chunks)
    by_key = sub_chunks["big"]  # ranges of the integer key, the first and last open
    assert by_key[0][0] is None and by_key[-1][1] is None and all(a[1] == b[0] for a, b in itertools.pairwise(by_key))
    assert sub_chunks["named"] == [[i, len(sub_chunks["named"])] for i in range(len(sub_chunks["named"]))]
    assert len(sub_chunks["named"]) > 1  # a text key: shares by CRC32
    assert len(tasks) == sum(len(c) for c in (*pub_chunks.values(), *sub_chunks.values()))
    assert all(len(s["result"]) <= 256 for s in sums)  # per range, never per row

    spark_calls.clear()
    mariadb.run(db, "DELETE FROM big WHERE id = 17")
    mariadb.run(db, "UPDATE big SET v = v + 0.01 WHERE id = 5003")
    mariadb.run(db, "UPDATE big SET at = at + INTERVAL 1 MICROSECOND WHERE id = 12000")
    mariadb.run(db, "UPDATE big SET k = 'k19999 \U0001f600' WHERE id = 19999")
    mariadb.run(db, "UPDATE big SET b = NULL WHERE id = 7777")
    mariadb.run(db, "INSERT INTO big (id, k) VALUES (30001, 'extra')")
    mariadb.run(db, "DELETE FROM named WHERE n IN (17, 4000)")
    mariadb.run(db, "UPDATE named SET n = -n WHERE n = 5999")
    report = run_agent("validate", topo, "p", spark=spark, validation={"ranges": 256, "max_keys": 4})
    [line, named] = report["subscribers"]["m1"]
    assert (named["missing"], named["extra"], named["different"]) == (2, 0, 1)
    assert report["match"] is False
    assert (line["missing"], line["extra"], line["different"]) == (1, 1, 4)
    keys = [17, 5003, 12000, 19999, 7777, 30001]
    assert line["differing_ranges"] == len({validation.key_range(json.dumps([k]).encode(), 256) for k in keys}) > 1
    assert len(line["differences"]) == 4  # the first max_keys keys; the counts are complete
    [(_, _), (rows_tasks, rows)] = spark_calls  # one rows task per article that differs
    assert len(rows_tasks) == 2 and len(rows_tasks[0]["bad"]) == line["differing_ranges"]
    assert len(rows[0]["result"]["differences"]) == 4

    everything = run_agent("validate", topo, "p", spark=spark, validation={"ranges": 7})
    [line, named] = everything["subscribers"]["m1"]
    pad = "y" * 50
    assert _found(named) == [(f"n17{pad}", MISSING), (f"n4000{pad}", MISSING), (f"n5999{pad}", DIFFERENT)]
    assert _found(line) == [
        ("12000", DIFFERENT),  # a timestamp one microsecond apart
        ("17", MISSING),
        ("19999", DIFFERENT),  # 4-byte UTF-8
        ("30001", EXTRA),
        ("5003", DIFFERENT),  # NUMERIC by value
        ("7777", DIFFERENT),  # NULL against bytes
    ]


def topo_articles(env):
    """Publication ``p``'s articles as the distributor keeps them."""
    with connections.connect(env.dist, "distributor") as dist:
        return dist_publications.load_articles(dist, "p")


#: A table and columns named with a line break, quotes, a backtick, ``go``, ``--`` and ``/*``,
#: 63 bytes, non-ASCII; the key is text, its values differing only in case or by 4-byte UTF-8.
TABLE = "t\nx/*#;-- y 'go'"
KEY = 'k`ey "q" -- /* go'
VALUE = "v" + "\u00e9" * 31  # 63 bytes in UTF-8


def test_hostile_names_and_keys_differing_in_case(env, spark, mariadb):
    env.run(
        env.pub,
        sql.SQL("CREATE TABLE {} ({} text PRIMARY KEY, {} jsonb)").format(
            sql.Identifier(TABLE), sql.Identifier(KEY), sql.Identifier(VALUE)
        ),
    )
    env.run(
        env.pub,
        sql.SQL(
            "INSERT INTO {} VALUES ('a', '{{\"x\": 1}}'), ('A', NULL), ('\U0001f600', '[1, 2.50]'), ('b', '{{}}')"
        ).format(sql.Identifier(TABLE)),
    )
    topo, db = mariadb_topology(env, mariadb, [f"public.{TABLE}"])
    snapshot_agent.run_snapshot(topo, "p", spark)
    clean = run_agent("validate", topo, "p", spark=spark)
    assert clean["match"] is True, clean
    quoted = "`" + TABLE.replace("`", "``") + "`"
    key, value = "`" + KEY.replace("`", "``") + "`", "`" + VALUE + "`"
    mariadb.run(db, f"DELETE FROM {quoted} WHERE {key} = 'A'")
    mariadb.run(db, f"UPDATE {quoted} SET {value} = '[1, 2.5, 3]' WHERE {key} = '\U0001f600'")
    mariadb.run(db, f"INSERT INTO {quoted} VALUES ('B', NULL)")
    report = run_agent("validate", topo, "p", spark=spark, validation={"ranges": 3})
    [line] = report["subscribers"]["m1"]
    assert _found(line) == [("A", MISSING), ("B", EXTRA), ("\U0001f600", DIFFERENT)], line


def test_the_command_line_validates_a_mariadb_subscriber_in_ranges(env, spark, mariadb, tmp_path, capsys):
    from airflow_repl import cli

    env.run(env.pub, "CREATE TABLE orders (id int PRIMARY KEY, v text)")
    env.run(env.pub, "INSERT INTO orders SELECT g, 'v' || g FROM generate_series(1, 500) g")
    db = mariadb.new_database()
    path = topology_file(
        env, tmp_path, ["public.orders"], snapshot_folder=str(tmp_path / "s"), subscribers={"m1": mariadb.uri(db)}
    )
    assert cli.main(["snapshot", "-t", path]) == 0
    mariadb.run(db, "UPDATE orders SET v = 'changed' WHERE id IN (3, 300)")
    capsys.readouterr()
    assert cli.main(["validate", "-t", path, "--ranges", "16", "-o", "json"]) == 6
    out, _ = capsys.readouterr()
    [line] = json.loads(out[: out.rindex("}") + 1])["subscribers"]["m1"]
    assert (line["ranges"], line["different"], _found(line)) == (16, 2, [("3", DIFFERENT), ("300", DIFFERENT)])
    mariadb.run(db, "DROP TABLE orders")
    assert cli.main(["validate", "-t", path]) == 3
    _, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("airflow-repl: error: MariaDB subscriber 'm1' has no table")
    assert "run the Snapshot Agent" in err and mariadb.server.password not in err


def test_a_postgresql_and_a_mariadb_subscriber_in_one_run(env, spark, mariadb):
    """Each kind by its route in the same run: each one's differences its own; a MariaDB
    subscriber without its table is its own failure, the PostgreSQL one still compared."""
    env.run(env.pub, "CREATE TABLE items (id int PRIMARY KEY, v text)")
    env.run(env.pub, "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 300) g")
    db = mariadb.new_database()
    servers = env.servers(subscribers=["sub1"])
    servers["subscribers"]["m1"] = mariadb.uri(db)
    topo = resolved_topology(
        {
            **servers,
            "publications": [{"name": "p", "articles": ["public.items"]}],
            "subscriptions": [{"publication": "p", "subscriber": name} for name in ("m1", "sub1")],
        }
    )
    snapshot_agent.run_snapshot(topo, "p", spark)
    env.run(env.sub, "DELETE FROM items WHERE id = 7")
    mariadb.run(db, "UPDATE items SET v = 'changed' WHERE id = 9")
    result = run_agent("validate", topo, "p", spark=spark)
    report = result["subscribers"]
    assert result["match"] is False and list(report) == ["m1", "sub1"]
    assert _found(report["m1"][0]) == [("9", DIFFERENT)] and _found(report["sub1"][0]) == [("(7)", MISSING)]
    mariadb.run(db, "DROP TABLE items")
    with pytest.raises(SubscribersFailed) as info:
        run_agent("validate", topo, "p", spark=spark)
    assert list(info.value.summary["subscribers"]) == ["sub1"]
    failures = {f["subscriber"]: f for f in info.value.failures}
    assert failures["m1"]["error_class"] == "NotInitialized" and "has no table 'items'" in failures["m1"]["message"]
    assert failures["sub1"]["error_class"] == "DifferencesFound"
