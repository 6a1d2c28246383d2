"""The unit folder's guard (``tests/unit/conftest.py``) works: every way to a server, to Spark or
to the network fails the test, and the integration fixtures are not available here."""

from __future__ import annotations

import importlib
import socket
import sys

import psycopg
import pytest

from airflow_repl.engine.postgres import connections
from airflow_repl.jobs import session
from airflow_repl.sandbox import Sandbox

REFUSED = pytest.fail.Exception  # pytest's own failure outcome: not an Exception, nothing swallows it


def test_postgresql_connections_are_refused():
    with pytest.raises(REFUSED, match=r"tried to connect to PostgreSQL.*belongs in tests/integration"):
        psycopg.connect("host=127.0.0.1 port=1")
    with pytest.raises(REFUSED, match="connect to PostgreSQL"):
        psycopg.Connection.connect("host=127.0.0.1 port=1")
    with pytest.raises(REFUSED, match="connect to PostgreSQL"):  # through the engine's own connect
        connections.connect("postgresql://u@127.0.0.1:1/d", "publisher")
    assert not issubclass(REFUSED, Exception)


def test_sandbox_clusters_spark_and_sockets_are_refused():
    with pytest.raises(REFUSED, match=r"Sandbox\.start"):
        Sandbox.start(object())  # type: ignore[arg-type]  # refused before it looks at self
    with pytest.raises(REFUSED, match=r"Sandbox\._run"):
        Sandbox._run(object(), "initdb")  # type: ignore[arg-type]
    with pytest.raises(REFUSED, match="SparkSession"):
        session.spark_session("unit")
    with socket.socket() as s, pytest.raises(REFUSED, match="network connection"):
        s.connect(("127.0.0.1", 1))


@pytest.mark.parametrize("fixture", ["sandbox", "spark", "env", "env2", "wal_env", "wal_cluster"])
def test_integration_fixtures_fail_with_the_reason(request, fixture):
    with pytest.raises(REFUSED, match=rf"fixture '{fixture}'.*belongs in tests/integration"):
        request.getfixturevalue(fixture)


@pytest.mark.parametrize("package", ["pyspark", "airflow"])
def test_pyspark_and_airflow_are_not_imported(package):
    if package in sys.modules:
        pytest.skip(f"{package} was imported by other tests of this session (tests/integration)")
    with pytest.raises(REFUSED, match=f"import {package}"):
        importlib.import_module(package)
