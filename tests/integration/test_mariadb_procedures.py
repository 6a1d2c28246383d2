"""The MariaDB dialect at a real MariaDB server: the generated procedures of every call syntax,
resolved from a real publisher table with hostile names, loaded by the real ``mariadb`` client
from ``airflow-repl script-procs --dialect mariadb`` and called as the Distribution Agent calls
them (:func:`mariadb.call_sql` with :func:`call_syntax.values`): inserts and updates with NULLs
and 4-byte UTF-8, key changes, an update that changes nothing, rows not found (20598), keys that
differ only in case; and the schema-change DDL run there."""

from __future__ import annotations

import decimal
import subprocess
from datetime import datetime

import psycopg
import pymysql
import pytest
from harness import topology_file
from psycopg import sql

from airflow_repl import cli
from airflow_repl.engine.articles.commands import DELETE, INSERT, UPDATE, Command
from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.codegen import mariadb as dialect
from airflow_repl.engine.mariadb import types
from airflow_repl.engine.model.propagation import Operation
from airflow_repl.engine.provisioning import deploy

#: The publisher's schema (the MariaDB database) and table, and the columns: a backtick, a
#: comment, ``#``, a line break, a quote and a backslash, and columns named like the procedures'
#: parameters and local variable (``c1``, ``bitmap``, ``msg``).
SCHEMA, TABLE = "we'ird\\db`x", "t\nx/*#;-- y"
COLUMNS = [
    ("id", "integer"),
    ("a`b -- c", "text"),
    ("c1", "integer"),
    ("bitmap", "character varying(20)"),
    ("msg", "numeric(10,2)"),
    ("at", "timestamp without time zone"),
]
#: The subscriber's database: MariaDB keeps every table of a subscriber in the one its address names.
DATABASE = "sub'db`\n#x"
SYNTAXES = [("CALL", "CALL"), ("SCALL", "CALL"), ("MCALL", "CALL"), ("XCALL", "XCALL")]


def _publish(env, tmp_path, upd: str, dele: str, table: str = TABLE, columns=COLUMNS) -> tuple[str, ResolvedArticle]:
    """The publisher's hostile table, a topology file publishing it with these syntaxes, and its
    article as the engine resolves it from the publisher's catalog."""
    env.run(env.pub, sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(SCHEMA)))
    cols = sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t)) for c, t in columns)
    key = sql.Identifier(columns[0][0])
    env.run(
        env.pub,
        sql.SQL("CREATE TABLE IF NOT EXISTS {} ({}, PRIMARY KEY ({}))").format(
            sql.Identifier(SCHEMA, table), cols, key
        ),
    )
    articles = [{"table": f"{SCHEMA}.{table}", "upd_cmd": upd, "del_cmd": dele}]
    topo = topology_file(env, tmp_path, articles)
    with psycopg.connect(env.pub, autocommit=True) as conn:
        (art,) = deploy.resolve_publication(conn, env.topology(articles).publication("p"))
    return topo, art


def _subscriber_table(mdb, art: ResolvedArticle) -> None:
    """The subscriber's database (named like the publisher's schema, hostile too) and the
    article's table in it, as the snapshot creates it (InnoDB, the type map's types, keys in
    utf8mb4_nopad_bin)."""
    cols = ", ".join(
        f"{dialect.quote(c.name)} {types.map_type('t', c.name, c.type, key=c.name in art.primary_key).ddl}"
        f"{' NOT NULL' if c.name in art.primary_key else ''}"
        for c in art.columns
    )
    key = ", ".join(dialect.quote(c) for c in art.primary_key)
    with mdb.server.connection() as conn, conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {dialect.quote(DATABASE)}")
        cur.execute(f"CREATE DATABASE {dialect.quote(DATABASE)} CHARACTER SET utf8mb4")
    with mdb.server.connection(DATABASE) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {dialect.quote(art.dest_table)} ({cols}, PRIMARY KEY ({key})) ENGINE=InnoDB")


def _client(mdb, tmp_path, script: str) -> subprocess.CompletedProcess:
    """Run ``script`` with the ``mariadb`` command-line client (its password in a 0600 file)."""
    cnf = tmp_path / "client.cnf"
    args = mdb.server.connect_args()
    cnf.write_text(
        f"[client]\nhost={args['host']}\nport={args['port']}\nuser={args['user']}\npassword={args['password']}\n"
    )
    cnf.chmod(0o600)
    return subprocess.run(
        ["mariadb", f"--defaults-file={cnf}", f"--database={DATABASE}"],
        input=script,
        text=True,
        capture_output=True,
        check=False,
    )


def _script_procs(topo: str, capsys, dialect: str = "mariadb") -> tuple[int, str, str]:
    code = cli.main(["script-procs", "-t", topo, "--dialect", dialect])
    out, err = capsys.readouterr()
    return code, out, err


def _rows(mdb, art: ResolvedArticle) -> list[tuple]:
    with mdb.server.connection(DATABASE) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT * FROM {dialect.quote(art.dest_table)} ORDER BY 1".replace("%", "%%"))
        return list(cur.fetchall())


