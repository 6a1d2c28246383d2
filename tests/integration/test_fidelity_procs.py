"""Data fidelity of the generated procedures and of row identity (issue 14): columns named like
procedure parameters, PostgreSQL's 100-argument limit per call syntax, DEFERRABLE keys and key
shifts over rows equal apart from the key, and user types (enums, domains, composites,
collations) created at the subscriber."""

from __future__ import annotations

import re

import psycopg
import pytest
from harness import assert_in_sync, cycle, topology_file

from airflow_repl.engine.agents import distribution_agent, log_reader_agent, snapshot_agent, snapshot_folder
from airflow_repl.engine.codegen import procedures, tsql_script
from airflow_repl.engine.errors import DeliveryError, ReplError, TopologyError
from airflow_repl.engine.provisioning import deploy

SYNTAX_ARTICLES = {  # article table -> propagation options: every call syntax, and SQL statements
    "t_call": {"upd_cmd": "CALL"},
    "t_scall": {"upd_cmd": "SCALL"},
    "t_mcall": {"upd_cmd": "MCALL"},
    "t_xcall": {"upd_cmd": "XCALL", "del_cmd": "XCALL"},
    "t_sql": {"ins_cmd": "SQL", "upd_cmd": "SQL", "del_cmd": "SQL"},
}


def rows(conninfo: str, table: str) -> list[tuple]:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        return conn.execute(f'SELECT * FROM "{table}" ORDER BY 1, 2').fetchall()


def assert_rows_equal(env, tables) -> None:
    for table in tables:
        assert rows(env.sub, table) == rows(env.pub, table), table


# ---------------------------------------------------------------- 1. parameter names = column names
CLASH_DDL = """CREATE TABLE "{t}" (c1 int, pkc1 int, c2 text, bitmap text, c3 int, c4 int, pkc2 text,
    c9 int, c10 text, PRIMARY KEY (c1, pkc1))"""


def test_columns_named_like_procedure_parameters_under_every_syntax(env, spark):
    # c1..c10, pkc1, pkc2 and bitmap are the parameter names of some syntax for this table (9
    # columns: XCALL updates pass c1..c18; CALL/SCALL/MCALL pass pkc1, pkc2 and bitmap)
    for t in SYNTAX_ARTICLES:
        env.run(env.pub, CLASH_DDL.format(t=t))
        env.run(
            env.pub,
            f"INSERT INTO \"{t}\" SELECT g, g * 10, 'v' || g, 'b' || g, g, g, 'k', g, 'x' FROM generate_series(1, 5) g",
        )
    topo = env.topology([{"table": t, **opts} for t, opts in SYNTAX_ARTICLES.items()])
    snapshot_agent.run_snapshot(topo, "p", spark)
    for t in SYNTAX_ARTICLES:
        env.run(
            env.pub,
            f"""
            INSERT INTO "{t}" VALUES (6, 60, 'v6', 'b6', 6, 6, 'k', 6, 'x');
            UPDATE "{t}" SET c2 = 'changed', bitmap = NULL, pkc2 = c2 WHERE c1 = 2;
            UPDATE "{t}" SET c3 = c3 + 100 WHERE c1 IN (3, 4);
            UPDATE "{t}" SET c1 = 30, c10 = 'moved' WHERE c1 = 3;
            DELETE FROM "{t}" WHERE c1 = 5;""",
        )
    read, _delivered = cycle(topo)
    assert read["commands"] == 5 * 7  # the key update is a DELETE + INSERT pair
    assert_rows_equal(env, SYNTAX_ARTICLES)
    assert_in_sync(topo)


