"""The distribution schema's versioned migrations on a real server: a database made by the DDL
of the last release without recorded versions (frozen in tests/unit/data/) upgrades in place,
keeps its rows and ends identical in the catalog to a fresh one; a second run changes nothing
and takes no ACCESS EXCLUSIVE lock; two agents starting together migrate once; a database newer
than this airflow-repl is refused."""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg
import pytest
import yaml
from psycopg import sql

from airflow_repl import cli
from airflow_repl.engine.errors import TopologyError
from airflow_repl.engine.state import dist_schema

DATA = Path(__file__).parents[1] / "unit" / "data"
LATEST = len(dist_schema.MIGRATIONS)

#: The schema as the catalog describes it: relations, columns (in order, with types, NOT NULL and
#: defaults), constraints, indexes and the schema's comment.
CATALOG = {
    "relations": "SELECT relname, relkind FROM pg_catalog.pg_class "
    "WHERE relnamespace = 'airflow_repl'::regnamespace ORDER BY 1",
    "columns": "SELECT c.relname, a.attnum, a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod), "
    "a.attnotnull, pg_catalog.pg_get_expr(d.adbin, d.adrelid) FROM pg_catalog.pg_attribute a "
    "JOIN pg_catalog.pg_class c ON c.oid = a.attrelid "
    "LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
    "WHERE c.relnamespace = 'airflow_repl'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped ORDER BY 1, 2",
    "constraints": "SELECT conrelid::regclass::text, conname, pg_catalog.pg_get_constraintdef(oid) "
    "FROM pg_catalog.pg_constraint WHERE connamespace = 'airflow_repl'::regnamespace ORDER BY 1, 2",
    "indexes": "SELECT indexname, indexdef FROM pg_catalog.pg_indexes WHERE schemaname = 'airflow_repl' ORDER BY 1",
    "comment": "SELECT pg_catalog.obj_description('airflow_repl'::regnamespace, 'pg_namespace')",
}

#: Rows in every kind of table, written into the database before its upgrade.
ROWS = """
INSERT INTO airflow_repl.publications (name, pg_publication, slot_name, allow_queued_tran)
    VALUES (E'p\\n"q', 'pub', 'slot', true);
INSERT INTO airflow_repl.articles (publication, name, definition) VALUES (E'p\\n"q', 'é', '{"a": 1}');
INSERT INTO airflow_repl.subscriptions (publication, subscriber, status, delivered_xact_seqno, update_mode)
    VALUES (E'p\\n"q', 'sub1', 'active', '0/16B3748', 'queued');
INSERT INTO airflow_repl.transactions (publication, xact_seqno, xid, commit_time, end_lsn, command_count, origin)
    VALUES (E'p\\n"q', '0/16B3748', 750, now(), '0/16B3790', 1, NULL);
INSERT INTO airflow_repl.commands (publication, xact_seqno, command_id, article, op, data)
    VALUES (E'p\\n"q', '0/16B3748', 1, 'é', 'I', '{"n": ["1", null]}');
INSERT INTO airflow_repl.agent_history (agent, publication, status) VALUES ('logreader', E'p\\n"q', 'succeeded');
INSERT INTO airflow_repl.errors (agent, publication, message) VALUES ('distribution', E'p\\n"q', 'it failed');
INSERT INTO airflow_repl.conflicts (publication, subscriber, article, key, kind, policy, outcome, queued_xid, queue_id)
    VALUES (E'p\\n"q', 'sub1', 'é', '[1]', 'update-update', 'pub wins', 'publisher', 9, 1);
INSERT INTO airflow_repl.tracer_tokens (publication, posted_at) VALUES (E'p\\n"q', now());
INSERT INTO airflow_repl.cleanup_state (publication, cleaned_xact_seqno) VALUES (E'p\\n"q', '0/0');
"""
TABLES = (
    "publications",
    "articles",
    "subscriptions",
    "transactions",
    "commands",
    "agent_history",
    "errors",
    "conflicts",
    "tracer_tokens",
    "cleanup_state",
)


def catalog(conninfo: str) -> dict[str, list[tuple]]:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        return {name: conn.execute(query).fetchall() for name, query in CATALOG.items()}


def contents(conninfo: str) -> dict[str, list[tuple]]:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        return {
            t: conn.execute(sql.SQL("SELECT * FROM airflow_repl.{} ORDER BY 1, 2").format(sql.Identifier(t))).fetchall()
            for t in TABLES
        }


def kept(before: dict[str, list[tuple]], after: dict[str, list[tuple]]) -> bool:
    """Every row of ``before`` is in ``after``, with the same values in the columns it had (a
    migration adds columns at the end)."""
    return {t: [r[: len(rows[0])] for r in after[t]] if rows else after[t] for t, rows in before.items()} == before


