"""Data edge cases under every propagation style, with PostgreSQL's native logical replication
as the oracle.

One publication holds the same set of tables once per propagation style (schema ``s_<style>``):
generated procedures with each update syntax (SCALL, MCALL, CALL, XCALL), SQL statements, and the
update modes ``all`` / ``multi_row_key_changes``.  The tables carry every built-in type family
with its edge values, TOASTed values, composite and text keys with odd characters, composite values
whose fields are all NULL (nested, in arrays, under a domain), identity and
generated columns, partitions, odd and 63-byte names and wide tables at the argument limits.
One snapshot and one Log Reader + Distribution cycle serve every style; each style's
subscriber tables are then compared value by value (canonical text, fetched from both servers
under the agents' pinned session settings) with the publisher, and with a native subscription
(``CREATE SUBSCRIPTION`` in another database of the subscriber cluster) of the ``s_default``
tables, which receive the very same changes.

Cases whose fix came with other pieces of work (user types, name collisions, argument limits, deferrable keys, `%` names, INCLUDE keys, inheritance, qualified types, collations, encodings) are separate small tests.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import psycopg
import pytest
from harness import ALL_BYTES, ODD_TEXT, UNICODE_TEXT, diff, drop_native_subscription, wait_native
from psycopg import sql

from airflow_repl.engine.agents import (
    change_mapping,
    command_lines,
    distribution_agent,
    log_reader_agent,
    snapshot_agent,
)
from airflow_repl.engine.errors import TopologyError
from airflow_repl.engine.model import naming
from airflow_repl.engine.postgres import connections, copy_escaping, lsn, pgoutput
from airflow_repl.engine.postgres.quoting import ident
from airflow_repl.engine.provisioning import deploy
from airflow_repl.engine.state import dist_encoding, dist_publications, dist_transactions
from airflow_repl.engine.subscriber import validation

# ---------------------------------------------------------------------- edge values

#: (column, type, edge values as PostgreSQL input text)
SCALARS = [
    (
        "num",
        "numeric",
        [
            "NaN",
            "Infinity",
            "-Infinity",
            "9" * 1000,
            "-0." + "0" * 999 + "1",
            "9" * 500 + "." + "9" * 500,
            "0",
            "-1.5e-300",
        ],
    ),
    ("num_s", "numeric(12,4)", ["-99999999.9999", "0.0001", "NaN", "0"]),
    ("f4", "real", ["NaN", "Infinity", "-Infinity", "-0", "1.17549435e-38", "3.4028235e+38", "1e-45", "0.1"]),
    (
        "f8",
        "double precision",
        ["NaN", "Infinity", "-Infinity", "-0", "5e-324", "1.7976931348623157e308", "0.1", "-2.2250738585072014e-308"],
    ),
    ("i2", "smallint", ["-32768", "32767", "0"]),
    ("i4", "integer", ["-2147483648", "2147483647", "0"]),
    ("i8", "bigint", ["-9223372036854775808", "9223372036854775807", "0"]),
    ("d", "date", ["4713-01-01 BC", "5874897-12-31", "infinity", "-infinity", "0044-03-15 BC", "2000-02-29"]),
    (
        "ts",
        "timestamp",
        [
            "4713-01-01 00:00:00 BC",
            "294276-12-31 23:59:59.999999",
            "infinity",
            "-infinity",
            "1999-12-31 23:59:59.5",
            "0001-01-01 00:00:00 BC",
        ],
    ),
    (
        "tstz",
        "timestamp with time zone",
        [
            "4713-01-01 00:00:00+00 BC",
            "294276-12-31 23:59:59.999999+00",
            "infinity",
            "-infinity",
            "2026-03-29 01:30:00.000001+01:00",
        ],
    ),
    ("t", "time", ["00:00:00", "24:00:00", "23:59:59.999999"]),
    ("ttz", "time with time zone", ["00:00:00+15:59", "24:00:00-15:59", "12:34:56.789+05:30"]),
    (
        "iv",
        "interval",
        [
            "178000000 years",
            "-178000000 years",
            "1 mon -1 days -00:00:00.000001",
            "2147483647 days 2562047788:00:54.775807",
            "-2147483648 months",
            "0",
        ],
    ),
    ("tx", "text", [UNICODE_TEXT, ODD_TEXT, "", "NULL", "\\N", "\\.", " "]),
    ("vc", "varchar(20)", ["ab  ", "\u00e9" * 20, ""]),
    ("ch", "char(5)", ["a", "     ", "\u00e9\u00e9\u00e9\u00e9\u00e9"]),
    ("qc", '"char"', ["a", "", "\\", "\\377"]),
    ("nm", "name", ["x" * 63, "\u00dcml\u00e4ut"]),
    ("by", "bytea", [ALL_BYTES, "\\x", "\\x00"]),
    ("b", "boolean", ["t", "f"]),
    ("u", "uuid", ["00000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-ffffffffffff"]),
    ("o", "oid", ["0", "4294967295"]),
    ("m", "money", ["-92233720368547758.08", "92233720368547758.07", "0"]),
    ("lsn", "pg_lsn", ["0/0", "FFFFFFFF/FFFFFFFF"]),
]
OTHERS = [
    (
        "j",
        "json",
        ['{"b":1,"a":2,"a":3}', ' { "x" : [1, 2.50, 1e400] } ', '"\\u00e9\\ud83d\\ude00\\u0000"', "null", "[]"],
    ),
    (
        "jb",
        "jsonb",
        ['{"b":1,"a":2,"a":3}', '{"\u00e9":"\\ud83d\\ude00","n":1.000,"big":1e400}', '"\\u00e9"', "null", "{}"],
    ),
    ("x", "xml", ['<a b="1">&amp; \u00e9</a>', "text <b/> more", '<?xml version="1.0"?><r/>', ""]),
    ("ip", "inet", ["::ffff:1.2.3.4/128", "192.168.0.1/24", "0.0.0.0/0", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"]),
    ("cidr", "cidr", ["10.0.0.0/8", "::/0"]),
    ("mac", "macaddr", ["08:00:2b:01:02:03", "ff:ff:ff:ff:ff:ff"]),
    ("mac8", "macaddr8", ["08:00:2b:01:02:03:04:05"]),
    ("bt", "bit(8)", ["10101010", "00000000"]),
    ("vb", "bit varying", ["", "1" * 1000]),
    ("tsv", "tsvector", ["'a':1A 'fat':2B,4C 'cat':5D", "", "'it''s' 'back\\\\slash'"]),
    ("tsq", "tsquery", ["'fat' & ( 'rat' | !'cat' ) <-> 'x'"]),
    ("pt", "point", ["(1.5,-0)", "(NaN,Infinity)", "(1e-300,-1e300)"]),
    ("bx", "box", ["(1,1),(0,0)", "(Infinity,0),(-Infinity,-1)"]),
    ("ls", "lseg", ["[(0,0),(1,1)]"]),
    ("ln", "line", ["{1,-1,0}"]),
    ("pa", "path", ["[(0,0),(1,1),(2,0)]", "((0,0),(1,1))"]),
    ("pg", "polygon", ["((0,0),(1,1),(1,0))"]),
    ("ci", "circle", ["<(0,0),1e300>", "<(1,2),0>"]),
    ("ai", "integer[]", ["{{1,NULL},{3,4}}", "[0:1][-5:-4]={{1,2},{3,NULL}}", "{}", "{NULL}"]),
    ("at", "text[]", ['{"NULL",NULL,"a\\"b","c\\\\d","",","," x "}', '[2:3]={\u00e9,"{}"}']),
    ("an", "numeric[]", ["{NaN,Infinity,-Infinity,1e-100}"]),
    ("af", "double precision[]", ["{-0,NaN,Infinity,5e-324}"]),
    ("ats", "timestamp with time zone[]", ['{infinity,"4713-01-01 00:00:00+00 BC"}']),
    ("ajb", "jsonb[]", ['{"{\\"a\\": 1}",NULL}']),
    ("r4", "int4range", ["empty", "[1,)", "(,)", "[-2147483648,2147483647)"]),
    ("rn", "numrange", ["(,)", "[1.5,2.5)", "[-Infinity,Infinity]"]),
    ("rts", "tstzrange", ["[-infinity,infinity]", '["4713-01-01 00:00:00+00 BC",)', "empty"]),
    ("rd", "daterange", ["empty", "[4713-01-01 BC,infinity)"]),
    ("mr", "int4multirange", ["{}", "{[1,3),[5,7)}", "{(,0),[10,)}"]),
    ("mrd", "datemultirange", ["{[2000-01-01,2000-02-01)}", "{}"]),
]
EDGE_ROWS = max(len(v) for _, _, v in SCALARS + OTHERS)

ODD_KEYS = [
    "it's",
    "back\\slash",
    "%s",
    "100%",
    "with space",
    "dot.ted",
    "\u00fcn\u00efc\u00f8d\u00e9 \U0001f600",
    '"dq"',
    "",
    " lead",
    "trail ",
    "tab\there",
    "new\nline",
    "\\x00",
    "NULL",
]

#: the schema of each propagation style, and its article options
STYLES = {
    "default": {},  # ins CALL, upd SCALL, del CALL
    "mcall": {"upd_cmd": "MCALL"},
    "call": {"upd_cmd": "CALL"},
    "xcall": {"upd_cmd": "XCALL", "del_cmd": "XCALL"},
    "sql": {"ins_cmd": "SQL", "upd_cmd": "SQL", "del_cmd": "SQL"},
    "pairs": {"updates_as_delete_insert": "all"},
    "multirow": {"updates_as_delete_insert": "multi_row_key_changes"},
}
#: the most columns (key included) each style's procedures take within PostgreSQL's 100
#: arguments: SCALL/MCALL updates take n + key + bitmap, CALL n + key, XCALL 2n; SQL has no limit
WIDE = {"default": 98, "mcall": 98, "call": 99, "xcall": 50, "sql": 300, "pairs": 98, "multirow": 98}

ODD_TABLE = 'Mixed Case "Q" Tbl'
ODD_COLUMNS = ["Key Col", "a.b", "back\\slash", "quote'd", "\u00dcn\u00efc\u00f6d\u00e9", "SELECT", 'dq"x']
LONG_TABLE = "t" + "\u00e9" * 31  # 63 bytes
LONG_COLUMNS = ["k" * 63, "\u00fc" * 31 + "x"]  # 63 bytes each
BIG = "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 32768) g)"  # 1 MiB of text


def schema_name(style: str) -> str:
    return f"s_{style}"


def article_name(style: str, table: str) -> str:
    """'<style> <table>', cut to the 63 bytes a name may have (the long table's is exactly 63)."""
    return f"{style} {table}".encode()[:63].decode(errors="ignore")


def _cols(spec) -> str:
    return ", ".join(f"{ident(c)} {t}" for c, t, _ in spec)


def tables_ddl(style: str) -> str:
    """The tables of one style's schema (the same DDL creates the native subscriber's tables)."""
    s = ident(schema_name(style))
    wide = ", ".join(f"w{i} {'integer' if i % 2 else 'text'}" for i in range(1, WIDE[style]))
    odd = ", ".join(f"{ident(c)} {'text' if i != 5 else 'int'}" for i, c in enumerate(ODD_COLUMNS))
    return f"""
        CREATE SCHEMA {s};
        CREATE TABLE {s}.scalars (id int PRIMARY KEY, {_cols(SCALARS)});
        CREATE TABLE {s}.others (id int PRIMARY KEY, {_cols(OTHERS)});
        CREATE TABLE {s}.toast (id int PRIMARY KEY, big text, bigb bytea, other int, note text);
        ALTER TABLE {s}.toast ALTER COLUMN big SET STORAGE EXTERNAL, ALTER COLUMN bigb SET STORAGE EXTERNAL;
        CREATE TABLE {s}.keys (gone1 int, k text, n int, d date, gone2 text, v text, PRIMARY KEY (k, n, d));
        ALTER TABLE {s}.keys DROP COLUMN gone1, DROP COLUMN gone2;  -- dropped columns between live ones
        CREATE TABLE {s}.idgen (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, base int,
                                twice int GENERATED ALWAYS AS (base * 2) STORED,
                                seq bigint GENERATED BY DEFAULT AS IDENTITY, note text);
        CREATE TABLE {s}.part (region text, id int, v text, PRIMARY KEY (region, id)) PARTITION BY LIST (region);
        CREATE TABLE {s}.part_eu PARTITION OF {s}.part FOR VALUES IN ('eu');
        CREATE TABLE {s}.part_us PARTITION OF {s}.part FOR VALUES IN ('us');
        CREATE TABLE {s}.{ident(ODD_TABLE)} ({odd}, PRIMARY KEY ({ident(ODD_COLUMNS[0])}));
        CREATE TABLE {s}.{ident(LONG_TABLE)} ({ident(LONG_COLUMNS[0])} text PRIMARY KEY,
                                                  {ident(LONG_COLUMNS[1])} text);
        CREATE TABLE {s}.wide (id int PRIMARY KEY, {wide});
        CREATE TYPE {s}.quad AS (a int, b text, c date, d numeric);
        CREATE TYPE {s}.nest AS (x int, q {s}.quad);
        CREATE DOMAIN {s}.dquad AS {s}.quad CHECK ((VALUE).a IS NULL OR (VALUE).a > 0);
        CREATE TABLE {s}.comp (id int PRIMARY KEY, q {s}.quad, n {s}.nest, qa {s}.quad[], dq {s}.dquad,
                               na {s}.nest[]);
    """


TABLES = ["scalars", "others", "toast", "keys", "idgen", "part_eu", "part_us", ODD_TABLE, LONG_TABLE, "wide", "comp"]
#: Composite values whose fields are all NULL (``(,,,)`` is not NULL, though ``IS NULL`` is true of
#: it), at the top, nested, in arrays and under a domain, beside NULLs and other values (``@s``:
#: the style's schema).
COMPOSITE_ROWS = r"""INSERT INTO @s.comp VALUES
    (1, '(,,,)', '(,"(,,,)")', '{"(,,,)",NULL}', '(,,,)', '{"(,)"}'),
    (2, NULL, '(,)', NULL, NULL, NULL),
    (3, '(1,x,2000-01-01,1.5)', '(1,"(,,,)")', '{}', '(,,,)', '{NULL}'),
    (4, '(,,,)', NULL, '{}', NULL, '{"(,\"(,,,)\")"}'),
    (5, '(2,"",,)', '(,)', '{"(,,,)"}', '(,,,)', NULL)"""
COMPOSITE_CHANGES = r"""
    INSERT INTO @s.comp VALUES (6, '(,,,)', '(,)', '{"(,,,)"}', '(,,,)', '{"(,\"(,,,)\")"}');
    UPDATE @s.comp SET q = '(,,,)', dq = '(,,,)', n = '(,)' WHERE id = 3;  -- values -> all NULL
    UPDATE @s.comp SET q = '(3,,,)' WHERE id = 1;  -- all NULL -> a value
    UPDATE @s.comp SET q = '(,,,)', dq = '(,,,)' WHERE id = 2;  -- NULL -> all NULL
    UPDATE @s.comp SET q = NULL, na = NULL WHERE id = 4;  -- all NULL -> NULL
    UPDATE @s.comp SET id = 50 WHERE id = 5;  -- a key change of a row of all-NULL composites"""


def in_schema(statements: str, style: str) -> str:
    return statements.replace("@s", ident(schema_name(style)))


# ---------------------------------------------------------------------- data and changes
def _edge(values: list[str], k: int) -> str:
    return values[k % len(values)]


def _insert(conn: psycopg.Connection, schema: str, table: str, columns: list[str], rows: list[list]) -> None:
    query = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
        sql.Identifier(schema, table),
        sql.SQL(", ").join(map(sql.Identifier, columns)),
        sql.SQL(", ").join(sql.Placeholder() * len(columns)),
    )
    with conn.cursor() as cur:
        cur.executemany(query, rows)