def test_procedure_bodies_reference_parameters_by_position_only(env):
    env.run(env.pub, CLASH_DDL.format(t="t"))
    for upd, dele in [("CALL", "CALL"), ("SCALL", "CALL"), ("MCALL", "CALL"), ("XCALL", "XCALL")]:
        with psycopg.connect(env.pub, autocommit=True) as conn:
            (art,) = deploy.resolve_publication(
                conn, env.topology([{"table": "t", "upd_cmd": upd, "del_cmd": dele}]).publication("p")
            )
        for op in ("insert", "update", "delete"):
            body = procedures.procedure_sql(art, op).split("$airflow_repl$")[1]
            assert body.lstrip().startswith("#variable_conflict use_column"), (upd, op)
            statement = body.split("BEGIN")[1].split(";")[0]
            assert not re.search(r"(?<![\"$\w])(c\d+|pkc\d+|bitmap)\b", statement), (upd, op, statement)
        # T-SQL keeps @parameters and [columns] apart
        script = tsql_script.article_script(art)
        if upd == "SCALL":
            assert "where [c1] = @pkc1 and [pkc1] = @pkc2" in script
            assert "[bitmap] = case substring(@bitmap,1,1) & 8 when 8 then @c4 else [bitmap] end" in script
        if upd == "XCALL":
            assert "[c1] = @c10" in script and "where [c1] = @c1 and [pkc1] = @c2" in script


# ---------------------------------------------------------------- 2. 100 arguments per procedure
def wide_ddl(table: str, n: int) -> str:
    cols = ", ".join(["id int PRIMARY KEY"] + [f"c{i} int" for i in range(2, n + 1)])
    return (
        f'CREATE TABLE "{table}" ({cols}); INSERT INTO "{table}" (id, c2, c{n}) '
        f"SELECT g, g, -g FROM generate_series(1, 10) g;"
    )


#: The widest table each call syntax takes (one-column key): insert CALL passes n parameters,
#: update CALL n + 1, SCALL / MCALL n + 2, XCALL 2n; delete CALL 1, XCALL n.
WIDEST = [
    ("w_xcall", 50, {"upd_cmd": "XCALL", "del_cmd": "XCALL"}),
    ("w_scall", 98, {"upd_cmd": "SCALL"}),
    ("w_mcall", 98, {"upd_cmd": "MCALL"}),
    ("w_call", 99, {"upd_cmd": "CALL"}),
    ("w_ins", 100, {"upd_cmd": "SQL"}),
    ("w_sql", 1000, {"ins_cmd": "SQL", "upd_cmd": "SQL", "del_cmd": "SQL"}),
]


def test_widest_table_of_each_syntax_replicates_end_to_end(env, spark):
    for table, n, _ in WIDEST:
        env.run(env.pub, wide_ddl(table, n))
    topo = env.topology([{"table": t, **opts} for t, _, opts in WIDEST])
    summary = snapshot_agent.run_snapshot(topo, "p", spark)
    assert summary["rows"] == 10 * len(WIDEST)
    for table, n, _ in WIDEST:
        env.run(
            env.pub,
            f"""
            INSERT INTO "{table}" (id, c2, c{n}) VALUES (11, 11, 11);
            UPDATE "{table}" SET c{n} = c{n} * 100, c3 = 3 WHERE id <= 3;
            UPDATE "{table}" SET id = id + 100 WHERE id = 4;
            DELETE FROM "{table}" WHERE id = 5;""",
        )
    cycle(topo)
    assert_rows_equal(env, [t for t, _, _ in WIDEST])
    assert_in_sync(topo)


REFUSED = [
    ("w_xcall", 51, {"upd_cmd": "XCALL", "del_cmd": "CALL"}, "update", "XCALL", 102, "CALL or SCALL or MCALL or SQL"),
    ("w_xdel", 101, {"upd_cmd": "SQL", "ins_cmd": "SQL", "del_cmd": "XCALL"}, "delete", "XCALL", 101, "CALL or SQL"),
    ("w_scall", 99, {"upd_cmd": "SCALL"}, "update", "SCALL", 101, "CALL or SQL"),
    ("w_mcall", 99, {"upd_cmd": "MCALL"}, "update", "MCALL", 101, "CALL or SQL"),
    ("w_call", 100, {"upd_cmd": "CALL"}, "update", "CALL", 101, "SQL"),
    ("w_ins", 101, {"upd_cmd": "SQL"}, "insert", "CALL", 101, "SQL"),
]