def _apply(mdb, art: ResolvedArticle, cmd: Command) -> None:
    """Call the procedure of ``cmd``'s operation as the Distribution Agent does."""
    op = {INSERT: Operation.INSERT, UPDATE: Operation.UPDATE, DELETE: Operation.DELETE}[cmd.op]
    with mdb.server.connection(DATABASE) as conn, conn.cursor() as cur:
        cur.execute(dialect.call_sql(art, op), dialect.call_values(art, op, cmd))


def _row_not_found(mdb, art: ResolvedArticle, cmd: Command, what: str) -> None:
    with pytest.raises(pymysql.err.MySQLError) as err:
        _apply(mdb, art, cmd)
    assert err.value.args[0] == dialect.ROW_NOT_FOUND_ERRNO, err.value.args
    assert err.value.args[1].startswith(f"row not found at the subscriber: {what} of {SCHEMA}.{TABLE} with key (id)=(")


EMOJI = "x😀 \u2018a`b\u2019 \\ 'q'"


@pytest.mark.parametrize(("upd", "dele"), SYNTAXES)
def test_generated_procedures_apply_every_call_syntax_at_mariadb(env, tmp_path, capsys, mariadb, upd, dele):
    mdb = mariadb
    topo, art = _publish(env, tmp_path, upd, dele)
    _subscriber_table(mdb, art)
    code, script, err = _script_procs(topo, capsys)
    assert (code, err) == (0, "")
    loaded = _client(mdb, tmp_path, script)
    assert loaded.returncode == 0, loaded.stderr
    routines = mdb.rows(
        "mysql",
        "SELECT ROUTINE_NAME FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = %s ORDER BY 1",
        (DATABASE,),
    )
    assert routines == sorted((art.default_procs[op],) for op in Operation)

    row1 = ["1", EMOJI, "7", "bm", "1.50", "2026-03-01 12:00:00"]
    row2 = ["2", None, None, None, None, None]
    _apply(mdb, art, Command(INSERT, "a", new=row1))
    _apply(mdb, art, Command(INSERT, "a", new=row2))
    when = datetime(2026, 3, 1, 12)
    assert _rows(mdb, art) == [
        (1, EMOJI, 7, "bm", decimal.Decimal("1.50"), when),
        (2, None, None, None, None, None),
    ]
    # values to NULL and NULLs to values; the other columns as they were
    _apply(mdb, art, Command(UPDATE, "a", old=row1, new=["1", None, "7", "bm", "2.25", None]))
    _apply(mdb, art, Command(UPDATE, "a", old=row2, new=["2", "é名😀", None, None, None, "2026-03-02 00:00:00"]))
    assert _rows(mdb, art) == [
        (1, None, 7, "bm", decimal.Decimal("2.25"), None),
        (2, "é名😀", None, None, None, datetime(2026, 3, 2)),
    ]
    # an update that leaves its row as it was found it: no error
    same = ["1", None, "7", "bm", "2.25", None]
    _apply(mdb, art, Command(UPDATE, "a", old=same, new=same))
    # a change of the key moves the row
    _apply(mdb, art, Command(UPDATE, "a", old=same, new=["10", "moved", "7", "bm", "2.25", None]))
    assert [r[:2] for r in _rows(mdb, art)] == [(2, "é名😀"), (10, "moved")]
    # rows not found: 20598, for updates and deletes
    gone = ["99", None, None, None, None, None]
    _row_not_found(mdb, art, Command(UPDATE, "a", old=gone, new=["99", "x", None, None, None, None]), "update")
    _row_not_found(mdb, art, Command(DELETE, "a", old=gone), "delete")
    _apply(mdb, art, Command(DELETE, "a", old=["10", "moved", "7", "bm", "2.25", None]))
    assert [r[0] for r in _rows(mdb, art)] == [2]
    _row_not_found(mdb, art, Command(DELETE, "a", old=["10", "moved", "7", "bm", "2.25", None]), "delete")


def test_keys_that_differ_only_in_case_stay_apart(env, tmp_path, capsys, mariadb):
    mdb = mariadb
    columns = [("k", "character varying(10)"), ("v", "text")]
    topo, art = _publish(env, tmp_path, "SCALL", "CALL", table="cased", columns=columns)
    _subscriber_table(mdb, art)
    code, script, _err = _script_procs(topo, capsys)
    assert code == 0 and _client(mdb, tmp_path, script).returncode == 0
    for key in ("a", "A", "ä"):
        _apply(mdb, art, Command(INSERT, "a", new=[key, f"v{key}"]))
    _apply(mdb, art, Command(UPDATE, "a", old=["a", "va"], new=["a", "changed"]))
    _apply(mdb, art, Command(DELETE, "a", old=["A", "vA"]))
    assert sorted(_rows(mdb, art)) == [("a", "changed"), ("ä", "vä")]
    with pytest.raises(pymysql.err.MySQLError) as err:
        _apply(mdb, art, Command(DELETE, "a", old=["A", "vA"]))
    assert err.value.args[0] == dialect.ROW_NOT_FOUND_ERRNO


