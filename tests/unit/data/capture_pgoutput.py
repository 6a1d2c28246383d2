"""Capture the pgoutput messages that ``tests/unit/test_pgoutput.py`` decodes.

usage: python tests/unit/data/capture_pgoutput.py [OUTPUT.json]

Starts a throw-away sandbox cluster (:class:`airflow_repl.sandbox.Sandbox`: when run as root,
PostgreSQL runs as the unprivileged ``airflowrepl`` user), creates a publication and two
``pgoutput`` slots, and runs one small step of SQL at a time.  After each step it takes the
step's messages off the slot (``pg_logical_slot_get_binary_changes`` with ``proto_version`` 1,
the publication and ``messages`` true: the Log Reader's options, plus logical messages) and
records them as hex with the ``lsn`` and ``xid`` the function returns beside each one, and the
server clock just before and just after the step (the commit time lies between).  The second
slot is read with ``binary`` true once, for the binary column format.  The cluster is destroyed
at the end; the output (default: ``pgoutput_messages.json`` beside this script) is committed.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import psycopg

from airflow_repl.sandbox import Sandbox

SLOT, BINARY_SLOT, PUBLICATION, ORIGIN = "capture", "capture_binary", "capture_pub", "capture_origin"
PREFIX = "airflow_repl.capture"
#: Stored out of line and uncompressed (STORAGE EXTERNAL): an UPDATE that does not touch it
#: sends it as an unchanged TOAST value ('u').
BIG = "0123456789" * 300

SETUP = f"""
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE items (id int PRIMARY KEY, name text, note text, big text, mood mood, price numeric(10,2));
ALTER TABLE items ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE SCHEMA "s p";
CREATE TABLE "s p"."Full Ident" (k int PRIMARY KEY, v text, n int);
ALTER TABLE "s p"."Full Ident" REPLICA IDENTITY FULL;
CREATE TABLE t1 (id serial PRIMARY KEY);
CREATE TABLE t2 (id serial PRIMARY KEY, t1_id int REFERENCES t1);
CREATE TABLE unpublished (id int);
CREATE PUBLICATION {PUBLICATION} FOR TABLE items, "s p"."Full Ident", t1, t2;
"""

#: (step name, its transactions: each string runs in one transaction, in one session)
STEPS: list[tuple[str, list[str]]] = [
    (
        "insert",
        [
            "INSERT INTO items VALUES (1, 'first', NULL, %(big)s, 'happy', 9.99), "
            "(2, 'é中😀 ''q'' \\', '', NULL, NULL, -0.5)"
        ],
    ),
    ("update_unchanged_toast", ["UPDATE items SET name = 'renamed', mood = 'ok' WHERE id = 1"]),
    ("update_key", ["UPDATE items SET id = 10, note = 'moved' WHERE id = 2"]),
    ("delete_key", ["DELETE FROM items WHERE id = 10"]),
    ("insert_full", ["""INSERT INTO "s p"."Full Ident" VALUES (1, 'a', NULL), (2, 'b', 2)"""]),
    ("update_full", ["""UPDATE "s p"."Full Ident" SET v = 'changed' WHERE k = 1"""]),
    ("delete_full", ["""DELETE FROM "s p"."Full Ident" WHERE k = 2"""]),
    ("insert_t1_t2", ["INSERT INTO t1 DEFAULT VALUES; INSERT INTO t2 (t1_id) VALUES (1)"]),
    ("truncate_restart_cascade", ["TRUNCATE t1, t2 RESTART IDENTITY CASCADE"]),
    ("truncate_plain", ["TRUNCATE t2"]),
    (
        "message_in_transaction",
        [f"SELECT pg_logical_emit_message(true, '{PREFIX}', 'in a transaction'); INSERT INTO t1 DEFAULT VALUES"],
    ),
    (  # decoding reads only flushed WAL: a transaction that writes (to a table outside the
        # publication: pgoutput sends nothing of it) flushes the message at its commit
        "message_alone",
        [
            f"SELECT pg_logical_emit_message(false, '{PREFIX}', 'outside any transaction')",
            "INSERT INTO unpublished VALUES (1)",
        ],
    ),
]


def _get(conn: psycopg.Connection, slot: str, *options: str) -> list[dict[str, Any]]:
    rows = conn.execute(
        "SELECT lsn::text, xid::text, data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL, "
        "'proto_version', '1', 'publication_names', %s, 'messages', 'true'" + ", %s" * len(options) + ")",
        (slot, PUBLICATION, *options),
    ).fetchall()
    return [{"lsn": lsn, "xid": xid, "hex": bytes(data).hex()} for lsn, xid, data in rows]


def _clock(conn: psycopg.Connection) -> str:
    return conn.execute("""SELECT to_char(clock_timestamp(), 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"')""").fetchone()[0]