def _update(conn: psycopg.Connection, schema: str, table: str, key: str, key_value, values: dict) -> None:
    conn.execute(
        sql.SQL("UPDATE {} SET {} WHERE {} = %s").format(
            sql.Identifier(schema, table),
            sql.SQL(", ").join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c in values),
            sql.Identifier(key),
        ),
        [*values.values(), key_value],
    )


def _edge_rows(spec, first_id: int, shift: int) -> list[list]:
    """Rows first_id.. with every edge value of every column (row k takes value k + shift), and
    one row of NULLs."""
    rows = [[first_id + k] + [_edge(v, k + shift) for _, _, v in spec] for k in range(EDGE_ROWS)]
    rows.append([first_id + EDGE_ROWS] + [None] * len(spec))
    return rows


def load_initial(conn: psycopg.Connection, style: str) -> None:
    s = schema_name(style)
    for table, spec in (("scalars", SCALARS), ("others", OTHERS)):
        _insert(conn, s, table, ["id"] + [c for c, _, _ in spec], _edge_rows(spec, 1, 0))
    conn.execute(in_schema(COMPOSITE_ROWS, style))
    q = sql.Identifier(s)
    conn.execute(
        sql.SQL(f"""
        INSERT INTO {{s}}.toast VALUES (1, {BIG}, decode({BIG}, 'hex'), 1, 'toasted'),
            (2, 'small', '\\x01', 2, 'becomes toasted'), (3, {BIG}, NULL, 3, 'stops being toasted'),
            (4, {BIG}, decode({BIG}, 'hex'), 4, 'key moves');
        INSERT INTO {{s}}.idgen (base, note) SELECT g, 'n' || g FROM generate_series(1, 3) g;
        INSERT INTO {{s}}.part VALUES ('eu', 1, 'a'), ('eu', 2, 'moves to us'), ('us', 3, 'c');
        """).format(s=q)
    )
    _insert(
        conn,
        s,
        "keys",
        ["k", "n", "d", "v"],
        [[k, i, "4713-01-01 BC" if i % 2 else "infinity", f"v{i}"] for i, k in enumerate(ODD_KEYS)],
    )
    _insert(
        conn, s, ODD_TABLE, ODD_COLUMNS, [[k, "1", "\\", "'", "\u00fc", str(i), '"'] for i, k in enumerate(ODD_KEYS)]
    )
    _insert(conn, s, LONG_TABLE, LONG_COLUMNS, [[k, k + "!"] for k in ODD_KEYS])
    wide_cols = ["id"] + [f"w{i}" for i in range(1, WIDE[style])]
    _insert(
        conn,
        s,
        "wide",
        wide_cols,
        [[str(r)] + [str(r * i) if i % 2 else f"r{r}c{i}" for i in range(1, WIDE[style])] for r in range(1, 6)],
    )


