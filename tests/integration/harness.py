"""What the integration tests share besides fixtures: the per-test databases (:class:`Env`), the
WAL boundaries the LSN tests cross, Airflow's private home for the session, and the helpers more
than one test module uses (setting up a published table, running the agents, checking the
subscriber, topology files, running an agent in a thread or in its own process).

Test modules import these with ``from harness import ...`` (pytest puts this folder on
``sys.path``); ``conftest.py`` builds its fixtures from them.  A test module never imports
another test module (tests/unit/test_test_imports.py fails when one does): a helper a second
module needs moves here.  Importing this module points ``AIRFLOW_HOME`` at a fresh temporary
folder before anything imports Airflow.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import yaml
from hypothesis import HealthCheck
from hypothesis import strategies as st
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from airflow_repl.engine.agents import distribution_agent, log_reader_agent, queue_reader_agent, snapshot_agent
from airflow_repl.engine.model import topology as topology_mod
from airflow_repl.engine.postgres.connections import resolve_topology, to_uri
from airflow_repl.engine.subscriber import validation
from airflow_repl.sandbox import Sandbox

_counter = itertools.count(1)

# Airflow reads its configuration once, at first import: give the whole session a private home.
AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="airflow-repl-tests-")) / "airflow"
os.environ["AIRFLOW_HOME"] = str(AIRFLOW_HOME)
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__LOGGING__LOGGING_LEVEL"] = "INFO"  # the e2e test reads the spark-submit log lines
# ... and the example DAGs' folder, which dag.test() parses: a test module importing Airflow when it
# is collected would otherwise freeze Airflow's default (AIRFLOW_HOME/dags) before the e2e tests run
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(Path(__file__).resolve().parents[2] / "dags")
os.environ.setdefault("AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT", "300")


def resolved_topology(data: dict) -> topology_mod.Topology:
    """A topology from its dictionary form with every server resolved (the tests use URIs)."""
    return resolve_topology(topology_mod.from_dict(data))


class Env:
    """A fresh publisher, distribution and subscriber database for one test.

    The publisher and distribution databases live in ``publisher_cluster`` (the sandbox's
    "publisher", or a cluster of the ``wal_cluster`` fixture), the subscribers in "subscriber".
    """

    def __init__(
        self,
        sandbox: Sandbox,
        tmp_path: Path,
        n_subscribers: int = 1,
        *,
        publisher_cluster: str = "publisher",
        boundary: str | None = None,
    ) -> None:
        n = next(_counter)
        self.publisher_cluster, self.boundary = publisher_cluster, boundary
        self.databases = [(publisher_cluster, f"pub_{n}"), (publisher_cluster, f"dist_{n}")] + [
            ("subscriber", f"sub_{n}_{i}") for i in range(1, n_subscribers + 1)
        ]
        self.pub = sandbox.create_database(publisher_cluster, f"pub_{n}", recreate=True)
        self.dist = sandbox.create_database(publisher_cluster, f"dist_{n}", recreate=True)
        self.subs = {
            f"sub{i}": sandbox.create_database("subscriber", f"sub_{n}_{i}", recreate=True)
            for i in range(1, n_subscribers + 1)
        }
        self.sub = self.subs["sub1"]
        self.tmp_path = tmp_path
        self.sandbox = sandbox

    def servers(self, subscribers: list[str] | None = None) -> dict:
        """The servers part of a topology's dictionary form: this test's databases (every
        subscriber, or the ones named) and its snapshot folder."""
        names = subscribers if subscribers is not None else list(self.subs)
        return {
            "publisher": to_uri(self.pub),
            "distributor": to_uri(self.dist),
            "subscribers": {name: to_uri(self.subs[name]) for name in names},
            "snapshot_folder": str(self.tmp_path / "snapshots"),
        }

    def topology(self, articles: list, *, publication: str = "p", **sub_options) -> topology_mod.Topology:
        return resolved_topology(
            {
                **self.servers(),
                "publications": [{"name": publication, "articles": articles}],
                "subscriptions": [
                    {"publication": publication, "subscriber": name, **sub_options} for name in self.subs
                ],
            }
        )

    @staticmethod
    def run(conninfo: str, sql: str, params=None) -> None:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(sql, params)

    @staticmethod
    def rows(conninfo: str, sql: str, params=None) -> list[tuple]:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            return conn.execute(sql, params).fetchall()

    def wal_position(self) -> str:
        """The publisher cluster's current WAL insert position."""
        return self.sandbox.wal_position(self.publisher_cluster)

    def cross_boundary(self) -> str:
        """Move the publisher's WAL to its boundary (only segment switches, about 1 MB at most
        from where a fresh ``wal_env`` starts): the next commit gets an LSN just past it.
        Returns the new position."""
        assert self.boundary is not None, "cross_boundary() needs an Env made by the wal_env fixture"
        return self.sandbox.advance_wal(self.publisher_cluster, self.boundary)

    def drop(self) -> None:
        for cluster, name in self.databases:
            self.sandbox.drop_database(cluster, name)


