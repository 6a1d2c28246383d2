"""Fixtures of the integration tests: private PostgreSQL clusters (publisher and subscriber are
separate clusters, the distribution database lives beside the publisher), one shared local
SparkSession, a Spark standalone cluster for the tests that ask for it, and a factory of fresh
databases + topology per test.  The classes and constants behind them live in ``harness.py``
and ``spark_cluster.py``, which test modules import directly."""

from __future__ import annotations

import logging
import os
import sys

import psycopg
import pytest
from harness import WAL_HEADROOM, Env
from spark_cluster import StandaloneCluster

from airflow_repl.engine.postgres.lsn import lsn_to_int
from airflow_repl.sandbox import Sandbox


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory):
    # pytest's temporary folders are private to root: as root, the sandbox puts its clusters
    # where the unprivileged server user can reach them (see Sandbox._pg_base)
    sb = Sandbox(tmp_path_factory.mktemp("sandbox"))
    sb.start()
    yield sb
    sb.destroy()


class MariaDB:
    """The session's private MariaDB server (``airflow_repl.sandbox_mariadb.MariaDBServer``) and
    the databases the tests made in it: ``new_database(prefix)`` makes a fresh utf8mb4 database
    and returns its name, ``uri(name)`` and ``connect(name)`` reach it; ``restart(kill=True)`` is
    a crash of the server."""

    def __init__(self, server) -> None:
        self.server = server
        self.made: list[str] = []

    def new_database(self, prefix: str = "msub") -> str:
        name = f"{prefix}_{len(self.made) + 1}"
        self.server.create_database(name, recreate=True)
        self.made.append(name)
        return name

    def uri(self, database: str) -> str:
        return self.server.uri(database)

    def connect(self, database: str | None = None):
        return self.server.connect(database)

    def rows(self, database: str, query: str, params=None) -> list[tuple]:
        with self.server.connection(database) as conn, conn.cursor() as cur:
            cur.execute(query, params)
            return list(cur.fetchall())

    def run(self, database: str, query: str, params=None) -> None:
        with self.server.connection(database) as conn, conn.cursor() as cur:
            cur.execute(query, params)

    def restart(self, *, kill: bool = False) -> None:
        self.server.restart(kill=kill)


@pytest.fixture(scope="session")
def mariadb(sandbox):
    """The sandbox's private MariaDB server, started once for the session (see :class:`MariaDB`)."""
    server = sandbox.mariadb()
    server.start()
    yield MariaDB(server)
    server.stop()


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


@pytest.fixture
def env3(sandbox, tmp_path):
    e = Env(sandbox, tmp_path, n_subscribers=3)
    yield e
    e.drop()


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


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory):
    """A Spark standalone cluster (a master and two workers of 1 core and 1 GiB, from the
    installed PySpark) for the tests that ask for it; stopped with every process it started."""
    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-cluster")).start()
    pgids = [p.pid for p in cluster.procs]
    yield cluster
    cluster.stop()
    left = cluster.leftovers(pgids)
    assert not left, f"processes of the Spark cluster still running after it stopped: {left}"