def make_changes(conninfo: str, style: str) -> None:
    """The same changes in every style's schema, in a handful of transactions."""
    s = schema_name(style)
    with psycopg.connect(conninfo) as conn:
        for table, spec in (("scalars", SCALARS), ("others", OTHERS)):
            names = [c for c, _, _ in spec]
            _insert(conn, s, table, ["id", *names], _edge_rows(spec, 101, 1))  # edge rows as INSERTs
            for k in range(EDGE_ROWS):  # every value -> another value
                _update(conn, s, table, "id", 1 + k, {c: _edge(v, k + 2) for c, _, v in spec})
            conn.commit()
            _update(conn, s, table, "id", 1 + EDGE_ROWS, {c: v[0] for c, _, v in spec})  # NULL -> value
            _update(conn, s, table, "id", 1, dict.fromkeys(names))  # value -> NULL
            _update(conn, s, table, "id", 2, {names[-1]: None})  # one column only
            _update(conn, s, table, "id", 3, {"id": 1000})  # single-row key change
            conn.execute(
                sql.SQL("UPDATE {} SET id = id + 2000 WHERE id IN (4, 5)").format(sql.Identifier(s, table))
            )  # multi-row key change
            conn.execute(sql.SQL("DELETE FROM {} WHERE id IN (6, 101)").format(sql.Identifier(s, table)))
            conn.execute(
                sql.SQL(
                    "UPDATE {t} SET id = 7000 WHERE id = 7; UPDATE {t} SET id = 7 WHERE id = 7000; "
                    "UPDATE {t} SET id = id WHERE id = 8"
                ).format(t=sql.Identifier(s, table))
            )
            conn.commit()
        q = sql.Identifier(s)
        conn.execute(
            sql.SQL(f"""
            UPDATE {{s}}.toast SET other = other + 10 WHERE id = 1;  -- TOASTed values unchanged
            UPDATE {{s}}.toast SET big = {BIG}, note = 'now toasted' WHERE id = 2;
            UPDATE {{s}}.toast SET big = 'small again', bigb = '\\x' WHERE id = 3;
            UPDATE {{s}}.toast SET id = 40 WHERE id = 4;  -- key change, TOASTed values unchanged
            INSERT INTO {{s}}.toast VALUES (5, {BIG} || 'x', decode({BIG}, 'hex'), 5, 'inserted');
            """).format(s=q)
        )
        conn.commit()
        conn.execute(sql.SQL("DELETE FROM {s}.toast WHERE id = 1").format(s=q))
        conn.execute(sql.SQL("UPDATE {s}.keys SET v = v || '!' WHERE k LIKE %s").format(s=q), ("%\\\\%",))
        conn.execute(sql.SQL("UPDATE {s}.keys SET k = k || '2' WHERE k = %s").format(s=q), ("it's",))
        conn.execute(sql.SQL("UPDATE {s}.keys SET n = n + 100").format(s=q))  # every key moves
        conn.execute(sql.SQL("DELETE FROM {s}.keys WHERE k IN (%s, %s)").format(s=q), ("%s", ""))
        conn.execute(sql.SQL("INSERT INTO {s}.keys VALUES (%s, -1, '-infinity', NULL)").format(s=q), ("new\r\n",))
        conn.commit()
        conn.execute(
            sql.SQL("""
            INSERT INTO {s}.idgen (base, note) VALUES (10, 'ten'), (NULL, 'null base');
            INSERT INTO {s}.idgen (base, seq) VALUES (11, 9223372036854775807);
            UPDATE {s}.idgen SET base = base + 1 WHERE id = 1;
            UPDATE {s}.idgen SET note = 'only note' WHERE id = 2;
            DELETE FROM {s}.idgen WHERE id = 3;
            INSERT INTO {s}.part VALUES ('us', 4, 'routed'), ('eu', 5, 'e');
            UPDATE {s}.part SET v = 'updated' WHERE id = 1;
            UPDATE {s}.part SET region = 'us' WHERE id = 2;  -- moves to another partition
            DELETE FROM {s}.part WHERE id = 3;
            """).format(s=q)
        )
        conn.commit()
        conn.execute(in_schema(COMPOSITE_CHANGES, style))
        conn.commit()
        odd, key = sql.Identifier(s, ODD_TABLE), sql.Identifier(ODD_COLUMNS[0])
        conn.execute(
            sql.SQL("UPDATE {} SET {} = {} || %s").format(
                odd, sql.Identifier(ODD_COLUMNS[3]), sql.Identifier(ODD_COLUMNS[3])
            ),
            ("''\\",),
        )
        conn.execute(sql.SQL("UPDATE {} SET {} = {} || '.' WHERE {} = %s").format(odd, key, key, key), ("dot.ted",))
        conn.execute(sql.SQL("DELETE FROM {} WHERE {} = %s").format(odd, key), ("100%",))
        _insert(conn, s, ODD_TABLE, ODD_COLUMNS, [["added %", None, "\\\\", "''", "\U0001f600", "-1", None]])
        long_t, long_k = sql.Identifier(s, LONG_TABLE), sql.Identifier(LONG_COLUMNS[0])
        conn.execute(
            sql.SQL("UPDATE {} SET {} = 'changed' WHERE {} = %s").format(
                long_t, sql.Identifier(LONG_COLUMNS[1]), long_k
            ),
            ("%s",),
        )
        conn.execute(
            sql.SQL("UPDATE {} SET {} = {} || 'x' WHERE {} = %s").format(long_t, long_k, long_k, long_k), ("it's",)
        )
        conn.execute(sql.SQL("DELETE FROM {} WHERE {} = %s").format(long_t, long_k), ("",))
        conn.commit()
        n = WIDE[style]
        _insert(
            conn,
            s,
            "wide",
            ["id"] + [f"w{i}" for i in range(1, n)],
            [[str(r)] + [str(-i) if i % 2 else None for i in range(1, n)] for r in (6, 7)],
        )
        conn.execute(
            sql.SQL("UPDATE {} SET {} WHERE id = 1").format(
                sql.Identifier(s, "wide"),
                sql.SQL(", ").join(
                    sql.SQL("{} = {}").format(sql.Identifier(f"w{i}"), sql.Literal(i if i % 2 else "all"))
                    for i in range(1, n)
                ),
            )
        )
        conn.execute(
            sql.SQL("UPDATE {} SET {} = NULL WHERE id = 2").format(
                sql.Identifier(s, "wide"), sql.Identifier(f"w{n - 1}")
            )
        )
        conn.execute(sql.SQL("UPDATE {} SET id = 30 WHERE id = 3").format(sql.Identifier(s, "wide")))
        conn.execute(sql.SQL("DELETE FROM {} WHERE id = 4").format(sql.Identifier(s, "wide")))
        conn.commit()