# ---------------------------------------------------------------------- edge values shared by the edge-data tests
#: One character of every Unicode plane (0-16), plus BMP specials
UNICODE_TEXT = (
    "".join(chr(p * 0x10000 + 0x141) for p in range(17))
    + "\u00e9\u4e2d\ufffd\ufeff\uffff\ud7ff\U0001f600\U0010ffff\U000e0001"
)
ODD_TEXT = (
    "tab\there\nnew line\r\n back\\slash 'single' \"double\" %s %(x)s $1 $$ \\. \\N \u200b\u200f\u202e\x7f\x01 end "
)
ALL_BYTES = "\\x" + bytes(range(256)).hex()

#: Positions where an LSN's text gains a digit (text order breaks there, numeric order does not).
WAL_BOUNDARIES = ("0/10000000", "1/10000000", "10/0")
#: A cluster of the wal_cluster fixture starts this far below its boundary.
WAL_HEADROOM = 4 << 20


# ---------------------------------------------------------------------------- agents and checks

#: Runs one agent in its own process (``python AGENT_RUNNER <agent> SPEC_JSON [KWARGS_JSON]``).
AGENT_RUNNER = str(Path(__file__).with_name("agent_runner.py"))


def ended_sessions(conn: psycopg.Connection) -> int:
    """Sessions of the connection's database ended so far (counted as each ends)."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()").fetchone()
    assert row is not None
    return int(row[0])


def sessions_ended_since(conn: psycopg.Connection, before: int, expected: int) -> int:
    """Sessions ended since ``before``, once ``expected`` have (or 10 s passed), and a moment
    more for any further one to be counted."""
    deadline = time.monotonic() + 10
    while ended_sessions(conn) < before + expected and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    return ended_sessions(conn) - before


def mariadb_topology(env, mariadb, articles, *, db=None, **sub_options):
    """Publication ``p`` of ``articles`` to one MariaDB subscriber ``m1`` (a fresh database)."""
    db = db or mariadb.new_database()
    servers = env.servers(subscribers=[])
    servers["subscribers"] = {"m1": mariadb.uri(db)}
    topo = resolved_topology(
        {
            **servers,
            "publications": [{"name": "p", "articles": articles}],
            "subscriptions": [{"publication": "p", "subscriber": "m1", **sub_options}],
        }
    )
    return topo, db


def deliver(topo, **options):
    log_reader_agent.run_log_reader(topo, "p")
    return distribution_agent.run_distribution(topo, "p", "m1", **options)


def spec_file(topo: topology_mod.Topology, tmp_path: Path) -> str:
    """The topology as AGENT_RUNNER's SPEC_JSON file (secrets included)."""
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(topo.to_dict(with_secrets=True)))
    return str(path)


def assert_in_sync(topo, subscriber="sub1"):
    report = validation.compare(topo, "p", subscriber)
    assert report and all(r["match"] for r in report), validation.format_report(report)
    return report


# ---------------------------------------------------------------------- net change's property (any subscriber)
#: A table every way of changing rows reaches: a two-column key, NULLs, a unique column.
NET_CHANGE_DDL = (
    "CREATE TABLE {t} (k1 int, k2 text, a int, b text, c numeric(12,3), u int UNIQUE, PRIMARY KEY (k1, k2))"
)


def create_net_change_tables(env, tables, ddl: str = NET_CHANGE_DDL) -> None:
    """The ``tables`` at the publisher, by ``ddl``, each with the same 12 rows."""
    env.run(env.pub, ";".join(ddl.format(t=t) for t in tables))
    env.run(
        env.pub,
        ";".join(
            f"INSERT INTO {t} SELECT g, 'a', g, CASE WHEN g % 4 = 0 THEN NULL ELSE 'b' || g END, g * 1.5, g "
            f"FROM generate_series(1, 12) g"
            for t in tables
        ),
    )


_keys = st.tuples(st.integers(0, 12), st.sampled_from(["a", "a", "b", "é", "x'y"]))
_values = st.tuples(
    st.one_of(st.none(), st.integers(-5, 50)),
    st.one_of(st.none(), st.text(st.characters(blacklist_characters="\x00"), max_size=6)),
    st.one_of(st.none(), st.decimals(-1000, 1000, places=3, allow_nan=False)),
)
_op = st.one_of(
    st.tuples(st.just("insert"), _keys, _values, st.integers(1000, 1100)),
    st.tuples(st.just("update"), _keys, _values),
    st.tuples(st.just("rekey"), _keys, _keys),
    st.tuples(st.just("swap"), _keys, _keys),  # the unique values of two rows exchanged
    st.tuples(st.just("shift"), st.integers(0, 2), st.integers(1, 40)),
    st.tuples(st.just("delete"), _keys),
)
net_change_transactions = st.lists(st.lists(_op, min_size=1, max_size=8), min_size=1, max_size=6)