@pytest.mark.parametrize("table, n, opts, operation, syntax, count, fits", REFUSED, ids=[r[0] for r in REFUSED])
def test_one_column_more_is_refused_when_the_topology_is_applied(env, table, n, opts, operation, syntax, count, fits):
    env.run(env.pub, wide_ddl(table, n))
    topo = env.topology([{"table": table, "name": "wide", **opts}])
    with pytest.raises(TopologyError) as err:
        deploy.apply_topology(topo)
    message = str(err.value)
    assert "\n" not in message
    option = {"insert": "ins_cmd", "update": "upd_cmd", "delete": "del_cmd"}[operation]
    assert message == (
        f"article 'wide' (public.{table}, {n} columns replicated): {syntax} syntax passes {count} parameters "
        f"to the {operation} procedure, but PostgreSQL procedures take at most 100; set {option} to {fits} "
        f"(SQL statements have no such limit) or replicate fewer columns"
    )
    # nothing changed: no publication, replica identity untouched, nothing at the distributor
    assert env.rows(env.pub, "SELECT count(*) FROM pg_publication")[0][0] == 0
    assert env.rows(env.pub, f"SELECT relreplident FROM pg_class WHERE relname = '{table}'")[0][0] == "d"
    assert env.rows(env.dist, "SELECT to_regclass('airflow_repl.publications')")[0][0] is None


# ---------------------------------------------------------------- 3. deferrable keys and key shifts


DEFERRABLE_DDL = """CREATE TABLE "{t}" (id int PRIMARY KEY DEFERRABLE, v text NOT NULL,
    u int UNIQUE DEFERRABLE INITIALLY DEFERRED);"""
SEED = """INSERT INTO "{t}" (id, v) VALUES (1, 'a'), (2, 'a'), (3, 'a'), (13, 'b'), (12, 'b'), (11, 'b'),
    (21, 'c'), (22, 'c'), (31, 'd'), (41, 'e'), (42, 'e'), (51, 'f'), (52, 'g'), (53, 'h');"""
SCENARIOS = [
    "UPDATE \"{t}\" SET id = id + 1 WHERE v = 'a'",  # three-row shift up over equal rows
    "UPDATE \"{t}\" SET id = id - 1 WHERE v = 'b'",  # shift down (scanned 13, 12, 11)
    "UPDATE \"{t}\" SET id = 43 - id WHERE v = 'c'",  # swap of equal rows
    # chains across statements of one transaction
    'UPDATE "{t}" SET id = 32 WHERE id = 31; UPDATE "{t}" SET id = 33 WHERE id = 32; '
    'UPDATE "{t}" SET v = \'d2\' WHERE id = 33; UPDATE "{t}" SET id = 34 WHERE id = 33',
    # a later statement updating the rows the first one produced
    "UPDATE \"{t}\" SET id = id + 1 WHERE v = 'e'; UPDATE \"{t}\" SET id = id + 20 WHERE v = 'e'",
    # swap of rows that differ, then shifted back
    'UPDATE "{t}" SET id = CASE id WHEN 51 THEN 52 WHEN 52 THEN 53 ELSE 51 END WHERE id BETWEEN 51 AND 53; '
    'UPDATE "{t}" SET id = id + 100 WHERE id BETWEEN 51 AND 53; UPDATE "{t}" SET id = id - 100 WHERE id > 100',
    # deferred unique key shifted over equal rows, then a plain insert, update and delete
    'UPDATE "{t}" SET u = id; UPDATE "{t}" SET u = u + 1; INSERT INTO "{t}" VALUES (60, \'a\', 60); '
    'DELETE FROM "{t}" WHERE id = 2',
]