# ---------------------------------------------------------------------- comparing
def columns_of(conn: psycopg.Connection, schema: str, table: str, *, generated: bool) -> list[str]:
    return [
        r[0]
        for r in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped "
            "AND (%s OR attgenerated = '') ORDER BY attnum",
            (sql.Identifier(schema, table).as_string(conn), generated),
        )
    ]


def table_text(
    conn: psycopg.Connection, schema: str, table: str, columns: list[str], *, cast: bool = False
) -> list[tuple]:
    """Every row as each column's type output text, sorted: exactly what PostgreSQL prints (and
    pgoutput sends) under the agents' pinned session settings (``conn`` comes from
    :func:`connections.connect`).  Not ``::text``: some casts differ from the output function
    (an XML declaration survives ``xml::text`` but not xml_out); ``cast`` compares ``::text``
    instead, which shows such stored differences."""
    form = sql.SQL("{}::text") if cast else sql.SQL("{}")
    with conn.cursor() as cur:
        cur.execute(
            sql.SQL("SELECT {} FROM {}").format(
                sql.SQL(", ").join(form.format(sql.Identifier(c)) for c in columns), sql.Identifier(schema, table)
            )
        )
        res = cur.pgresult
        assert res is not None
        rows = [
            tuple(
                None if (v := res.get_value(r, c)) is None else v.decode(conn.info.encoding) for c in range(res.nfields)
            )
            for r in range(res.ntuples)
        ]
    return sorted(rows, key=lambda r: [(v is None, v or "") for v in r])


