"""Test harness: private PostgreSQL clusters (publisher and subscriber are separate clusters,
the distribution database lives beside the publisher), one shared local SparkSession, and a
factory of fresh databases + topology per test."""

from __future__ import annotations

import itertools
import logging
import os
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest

from airflow_repl.engine.model import topology as topology_mod
from airflow_repl.engine.postgres.connections import resolve_topology, to_uri
from airflow_repl.engine.postgres.lsn import lsn_to_int
from airflow_repl.sandbox import Sandbox

_counter = itertools.count(1)

# Airflow reads its configuration once, at first import: give the whole session a private home.
AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="airflow-repl-tests-")) / "airflow"
os.environ["AIRFLOW_HOME"] = str(AIRFLOW_HOME)
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__LOGGING__LOGGING_LEVEL"] = "INFO"  # the e2e test reads the spark-submit log lines


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory):
    # pytest's temporary folders are private to root: as root, the sandbox puts its clusters
    # where the unprivileged server user can reach them (see Sandbox._pg_base)
    sb = Sandbox(tmp_path_factory.mktemp("sandbox"))
    sb.start()
    yield sb
    sb.destroy()


@pytest.fixture(scope="session")
def spark():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from airflow_repl.jobs.session import spark_session

    session = spark_session("airflow-repl-tests", master="local[2]")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    # py4j says goodbye at INFO from __del__, after pytest closed the streams it would log to
    logging.getLogger("py4j").setLevel(logging.WARNING)
    session.stop()


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

    def topology(self, articles: list, *, publication: str = "p", **sub_options) -> topology_mod.Topology:
        return _resolved(
            {
                "publisher": to_uri(self.pub),
                "distributor": to_uri(self.dist),
                "subscribers": {name: to_uri(ci) for name, ci in self.subs.items()},
                "snapshot_folder": str(self.tmp_path / "snapshots"),
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


@pytest.fixture
def env(sandbox, tmp_path):
    e = Env(sandbox, tmp_path)
    yield e
    e.drop()


@pytest.fixture
def env2(sandbox, tmp_path):
    e = Env(sandbox, tmp_path, n_subscribers=2)
    yield e
    e.drop()


#: Positions where an LSN's text gains a digit (text order breaks there, numeric order does not).
WAL_BOUNDARIES = ("0/10000000", "1/10000000", "10/0")
#: A cluster of the wal_cluster fixture starts this far below its boundary.
WAL_HEADROOM = 4 << 20


@pytest.fixture(scope="session")
def wal_cluster(sandbox):
    """Factory ``wal_cluster(boundary, room=2 MB) -> cluster name``: a sandbox cluster (1 MB WAL
    segments) whose WAL insert position is below the LSN ``boundary`` by at least ``room``
    bytes and by at most WAL_HEADROOM.  One cluster per boundary, cached for the session and
    replaced by a fresh one (about 1 s) once a test has used up its room."""

    def get(boundary: str, room: int = 2 << 20) -> str:
        name = "wal_" + boundary.replace("/", "_").lower()
        goal = lsn_to_int(boundary)
        if name in sandbox.wal_clusters():
            try:
                if lsn_to_int(sandbox.wal_position(name)) + room <= goal:
                    return name
            except psycopg.OperationalError:
                pass  # stopped or broken by an earlier test: make a new one
        sandbox.add_wal_cluster(name, max(0, goal - WAL_HEADROOM))
        return name

    return get


@pytest.fixture
def wal_env(sandbox, wal_cluster, tmp_path):
    """Factory ``wal_env(boundary, n_subscribers=1) -> Env`` whose publisher and distribution
    databases live in a ``wal_cluster(boundary)`` cluster (subscribers in the usual subscriber
    cluster).  ``env.cross_boundary()`` then moves the publisher's WAL to the boundary.  The
    databases are dropped when the test ends."""
    made: list[Env] = []

    def make(boundary: str, n_subscribers: int = 1) -> Env:
        e = Env(
            sandbox,
            tmp_path / f"wal{len(made)}",
            n_subscribers,
            publisher_cluster=wal_cluster(boundary),
            boundary=boundary,
        )
        made.append(e)
        return e

    yield make
    for e in made:
        e.drop()
