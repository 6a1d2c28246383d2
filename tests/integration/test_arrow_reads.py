"""The Snapshot Agent's reads of a key range as Arrow batches (ADBC, COPY binary), against a real
server: the exported snapshot is honoured, every typed column keeps its value at the edges of its
type, text arrives in UTF8 from a LATIN1 database, and a failure is one line without the password."""

from __future__ import annotations

import math
import threading
import time

import psycopg
import pyarrow as pa
import pytest
from harness import ended_sessions, sessions_ended_since

from airflow_repl.engine.errors import ConnectionFailed, ReplError
from airflow_repl.engine.postgres import arrow_reads
from airflow_repl.engine.postgres.connections import describe

EDGES = """
CREATE TABLE edges (
    id int PRIMARY KEY, b bool, s int2, i int4, l int8, r float4, d float8,
    t text, v varchar(10), c char(3), y bytea, n numeric
);
INSERT INTO edges VALUES
    (1, true, -32768, -2147483648, -9223372036854775808, 'NaN', 'NaN', '', '', '', '\\x', 0),
    (2, false, 32767, 2147483647, 9223372036854775807, 'Infinity', '-Infinity',
        E'tab\\there\\nnew line\\\\ back"quote''s', 'é€😀', 'ab', '\\x00ff0a5c', 123456789012345678901234567890.000000001),
    (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
    (4, true, 0, 0, 0, 3.4028235e38, 2.2250738585072014e-308, 'x', 'y', 'z', '\\x00', -0.5),
    (5, false, 1, 1, 1, 1.4e-45, 4.9e-324, repeat('long', 100000), 'v', 'c', decode(repeat('ab', 200000), 'hex'), 1e-20);
"""

QUERY = "SELECT id, b, s, i, l, r, d, t, v, c, y, CASE WHEN n IS NULL THEN NULL ELSE pg_catalog.concat(n) END AS n FROM edges"


def _export(conninfo: str) -> tuple[psycopg.Connection, str]:
    holder = psycopg.connect(conninfo, autocommit=True)
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    row = holder.execute("SELECT pg_export_snapshot()").fetchone()
    assert row is not None
    return holder, str(row[0])


def _read(conninfo: str, snapshot: str, query: str = QUERY) -> pa.Table:
    with arrow_reads.snapshot_batches(conninfo, "publisher", snapshot, query, "article 'edges'") as batches:
        return pa.Table.from_batches(list(batches), schema=batches.schema)


def test_every_typed_column_keeps_its_edges_and_the_snapshot_is_honoured(env):
    with psycopg.connect(env.pub, autocommit=True) as conn:
        conn.execute(EDGES)
        holder, snapshot = _export(env.pub)
        try:
            conn.execute("INSERT INTO edges (id) VALUES (6)")  # after the export: not in the snapshot
            conn.execute("UPDATE edges SET t = 'changed' WHERE id = 4")
            table = _read(env.pub, snapshot)
        finally:
            holder.close()
        expected = conn.execute(QUERY + " ORDER BY 1").fetchall()
    rows = sorted(table.to_pylist(), key=lambda r: r["id"])
    assert [r["id"] for r in rows] == [1, 2, 3, 4, 5]
    assert rows[3]["t"] == "x"
    assert [f.type for f in table.schema] == [
        pa.int32(),
        pa.bool_(),
        pa.int16(),
        pa.int32(),
        pa.int64(),
        pa.float32(),
        pa.float64(),
        pa.string(),
        pa.string(),
        pa.string(),
        pa.binary(),
        pa.string(),
    ]
    expected = [e for e in expected if e[0] != 6]
    expected[3] = (*expected[3][:7], "x", *expected[3][8:])
    for got, want in zip(rows, expected, strict=True):
        for name, value, wanted in zip(got, got.values(), want, strict=True):
            if isinstance(wanted, float) and math.isnan(wanted):
                assert math.isnan(value)
            elif name == "r" and wanted is not None:  # float4: psycopg gives its shortest text as a double
                assert value == pa.scalar(wanted, pa.float32()).as_py()
            else:
                assert value == wanted, name
    assert rows[4]["y"] == bytes.fromhex("ab" * 200_000)
    assert rows[1]["c"] == "ab "  # char(n) keeps its padding, as its output function gives it
    assert rows[1]["n"] == "123456789012345678901234567890.000000001"