# ---------------------------------------------------------------------- native oracle
def create_native_subscription(pub_conninfo: str, native_conninfo: str, name: str, tables: list[str]) -> None:
    with psycopg.connect(pub_conninfo, autocommit=True) as pub:
        pub.execute(
            sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
                sql.Identifier(name), sql.SQL(", ").join(sql.Identifier(schema_name("default"), t) for t in tables)
            )
        )
    with psycopg.connect(native_conninfo, autocommit=True) as sub:
        sub.execute(
            sql.SQL("CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION {} WITH (slot_name = {})").format(
                sql.Identifier(name), sql.Literal(pub_conninfo), sql.Identifier(name), sql.Literal(name)
            )
        )


# ---------------------------------------------------------------------- the shared run
@dataclass
class World:
    snapshot_diffs: dict[str, list[str]] = field(default_factory=dict)
    native_snapshot_diffs: dict[str, list[str]] = field(default_factory=dict)
    change_diffs: dict[str, list[str]] = field(default_factory=dict)
    native_diffs: dict[str, list[str]] = field(default_factory=dict)
    error: BaseException | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    #: the slot's pgoutput messages of the changes (peeked before the Log Reader read them) and
    #: the articles they map to: the compiled command lines are checked on them
    messages: list[bytes] = field(default_factory=list)
    articles: dict = field(default_factory=dict)
    dist: str = ""  # the distribution database's conninfo

    def check(self) -> None:
        if self.error is not None:
            raise AssertionError(f"the shared run failed: {self.error!r}") from self.error


def _compare_style(
    pub: psycopg.Connection, sub: psycopg.Connection, native: psycopg.Connection, style: str
) -> tuple[list[str], list[str]]:
    """Differences of a style's subscriber tables from the publisher and from the native
    subscriber."""
    s = schema_name(style)
    ours, theirs = [], []
    for table in TABLES:
        cols = columns_of(pub, s, table, generated=False)
        pub_rows = table_text(pub, s, table, cols)
        ours += diff(f"{s}.{table} (subscriber vs publisher)", cols, pub_rows, table_text(sub, s, table, cols))
        if table == "wide" and WIDE[style] != WIDE["default"]:
            continue  # the native copy is the default style's, of another width
        every = columns_of(pub, s, table, generated=True)
        missing = [c for c in every if c not in columns_of(sub, s, table, generated=True)]
        if missing:
            theirs.append(
                f"{s}.{table}: column(s) {missing} missing at the subscriber, present at the native subscriber"
            )
            every = [c for c in every if c not in missing]
        for cast in (False, True):
            theirs += diff(
                f"{s}.{table} (subscriber vs native subscriber{', ::text' * cast})",
                every,
                table_text(native, schema_name("default"), table, every, cast=cast),
                table_text(sub, s, table, every, cast=cast),
            )
    return ours, theirs


def _compare_all(env, native: str, style: str) -> tuple[list[str], list[str]]:
    with (
        connections.connect(env.pub, "publisher", autocommit=True) as pub,
        connections.connect(env.sub, "subscriber", autocommit=True) as sub,
        connections.connect(native, "native subscriber", autocommit=True) as nat,
    ):
        return _compare_style(pub, sub, nat, style)


@pytest.fixture(scope="module")
def world(sandbox, spark, tmp_path_factory):
    from harness import Env

    env = Env(sandbox, tmp_path_factory.mktemp("edges"))
    native_name = f"native_{env.databases[0][1]}"
    native = sandbox.create_database("subscriber", native_name, recreate=True)
    oracle = f"oracle_{env.databases[0][1]}"
    world = World(dist=env.dist)
    started = time.monotonic()

    @contextmanager
    def timed(step: str) -> Iterator[None]:
        t0 = time.monotonic()
        try:
            yield
        finally:
            world.seconds[step] = time.monotonic() - t0

    try:
        with timed("load"):
            with psycopg.connect(env.pub) as conn:
                for style in STYLES:
                    conn.execute(tables_ddl(style))
                    load_initial(conn, style)
            env.run(native, tables_ddl("default"))
            (toast_rel,) = env.rows(
                env.pub, "SELECT reltoastrelid::regclass::text FROM pg_class WHERE oid = 's_default.toast'::regclass"
            )[0]
            chunks = env.rows(env.pub, f"SELECT count(*) FROM {toast_rel}")[0][0]  # a catalog name, not input
            assert chunks > 1000, "the 1 MiB values must be stored out of line (TOASTed)"
        topo = env.topology(
            [
                {"table": f"{schema_name(style)}.{t}", "name": article_name(style, t), **opts}
                for style, opts in STYLES.items()
                for t in TABLES
            ],
            subscription_streams=2,
        )  # parallel streams bind the same values
        with timed("snapshot"):
            snapshot_agent.run_snapshot(topo, "p", spark)
        create_native_subscription(env.pub, native, oracle, TABLES)
        with timed("native copy"):
            wait_native(env.pub, native, oracle)
        with timed("compare snapshot"):
            for style in STYLES:
                world.snapshot_diffs[style], world.native_snapshot_diffs[style] = _compare_all(env, native, style)
        with timed("changes"):
            for style in STYLES:
                make_changes(env.pub, style)
        with timed("peek"):
            world.messages, world.articles = peek_messages(env)
        with timed("cycle"):
            log_reader_agent.run_log_reader(topo, "p")
            distribution_agent.run_distribution(topo, "p", "sub1")
        with timed("native changes"):
            wait_native(env.pub, native, oracle)
        with timed("compare changes"):
            for style in STYLES:
                world.change_diffs[style], world.native_diffs[style] = _compare_all(env, native, style)
    except Exception as exc:
        world.error = exc
    world.seconds["total"] = time.monotonic() - started
    print(f"\nshared run: {world.seconds}")
    yield world
    drop_native_subscription(native, oracle)
    sandbox.drop_database("subscriber", native_name)
    env.drop()