@pytest.mark.parametrize("chunk, streams", [(5000, 1), (2, 3)])
def test_key_shifts_over_equal_rows_under_every_syntax(env, spark, chunk, streams):
    tables = {
        **SYNTAX_ARTICLES,
        "t_multi": {"updates_as_delete_insert": "multi_row_key_changes"},
        "t_all": {"updates_as_delete_insert": "all", "upd_cmd": "MCALL"},
    }
    for t in tables:
        env.run(env.pub, DEFERRABLE_DDL.format(t=t) + SEED.format(t=t))
    topo = env.topology([{"table": t, **opts} for t, opts in tables.items()], subscription_streams=streams)
    snapshot_agent.run_snapshot(topo, "p", spark)
    # the subscriber's keys are as deferrable as the publisher's
    deferral = (
        "SELECT c.relname, k.contype, k.condeferrable, k.condeferred FROM pg_constraint k "
        "JOIN pg_class c ON c.oid = k.conrelid WHERE c.relname LIKE 't\\_%' ORDER BY 1, 2"
    )
    assert env.rows(env.sub, deferral) == env.rows(env.pub, deferral)
    assert ("t_call", "u", True, True) in env.rows(env.sub, deferral)
    for scenario in SCENARIOS:
        for t in tables:
            env.run(env.pub, "BEGIN; " + scenario.format(t=t) + "; COMMIT")
    log_reader_agent.run_log_reader(topo, "p", chunk=chunk)
    distribution_agent.run_distribution(topo, "p", "sub1")
    assert_rows_equal(env, tables)
    assert_in_sync(topo)
    # under the Distribution Agent's session_replication_role = replica a DEFERRABLE key is still
    # enforced: a row the subscriber already has is a duplicate key, not a second row
    env.run(env.sub, "INSERT INTO t_call VALUES (70, 'local')")
    env.run(env.pub, "INSERT INTO t_call VALUES (70, 'publisher')")
    log_reader_agent.run_log_reader(topo, "p")
    with pytest.raises(DeliveryError, match="duplicate key"):
        distribution_agent.run_distribution(topo, "p", "sub1")
    assert env.rows(env.sub, "SELECT v FROM t_call WHERE id = 70") == [("local",)]


def test_deferrable_keys_are_scripted_deferrable(env):
    env.run(env.pub, DEFERRABLE_DDL.format(t="t") + 'CREATE TABLE "n" (id int PRIMARY KEY, u int UNIQUE)')
    with psycopg.connect(env.pub, autocommit=True) as conn:
        t, n = deploy.resolve_publication(conn, env.topology(["t", "n"]).publication("p"))
    script = snapshot_folder.keys_script(t)  # the keys come after the load
    assert 'PRIMARY KEY ("id") DEFERRABLE;' in script
    assert 'UNIQUE ("u") DEFERRABLE INITIALLY DEFERRED;' in script
    assert "ENABLE ALWAYS TRIGGER" in script
    assert "DEFERRABLE" not in snapshot_folder.keys_script(n) and "TRIGGER" not in snapshot_folder.keys_script(n)
    assert "KEY" not in snapshot_folder.schema_script(t) and "UNIQUE" not in snapshot_folder.schema_script(t)
    assert "deferrable_keys" not in n.to_dict()["table"]  # unchanged definitions keep their hash