def test_text_of_a_latin1_database_arrives_in_utf8(sandbox, tmp_path):
    dbname = "arrow_latin1"
    with psycopg.connect(sandbox.conninfo("publisher"), autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {dbname}")
        admin.execute(f"CREATE DATABASE {dbname} TEMPLATE template0 ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C'")
    conninfo = sandbox.conninfo("publisher", dbname)
    try:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id int PRIMARY KEY, s text)")
            conn.execute("INSERT INTO t VALUES (1, 'café ÿ ñ')")
            holder, snapshot = _export(conninfo)
            try:
                table = _read(conninfo, snapshot, "SELECT id, s FROM t")
            finally:
                holder.close()
        assert table.column("s").to_pylist() == ["café ÿ ñ"]
    finally:
        with psycopg.connect(sandbox.conninfo("publisher"), autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {dbname}")


def test_a_bad_snapshot_is_one_line_naming_what_was_read(env):
    with pytest.raises(ReplError) as failed:
        _read(env.pub, "00000003-0000001B-1")
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith(f"cannot read article 'edges' at the publisher ({describe(env.pub)}): ")
    assert "snapshot" in message
    assert "password" not in message.lower()


def test_an_unreachable_server_is_one_line_without_the_password(env):
    params = psycopg.conninfo.conninfo_to_dict(env.pub)
    with psycopg.connect(env.pub) as conn:
        password = conn.info.password
    with socket_closed() as port:
        dead = psycopg.conninfo.make_conninfo(env.pub, port=port)
        with pytest.raises(ConnectionFailed) as failed:
            _read(dead, "00000003-0000001B-1")
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith(f"cannot connect to the publisher at {params['user']}@")
    assert password and password not in message


class socket_closed:
    """A local port nothing listens on."""

    def __enter__(self) -> int:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        return int(self.sock.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


def test_a_server_that_goes_away_mid_read_is_one_line(env):
    with psycopg.connect(env.pub, autocommit=True) as conn:
        conn.execute("CREATE TABLE big AS SELECT g AS id, repeat('x', 200) AS t FROM generate_series(1, 300000) g")
        holder, snapshot = _export(env.pub)
        try:
            with pytest.raises(ReplError) as failed:
                query = "SELECT id, t FROM big"
                with arrow_reads.snapshot_batches(env.pub, "publisher", snapshot, query, "article 'big'") as batches:
                    next(iter(batches))  # the read has started
                    conn.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE query LIKE 'COPY (SELECT id, t FROM big)%%'"
                    )
                    for _ in batches:
                        pass
        finally:
            holder.close()
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith(f"cannot read article 'big' at the publisher ({describe(env.pub)}): ")


def test_reads_of_one_thread_share_the_drivers_database_and_a_failure_starts_afresh(env):
    """ADBC's database object (a connection and a load of the server's types when it is made)
    is made once per thread: each further read is one session, not two.  A refused connection
    forgets it (one line, the password left out), so the next read makes it again; another
    thread has its own."""
    dbname = psycopg.conninfo.conninfo_to_dict(env.pub)["dbname"]
    with psycopg.connect(env.pub, autocommit=True) as conn:
        conn.execute("CREATE TABLE shared_reads AS SELECT g AS id FROM generate_series(1, 10) g")
        holder, snapshot = _export(env.pub)
        try:
            _read(env.pub, snapshot, "SELECT id FROM shared_reads")  # this thread's database, if not made yet
            time.sleep(0.5)
            before = ended_sessions(conn)
            for _ in range(3):
                assert _read(env.pub, snapshot, "SELECT id FROM shared_reads").num_rows == 10
            assert sessions_ended_since(conn, before, 3) == 3
            admin = psycopg.connect(psycopg.conninfo.make_conninfo(env.pub, dbname="postgres"), autocommit=True)
            with admin:  # a database's connections are refused from another one
                admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS false')
                try:
                    with pytest.raises(ConnectionFailed) as refused:
                        _read(env.pub, snapshot, "SELECT id FROM shared_reads")
                finally:
                    admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS true')
            assert "\n" not in str(refused.value) and "not currently accepting connections" in str(refused.value)
            time.sleep(0.5)
            before = ended_sessions(conn)
            assert _read(env.pub, snapshot, "SELECT id FROM shared_reads").num_rows == 10
            assert sessions_ended_since(conn, before, 2) == 2  # the database made again, then the read
        finally:
            holder.close()
    assert _read_in_new_thread_count(env.pub) == 10


def _read_in_new_thread_count(conninfo: str) -> int:
    """A read in a fresh thread (its own database) of a fresh snapshot."""
    result: list[int] = []

    def read() -> None:
        holder, snapshot = _export(conninfo)
        try:
            result.append(_read(conninfo, snapshot, "SELECT id FROM shared_reads").num_rows)
        finally:
            holder.close()

    worker = threading.Thread(target=read)
    worker.start()
    worker.join()
    return result[0]