def made_before_versions(conninfo: str, digest: str, *, marked: bool) -> None:
    """The distribution schema as airflow-repl made it before versions were recorded (the DDL
    frozen under its digest, then the digest as the schema's comment), or, unmarked, as an
    earlier release left it."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute((DATA / f"distribution_ddl_{digest}.sql").read_text())
        if marked:
            mark = f"airflow-repl distribution schema {digest}"
            conn.execute(sql.SQL("COMMENT ON SCHEMA airflow_repl IS {}").format(sql.Literal(mark)))
        conn.execute(ROWS)


def exclusive_locks_of_ensure_schema(conninfo: str) -> list[str]:
    """Run ensure_schema inside a transaction and return the relations (but TOAST tables) it
    holds ACCESS EXCLUSIVE locks on at its end."""
    with psycopg.connect(conninfo) as conn:
        conn.execute("SELECT 1")  # a transaction is open: ensure_schema's own nest in it
        dist_schema.ensure_schema(conn)
        return [
            str(r[0])
            for r in conn.execute(
                "SELECT relation::regclass::text FROM pg_catalog.pg_locks WHERE pid = pg_backend_pid() "
                "AND locktype = 'relation' AND mode = 'AccessExclusiveLock' "
                "AND relation::regclass::text NOT LIKE 'pg\\_toast.%' ORDER BY 1"
            )
        ]


VERSION_TABLE = ["airflow_repl.schema_version", "airflow_repl.schema_version_pkey"]
#: Tables the migrations after version 11 make (their locks hold up nobody: nothing uses them yet).
NEW_TABLES = ["airflow_repl.subscription_articles", "airflow_repl.subscription_articles_pkey"]


@pytest.mark.parametrize(
    ("digest", "marked", "locked"),
    [
        # with pause and drop: only the version table is made, no lock a running agent would wait for
        ("2ec133100489f1fd", True, VERSION_TABLE),
        # before them: the paused column (its table locked once) and the drops table too
        ("c65c0fe6d55c40f8", True, ["airflow_repl.drops", "airflow_repl.drops_pkey", "airflow_repl.subscriptions"]),
        # an earlier release's: its DDL runs again, as that release's own did
        ("c65c0fe6d55c40f8", False, ["airflow_repl.conflicts", "airflow_repl.subscriptions"]),
    ],
    ids=["digest-marked with drops", "digest-marked", "earlier release"],
)
def test_a_database_made_before_versions_upgrades_in_place_to_a_fresh_ones_schema(env, digest, marked, locked):
    made_before_versions(env.dist, digest, marked=marked)
    rows = contents(env.dist)
    assert rows["commands"] and rows["conflicts"]
    locks = exclusive_locks_of_ensure_schema(env.dist)
    assert set(locked) <= set(locks) and set(locks) <= set(locked) | set(VERSION_TABLE) | set(NEW_TABLES) | {
        f"airflow_repl.{t}" for t in ("publications", "transactions", "errors", "drops", "drops_pkey")
    }
    assert kept(rows, contents(env.dist))
    assert env.rows(env.dist, "SELECT max(version) FROM airflow_repl.schema_version") == [(LATEST,)]

    with psycopg.connect(env.pub) as fresh:  # an empty database of the same server
        dist_schema.ensure_schema(fresh)
    assert catalog(env.dist) == catalog(env.pub)
    assert env.rows(env.pub, "SELECT version FROM airflow_repl.schema_version ORDER BY 1") == [
        (v,) for v in range(1, LATEST + 1)
    ]

    recorded = env.rows(env.dist, "SELECT * FROM airflow_repl.schema_version ORDER BY 1")
    before, upgraded = catalog(env.dist), contents(env.dist)
    assert exclusive_locks_of_ensure_schema(env.dist) == []  # the second run: nothing
    assert catalog(env.dist) == before and contents(env.dist) == upgraded
    assert env.rows(env.dist, "SELECT * FROM airflow_repl.schema_version ORDER BY 1") == recorded


def test_two_agents_starting_together_migrate_once(env):
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def agent() -> None:
        try:
            with psycopg.connect(env.dist, autocommit=True) as conn:
                start.wait(10)
                dist_schema.ensure_schema(conn)
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=agent) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert env.rows(env.dist, "SELECT version FROM airflow_repl.schema_version ORDER BY 1") == [
        (v,) for v in range(1, LATEST + 1)
    ]


def test_a_database_newer_than_this_airflow_repl_is_refused_before_anything_changes(env):
    with psycopg.connect(env.dist, autocommit=True) as conn:
        dist_schema.ensure_schema(conn)
        conn.execute(
            "INSERT INTO airflow_repl.schema_version (version, name) VALUES (%s, 'a later release')", (LATEST + 1,)
        )
        before, dbname = catalog(env.dist), conn.info.dbname
        with pytest.raises(TopologyError) as refused:
            dist_schema.ensure_schema(conn)
    assert "\n" not in str(refused.value)
    assert str(refused.value).startswith(
        f"the distribution database '{dbname}' has schema version {LATEST + 1}, newer than this airflow-repl"
    )
    assert catalog(env.dist) == before


def test_the_command_line_refuses_a_newer_database_in_one_line(env, tmp_path, capsys):
    env.run(env.pub, "CREATE TABLE items (id integer PRIMARY KEY, v text)")
    with psycopg.connect(env.dist, autocommit=True) as conn:
        dist_schema.ensure_schema(conn)
        conn.execute("INSERT INTO airflow_repl.schema_version (version, name) VALUES (%s, 'later')", (LATEST + 1,))
    topology = tmp_path / "topology.yaml"
    topology.write_text(
        yaml.safe_dump(
            {
                **env.servers(),
                "publications": [{"name": "p", "articles": [{"table": "public.items"}]}],
                "subscriptions": [{"publication": "p", "subscriber": "sub1"}],
            }
        )
    )
    code = cli.main(["register-script", "-t", str(topology), "--article", "items", "--python", "posixpath:join"])
    err = capsys.readouterr().err
    assert code == TopologyError.exit_code == 2
    assert err.startswith("airflow-repl: error: the distribution database") and err.count("\n") == 1
    assert f"has schema version {LATEST + 1}, newer than this airflow-repl knows (up to {LATEST})" in err
    assert env.rows(env.dist, "SELECT count(*) FROM airflow_repl.custom_scripts") == [(0,)]