# ---------------------------------------------------------------- 4. user types at the subscriber
TYPES_DDL = """
CREATE SCHEMA other;
CREATE TYPE other.color AS ENUM ('red', 'green', 'blue');
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE COLLATION other.ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
CREATE COLLATION bytewise (provider = libc, locale = 'C');
CREATE DOMAIN posint AS integer DEFAULT 1 NOT NULL CONSTRAINT positive CHECK (VALUE > 0);
CREATE DOMAIN warm AS other.color CHECK (VALUE <> 'blue');
CREATE DOMAIN code AS text COLLATE bytewise CHECK (length(VALUE) < 10);
CREATE TYPE other.pt AS (x integer, c other.color, label text COLLATE "C", w warm);
CREATE TYPE other.floatrange AS RANGE (subtype = float8, subtype_diff = float8mi);
CREATE SCHEMA "my schema";
CREATE TYPE "my schema"."Odd ""Ty"" pe" AS ENUM ('it''s', 'a "b"', '');
CREATE TABLE t (id int PRIMARY KEY, m mood, ms mood[], c other.color, w warm, p other.pt, ps other.pt[],
    n text COLLATE other.ci, b text COLLATE bytewise, r other.floatrange, k posint, cd code, cs other.color[],
    plain text, odd "my schema"."Odd ""Ty"" pe");
INSERT INTO t VALUES
    (1, 'sad', '{sad,happy}', 'red', 'green', '(1,blue,"a b",red)', ARRAY['(2,red,x,green)'::other.pt, NULL],
     'Straße', 'B', '[1.5,2)', 5, 'abc', '{red,NULL,blue}', 'x', 'it''s'),
    (2, NULL, '{}', NULL, NULL, NULL, NULL, NULL, NULL, 'empty', 1, NULL, NULL, NULL, '');
"""
TYPE_ROWS = "SELECT t::text FROM t ORDER BY id"


def test_user_types_domains_enums_composites_and_collations_replicate(env, spark):
    env.run(env.pub, TYPES_DDL)
    # identical objects already at the subscriber are accepted and kept
    env.run(
        env.sub,
        "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy'); CREATE SCHEMA other; "
        "CREATE COLLATION other.ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)",
    )
    mood_oid = env.rows(env.sub, "SELECT 'mood'::regtype::oid")[0][0]
    topo = env.topology(["t"])
    summary = snapshot_agent.run_snapshot(topo, "p", spark)
    schema_sql = (snapshot_agent.Path(summary["folder"]) / "schema.sql").read_text()

    def at(text: str) -> int:
        return schema_sql.index(text)

    # what an object uses comes before it, and every object before the tables
    assert at('"other"."color" AS ENUM') < at('"public"."warm" AS other.color') < at('"other"."pt" AS (')
    assert at('COLLATION IF NOT EXISTS "public"."bytewise"') < at('"public"."code" AS text COLLATE')
    assert max(at('CREATE COLLATION IF NOT EXISTS "other"."ci"'), at("AS RANGE"), at("posint")) < at("CREATE TABLE")
    assert env.rows(env.sub, "SELECT 'mood'::regtype::oid")[0][0] == mood_oid
    assert env.rows(env.sub, TYPE_ROWS) == env.rows(env.pub, TYPE_ROWS)
    env.run(
        env.pub,
        """
        INSERT INTO t VALUES (3, 'happy', '{ok}', 'blue', 'red', '(3,green,z,red)', '{}', 'STRASSE', 'a',
                              '(,)', 7, 'q', '{green}', 'y', 'a "b"');
        UPDATE t SET m = 'ok', p.c = 'green', ms = ms || 'ok'::mood, n = 'strasse', r = '[3,4]' WHERE id = 1;
        UPDATE t SET id = 20, w = 'green', cs = '{blue}' WHERE id = 2;
        DELETE FROM t WHERE id = 3;""",
    )
    cycle(topo)
    assert env.rows(env.sub, TYPE_ROWS) == env.rows(env.pub, TYPE_ROWS)
    assert_in_sync(topo)
    # the subscriber's objects are the publisher's: labels in order, domain rules, collations
    assert env.rows(env.sub, "SELECT enum_range(NULL::other.color)::text") == [("{red,green,blue}",)]
    with pytest.raises(psycopg.errors.CheckViolation):
        env.run(env.sub, "SELECT 'blue'::warm")
    assert env.rows(env.sub, "SELECT 'a' = 'A' COLLATE other.ci, 'B' < 'a' COLLATE bytewise") == [(True, True)]
    assert env.rows(
        env.sub,
        "SELECT attname, collname FROM pg_attribute JOIN pg_collation c ON c.oid = attcollation "
        "WHERE attrelid = 't'::regclass AND attname IN ('n', 'b') ORDER BY 1",
    ) == [("b", "bytewise"), ("n", "ci")]