def net_change_steps(table: str, step) -> list[tuple[str, tuple]]:
    kind = step[0]
    where = "WHERE k1 = %s AND k2 = %s"
    if kind == "insert":
        (k1, k2), v, u = step[1], step[2], step[3]
        return [(f"INSERT INTO {table} VALUES (%s, %s, %s, %s, %s, %s)", (k1, k2, *v, u))]
    if kind == "update":
        (k1, k2), (a, b, c) = step[1], step[2]
        return [(f"UPDATE {table} SET a = %s, b = %s, c = %s {where}", (a, b, c, k1, k2))]
    if kind == "rekey":
        (k1, k2), (n1, n2) = step[1], step[2]
        return [(f"UPDATE {table} SET k1 = %s, k2 = %s {where}", (n1, n2, k1, k2))]
    if kind == "swap":  # as an application swaps unique values: through a value nobody has
        (x1, x2), (y1, y2) = step[1], step[2]
        hold = f"(SELECT u FROM {table} WHERE k1 = %s AND k2 = %s)"
        return [
            ("CREATE TEMP TABLE IF NOT EXISTS held (u int)", None),
            ("TRUNCATE held", None),
            (f"INSERT INTO held {hold[1:-1]}", (x1, x2)),
            (f"UPDATE {table} SET u = -1000000 {where}", (x1, x2)),
            (
                f"UPDATE {table} SET u = (SELECT u FROM held) WHERE k1 = %s AND k2 = %s AND EXISTS (SELECT FROM held)",
                (y1, y2),
            ),
            (f"UPDATE {table} SET u = {hold} WHERE u = -1000000", (y1, y2)),
        ]
    if kind == "shift":
        return [(f"UPDATE {table} SET k1 = k1 + %s WHERE k1 %% 3 = %s", (step[2] + 100, step[1]))]
    (k1, k2) = step[1]
    return [(f"DELETE FROM {table} {where}", (k1, k2))]


#: An example with every kind of step (``@example`` of the net-change property tests).
EVERY_KIND = [
    [
        ("insert", (13, "b"), (4, "new", None), 1001),
        ("update", (1, "a"), (None, None, 2)),
        ("update", (1, "a"), (3, "again", None)),
        ("rekey", (2, "a"), (40, "é")),
        ("swap", (3, "a"), (5, "a")),
        ("delete", (6, "a")),
        ("insert", (6, "a"), (1, None, None), 1002),
    ],
    [
        ("shift", 1, 7),
        ("update", (13, "b"), (6, "x'y", 1)),
        ("delete", (13, "b")),
        ("insert", (13, "b"), (0, "", 0), 1003),
    ],
]


#: The property tests' hypothesis settings: the same examples every run (derandomized), no
#: deadline (servers and Spark), a module-scoped world shared by the examples.
PROPERTY_SETTINGS = {
    "deadline": None,
    "derandomize": True,
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
}


def commit_on_every_table(conninfo: str, txns: list, tables, statements: Callable[[str, Any], list]) -> None:
    """Each generated transaction (a list of steps) committed at ``conninfo`` against every one of
    ``tables`` (``statements(table, step)``: its (query, params) pairs); one the publisher refuses
    as a whole (a unique violation, a number out of range) is left out: nothing to replicate."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for txn in txns:
            for table in tables:
                try:
                    with conn.transaction():
                        for step in txn:
                            for query, params in statements(table, step):
                                conn.execute(query, params)
                except (psycopg.errors.UniqueViolation, psycopg.errors.NumericValueOutOfRange):
                    pass


def cycle(topo, subscriber="sub1"):
    read = log_reader_agent.run_log_reader(topo, "p")
    delivered = distribution_agent.run_distribution(topo, "p", subscriber)
    return read, delivered


class AgentThread(threading.Thread):
    """Runs one agent function in a thread and keeps its summary (or its error)."""

    def __init__(self, func: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(daemon=True)
        self.func, self.args, self.kwargs = func, args, kwargs
        self.summary: dict[str, Any] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.summary = self.func(*self.args, **self.kwargs)
        except BaseException as exc:  # reported by the test
            self.error = exc


def wait_for(condition: Any, timeout: float) -> float | None:
    """Seconds until ``condition()`` held, or None after ``timeout``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if condition():
            return time.monotonic() - start
        time.sleep(0.05)
    return None


def count_applied_rows(env):
    """An ENABLE ALWAYS trigger at the subscriber (it fires under session_replication_role =
    replica) that records every row the agents apply, in table ``applied``."""
    env.run(
        env.sub,
        """
        CREATE TABLE applied (op text);
        CREATE FUNCTION count_op() RETURNS trigger LANGUAGE plpgsql AS
            $$BEGIN INSERT INTO applied VALUES (TG_OP); RETURN NULL; END$$;
        CREATE TRIGGER always_trigger AFTER INSERT OR UPDATE OR DELETE ON items FOR EACH ROW EXECUTE FUNCTION count_op();
        ALTER TABLE items ENABLE ALWAYS TRIGGER always_trigger;""",
    )