def _step(conn: psycopg.Connection, name: str, transactions: list[str], binary: bool = False) -> dict[str, Any]:
    started = _clock(conn)
    for text in transactions:
        with conn.transaction():
            conn.execute(text, {"big": BIG} if "%(big)s" in text else None)
    step = {"name": name, "sql": transactions, "started": started, "finished": _clock(conn)}
    step["messages"] = _get(conn, SLOT)
    if binary:
        step["binary_messages"] = _get(conn, BINARY_SLOT, "binary", "true")
    return step


def _origin_step(conn: psycopg.Connection) -> dict[str, Any]:
    """A transaction replayed from elsewhere: its origin and the origin's commit LSN and time."""
    conn.execute("SELECT pg_replication_origin_create(%s)", (ORIGIN,))
    conn.execute("SELECT pg_replication_origin_session_setup(%s)", (ORIGIN,))
    started = _clock(conn)
    sql = "INSERT INTO t1 DEFAULT VALUES"
    with conn.transaction():
        conn.execute("SELECT pg_replication_origin_xact_setup('1/ABCDEF0', '2001-02-03T04:05:06.789+00:00')")
        conn.execute(sql)
    finished = _clock(conn)
    conn.execute("SELECT pg_replication_origin_session_reset()")
    step = {"name": "origin", "sql": [sql], "started": started, "finished": finished}
    step["origin"] = {"name": ORIGIN, "lsn": "1/ABCDEF0", "time": "2001-02-03T04:05:06.789+00:00"}
    step["messages"] = _get(conn, SLOT)
    return step


def capture(conninfo: str) -> dict[str, Any]:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SET TIME ZONE 'UTC'")
        conn.execute(SETUP)
        for slot in (SLOT, BINARY_SLOT):
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        oids = dict(
            conn.execute(
                "SELECT c.oid::regclass::text, c.oid::bigint FROM pg_class c "
                "WHERE c.oid IN ('items'::regclass, '\"s p\".\"Full Ident\"'::regclass, 't1'::regclass, 't2'::regclass)"
            ).fetchall()
        )
        oids["mood"] = conn.execute("SELECT 'mood'::regtype::oid::bigint").fetchone()[0]
        steps = [_step(conn, name, sql, binary=name == "insert") for name, sql in STEPS]
        steps.append(_origin_step(conn))
        version = conn.execute("SHOW server_version").fetchone()[0]
    return {
        "about": "pgoutput messages (protocol version 1) captured by capture_pgoutput.py; see its docstring",
        "server_version": version,
        "setup": SETUP.strip().splitlines(),
        "big": {"value": "'0123456789' repeated 300 times", "length": len(BIG)},
        "oids": oids,
        "steps": steps,
    }


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("pgoutput_messages.json")
    with tempfile.TemporaryDirectory(prefix="capture-pgoutput-") as tmp:
        sandbox = Sandbox(Path(tmp) / "sandbox", clusters=("publisher",))
        sandbox.start()
        try:
            data = capture(sandbox.create_database("publisher", "capture"))
        finally:
            sandbox.destroy()
    out.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    print(f"{sum(len(s['messages']) for s in data['steps'])} messages in {len(data['steps'])} steps -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
