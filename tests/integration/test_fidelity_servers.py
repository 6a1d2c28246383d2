"""Data fidelity against real servers that differ the way real databases do: collations (C vs
ICU), encodings (LATIN1 vs UTF8), search_path, inheritance, INCLUDE keys and identifiers with
``%``, quotes, spaces, dots and mixed case.  Every test compares the subscriber with the
publisher row by row and with ``validate``."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import psycopg
import pytest
from harness import assert_in_sync, cycle
from psycopg import sql

from airflow_repl.engine.agents import distribution_agent, log_reader_agent, snapshot_agent, snapshot_folder
from airflow_repl.engine.errors import ReplError, TopologyError
from airflow_repl.engine.postgres import catalog
from airflow_repl.engine.provisioning import deploy
from airflow_repl.engine.subscriber import validation

ICU = "LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C' ENCODING 'UTF8'"
LATIN1 = "ENCODING 'LATIN1' LOCALE 'C'"


def recreate(env, role: str, options: str) -> str:
    """Re-create one of the env's databases ('pub' or a subscriber name) with CREATE DATABASE options."""
    index = 0 if role == "pub" else 1 + int(role.removeprefix("sub"))
    cluster, name = env.databases[index]
    env.sandbox.drop_database(cluster, name)
    with psycopg.connect(env.sandbox.conninfo(cluster), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0 " + options).format(sql.Identifier(name)))
    conninfo = env.sandbox.conninfo(cluster, name)
    if role == "pub":
        env.pub = conninfo
    else:
        env.subs[role] = conninfo
        env.sub = env.subs["sub1"]
    return conninfo


def sub_rows(env, query: str, subscriber: str = "sub1") -> list[tuple]:
    return env.rows(env.subs[subscriber], query)


# ---------------------------------------------------------------------- collations
def test_icu_subscriber_gets_every_row_and_validate_matches(env, spark, monkeypatch):
    recreate(env, "sub1", ICU)
    assert env.rows(env.sub, "SELECT datlocprovider FROM pg_database WHERE datname = current_database()") == [("i",)]
    # C orders every 'K…' key before every 'k…' key; en-US interleaves them
    env.run(
        env.pub,
        "CREATE TABLE words (k text PRIMARY KEY, n int, v text); "
        "INSERT INTO words SELECT CASE WHEN g % 2 = 0 THEN 'K' ELSE 'k' END || lpad(g::text, 6, '0'), "
        "g, 'row ' || g FROM generate_series(1, 20000) g",
    )
    monkeypatch.setattr(snapshot_folder, "ROWS_PER_PARTITION", 2000)
    topo = env.topology(["words"])
    summary = snapshot_agent.run_snapshot(topo, "p", spark, max_partitions=4)
    assert summary["partitions"] == 4 and summary["rows"] == 20000
    assert sub_rows(env, "SELECT count(*), count(DISTINCT k) FROM words") == [(20000, 20000)]
    assert sub_rows(env, "SELECT count(*) FROM airflow_repl.snapshot_files") == [(4,)]
    assert sub_rows(env, "SELECT count(*) FROM words") == [(20000,)]
    assert_in_sync(topo)  # same values, different orderings: a match
    env.run(
        env.pub,
        "UPDATE words SET v = v || '!' WHERE n % 1000 = 0; DELETE FROM words WHERE n % 999 = 0; "
        "INSERT INTO words VALUES ('K~new', 0, 'new'), ('k~new', 0, 'new')",
    )
    cycle(topo)
    assert sorted(sub_rows(env, "SELECT k, n, v FROM words")) == sorted(env.rows(env.pub, "SELECT k, n, v FROM words"))
    assert_in_sync(topo)
    # a real difference is still found, with its keys
    env.run(
        env.sub,
        "UPDATE words SET v = 'changed' WHERE k = 'k000001'; DELETE FROM words WHERE k = 'K000002'; "
        "INSERT INTO words VALUES ('zz', 1, 'extra')",
    )
    report = validation.compare(topo, "p", "sub1")
    assert not report[0]["match"]
    assert sorted((d["key"], d["difference"]) for d in report[0]["differences"]) == [
        ("(K000002)", "missing at the subscriber"),
        ("(k000001)", "values differ"),
        ("(zz)", "extra at the subscriber"),
    ]
    assert "key (k000001): values differ" in validation.format_report(report)


# ---------------------------------------------------------------------- encodings
def test_latin1_publisher_to_utf8_icu_and_latin1_subscribers(env2, spark):
    env = env2
    recreate(env, "pub", LATIN1)
    recreate(env, "sub1", ICU)
    recreate(env, "sub2", LATIN1)
    env.run(env.pub, "CREATE TABLE t (k text PRIMARY KEY, v text)")
    env.run(
        env.pub,
        "INSERT INTO t VALUES (%s, %s), (%s, %s), (%s, %s)",
        ("é", "café", "Ã©", "looks like mojibake", "ÿ", "ÿ"),
    )
    topo = env.topology(["t"])
    snapshot_agent.run_snapshot(topo, "p", spark)
    # after the snapshot: through the Log Reader (pgoutput text in the publisher's encoding)
    with psycopg.connect(env.pub) as conn:  # one transaction
        conn.execute("INSERT INTO t VALUES (%s, %s), (%s, %s)", ("Ã©2", "Ã©", "è", "é"))
        conn.execute("UPDATE t SET v = %s WHERE k = %s", ("naïve", "é"))
        conn.execute("DELETE FROM t WHERE k = %s", ("ÿ",))
    log_reader_agent.run_log_reader(topo, "p")
    expected = sorted(env.rows(env.pub, "SELECT k, v FROM t"))
    assert ("Ã©2", "Ã©") in expected and ("è", "é") in expected
    for subscriber in ("sub1", "sub2"):
        distribution_agent.run_distribution(topo, "p", subscriber)
        assert sorted(sub_rows(env, "SELECT k, v FROM t", subscriber)) == expected
        assert_in_sync(topo, subscriber)  # UTF8/LATIN1 and C/ICU pairs: the same values match


def test_publisher_search_path_does_not_change_scripted_types(env, spark):
    env.run(
        env.pub,
        "CREATE SCHEMA other; CREATE TYPE other.color AS ENUM ('red', 'green'); "
        "CREATE TYPE public.mood AS ENUM ('ok', 'meh')",
    )
    env.run(
        env.pub,
        sql.SQL("ALTER DATABASE {} SET search_path = other, public").format(sql.Identifier(env.databases[0][1])),
    )
    env.run(
        env.pub,
        "CREATE TABLE public.paint (id int PRIMARY KEY, c color, m mood, cs color[]); "
        "INSERT INTO paint VALUES (1, 'red', 'ok', '{red,green}'), (2, 'green', 'meh', NULL)",
    )
    # the subscriber has the types (creating them is another part of the snapshot)
    env.run(
        env.sub,
        "CREATE SCHEMA other; CREATE TYPE other.color AS ENUM ('red', 'green'); "
        "CREATE TYPE public.mood AS ENUM ('ok', 'meh')",
    )
    topo = env.topology([{"table": "paint", "row_filter": "id <> 3"}])
    summary = snapshot_agent.run_snapshot(topo, "p", spark)
    script = (Path(summary["folder"]) / "schema.sql").read_text()
    assert '"c" other.color' in script and '"m" public.mood' in script and '"cs" other.color[]' in script
    env.run(
        env.pub,
        "INSERT INTO paint VALUES (3, 'green', 'ok', NULL), (4, 'red', 'meh', '{green}'); "
        "UPDATE paint SET m = 'meh' WHERE id = 1",
    )
    cycle(topo)
    assert sub_rows(env, "SELECT id, c::text, m::text FROM paint ORDER BY id") == [
        (1, "red", "meh"),
        (2, "green", "meh"),
        (4, "red", "meh"),
    ]
    assert_in_sync(topo)


# ---------------------------------------------------------------------- inheritance
INHERITANCE = """
CREATE TABLE {p} (id int PRIMARY KEY, v text);
CREATE TABLE {p}_c1 (extra int) INHERITS ({p});
CREATE TABLE {p}_c2 (more text) INHERITS ({p}_c1);
INSERT INTO {p} VALUES (1, 'p1'), (2, 'p2'), (3, 'p3');
INSERT INTO {p}_c1 VALUES (11, 'c11', 1), (12, 'c12', 2), (13, 'c13', 3);
INSERT INTO {p}_c2 VALUES (21, 'c21', 1, 'x'), (22, 'c22', 2, 'y');
"""
CHANGES = """
INSERT INTO {p} VALUES (4, 'p4'); INSERT INTO {p}_c1 VALUES (14, 'c14', 4);
UPDATE {p}_c1 SET v = 'c11 changed' WHERE id = 11; UPDATE {p}_c2 SET id = 31 WHERE id = 21;
DELETE FROM {p}_c1 WHERE id = 12; DELETE FROM {p} WHERE id = 2; UPDATE {p} SET v = v || '+' WHERE id = 22;
"""


def test_inheritance_parent_only_or_with_children_never_a_mix(env, spark):
    for p in ("only_t", "all_t"):
        env.run(env.pub, INHERITANCE.format(p=p))
    topo = env.topology(["only_t", {"table": "all_t", "include_children": True}])
    snapshot_agent.run_snapshot(topo, "p", spark)
    assert sub_rows(env, "SELECT id FROM only_t ORDER BY id") == [(1,), (2,), (3,)]
    assert sub_rows(env, "SELECT id FROM all_t ORDER BY id") == [(i,) for i in (1, 2, 3, 11, 12, 13, 21, 22)]
    assert_in_sync(topo)
    for p in ("only_t", "all_t"):
        env.run(env.pub, CHANGES.format(p=p))
    cycle(topo)
    assert sub_rows(env, "SELECT id, v FROM only_t ORDER BY id") == env.rows(
        env.pub, "SELECT id, v FROM ONLY only_t ORDER BY id"
    )
    assert sub_rows(env, "SELECT id, v FROM all_t ORDER BY id") == env.rows(
        env.pub, "SELECT id, v FROM all_t ORDER BY id"
    )
    assert (31, "c21") in sub_rows(env, "SELECT id, v FROM all_t") and (22, "c22+") in sub_rows(
        env, "SELECT id, v FROM all_t"
    )
    assert_in_sync(topo)
    # TRUNCATE of the whole hierarchy empties the article; TRUNCATE ONLY of the parent only the parent's rows
    env.run(env.pub, "TRUNCATE all_t; INSERT INTO all_t_c2 VALUES (100, 'after', 0, 'z'); TRUNCATE ONLY only_t")
    cycle(topo)
    assert sub_rows(env, "SELECT id FROM all_t") == [(100,)]
    assert sub_rows(env, "SELECT count(*) FROM only_t") == [(0,)]
    assert_in_sync(topo)
    # truncating part of an included hierarchy cannot be replicated exactly: refused, named
    env.run(env.pub, "TRUNCATE all_t_c1")
    with pytest.raises(ReplError, match=r"TRUNCATE of only part of public.all_t .* article 'all_t', which includes"):
        log_reader_agent.run_log_reader(topo, "p")


def test_block_ranges_read_every_row_once_over_children_of_other_sizes(env, spark, monkeypatch):
    """Several block ranges over a hierarchy whose tables have other sizes (the parent small, a
    child large, with dead tuples and free space in the middle): every row once."""
    env.run(env.pub, INHERITANCE.format(p="blk"))
    env.run(
        env.pub,
        """INSERT INTO blk_c1 SELECT g, repeat('x', g % 300), g FROM generate_series(1000, 40999) g;
           DELETE FROM blk_c1 WHERE id % 3 = 0 AND id BETWEEN 5000 AND 20000;
           UPDATE blk_c1 SET v = 'moved' WHERE id BETWEEN 30000 AND 30999;
           INSERT INTO blk SELECT g, 'p' FROM generate_series(100, 599) g""",
    )
    monkeypatch.setattr(snapshot_folder, "ROWS_PER_PARTITION", 2000)
    topo = env.topology([{"table": "blk", "include_children": True}])
    summary = snapshot_agent.run_snapshot(topo, "p", spark, max_partitions=7)
    assert summary["partitions"] == 7
    manifest = json.loads((Path(summary["folder"]) / "manifest.json").read_text())
    files = manifest["articles"][0]["files"]
    bounds = [(f["lower"], f["upper"]) for f in files]
    assert bounds[0][0] is None and bounds[-1][1] is None  # open at both ends
    assert all(a[1] == b[0] and isinstance(a[1], int) for a, b in itertools.pairwise(bounds))  # contiguous blocks
    assert sum(1 for f in files if f["rows"]) > 3  # the rows really are spread over the ranges
    expected = env.rows(env.pub, "SELECT id, v FROM blk ORDER BY id")
    assert sub_rows(env, "SELECT id, v FROM blk ORDER BY id") == expected
    assert sub_rows(env, "SELECT count(*), count(DISTINCT id) FROM blk") == [(len(expected), len(expected))]
    assert_in_sync(topo)


def test_a_child_cannot_be_an_article_and_an_included_child(env):
    env.run(env.pub, INHERITANCE.format(p="h") + "ALTER TABLE h_c2 ADD PRIMARY KEY (id);")
    topo = env.topology([{"table": "h", "include_children": True}, "h_c2"])
    with pytest.raises(
        TopologyError,
        match=r"public.h_c2 is published by article 'h_c2' and is also an "
        r"inheritance child of public.h",
    ):
        deploy.apply_topology(topo)


# ---------------------------------------------------------------------- keys
def test_include_columns_are_not_key_columns(env, spark):
    env.run(
        env.pub,
        "CREATE TABLE inc (a int, b int, c text, d int, PRIMARY KEY (a) INCLUDE (b), "
        "UNIQUE (c) INCLUDE (d)); INSERT INTO inc VALUES (1, 1, 'one', 1), (2, NULL, 'two', NULL)",
    )
    with psycopg.connect(env.pub) as conn:
        info = catalog.load_table(conn, "public", "inc")
    assert (info.primary_key, info.unique_keys) == (["a"], [["c"]])
    topo = env.topology(["inc"])
    snapshot_agent.run_snapshot(topo, "p", spark)
    assert sorted(
        r[0]
        for r in sub_rows(env, "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = 'inc'::regclass")
    ) == ["PRIMARY KEY (a)", "UNIQUE (c)"]
    env.run(env.pub, "INSERT INTO inc VALUES (3, NULL, 'three', NULL); UPDATE inc SET b = NULL, d = 5 WHERE a = 1")
    cycle(topo)
    assert sub_rows(env, "SELECT * FROM inc ORDER BY a") == [
        (1, None, "one", 5),
        (2, None, "two", None),
        (3, None, "three", None),
    ]
    assert_in_sync(topo)


# ---------------------------------------------------------------------- identifiers
ODD_DDL = """
CREATE SCHEMA "Odd %s Schema";
CREATE TABLE "Odd %s Schema"."Pct%% ""T"" 50%" ("Id%s" int PRIMARY KEY, "%" text, "a.b" text, "Mixed Case" int,
                                                  "q""uote %%" text);
CREATE TABLE "Odd %s Schema"."Pct%s SQL" ("Id%s" int PRIMARY KEY, "%" text, "Mixed Case" int);
INSERT INTO "Odd %s Schema"."Pct%% ""T"" 50%" SELECT g, g || '%', 'a.b', g % 3, '%s' FROM generate_series(1, 40) g;
INSERT INTO "Odd %s Schema"."Pct%s SQL" SELECT g, '%%' || g, g FROM generate_series(1, 40) g;
"""


@pytest.mark.parametrize("style", ["CALL", "SQL"])
def test_percent_quotes_spaces_dots_and_case_in_names(env, spark, monkeypatch, style):
    env.run(env.pub, ODD_DDL)
    monkeypatch.setattr(snapshot_folder, "ROWS_PER_PARTITION", 10)  # several key ranges
    prop = {} if style == "CALL" else {"ins_cmd": "SQL", "upd_cmd": "SQL", "del_cmd": "SQL"}
    topo = env.topology(
        [
            {"table": 'Odd %s Schema.Pct%% "T" 50%', **prop},
            {"table": "Odd %s Schema.Pct%s SQL", "row_filter": '"Mixed Case" % 3 <> 1', **prop},
        ]
    )
    summary = snapshot_agent.run_snapshot(topo, "p", spark, max_partitions=3)
    assert summary["partitions"] == 6
    big = '"Odd %s Schema"."Pct%% ""T"" 50%"'
    small = '"Odd %s Schema"."Pct%s SQL"'
    assert sub_rows(env, f"SELECT count(*) FROM {big}") == [(40,)]
    assert sub_rows(env, f"SELECT count(*) FROM {small}") == [(26,)]
    env.run(
        env.pub,
        f"INSERT INTO {big} VALUES (41, '%%', '.', 7, '\"'); UPDATE {big} SET \"%\" = '%s%s' "
        f'WHERE "Id%s" = 1; UPDATE {big} SET "Id%s" = "Id%s" + 100 WHERE "Id%s" <= 3; '
        f'DELETE FROM {big} WHERE "Id%s" = 10; UPDATE {small} SET "Mixed Case" = 0 WHERE "Id%s" = 4; '
        f"DELETE FROM {small} WHERE \"Id%s\" = 5; TRUNCATE {small}; INSERT INTO {small} VALUES (9, '%', 9)",
    )
    cycle(topo)
    for table, where in ((big, ""), (small, ' WHERE "Mixed Case" % 3 <> 1')):
        assert sorted(sub_rows(env, f"SELECT * FROM {table}")) == sorted(
            env.rows(env.pub, f"SELECT * FROM {table}{where}")
        )
    assert_in_sync(topo)
    env.run(env.sub, f'UPDATE {big} SET "a.b" = \'x\' WHERE "Id%s" = 41')
    report = validation.compare(topo, "p", "sub1")
    assert [d["key"] for r in report for d in r.get("differences", [])] == ["(41)"]


# ---------------------------------------------------------------------- pure logic (no server)


def test_a_subscriber_missing_snapshot_rows_is_not_activated(env):
    env.run(env.pub, "CREATE TABLE t (id int PRIMARY KEY)")
    env.run(env.sub, "CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1), (2)")
    art = deploy.apply_topology(env.topology(["t"]), ["p"])["p"][0]
    with psycopg.connect(env.sub) as sub:
        snapshot_agent._check_loaded_rows(sub, [art], {"articles": [{"name": "t", "rows": 2}]}, "sub1")
        with pytest.raises(
            ReplError,
            match=r"subscriber 'sub1' holds 2 rows in public.t after loading the snapshot "
            r"of article 't', which has 3: the subscription was not activated",
        ):
            snapshot_agent._check_loaded_rows(sub, [art], {"articles": [{"name": "t", "rows": 3}]}, "sub1")


def test_a_character_the_subscriber_encoding_cannot_hold_is_named(env, spark):
    recreate(env, "sub1", LATIN1)
    env.run(env.pub, "CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t VALUES (1, 'fits: é'), (2, '€')")
    with pytest.raises(
        Exception,
        match=r"encoding LATIN1\) cannot store a character of article 't' \(public.t\): "
        r"character with byte sequence 0xe2 0x82 0xac",
    ):
        snapshot_agent.run_snapshot(env.topology(["t"]), "p", spark)
    assert env.rows(env.dist, "SELECT status FROM airflow_repl.subscriptions") == [("initializing",)]
