"""What the integration tests share besides fixtures: the per-test databases (:class:`Env`), the
WAL boundaries the LSN tests cross, and Airflow's private home for the session.

Test modules import these with ``from harness import ...`` (pytest puts this folder on
``sys.path``); ``conftest.py`` builds its fixtures from them.  Importing this module points
``AIRFLOW_HOME`` at a fresh temporary folder before anything imports Airflow.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import psycopg

from airflow_repl.engine.model import topology as topology_mod
from airflow_repl.engine.postgres.connections import resolve_topology, to_uri
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


def _resolved(data: dict) -> topology_mod.Topology:
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
        return _resolved(
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


#: Positions where an LSN's text gains a digit (text order breaks there, numeric order does not).
WAL_BOUNDARIES = ("0/10000000", "1/10000000", "10/0")
#: A cluster of the wal_cluster fixture starts this far below its boundary.
WAL_HEADROOM = 4 << 20


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
    proc: subprocess.Popen, sandbox: Sandbox, cluster: str, signum: int
) -> tuple[float, str, str]:
    """Restart ``cluster`` and, while it restarts, send ``signum`` to ``proc``: as
    :func:`signal_and_time`."""
    restart = threading.Thread(target=sandbox.restart_cluster, args=(cluster, "fast"))
    restart.start()
    try:
        time.sleep(0.3)
        assert proc.poll() is None, proc.communicate()
        return signal_and_time(proc, signum)
    finally:
        restart.join()


def lock_waits(conninfo: str) -> int:
    """How many sessions of the database wait for a lock."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0