def peek_messages(env) -> tuple[list[bytes], dict]:
    """The publication's pgoutput messages waiting in its slot (peeked: the slot does not move),
    as the Log Reader reads them, and its articles by relation."""
    with psycopg.connect(env.dist, autocommit=True) as dist:
        slot = dist_publications.slot_name(dist, "p")
        articles = change_mapping.relation_articles(dist_publications.load_articles(dist, "p"))
    rows = env.rows(
        env.pub,
        "SELECT data FROM pg_catalog.pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', '1', "
        "'publication_names', %s, 'messages', 'true')",
        (slot, naming.pg_publication("p")),
    )
    return [bytes(data) for (data,) in rows], articles


def test_compiled_command_lines_match_the_python_path_on_every_edge_value(world):
    """Every row message of the changes (every type's edge values, TOASTed values, odd and
    63-byte names, wide tables, partitions, column filters), taken by the compiled function:
    its line is the Python path's, byte for byte; it declines only pairs and unchanged TOASTed
    values; and it takes most of them (the Log Reader's run above took the same path)."""
    world.check()
    row_line = command_lines.row_line()
    assert row_line is not None
    relmaps: dict[int, change_mapping.RelationMap | None] = {}
    prefix, compiled, declined = b"p\t0/1\t", 0, 0
    for message in world.messages:
        decoded = pgoutput.decode(message)
        if isinstance(decoded, pgoutput.Relation):
            relmaps[decoded.relid] = change_mapping.map_relation(decoded, world.articles)
        if not isinstance(decoded, pgoutput.Insert | pgoutput.Update | pgoutput.Delete):
            continue
        relmap = relmaps[decoded.relid]
        if relmap is None:
            continue
        art = relmap.article
        field = copy_escaping.copy_field(art.name)
        line = row_line(message, relmap.positions_u16, relmap.keys_u16, art.update_mode == "all", prefix, 9, field)
        commands = change_mapping.row_commands(decoded, relmap)
        if line is None:
            declined += 1
            images = [getattr(decoded, side, None) or [] for side in ("old", "new")]
            unchanged = any(v is pgoutput.UNCHANGED_TOAST for image in images for v in image)
            assert len(commands) == 2 or unchanged, f"declined {commands[0].op} of {art.name}"
            continue
        compiled += 1
        (cmd,) = commands
        expected = dist_transactions.command_line(
            prefix, 9, field, cmd.op.value.encode(), dist_encoding.command_data(cmd.to_json())
        )
        assert line == expected, f"{cmd.op} of {art.name}"
    assert compiled > declined > 0, (compiled, declined)  # 594 and 260 (pairs of the "all" styles, key changes)


def test_transaction_rows_are_the_slots_begin_and_commit_messages(world):
    """The Log Reader reads every transaction's Begin and Commit straight from the message bytes
    and writes its row as a COPY line: each stored row holds what the decoded messages say (xid,
    commit time to the microsecond, end LSN) and the rows each article changed."""
    world.check()
    expected: dict[str, tuple[int, object, str, dict[str, int]]] = {}
    relations: dict[int, str] = {}
    xid, rows = 0, {}
    for message in world.messages:
        decoded = pgoutput.decode(message)
        if isinstance(decoded, pgoutput.Relation):
            relmap = change_mapping.map_relation(decoded, world.articles)
            if relmap is not None:
                relations[decoded.relid] = relmap.article.name
        elif isinstance(decoded, pgoutput.Begin):
            xact, xid, rows = lsn.int_to_lsn(decoded.final_lsn), decoded.xid, {}
        elif isinstance(decoded, pgoutput.Insert | pgoutput.Update | pgoutput.Delete):
            name = relations[decoded.relid]
            rows[name] = rows.get(name, 0) + 1
        elif isinstance(decoded, pgoutput.Commit) and rows:
            expected[xact] = (xid, decoded.commit_time, lsn.int_to_lsn(decoded.end_lsn), rows)
    with psycopg.connect(world.dist, autocommit=True) as dist:
        stored = {
            xact: (xid, at, end, article_rows)
            for xact, xid, at, end, article_rows in dist.execute(
                "SELECT xact_seqno::text, xid, commit_time, end_lsn::text, article_rows "
                "FROM airflow_repl.transactions WHERE publication = 'p'"
            )
        }
    assert len(expected) > 10
    assert {x: stored.get(x) for x in expected} == expected


@pytest.mark.parametrize("style", STYLES)
def test_snapshot_copies_every_edge_value(world, style):
    world.check()
    assert not world.snapshot_diffs[style], "\n".join(world.snapshot_diffs[style])


@pytest.mark.parametrize("style", STYLES)
def test_changes_deliver_every_edge_value(world, style):
    world.check()
    assert not world.change_diffs[style], "\n".join(world.change_diffs[style])


@pytest.mark.parametrize("style", STYLES)
def test_subscriber_matches_native_logical_replication(world, style):
    world.check()
    problems = world.native_snapshot_diffs[style] + world.native_diffs[style]
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------- no server


# ---------------------------------------------------------------------- one case, one database
def small_run(env, spark, ddl: str, articles: list, changes: str, *, sub_ddl: str = "", **snapshot_options):
    """Publisher DDL + rows, snapshot, changes, one Log Reader + Distribution cycle; returns the
    topology."""
    env.run(env.pub, ddl)
    if sub_ddl:
        env.run(env.sub, sub_ddl)
    topo = env.topology(articles)
    snapshot_agent.run_snapshot(topo, "p", spark, **snapshot_options)
    if changes:
        env.run(env.pub, changes)
    log_reader_agent.run_log_reader(topo, "p")
    distribution_agent.run_distribution(topo, "p", "sub1")
    return topo


def assert_same_rows(pub: str, sub: str, schema: str, table: str, dest: tuple[str, str] | None = None) -> None:
    dschema, dtable = dest or (schema, table)
    with (
        connections.connect(pub, "publisher", autocommit=True) as p,
        connections.connect(sub, "subscriber", autocommit=True) as s,
    ):
        cols = columns_of(p, schema, table, generated=False)
        problems = diff(
            f"{schema}.{table}", cols, table_text(p, schema, table, cols), table_text(s, dschema, dtable, cols)
        )
    assert not problems, "\n".join(problems)