# ------------------------------------------------------------------- published tables, set up


def make_items(env, rows=60000):
    env.run(
        env.pub,
        "CREATE TABLE items (id bigint PRIMARY KEY, grp int NOT NULL, payload text, "
        "amount numeric(12,3) DEFAULT 1.5, at timestamptz DEFAULT now())",
    )
    env.run(
        env.pub,
        "INSERT INTO items (id, grp, payload) SELECT g, g %% 10, md5(g::text) FROM generate_series(1, %s) g",
        (rows,),
    )


def snapshotted_items(env, spark, rows, **sub_options):
    """``items`` with ``rows`` rows, published in publication ``p`` and snapshotted to the
    subscriber; returns the topology."""
    make_items(env, rows)
    topo = env.topology(["public.items"], **sub_options)
    snapshot_agent.run_snapshot(topo, "p", spark)
    return topo


def setup_items(env, spark, rows: int = 10):
    """``items (id, v)`` with ``rows`` rows, published in ``p`` and snapshotted to every
    subscriber; returns the topology."""
    env.run(env.pub, "CREATE TABLE items (id int PRIMARY KEY, v text)")
    env.run(env.pub, "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, %s) g", (rows,))
    topo = env.topology(["public.items"])
    snapshot_agent.run_snapshot(topo, "p", spark)
    return topo


#: Rows of ``items`` that setup_queued publishes.
QUEUED_ROWS = 50
#: Rows of ``items`` that setup_immediate publishes.
IMMEDIATE_ROWS = 20


def queued_topology(env, policy: str = "pub wins", **sub_options):
    data = {
        **env.servers(),
        "publications": [
            {"name": "p", "articles": ["public.items"], "allow_queued_tran": True, "conflict_policy": policy}
        ],
        "subscriptions": [
            {"publication": "p", "subscriber": name, "update_mode": "queued tran", **sub_options} for name in env.subs
        ],
    }
    return resolved_topology(data)


def setup_queued(env, spark, policy: str = "pub wins", **sub_options):
    """``items`` (QUEUED_ROWS rows) published with queued updating and snapshotted to every
    subscriber."""
    env.run(env.pub, "CREATE TABLE items (id int PRIMARY KEY, v text, n int NOT NULL DEFAULT 0)")
    env.run(env.pub, "INSERT INTO items (id, v) SELECT g, 'v' || g FROM generate_series(1, %s) g", (QUEUED_ROWS,))
    topo = queued_topology(env, policy, **sub_options)
    snapshot_agent.run_snapshot(topo, "p", spark)
    return topo


def immediate_topology(env, modes: dict[str, str], **options):
    data = {
        **env.servers(),
        "publications": [
            {"name": "p", "articles": ["public.items"], "allow_sync_tran": True, "allow_queued_tran": True}
        ],
        "subscriptions": [
            {"publication": "p", "subscriber": name, "update_mode": mode, **options} for name, mode in modes.items()
        ],
    }
    return resolved_topology(data)


def setup_immediate(env, spark, modes: dict[str, str] | None = None, **options):
    """``items`` (IMMEDIATE_ROWS rows) published with immediate (and queued) updating and
    snapshotted to every subscriber, each in its mode of ``modes`` (default: sync tran), with the
    subscription ``options``."""
    env.run(env.pub, "CREATE TABLE items (id int PRIMARY KEY, v text, n int NOT NULL DEFAULT 0)")
    env.run(env.pub, "INSERT INTO items (id, v) SELECT g, 'v' || g FROM generate_series(1, %s) g", (IMMEDIATE_ROWS,))
    topo = immediate_topology(env, modes or dict.fromkeys(env.subs, "sync tran"), **options)
    snapshot_agent.run_snapshot(topo, "p", spark)
    return topo


def item_rows(conninfo, where="true"):
    """id -> (v, n, row version) of the updatable ``items`` table's rows."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        found = conn.execute(f"SELECT id, v, n, msrepl_tran_version::text FROM items WHERE {where}").fetchall()
    return {r[0]: r[1:] for r in found}


def queue_counts(conninfo):
    """(transactions, commands) waiting in a queued subscriber's queue."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        (txns,) = conn.execute("SELECT count(*) FROM airflow_repl.queue_commits").fetchone()
        (cmds,) = conn.execute("SELECT count(*) FROM airflow_repl.queue").fetchone()
    return txns, cmds


# ---------------------------------------------------------------------------- topology files


def items_topology_file(env, tmp_path) -> str:
    """The test's topology as a YAML file (the CLI's and the sensors' input): ``items``
    published in ``p`` to every subscriber."""
    path = tmp_path / "topology.yaml"
    data = {
        **env.servers(),
        "publications": [{"name": "p", "articles": ["public.items"]}],
        "subscriptions": [{"publication": "p", "subscriber": name} for name in env.subs],
    }
    path.write_text(yaml.safe_dump(data))
    return str(path)


