"""MariaDB's quoting at a real MariaDB server: string literals that mean the same under any
``sql_mode`` (``NO_BACKSLASH_ESCAPES`` included), names ending in whitespace that MariaDB refuses
(and :func:`quoting.check_name` refuses first), and every refusal of the MariaDB snapshot's plan
one line, whatever the destination's name holds."""

from __future__ import annotations

import psycopg
import pymysql
import pytest
from psycopg import sql

from airflow_repl.engine.agents import mariadb_snapshot
from airflow_repl.engine.errors import TopologyError
from airflow_repl.engine.mariadb import quoting
from airflow_repl.engine.provisioning import deploy

TEXTS = ["plain", "it's", "a\\'b", "back\\slash\\", "line\nbreak", "nul\0byte", "caf\u00e9 \U0001f600", "'; DROP x; --"]


@pytest.mark.parametrize("mode", ["NO_BACKSLASH_ESCAPES", "ANSI_QUOTES,NO_BACKSLASH_ESCAPES", ""])
def test_literals_mean_their_text_under_every_sql_mode(mariadb, mode):
    db = mariadb.new_database()
    with mariadb.server.connection(db) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION sql_mode = %s", (mode,))
        for text in TEXTS:
            cur.execute(f"SELECT {quoting.literal(text)}")
            (value,) = cur.fetchone()
            assert (value.decode() if isinstance(value, bytes) else value) == text, (mode, text)


@pytest.mark.parametrize("end", [" ", "\t", "\n", "\v", "\f", "\r"])
def test_names_ending_in_whitespace_are_refused_by_mariadb_and_by_check_name(mariadb, end):
    db = mariadb.new_database()
    with pytest.raises(pymysql.MySQLError):
        mariadb.run(db, f"CREATE TABLE {quoting.ident('t' + end)} (id int PRIMARY KEY)")
    with pytest.raises(TopologyError) as err:
        quoting.check_name("table", "t" + end, "article 'a'")
    assert "\n" not in str(err.value) and repr("t" + end) in str(err.value)


#: A publisher schema whose name holds a line break, a comment and a quote.
SCHEMA = "s\n-- it's"


@pytest.mark.parametrize(
    ("tables", "refusal"),
    [
        ([("t\t", "id int PRIMARY KEY")], "cannot be a MariaDB name"),
        ([("x\U0001f600", "id int PRIMARY KEY")], "cannot be a MariaDB name"),
        ([("t", 'id int PRIMARY KEY, "A" int, "a" int')], "differ only in case"),
        ([("t", 'id int PRIMARY KEY, "c\U0001f600" int')], "cannot be a MariaDB name"),
        ([("t", "id int PRIMARY KEY, price money")], "cannot hold"),
        ([("t", 'id int PRIMARY KEY, "p\nq" point')], "cannot hold"),
        ([("t", "id int PRIMARY KEY"), ("t", "id int PRIMARY KEY")], "both go to table"),
    ],
)
def test_every_refusal_of_the_snapshots_plan_is_one_line(env, tables, refusal):
    articles = []
    for i, (table, columns) in enumerate(tables):
        schema = f"{SCHEMA}{i}"
        env.run(env.pub, sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        env.run(env.pub, sql.SQL("CREATE TABLE {} ({})").format(sql.Identifier(schema, table), sql.SQL(columns)))
        articles.append({"table": f"{schema}.{table}", "name": f"a{i}"})
    with psycopg.connect(env.pub, autocommit=True) as conn:
        resolved = deploy.resolve_publication(conn, env.topology(articles).publication("p"))
        kinds = mariadb_snapshot.user_type_kinds(conn, resolved)
    with pytest.raises(TopologyError) as err:
        mariadb_snapshot.plan_tables(resolved, kinds, "m\n1")
    message = str(err.value)
    assert refusal in message and "\n" not in message and "\r" not in message, message