def test_snapshot_key_ranges_over_edge_key_values(env, spark):
    """Several key ranges whose bounds are odd text, infinite timestamps, NaN and -Infinity
    floats and huge numerics: every row lands exactly once."""
    small_run(
        env,
        spark,
        """
        CREATE TABLE rk (k text, ts timestamptz, f float8, n numeric, v int,
                         PRIMARY KEY (k, ts, f, n));
        INSERT INTO rk SELECT (ARRAY[E'it''s', E'back\\\\slash', '%s', ' ', '', E'\\u00e9\\U0001F600', 'NULL'])[g % 7 + 1],
            (ARRAY['infinity', '-infinity', '4713-01-01 00:00:00+00 BC', '2000-01-01'])[g % 4 + 1]::timestamptz,
            (ARRAY['NaN', '-Infinity', '-0', '5e-324', '1e308'])[g % 5 + 1]::float8,
            g::numeric * 1e-300 + 1e300, g FROM generate_series(1, 120000) g""",
        ["rk"],
        "UPDATE rk SET v = -v WHERE v % 1000 = 0",
        max_partitions=4,
    )
    assert env.rows(env.sub, "SELECT count(*), count(DISTINCT (k, ts, f, n)) FROM rk") == [(120000, 120000)]
    assert_same_rows(env.pub, env.sub, "public", "rk")


def test_enum_domain_composite_and_range_types(env, spark):
    small_run(
        env,
        spark,
        """
        CREATE TYPE mood AS ENUM ('sad', 'ok', 'h\u00e4ppy ''q''');
        CREATE DOMAIN posint AS int CHECK (VALUE > 0);
        CREATE TYPE pair AS (a int, b text);
        CREATE TYPE floatrange AS RANGE (subtype = float8);
        CREATE TABLE ut (id int PRIMARY KEY, m mood, ms mood[], p posint, c pair, cs pair[], r floatrange);
        INSERT INTO ut VALUES (1, 'sad', '{ok,NULL}', 1, '(1,"x y")', ARRAY['(1,)'::pair, NULL], '[-Infinity,0)'),
                              (2, NULL, NULL, NULL, NULL, NULL, 'empty');""",
        ["ut"],
        """INSERT INTO ut VALUES (3, 'h\u00e4ppy ''q''', '{sad}', 2147483647, '(,)', '{}', '(1.5,NaN]');
                   UPDATE ut SET m = 'ok', c = '(2,"\\\\")' WHERE id = 1; DELETE FROM ut WHERE id = 2""",
    )
    assert_same_rows(env.pub, env.sub, "public", "ut")


def test_columns_named_like_procedure_parameters(env, spark):
    syntaxes = {
        "CALL": {"upd_cmd": "CALL"},
        "SCALL": {},
        "MCALL": {"upd_cmd": "MCALL"},
        "XCALL": {"upd_cmd": "XCALL", "del_cmd": "XCALL"},
    }
    ddl = "".join(
        f"CREATE TABLE {s.lower()} (id int PRIMARY KEY, c1 int, c2 text, pkc1 int, bitmap bytea); "
        f"INSERT INTO {s.lower()} VALUES (1, 1, 'a', 1, '\\x01'), (2, 2, 'b', 2, NULL);"
        for s in syntaxes
    )
    changes = "".join(
        f"INSERT INTO {s.lower()} VALUES (3, 3, 'c', 3, '\\xff'); UPDATE {s.lower()} SET c2 = 'B', "
        f"bitmap = '\\x' WHERE id = 2; DELETE FROM {s.lower()} WHERE id = 1;"
        for s in syntaxes
    )
    small_run(env, spark, ddl, [{"table": s.lower(), **o} for s, o in syntaxes.items()], changes)
    for s in syntaxes:
        assert_same_rows(env.pub, env.sub, "public", s.lower())


def test_table_beyond_the_argument_limit_is_refused_when_applied(env):
    env.run(env.pub, "CREATE TABLE w51 (id int PRIMARY KEY, " + ", ".join(f"w{i} int" for i in range(1, 51)) + ")")
    with pytest.raises(TopologyError, match=r"w51.*51 columns.*XCALL"):
        deploy.apply_topology(env.topology([{"table": "w51", "upd_cmd": "XCALL"}]))


def test_deferrable_key_shift_over_equal_rows(env, spark):
    small_run(
        env,
        spark,
        """CREATE TABLE dk (id int PRIMARY KEY DEFERRABLE, v text);
                             INSERT INTO dk SELECT g, 'same' FROM generate_series(1, 5) g""",
        ["dk"],
        "UPDATE dk SET id = id + 1",
    )
    assert env.rows(
        env.sub, "SELECT condeferrable FROM pg_constraint WHERE conrelid = 'dk'::regclass AND contype = 'p'"
    ) == [(True,)]
    assert_same_rows(env.pub, env.sub, "public", "dk")


def test_percent_in_names_under_procedures_and_sql(env, spark):
    small_run(
        env,
        spark,
        """
        CREATE TABLE "100% p" ("id%" int PRIMARY KEY, "a%s" text, "%(x)s" int);
        CREATE TABLE "100% s" ("id%" int PRIMARY KEY, "a%s" text, "%(x)s" int);
        INSERT INTO "100% p" VALUES (1, '%', 1), (2, '%%', 2); INSERT INTO "100% s" VALUES (1, '%', 1), (2, '%%', 2);""",
        ["100% p", {"table": "100% s", "ins_cmd": "SQL", "upd_cmd": "SQL", "del_cmd": "SQL"}],
        """INSERT INTO "100% p" VALUES (3, '%s', 3); UPDATE "100% p" SET "a%s" = '%d' WHERE "id%" = 1;
           DELETE FROM "100% p" WHERE "id%" = 2; INSERT INTO "100% s" VALUES (3, '%s', 3);
           UPDATE "100% s" SET "a%s" = '%d' WHERE "id%" = 1; DELETE FROM "100% s" WHERE "id%" = 2;""",
    )
    assert_same_rows(env.pub, env.sub, "public", "100% p")
    assert_same_rows(env.pub, env.sub, "public", "100% s")


def test_primary_key_with_include_columns(env, spark):
    small_run(
        env,
        spark,
        """CREATE TABLE inc (a int, b int, v text, PRIMARY KEY (a) INCLUDE (b));
                             INSERT INTO inc VALUES (1, 1, 'x')""",
        ["inc"],
        "INSERT INTO inc VALUES (2, NULL, 'null b'); UPDATE inc SET b = NULL WHERE a = 1",
    )
    assert_same_rows(env.pub, env.sub, "public", "inc")


def test_inheritance_parent_alone(env, spark):
    small_run(
        env,
        spark,
        """CREATE TABLE parent (id int PRIMARY KEY, v text);
                             CREATE TABLE child (extra int) INHERITS (parent);
                             INSERT INTO parent VALUES (1, 'parent'); INSERT INTO child VALUES (2, 'child', 0)""",
        ["parent"],
        "INSERT INTO parent VALUES (3, 'p'); INSERT INTO child VALUES (4, 'c', 1); UPDATE child SET v = 'c2'",
    )
    assert env.rows(env.sub, "SELECT id FROM parent ORDER BY id") == [(1,), (3,)]


