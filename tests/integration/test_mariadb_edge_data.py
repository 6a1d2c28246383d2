"""The edge data through every propagation at a MariaDB subscriber, end to end with real servers:
SQL statements (the default), the generated procedures ``sp_MSins_/sp_MSupd_/sp_MSdel_``, and
custom MariaDB procedures called with each call syntax (CALL, SCALL, MCALL, XCALL).

Every type of the type map (docs/subscribers-mariadb.md) with its edge values (test_data_edges'
where MariaDB can hold them), NULLs, a toasted 1 MiB text and bytea, 4-byte UTF-8, 63-byte and
hostile names, keys that differ only in case or trailing spaces, key updates as DELETE/INSERT
pairs, an empty and a large transaction: one snapshot and one delivery per propagation, then the
MariaDB tables compared with the publisher row by row by canonical value (the validation's
comparison).  A value MariaDB cannot hold (NaN) stops delivery with one line naming the column,
under every propagation."""

from __future__ import annotations

import psycopg
import pytest
from harness import ALL_BYTES, ODD_TEXT, UNICODE_TEXT, deliver, mariadb_topology
from psycopg import sql

from airflow_repl.engine.agents import snapshot_agent
from airflow_repl.engine.errors import DeliveryError
from airflow_repl.engine.postgres.quoting import ident
from airflow_repl.engine.subscriber import validation

#: Text parameters compare and combine as the columns do (``IF(..., c2, col)`` refuses to mix
#: collations); json and jsonb ones are MariaDB's JSON, whose collation is utf8mb4_bin.
TEXT = "LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin"
UUID = "CHAR(36) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin"
LONG_COLUMN = "c" + "\u00e9" * 31  # 63 bytes
ODD_COLUMN = 'Quoted "Col"\nline `x` -- /* go 100%s %% %(v)s'
#: A 63-byte table name with a quote, a backtick, a line break, a comment and ``go``.
ODD_TABLE = 'Q"`\n-- /* go ' + "\u00e9" * 25