def topology_file(
    env,
    tmp_path,
    articles: list,
    *,
    snapshot_folder: str = "snaps",
    subscribers: dict | None = None,
    **publication_keys,
) -> str:
    """A topology YAML file of the test's publisher, distributor and ``sub1`` (or ``subscribers``:
    name -> URI): publication ``p`` of ``articles`` (and ``publication_keys``) subscribed by each,
    its snapshot folder ``snapshot_folder`` (a relative one is relative to the working folder)."""
    subscribers = subscribers or {"sub1": to_uri(env.sub)}
    path = tmp_path / "topology.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "publisher": to_uri(env.pub),
                "distributor": to_uri(env.dist),
                "subscribers": subscribers,
                "snapshot_folder": snapshot_folder,
                "publications": [{"name": "p", "articles": articles, **publication_keys}],
                "subscriptions": [{"publication": "p", "subscriber": name} for name in subscribers],
            },
            allow_unicode=True,
        )
    )
    return str(path)


def every_subscriber_file(env, tmp_path, articles: list) -> str:
    """A topology YAML file of the test's servers: publication ``p`` of ``articles`` subscribed
    by every subscriber of the test."""
    path = tmp_path / "topology.yaml"
    data = {
        **env.servers(),
        "publications": [{"name": "p", "articles": articles}],
        "subscriptions": [{"publication": "p", "subscriber": name} for name in env.subs],
    }
    path.write_text(yaml.safe_dump(data))
    return str(path)


def orders_topology_file(env, tmp_path) -> str:
    """A topology YAML file publishing ``orders`` (``upd_cmd`` MCALL) in ``p`` to ``sub1``, its
    snapshot folder ``snaps`` relative to the working folder."""
    return topology_file(env, tmp_path, [{"table": "public.orders", "upd_cmd": "MCALL"}])


# ---------------------------------------------------------------------- comparing rows, native oracle
def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}...({len(text)} chars)"


def diff(label: str, columns: list[str], expected: list[tuple], actual: list[tuple]) -> list[str]:
    """Readable differences between two sorted row lists (empty when equal)."""
    if expected == actual:
        return []
    out = [f"{label}: {len(expected)} rows expected, {len(actual)} found"]
    exp, act = set(expected), set(actual)
    for row in [r for r in expected if r not in act][:3]:
        near = next((a for a in actual if a[0] == row[0]), None)
        if near is None:
            out.append(f"  missing row {_short(row[0])}")
        else:
            out += [
                f"  row {_short(row[0])} column {c}: expected {_short(e)}, found {_short(a)}"
                for c, e, a in zip(columns, row, near, strict=False)
                if e != a
            ]
    out += [f"  unexpected row {_short(r[0])}" for r in [r for r in actual if r not in exp][:3]]
    return out


def wait_native(pub_conninfo: str, native_conninfo: str, name: str, timeout: float = 90.0) -> None:
    """Until the native subscription has copied every table and confirmed the publisher's
    current WAL position."""
    deadline = time.monotonic() + timeout
    with (
        psycopg.connect(pub_conninfo, autocommit=True) as pub,
        psycopg.connect(native_conninfo, autocommit=True) as sub,
    ):
        target = pub.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        while time.monotonic() < deadline:
            syncing = sub.execute("SELECT count(*) FROM pg_subscription_rel WHERE srsubstate <> 'r'").fetchone()[0]
            done = pub.execute(
                "SELECT confirmed_flush_lsn >= %s FROM pg_replication_slots WHERE slot_name = %s", (target, name)
            ).fetchone()
            if not syncing and done and done[0]:
                return
            time.sleep(0.2)
    raise AssertionError(f"the native subscription {name} did not catch up within {timeout}s")


def drop_native_subscription(native_conninfo: str, name: str) -> None:
    with psycopg.connect(native_conninfo, autocommit=True) as sub:
        if sub.execute("SELECT 1 FROM pg_subscription WHERE subname = %s", (name,)).fetchone():
            sub.execute(sql.SQL("DROP SUBSCRIPTION {}").format(sql.Identifier(name)))


def signal_and_time(proc: subprocess.Popen, signum: int, timeout: float = 60) -> tuple[float, str, str]:
    """Send ``signum`` to ``proc`` and wait for it to end: (seconds from the signal to its end,
    its standard output, its standard error)."""
    sent = time.monotonic()
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=timeout)
    return time.monotonic() - sent, out, err