def test_type_found_through_the_publishers_search_path(env, spark):
    env.run(env.pub, "CREATE SCHEMA other; CREATE TYPE other.color AS ENUM ('red', 'green')")
    with psycopg.connect(env.pub, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET search_path = public, other").format(sql.Identifier(conn.info.dbname))
        )
    small_run(
        env,
        spark,
        "CREATE TABLE painted (id int PRIMARY KEY, c other.color, cs other.color[]); "
        "INSERT INTO painted VALUES (1, 'red', '{green}')",
        ["painted"],
        "INSERT INTO painted VALUES (2, 'green', NULL)",
        sub_ddl="CREATE SCHEMA other; CREATE TYPE other.color AS ENUM ('red', 'green')",
    )
    assert_same_rows(env.pub, env.sub, "public", "painted")


def _database(sandbox, cluster: str, name: str, options: str) -> str:
    sandbox.drop_database(cluster, name)
    with psycopg.connect(sandbox.conninfo(cluster), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0 " + options).format(sql.Identifier(name)))
    return sandbox.conninfo(cluster, name)


def test_subscriber_with_an_icu_collation(env, spark):
    name = "icu_" + env.databases[0][1]
    env.databases.append(("subscriber", name))
    env.subs["sub1"] = env.sub = _database(
        env.sandbox, "subscriber", name, "LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.utf8'"
    )
    small_run(
        env,
        spark,
        """CREATE TABLE mixed (k text PRIMARY KEY, v int);
                             INSERT INTO mixed SELECT (ARRAY['a', 'B', 'c', 'D'])[g % 4 + 1] || g, g
                             FROM generate_series(1, 120000) g""",
        ["mixed"],
        "",
        max_partitions=4,
    )
    assert env.rows(env.sub, "SELECT count(*) FROM mixed") == [(120000,)]


def test_latin1_publisher(env, spark):
    name = "latin1_" + env.databases[0][1]
    env.databases.append(("publisher", name))
    env.pub = _database(env.sandbox, "publisher", name, "ENCODING 'LATIN1' LOCALE 'C'")
    small_run(
        env,
        spark,
        "CREATE TABLE l1 (id int PRIMARY KEY, v text); INSERT INTO l1 VALUES (1, '\u00e9')",
        ["l1"],
        "INSERT INTO l1 VALUES (2, '\u00e9'), (3, '\u00c3\u00a9'), (4, '\u00ff\u00a0')",
    )
    assert env.rows(env.sub, "SELECT v FROM l1 ORDER BY id") == [
        ("\u00e9",),
        ("\u00e9",),
        ("\u00c3\u00a9",),
        ("\u00ff\u00a0",),
    ]


def test_subscriber_database_settings_do_not_change_values(env, spark):
    """A subscriber database whose defaults read text differently (xmloption = document rejects
    XML content fragments; array_nulls = off reads NULL in an array literal as the string
    'NULL'): the agents' sessions pin the settings, so the values arrive unchanged."""
    with psycopg.connect(env.sub, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET xmloption = document; ALTER DATABASE {} SET array_nulls = off").format(
                sql.Identifier(conn.info.dbname), sql.Identifier(conn.info.dbname)
            )
        )
    small_run(
        env,
        spark,
        """CREATE TABLE st (id int PRIMARY KEY, x xml, a text[]);
                             INSERT INTO st VALUES (1, 'text <b/> more', '{NULL,"NULL",x}')""",
        [{"table": "st", "ins_cmd": "CALL"}],
        """INSERT INTO st VALUES (2, 'a<b/>', '{NULL}');
              UPDATE st SET x = 'c<d/>', a = '{y,NULL}' WHERE id = 1""",
    )
    assert_same_rows(env.pub, env.sub, "public", "st")
    assert env.rows(env.sub, "SELECT a[1] IS NULL FROM st ORDER BY id") == [(False,), (True,)]


def test_distribution_database_in_another_encoding_is_refused_before_anything_changes(env, spark):
    """Commands hold values as JSON, which a LATIN1 distribution database cannot store for
    characters outside LATIN1 (the Log Reader used to stop there, for good): such a database is
    refused when the topology is applied, before the publisher is touched."""
    name = "latin1d_" + env.databases[0][1]
    env.databases.append(("publisher", name))
    env.dist = _database(env.sandbox, "publisher", name, "ENCODING 'LATIN1' LOCALE 'C'")
    env.run(env.pub, "CREATE TABLE u (id int PRIMARY KEY, v text)")
    with pytest.raises(
        TopologyError,
        match=rf"distribution database '{name}' uses encoding LATIN1.*"
        r"ENCODING 'UTF8'",
    ):
        snapshot_agent.run_snapshot(env.topology(["u"]), "p", spark)
    assert env.rows(env.pub, "SELECT count(*) FROM pg_publication") == [(0,)]
    assert env.rows(env.pub, "SELECT relreplident FROM pg_class WHERE relname = 'u'") == [("d",)]


def test_a_distribution_database_with_the_earlier_jsonb_commands_delivers_every_edge_value(env, spark):
    """Commands and the transactions' article rows are stored as ``json`` (the text as the Log
    Reader wrote it); a distribution database made by an earlier airflow-repl has ``jsonb``
    there, which the agents read alike: every edge value of one style's tables (TOASTed values,
    odd and 63-byte names, wide tables, partitions) arrives through either."""
    with psycopg.connect(env.pub) as conn:
        conn.execute(tables_ddl("default"))
        load_initial(conn, "default")
    topo = env.topology(
        [{"table": f"{schema_name('default')}.{t}", "name": article_name("default", t)} for t in TABLES]
    )
    snapshot_agent.run_snapshot(topo, "p", spark)
    assert env.rows(
        env.dist,
        "SELECT atttypid::regtype::text FROM pg_attribute "
        "WHERE (attrelid, attname) IN (('airflow_repl.commands'::regclass, 'data'), "
        "('airflow_repl.transactions'::regclass, 'article_rows'))",
    ) == [("json",), ("json",)]
    env.run(env.dist, "ALTER TABLE airflow_repl.commands ALTER COLUMN data TYPE jsonb")
    env.run(env.dist, "ALTER TABLE airflow_repl.transactions ALTER COLUMN article_rows TYPE jsonb")
    make_changes(env.pub, "default")
    read = log_reader_agent.run_log_reader(topo, "p")
    delivered = distribution_agent.run_distribution(topo, "p", "sub1")
    assert read["transactions"] >= 9 and delivered["transactions"] == read["transactions"]
    report = validation.compare(topo, "p", "sub1")
    assert report and all(r["match"] for r in report), validation.format_report(report)