#: (column, PostgreSQL type, the custom procedures' MariaDB parameter type, edge values as
#: PostgreSQL input text): every type of the type map, each value one MariaDB holds.
EDGE = [
    ("i2", "smallint", "SMALLINT", ["-32768", "32767", "0"]),
    ("i4", "integer", "INT", ["-2147483648", "2147483647", "0"]),
    ("i8", "bigint", "BIGINT", ["-9223372036854775808", "9223372036854775807", "0"]),
    ("o", "oid", "INT UNSIGNED", ["0", "4294967295"]),
    ("n", "numeric(65,30)", "DECIMAL(65,30)", ["9" * 35 + "." + "9" * 30, "-0." + "0" * 29 + "1", "0", "-1.5"]),
    ("n0", "numeric(12)", "DECIMAL(12,0)", ["-999999999999", "0"]),
    ("f4", "real", "FLOAT", ["-0", "1.17549435e-38", "3.4028235e+38", "0.1", "1e-45"]),
    ("f8", "double precision", "DOUBLE", ["-0", "5e-324", "1.7976931348623157e308", "0.1", "-2.2250738585072014e-308"]),
    ("bo", "boolean", "BOOLEAN", ["t", "f"]),
    ("tx", "text", TEXT, [UNICODE_TEXT, ODD_TEXT, "", "NULL", "\\N", " "]),
    ("vc", "varchar(20)", TEXT, ["ab  ", "\u00e9" * 20, ""]),
    ("ch", "char(5)", TEXT, ["a", "     ", "\u00e9\u00e9\u00e9\u00e9\U0001f600"]),
    ("by", "bytea", "LONGBLOB", [ALL_BYTES, "\\x", "\\x00"]),
    ("u", "uuid", UUID, ["00000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-ffffffffffff"]),
    ("d", "date", "DATE", ["0001-01-01", "9999-12-31", "2000-02-29"]),
    ("ts", "timestamp", "DATETIME(6)", ["0001-01-01 00:00:00", "9999-12-31 23:59:59.999999", "1999-12-31 23:59:59.5"]),
    (
        "tstz",
        "timestamptz",
        "DATETIME(6)",
        ["2026-03-29 01:30:00.000001+01:00", "9999-12-31 23:59:59.999999+00", "0001-01-01 12:00:00+05:30:17"],
    ),
    ("t", "time", "TIME(6)", ["00:00:00", "24:00:00", "23:59:59.999999"]),
    ("t3", "time(3)", "TIME(6)", ["12:34:56.789"]),
    (
        "iv",
        "interval",
        TEXT,
        ["178000000 years", "1 mon -1 days -00:00:00.000001", "2147483647 days 2562047788:00:54.775807", "0"],
    ),
    (
        "j",
        "json",
        "JSON",
        ['{"b":1,"a":2,"a":3}', ' { "x" : [1, 2.50, 1e400] } ', '"\\u00e9\\ud83d\\ude00\\u0000"', "[]"],
    ),
    ("jb", "jsonb", "JSON", ['{"\u00e9":"\\ud83d\\ude00","n":1.000,"big":1e400}', '"\\u00e9"', "null", "{}"]),
    ("x", "xml", TEXT, ['<a b="1">&amp; \u00e9</a>', "text <b/> more", ""]),
    ("ip", "inet", TEXT, ["::ffff:1.2.3.4/128", "192.168.0.1/24", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"]),
    ("cidr", "cidr", TEXT, ["10.0.0.0/8", "::/0"]),
    ("mac", "macaddr", TEXT, ["08:00:2b:01:02:03", "ff:ff:ff:ff:ff:ff"]),
    ("mac8", "macaddr8", TEXT, ["08:00:2b:01:02:03:04:05"]),
    ("ai", "integer[]", TEXT, ["{{1,NULL},{3,4}}", "[0:1][-5:-4]={{1,2},{3,NULL}}", "{}", "{NULL}"]),
    ("at", "text[]", TEXT, ['{"NULL",NULL,"a\\"b","c\\\\d","",","," x "}', '[2:3]={\u00e9,"{}"}']),
    ("ats", "timestamptz[]", TEXT, ['{infinity,"4713-01-01 00:00:00+00 BC"}']),
    ("ajb", "jsonb[]", TEXT, ['{"{\\"a\\": 1}",NULL}']),
    ("m", "mood", TEXT, ["h\u00e4ppy 'q'", "sad"]),
    ("p", "posint", "INT", ["7", "2147483647"]),
    ("dtz", "stamp", "DATETIME(6)", ["2026-01-02 03:04:05.5-02"]),  # a domain over timestamptz: converted to UTC
    ("db", "flag", "BOOLEAN", ["t", "f"]),  # a domain over boolean
    ("r4", "int4range", TEXT, ["empty", "[1,)", "(,)", "[-2147483648,2147483647)"]),
    ("rn", "numrange", TEXT, ["[1.5,2.5)", "[-Infinity,Infinity]"]),
    ("rts", "tstzrange", TEXT, ["[-infinity,infinity]", '["4713-01-01 00:00:00+00 BC",)']),
    ("mr", "int4multirange", TEXT, ["{}", "{[1,3),[5,7)}", "{(,0),[10,)}"]),
    (LONG_COLUMN, "text", TEXT, ["long"]),
    (ODD_COLUMN, "text", TEXT, ["odd \U0001f600"]),
]
#: Rows 1..EDGE_ROWS carry the edge values (row r the r-th value of each column, cycling).
EDGE_ROWS = max(len(v) for *_, v in EDGE)
TYPES = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'h\u00e4ppy ''q''');
CREATE DOMAIN posint AS int CHECK (VALUE > 0);
CREATE DOMAIN stamp AS timestamptz;
CREATE DOMAIN flag AS boolean;
"""
#: (column, PostgreSQL type, parameter type) of the other tables.
KEYS = [("k", "text", TEXT), ("b", "bytea", "LONGBLOB"), ("n", "int", "INT"), ("v", "text", TEXT)]
TOAST = [("id", "int", "INT"), ("big", "text", TEXT), ("bigb", "bytea", "LONGBLOB"), ("note", "text", TEXT)]
ODD = [("k" * 63, "text", TEXT), ("\u00fc" * 31 + "x", "text", TEXT), ("go", "int", "INT")]
BIG = "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 32768) g)"  # 1 MiB of text
#: Keys that differ only in case, accents or trailing spaces, 4-byte UTF-8, quotes, line breaks.
ODD_KEYS = ["a", "A", "a ", "\u00e4", "\u00c4", "it's", "back\\slash", "%s", "\U0001f600", "new\nline", "", "NULL"]


def _create(env) -> None:
    edge = ", ".join(f"{ident(c)} {t}" for c, t, *_ in EDGE)
    env.run(
        env.pub,
        TYPES
        + f"CREATE TABLE edge (id int PRIMARY KEY, {edge});"
        + "CREATE TABLE keys (k text, b bytea, n int, v text, PRIMARY KEY (k, b, n));"
        + "CREATE TABLE toast (id int PRIMARY KEY, big text, bigb bytea, note text);"
        + "ALTER TABLE toast ALTER COLUMN big SET STORAGE EXTERNAL, ALTER COLUMN bigb SET STORAGE EXTERNAL;"
        + f"CREATE TABLE {ident(ODD_TABLE)} ({ident(ODD[0][0])} text PRIMARY KEY, {ident(ODD[1][0])} text, go int);"
        + "CREATE TABLE unpublished (id int PRIMARY KEY);",
    )


def _edge_row(r: int, id_: int) -> sql.Composable:
    """Row ``id_`` holding the ``r``-th edge value of each column (cycling)."""
    values = [sql.SQL("{}::{}").format(sql.Literal(v[r % len(v)]), sql.SQL(t)) for _, t, _, v in EDGE]
    return sql.SQL("({}, {})").format(sql.Literal(id_), sql.SQL(", ").join(values))


def _insert_edge(conn: psycopg.Connection, rows: list[tuple[int, int]]) -> None:
    conn.execute(sql.SQL("INSERT INTO edge VALUES {}").format(sql.SQL(", ").join(_edge_row(r, i) for r, i in rows)))


def _set_edge(conn: psycopg.Connection, id_: int, r: int, columns: list[str] | None = None) -> None:
    """Row ``id_``'s ``columns`` (all) set to the ``r``-th edge values."""
    sets = [
        sql.SQL("{} = {}::{}").format(sql.Identifier(c), sql.Literal(v[r % len(v)]), sql.SQL(t))
        for c, t, _, v in EDGE
        if columns is None or c in columns
    ]
    conn.execute(sql.SQL("UPDATE edge SET {} WHERE id = {}").format(sql.SQL(", ").join(sets), sql.Literal(id_)))


def _initial(env) -> None:
    with psycopg.connect(env.pub, autocommit=True) as conn:
        _insert_edge(conn, [(r, r + 1) for r in range(EDGE_ROWS)])
        conn.execute("INSERT INTO edge (id) VALUES (100), (101)")  # every other column NULL
        for i, k in enumerate(ODD_KEYS):
            conn.execute("INSERT INTO keys VALUES (%s, %s, %s, %s)", (k, k.encode(), i, f"v{i}"))
        conn.execute(f"INSERT INTO toast VALUES (1, {BIG}, convert_to({BIG}, 'UTF8'), 'n'), (2, NULL, NULL, NULL)")
        conn.execute(sql.SQL("INSERT INTO {} VALUES ('a', 'x', 1), ('A', NULL, 2)").format(sql.Identifier(ODD_TABLE)))


def _changes(env) -> int:
    """The changes after the snapshot, one publisher transaction each; how many transactions
    touch the published tables."""
    odd = sql.Identifier(ODD_TABLE)
    with psycopg.connect(env.pub, autocommit=True) as conn:
        _insert_edge(conn, [(r, 200 + r) for r in range(EDGE_ROWS)])  # 1: the edge values by INSERTs
        conn.execute("INSERT INTO edge (id) VALUES (300)")  # 2: NULLs
        for r in range(EDGE_ROWS):  # 3..: every column of every row changed to the next row's values
            _set_edge(conn, r + 1, r + 1)
        _set_edge(conn, 100, 0)  # NULLs to values
        conn.execute(  # values to NULLs
            sql.SQL("UPDATE edge SET {} WHERE id = 2").format(
                sql.SQL(", ").join(sql.SQL("{} = NULL").format(sql.Identifier(c)) for c, *_ in EDGE)
            )
        )
        _set_edge(conn, 3, 0, ["n", "tstz", "jb", "by", ODD_COLUMN])  # a few columns: SCALL's partial lists
        conn.execute("UPDATE edge SET id = 400 WHERE id = 200")  # a key change: a DELETE/INSERT pair
        conn.execute("UPDATE edge SET id = 401, tx = 'moved' WHERE id = 101")  # one of NULLs
        conn.execute("DELETE FROM edge WHERE id IN (201, 300)")
        conn.execute("UPDATE toast SET note = 'toasted values unchanged' WHERE id = 1")
        conn.execute(f"UPDATE toast SET big = {BIG} || 'x', bigb = NULL WHERE id = 1")
        conn.execute(f"UPDATE toast SET big = {BIG}, bigb = convert_to({BIG}, 'UTF8') WHERE id = 2")
        conn.execute("UPDATE keys SET v = 'upper' WHERE k = 'A'")  # only 'A' of the keys alike
        conn.execute("UPDATE keys SET k = 'a  ' WHERE k = 'a '")  # key changes
        conn.execute("UPDATE keys SET b = '\\x00'::bytea, n = -1 WHERE k = '\U0001f600'")
        conn.execute("DELETE FROM keys WHERE k = '\u00e4'")
        conn.execute(
            sql.SQL("UPDATE {} SET go = 3, {} = 'y\u00e9' WHERE go = 1").format(odd, sql.Identifier(ODD[1][0]))
        )
        conn.execute(sql.SQL("UPDATE {} SET {} = 'B' WHERE go = 2").format(odd, sql.Identifier(ODD[0][0])))
        with conn.transaction():  # empty: nothing published changes
            conn.execute("UPDATE edge SET tx = tx WHERE false")
            conn.execute("INSERT INTO unpublished VALUES (1)")
        with conn.transaction():  # large: 1,200 rows in, all updated, a third deleted
            conn.execute("INSERT INTO keys SELECT 'bulk ' || g, '\\x'::bytea, g, 'v' FROM generate_series(1, 1200) g")
            conn.execute("UPDATE keys SET v = v || n WHERE k LIKE 'bulk %'")
            conn.execute("DELETE FROM keys WHERE k LIKE 'bulk %' AND n % 3 = 0")
    return EDGE_ROWS + 18


# ---------------------------------------------------------------------- custom procedures
def _flag(k: int) -> str:
    """Column ``k`` (1-based) is flagged in ``bitmap``: bit 2^((k-1) mod 8) of byte (k-1) div 8 + 1."""
    return f"ASCII(SUBSTRING(bitmap, {(k - 1) // 8 + 1}, 1)) & {1 << ((k - 1) % 8)} <> 0"


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def custom_procedures(table: str, tag: str, columns: list[tuple[str, str]], key: list[str], upd: str, dele: str):
    """CREATE PROCEDURE of a custom insert, update (call syntax ``upd``) and delete (``dele``)
    procedure of ``table`` (``columns``: (name, parameter type)), each doing the obvious thing
    with its parameters: SCALL and MCALL set the columns the bitmap flags; XCALL finds its row by
    the whole before image (every column ``<=>`` its value, so a before image that differs from
    the row in any value is a row not found).  No row matched raises 20598."""
    t = _q(table)
    n = len(columns)
    names = [c for c, _ in columns]
    col = {c: f"{t}.{_q(c)}" for c in names}
    cols = [(f"c{i + 1}", p) for i, (_, p) in enumerate(columns)]
    pks = [(f"pkc{j + 1}", dict(columns)[k]) for j, k in enumerate(key)]
    by_key = " AND ".join(f"{col[k]} = pkc{j + 1}" for j, k in enumerate(key))
    by_image = " AND ".join(f"{col[c]} <=> c{i + 1}" for i, c in enumerate(names))

    def proc(name: str, params: list[tuple[str, str]], change: str, row: str) -> str:
        """``change`` (a statement), then 20598 when it changed no row and ``row`` matches none."""
        decl = ", ".join(f"IN {p} {typ}" for p, typ in params)
        check = (
            f"IF ROW_COUNT() = 0 AND NOT EXISTS (SELECT 1 FROM {t} WHERE {row}) THEN "
            f"SIGNAL SQLSTATE 'RP598' SET MYSQL_ERRNO = 20598, MESSAGE_TEXT = 'row not found'; END IF"
        )
        return f"CREATE PROCEDURE {name}({decl}) MODIFIES SQL DATA BEGIN {change}; {check}; END"

    values = ", ".join(p for p, _ in cols)
    ins = proc(f"my_ins_{tag}", cols, f"INSERT INTO {t} ({', '.join(map(_q, names))}) VALUES ({values})", "TRUE")
    if upd == "CALL":
        params, row = cols + pks, by_key
        sets = [f"{col[c]} = c{i + 1}" for i, c in enumerate(names)]
    elif upd in ("SCALL", "MCALL"):
        params, row = [*cols, *pks, ("bitmap", "LONGBLOB")], by_key
        sets = [f"{col[c]} = IF({_flag(i + 1)}, c{i + 1}, {col[c]})" for i, c in enumerate(names)]
    else:
        params, row = cols + [(f"c{n + i + 1}", p) for i, (_, p) in enumerate(columns)], by_image
        sets = [f"{col[c]} = c{n + i + 1}" for i, c in enumerate(names)]
    up = proc(f"my_upd_{tag}", params, f"UPDATE {t} SET {', '.join(sets)} WHERE {row}", row)
    params, row = (pks, by_key) if dele == "CALL" else (cols, by_image)
    de = proc(f"my_del_{tag}", params, f"DELETE FROM {t} WHERE {row}", "FALSE")
    return [ins, up, de]


#: Each table: (its name, its tag in procedure names, (column, parameter type) of its columns, its key).
TABLES = [
    ("edge", "edge", [("id", "INT")] + [(c, p) for c, _, p, _ in EDGE], ["id"]),
    ("keys", "keys", [(c, p) for c, _, p in KEYS], ["k", "b", "n"]),
    ("toast", "toast", [(c, p) for c, _, p in TOAST], ["id"]),
    (ODD_TABLE, "odd", [(c, p) for c, _, p in ODD], [ODD[0][0]]),
]

#: Each propagation: update and delete syntax of the custom procedures, or "sql", "generated".
PROPAGATIONS = ["sql", "generated", "CALL", "SCALL", "MCALL", "XCALL"]


def _articles(propagation: str) -> list:
    if propagation == "sql":
        return ["public.edge", "public.keys", "public.toast", f"public.{ODD_TABLE}"]
    if propagation == "generated":
        # the odd table's generated name is no plain identifier: it cannot choose its procedures
        syntaxes = {"edge": ("SCALL", "CALL"), "keys": ("XCALL", "XCALL"), "toast": ("MCALL", "CALL")}
        return [
            {
                "table": f"public.{t}",
                "ins_cmd": f"CALL sp_MSins_public{t}",
                "upd_cmd": f"{u} sp_MSupd_public{t}",
                "del_cmd": f"{d} sp_MSdel_public{t}",
            }
            for t, (u, d) in syntaxes.items()
        ] + [f"public.{ODD_TABLE}"]
    dele = "XCALL" if propagation == "XCALL" else "CALL"
    return [
        {
            "table": f"public.{table}",
            "ins_cmd": f"CALL my_ins_{tag}",
            "upd_cmd": f"{propagation} my_upd_{tag}",
            "del_cmd": f"{dele} my_del_{tag}",
        }
        for table, tag, *_ in TABLES
    ]


def _calls(mariadb) -> int:
    [(_, n)] = mariadb.rows(None, "SHOW GLOBAL STATUS LIKE 'Com_call_procedure'")
    return int(n)


@pytest.mark.parametrize("propagation", PROPAGATIONS)
def test_the_edge_data_through_each_propagation_matches_the_publisher_by_value(env, spark, mariadb, propagation):
    _create(env)
    _initial(env)
    db = mariadb.new_database()
    if propagation not in ("sql", "generated"):
        dele = "XCALL" if propagation == "XCALL" else "CALL"
        for table, tag, columns, key in TABLES:
            for statement in custom_procedures(table, tag, columns, key, propagation, dele):
                mariadb.run(db, statement)
    # SQL statements go by net change (apply_mode auto); the generated procedures are called
    # command by command (under auto, net change would apply their batches with statements)
    options = {"apply_mode": "per_command"} if propagation == "generated" else {}
    topo, _ = mariadb_topology(env, mariadb, _articles(propagation), db=db, **options)
    snapshot_agent.run_snapshot(topo, "p", spark)
    lines = validation.compare(topo, "p", "m1")
    assert all(line["match"] for line in lines), validation.format_report(lines)
    transactions = _changes(env)
    before = _calls(mariadb)
    done = deliver(topo)
    assert done["transactions"] == transactions
    if propagation == "sql":
        assert _calls(mariadb) == before
    else:
        assert _calls(mariadb) > before
    lines = validation.compare(topo, "p", "m1")
    assert all(line["match"] and not line["differences"] for line in lines), validation.format_report(lines)
    counts = {line["article"]: line["subscriber_rows"] for line in lines}
    assert counts == {"edge": EDGE_ROWS + 2 + EDGE_ROWS - 1, "keys": len(ODD_KEYS) - 1 + 800, "toast": 2, ODD_TABLE: 2}
    # a value MariaDB cannot hold stops delivery with one line naming its column; nothing of its
    # transaction is applied
    env.run(env.pub, "UPDATE edge SET tx = 'before', f8 = 'NaN' WHERE id = 1")
    with pytest.raises(DeliveryError) as err:
        deliver(topo)
    assert "column 'f8'" in str(err.value) and "NaN" in str(err.value) and "\n" not in str(err.value)
    assert mariadb.rows(db, "SELECT tx FROM edge WHERE id = 1") != [("before",)]