@pytest.mark.parametrize(("upd", "dele"), [("SCALL", "CALL"), ("XCALL", "XCALL")])
def test_values_travel_as_the_type_map_converts_them(env, tmp_path, capsys, mariadb, upd, dele):
    mdb = mariadb
    columns = [
        ("id", "bigint"),
        ("flag", "boolean"),
        ("blob", "bytea"),
        ("tz", "timestamp with time zone"),
        ("j", "jsonb"),
        ("u", "uuid"),
        ("arr", "integer[]"),
    ]
    topo, art = _publish(env, tmp_path, upd, dele, table="typed", columns=columns)
    _subscriber_table(mdb, art)
    code, script, _err = _script_procs(topo, capsys)
    assert code == 0 and _client(mdb, tmp_path, script).returncode == 0
    uuid = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
    row = ["1", "t", "\\x00ff", "2026-03-01 14:00:00.5+02", '{"a": "😀"}', uuid, "{1,NULL,3}"]
    _apply(mdb, art, Command(INSERT, "a", new=row))
    when = datetime(2026, 3, 1, 12, 0, 0, 500000)  # in UTC
    assert _rows(mdb, art) == [(1, 1, b"\x00\xff", when, '{"a": "😀"}', uuid, "{1,NULL,3}")]
    changed = ["1", "f", "\\xdeadbeef", "2026-03-01 23:30:00-01:30", None, uuid, "{}"]
    _apply(mdb, art, Command(UPDATE, "a", old=row, new=changed))
    assert _rows(mdb, art) == [(1, 0, b"\xde\xad\xbe\xef", datetime(2026, 3, 2, 1), None, uuid, "{}")]
    _apply(mdb, art, Command(DELETE, "a", old=changed))
    assert _rows(mdb, art) == []


def test_script_procs_refuses_a_name_mariadb_cannot_hold_before_printing(env, tmp_path, capsys):
    env.run(env.pub, "CREATE TABLE orders (id int PRIMARY KEY, v text)")
    env.run(env.pub, 'CREATE TABLE "emoji😀" (id int PRIMARY KEY, v text)')
    topo = topology_file(env, tmp_path, [{"table": "orders"}, {"table": "emoji😀"}])
    code, out, err = _script_procs(topo, capsys)
    assert (code, out) == (2, "")
    assert err == (
        "airflow-repl: error: table 'emoji😀' of article 'emoji😀' ('public.emoji😀') at a MariaDB subscriber cannot "
        "be a MariaDB name (at most 64 characters, no NUL, no trailing space, tab, line break, vertical tab, form "
        "feed or carriage return, no 4-byte UTF-8 character): rename it at the publisher or leave it out of the "
        "article\n"
    )


def test_schema_change_ddl_runs_at_mariadb_and_the_procedures_follow(env, tmp_path, capsys, mariadb):
    mdb = mariadb
    _topo, art = _publish(env, tmp_path, "SCALL", "CALL")
    _subscriber_table(mdb, art)
    with mdb.server.connection(DATABASE) as conn, conn.cursor() as cur:
        for op in Operation:
            cur.execute(dialect.procedure_sql(art, op))
    _apply(mdb, art, Command(INSERT, "a", new=["1", "one", "7", "bm", "1.50", None]))
    changes = [
        {"kind": "add_column", "column": "new`col", "type": "boolean", "existing": "t", "not_null": True},
        {"kind": "alter_type", "column": "c1", "type": "bigint"},
        {"kind": "alter_type", "column": "bitmap", "type": "character varying(40)"},
        {"kind": "rename_column", "column": "a`b -- c", "new_name": "renamed\n#x"},
        {"kind": "drop_column", "column": "msg"},
    ]
    with mdb.server.connection(DATABASE) as conn, conn.cursor() as cur:
        for change in changes:
            for statement in dialect.schema_change_sql(art, {**change, "in_article": True}):
                cur.execute(statement.replace("%", "%%"))
        assert dialect.schema_change_sql(art, {"kind": "drop_column", "column": "x", "in_article": False}) == []
    columns = mdb.rows(
        "mysql",
        "SELECT COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COLUMN_DEFAULT FROM information_schema.COLUMNS "
        "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
        (DATABASE, TABLE),
    )
    assert columns == [
        ("id", "int(11)", "NO", None),
        ("renamed\n#x", "longtext", "YES", "NULL"),
        ("c1", "bigint(20)", "YES", "NULL"),
        ("bitmap", "varchar(40)", "YES", "NULL"),
        ("at", "datetime(6)", "YES", "NULL"),
        ("new`col", "tinyint(1)", "NO", None),
    ]
    assert _rows(mdb, art) == [(1, "one", 7, "bm", None, 1)]  # the existing row got the publisher's value