def test_types_that_differ_at_a_subscriber_are_refused_before_anything_changes(env2, spark):
    env = env2
    env.run(env.pub, TYPES_DDL)
    env.run(
        env.subs["sub2"],
        "CREATE TYPE mood AS ENUM ('sad', 'ok'); CREATE DOMAIN posint AS bigint; "
        "CREATE SCHEMA other; CREATE TYPE other.pt AS (x integer)",
    )
    topo = env.topology(["t"])
    with pytest.raises(ReplError) as err:
        snapshot_agent.run_snapshot(topo, "p", spark)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("subscriber 'sub2' cannot take the types the published columns use: ")
    assert "enum public.mood differs (labels ['sad', 'ok'] here, ['sad', 'ok', 'happy'] at the publisher)" in message
    assert "domain public.posint differs (base 'bigint' here, 'integer' at the publisher; " in message
    assert "composite other.pt differs (attributes" in message
    assert "enum other.color" not in message  # missing objects are created, not reported
    # nothing changed at either subscriber
    for sub in env.subs.values():
        assert env.rows(
            sub,
            "SELECT to_regclass('public.t'), to_regnamespace('airflow_repl'), "
            "to_regtype('other.color'), to_regtype('warm')",
        ) == [(None, None, None, None)]
    assert env.rows(env.subs["sub2"], "SELECT enum_range(NULL::mood)::text") == [("{sad,ok}",)]
    # refused before the snapshot was taken: no slot holds WAL for it
    assert env.rows(env.pub, "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()") == [(0,)]
    # fixed at the subscriber, the snapshot goes through
    env.run(env.subs["sub2"], "DROP TYPE mood; DROP DOMAIN posint; DROP TYPE other.pt")
    snapshot_agent.run_snapshot(topo, "p", spark)
    for sub in env.subs.values():
        assert env.rows(sub, TYPE_ROWS) == env.rows(env.pub, TYPE_ROWS)


def test_cli_apply_refuses_a_too_wide_table_in_one_line(env, tmp_path, capsys):
    from airflow_repl import cli

    env.run(env.pub, wide_ddl("wide", 51))
    path = topology_file(env, tmp_path, [{"table": "public.wide", "upd_cmd": "XCALL"}])
    assert cli.main(["apply", "-t", path]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "airflow-repl: error: article 'wide' (public.wide, 51 columns replicated): XCALL syntax "
        "passes 102 parameters to the update procedure, but PostgreSQL procedures take at most 100; "
        "set upd_cmd to CALL or SCALL or MCALL or SQL (SQL statements have no such limit) or "
        "replicate fewer columns"
    ]


def test_a_type_from_an_extension_missing_at_the_subscriber_is_named_with_the_fix(env, spark):
    env.run(
        env.pub,
        "CREATE EXTENSION citext; CREATE TABLE ci (id int PRIMARY KEY, name citext, names citext[]); "
        "INSERT INTO ci VALUES (1, 'Abc', '{X,y}')",
    )
    topo = env.topology(["ci"])
    with pytest.raises(
        ReplError,
        match=r"^subscriber 'sub1' cannot take the types the published columns use: "
        r"type public\.citext is missing \(CREATE EXTENSION \"citext\" WITH SCHEMA "
        r"\"public\"\)\. ",
    ):
        snapshot_agent.run_snapshot(topo, "p", spark)
    assert env.rows(env.sub, "SELECT to_regclass('public.ci')") == [(None,)]
    env.run(env.sub, "CREATE EXTENSION citext")
    snapshot_agent.run_snapshot(topo, "p", spark)
    env.run(env.pub, "UPDATE ci SET name = 'ABC', names = names || 'Z'::citext")
    cycle(topo)
    assert env.rows(env.sub, "SELECT ci::text FROM ci") == [('(1,ABC,"{X,y,Z}")',)]
    assert env.rows(env.sub, "SELECT count(*) FROM ci WHERE name = 'abc'") == [(1,)]