def wait_until(condition, timeout: float = 60, what: str = "the condition") -> None:
    """Poll ``condition()`` until it holds (an assertion error naming ``what`` after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def signal_while_restarting(
    proc: subprocess.Popen, sandbox: Sandbox, cluster: str, signum: int, may_end_first: bool = False
) -> tuple[float | None, str, str]:
    """Restart ``cluster`` and, while it restarts, send ``signum`` to ``proc``: as
    :func:`signal_and_time`.  ``may_end_first``: ``proc`` may have ended on its own before the
    signal (it met the restart in a statement): (None, its output, its error)."""
    restart = threading.Thread(target=sandbox.restart_cluster, args=(cluster, "fast"))
    restart.start()
    try:
        time.sleep(0.3)
        if may_end_first and proc.poll() is not None:
            out, err = proc.communicate()
            return None, out, err
        assert proc.poll() is None, proc.communicate()
        return signal_and_time(proc, signum)
    finally:
        restart.join()


def idle_for(conninfo: str, seconds: float) -> bool:
    """Whether every other session of the database has been idle (between transactions) for
    ``seconds`` at least: e.g. a continuous agent waiting out its poll interval."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE state <> 'idle' OR now() - state_change < make_interval(secs => %s)), "
            "count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'",
            (seconds,),
        ).fetchone()
    return row is not None and row[1] > 0 and row[0] == 0


def lock_waits(conninfo: str) -> int:
    """How many sessions of the database wait for a lock."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


# ---------------------------------------------------------------------- servers' state, ports
def database_state(conninfo: str) -> dict[str, str]:
    """A digest of every row of every table outside the system schemas, plus the publications,
    replication slots and prepared transactions of the database: equal digests, same state."""
    out: dict[str, str] = {}
    with psycopg.connect(conninfo, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT table_schema, table_name FROM information_schema.tables WHERE table_type = 'BASE TABLE' "
            "AND table_schema NOT IN ('pg_catalog', 'information_schema') AND table_schema NOT LIKE 'pg_temp%' "
            "ORDER BY 1, 2"
        ).fetchall()
        for schema, table in tables:
            rows = conn.execute(sql.SQL("SELECT t::text FROM {} t").format(sql.Identifier(schema, table))).fetchall()
            out[f"table {schema}.{table}"] = hashlib.md5("\n".join(sorted(r[0] for r in rows)).encode()).hexdigest()
        out["publications"] = repr(
            conn.execute(
                "SELECT p.pubname, array(SELECT tablename FROM pg_publication_tables t WHERE t.pubname = p.pubname "
                "ORDER BY 1) FROM pg_publication p ORDER BY 1"
            ).fetchall()
        )
        out["slots"] = repr(
            conn.execute(
                "SELECT slot_name, temporary FROM pg_replication_slots WHERE database = current_database() ORDER BY 1"
            ).fetchall()
        )
        out["prepared"] = repr(
            conn.execute("SELECT gid FROM pg_prepared_xacts WHERE database = current_database() ORDER BY 1").fetchall()
        )
        out["functions"] = repr(
            conn.execute(
                "SELECT n.nspname, p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                "WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') ORDER BY 1, 2"
            ).fetchall()
        )
    return out


def unused_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def installed_objects(env, conninfo) -> dict:
    """What the product installed at a subscriber: procedures, triggers, its airflow_repl tables' rows."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        procs = [r[0] for r in conn.execute("SELECT proname FROM pg_proc WHERE proname LIKE 'sp\\_MS%' ORDER BY 1")]
        triggers = [
            r[0]
            for r in conn.execute(
                "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal AND tgname LIKE 'airflow\\_repl%' ORDER BY 1"
            )
        ]
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT relname FROM pg_class WHERE relnamespace = to_regnamespace('airflow_repl') AND relkind = 'r' "
                "ORDER BY 1"
            )
        ]
        functions = [
            r[0]
            for r in conn.execute("SELECT proname FROM pg_proc WHERE pronamespace = to_regnamespace('airflow_repl')")
        ]
        state = conn.execute("SELECT count(*) FROM airflow_repl.subscription_state").fetchone()[0]
        files = conn.execute("SELECT count(*) FROM airflow_repl.snapshot_files").fetchone()[0]
        dblink = conn.execute("SELECT count(*) FROM pg_extension WHERE extname = 'dblink'").fetchone()[0]
    return {
        "procs": procs,
        "triggers": triggers,
        "tables": tables,
        "functions": sorted(functions),
        "watermarks": state,
        "ledger": files,
        "dblink": dblink,
    }


#: Headless chromium, for the tests that render the HTML report (None: not installed).
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(*args: str) -> str:
    """Run headless chromium (as root it needs --no-sandbox); its standard output."""
    assert CHROMIUM
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout


# ---------------------------------------------------------------------- agents in processes, draining
@dataclass
class Outcome:
    agent: str
    code: int
    out: str
    err: str
    killed: bool


def run_agent_process(
    agent: str,
    spec: str,
    kwargs: dict,
    kill_after: float | None = None,
    kill_when: Callable[[], bool] | None = None,
    runner: str = AGENT_RUNNER,
) -> Outcome:
    """Run an agent in its own process; SIGKILL it after ``kill_after`` seconds, or as soon as
    ``kill_when()`` (asked every 50 ms) says so, unless it ended first.  ``runner``: a script
    that runs AGENT_RUNNER's ``main()`` (after patching something in the agent's process)."""
    proc = subprocess.Popen(
        [sys.executable, runner, agent, spec, json.dumps(kwargs)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    killed = False
    if kill_after is not None:
        try:
            proc.wait(timeout=kill_after)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            killed = True
    while kill_when is not None and proc.poll() is None:
        if kill_when():
            os.kill(proc.pid, signal.SIGKILL)
            killed = True
            break
        time.sleep(0.05)
    out, err = proc.communicate(timeout=300)
    return Outcome(agent, proc.returncode, out, err, killed)


class Writer:
    """A thread writing at ``conninfo`` until the ``with`` block ends: ``step(conn, i)`` for
    i = 1, 2, ... each in a transaction of its own; ``n`` counts the steps begun."""

    def __init__(self, conninfo: str, step: Callable[[psycopg.Connection, int], None]) -> None:
        self.conninfo, self.step, self.stop, self.n = conninfo, step, threading.Event(), 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            while not self.stop.is_set():
                self.n += 1
                with conn.transaction():
                    self.step(conn, self.n)
                time.sleep(0.002)

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def audit_sql(*tables: str, always: bool = False) -> str:
    """Table ``audit (tbl, op)`` and a trigger on each of ``tables`` recording every row change
    there; ``always``: ENABLE ALWAYS (it fires for the agents' changes at a subscriber too)."""
    script = (
        "CREATE TABLE audit (tbl text NOT NULL, op text NOT NULL);\n"
        "CREATE FUNCTION audit_row() RETURNS trigger LANGUAGE plpgsql AS\n"
        "    $$BEGIN INSERT INTO audit VALUES (TG_TABLE_NAME, TG_OP); RETURN NULL; END$$;\n"
    )
    for table in tables:
        script += (
            f"CREATE TRIGGER audit_{table} AFTER INSERT OR UPDATE OR DELETE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION audit_row();\n"
        )
        if always:
            script += f"ALTER TABLE {table} ENABLE ALWAYS TRIGGER audit_{table};\n"
    return script


#: Runs an ``airflow-repl`` command killed before its K-th database call (see its docstring).
KILL_RUNNER = str(Path(__file__).with_name("kill_runner.py"))


def kill_seeds(default: list[int]) -> list[int]:
    """The seeds of the random-kill rounds: ``default``, or ``AIRFLOW_REPL_KILL_SEEDS``: ``N``
    runs seeds 1..N, ``7,12`` (a comma) those seeds; a failure names its seed."""
    given = os.environ.get("AIRFLOW_REPL_KILL_SEEDS", "").strip()
    if not given:
        return default
    if "," in given:
        return [int(s) for s in given.split(",") if s.strip()]
    return list(range(1, int(given) + 1))


def run_killed_at(kill_at: int, *args: str) -> subprocess.CompletedProcess:
    """``airflow-repl ARGS`` in its own process, SIGKILLed just before its ``kill_at``-th
    database call (0: run to the end, and :func:`database_calls` counts them)."""
    return subprocess.run(
        [sys.executable, KILL_RUNNER, str(kill_at), *args],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        capture_output=True,
        text=True,
        timeout=300,
    )


def database_calls(done: subprocess.CompletedProcess) -> int:
    """The database calls a finished :func:`run_killed_at` process made."""
    assert done.returncode == 0, done.stderr
    return int(done.stderr.rsplit("boundaries: ", 1)[1])


def drain(topo, queued=("sub1", "sub2"), delivered=("sub1", "sub2"), options: dict | None = None) -> None:
    """Queue readers (of the ``queued`` subscribers), Log Reader, Distribution Agents (to the
    ``delivered`` ones, with their ``options``), until a whole pass moves nothing (a resolution
    can send changes on: compensation is local, a won conflict comes back).  The Log Reader
    resolves the immediate subscribers' transactions in doubt first."""
    for _ in range(6):
        moved = sum(queue_reader_agent.run_queue_reader(topo, "p", s)["transactions"] for s in queued)
        moved += log_reader_agent.run_log_reader(topo, "p")["transactions"]
        moved += sum(
            distribution_agent.run_distribution(topo, "p", s, **(options or {}).get(s, {}))["transactions"]
            for s in delivered
        )
        if not moved:
            return
    raise AssertionError("the agents did not settle after six passes")


def first_event(trigger):
    """The first event of an Airflow trigger's ``run()``, driven with asyncio (60 s at most)."""

    async def run():
        async for event in trigger.run():
            return event.payload
        return None

    return asyncio.run(asyncio.wait_for(run(), timeout=60))


def assert_no_secret(trigger, env):
    """The trigger's ``serialize()`` (classpath, kwargs), checked to hold no password or URI of the test's servers."""

    classpath, kwargs = trigger.serialize()
    text = json.dumps(kwargs)
    passwords = {conninfo_to_dict(c).get("password") for c in (env.pub, env.dist, *env.subs.values())} - {None}
    assert passwords  # the sandbox's servers have passwords: the check means something
    assert not any(p in text for p in passwords) and "postgresql://" not in text
    return classpath, kwargs


# ---------------------------------------------------------------------- schema changes
#: (statement template, the column the subscriber must have afterwards (name, type), or None)
SCHEMA_CHANGES = {
    "add_nullable": ("ALTER TABLE {t} ADD COLUMN extra text", ("extra", "text")),
    "add_default_not_null": ("ALTER TABLE {t} ADD COLUMN flag int NOT NULL DEFAULT 7", ("flag", "integer")),
    "drop": ("ALTER TABLE {t} DROP COLUMN note", None),
    "rename": ("ALTER TABLE {t} RENAME COLUMN note TO remark", ("remark", "character varying")),
    "widen_int": ("ALTER TABLE {t} ALTER COLUMN qty TYPE bigint", ("qty", "bigint")),
    "widen_varchar": ("ALTER TABLE {t} ALTER COLUMN note TYPE text", ("note", "text")),
}


def schema_change_dml(conn, t, base, columns=""):
    """Insert, update (a plain one and a key change) and delete rows of ``t``."""
    conn.execute(f"INSERT INTO {t} (id, qty, note) VALUES ({base}, {base}, 'ins {base}')")
    conn.execute(f"UPDATE {t} SET qty = qty + 1 WHERE id = {base % 20 + 1}")
    conn.execute(f"UPDATE {t} SET id = id + 1000 WHERE id = {(base + 7) % 20 + 1}")
    conn.execute(f"DELETE FROM {t} WHERE id = {(base + 13) % 20 + 1}")


def schema_change_dml_after(conn, t, base, change):
    """Row changes that use the changed column (its new name or type)."""
    if change == "rename":
        conn.execute(f"INSERT INTO {t} (id, qty, remark) VALUES ({base}, 1, 'renamed {base}')")
        conn.execute(f"UPDATE {t} SET remark = 'upd' WHERE id = {base}")
    elif change == "drop":
        conn.execute(f"INSERT INTO {t} (id, qty) VALUES ({base}, 1)")
        conn.execute(f"UPDATE {t} SET qty = 5 WHERE id = {base}")
    elif change == "add_nullable":
        conn.execute(f"INSERT INTO {t} (id, qty, note, extra) VALUES ({base}, 1, 'x', 'extra {base}')")
        conn.execute(f"UPDATE {t} SET extra = 'changed' WHERE id = {base % 20 + 2}")
    elif change == "add_default_not_null":
        conn.execute(f"INSERT INTO {t} (id, qty, note, flag) VALUES ({base}, 1, 'x', 42)")
        conn.execute(f"UPDATE {t} SET flag = 8 WHERE id = {base % 20 + 2}")
    elif change == "widen_int":
        conn.execute(f"INSERT INTO {t} (id, qty, note) VALUES ({base}, 9000000000, 'big')")
    else:
        conn.execute(f"INSERT INTO {t} (id, qty, note) VALUES ({base}, 1, '{'long text ' * 5}')")
    conn.execute(f"DELETE FROM {t} WHERE id = {(base + 3) % 20 + 1}")


# ---------------------------------------------------------------------- MariaDB subscribers
def backlog(env, mariadb, spark, transactions, article="public.items", **sub_options):
    """``items`` snapshotted to a MariaDB subscriber, then ``transactions`` publisher
    transactions of 5 inserts each waiting for delivery (read by the Log Reader)."""
    env.run(env.pub, "CREATE TABLE items (id int PRIMARY KEY, v text)")
    topo, db = mariadb_topology(env, mariadb, [article], **sub_options)
    snapshot_agent.run_snapshot(topo, "p", spark)
    count_applied(mariadb, db)
    with psycopg.connect(env.pub, autocommit=True) as conn:
        for t in range(transactions):
            with conn.transaction():
                conn.execute(
                    "INSERT INTO items SELECT g, 'v' || g FROM generate_series(%s::int, %s::int) g",
                    (t * 5 + 1, t * 5 + 5),
                )
    log_reader_agent.run_log_reader(topo, "p")
    return topo, db


def assert_applied_once(mariadb, db, transactions):
    assert mariadb.rows(db, "SELECT COUNT(*), COUNT(DISTINCT id), MAX(id) FROM items") == [
        (transactions * 5, transactions * 5, transactions * 5)
    ]
    assert mariadb.rows(db, "SELECT op, COUNT(*) FROM applied GROUP BY op") == [("I", transactions * 5)]


def count_applied(mariadb, db, table="items"):
    """A MariaDB trigger that logs every row the agent applies (rolled back with its batch)."""
    mariadb.run(db, "CREATE TABLE applied (op CHAR(1)) ENGINE=InnoDB")
    for op, when in (("I", "INSERT"), ("U", "UPDATE"), ("D", "DELETE")):
        mariadb.run(
            db, f"CREATE TRIGGER applied_{op} AFTER {when} ON {table} FOR EACH ROW INSERT INTO applied VALUES ('{op}')"
        )
