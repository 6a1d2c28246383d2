"""Unit tests: no server, no Spark, no Airflow, no network; the whole folder runs in seconds.

The integration fixtures (``sandbox``, ``spark``, ``env`` ...) live in
``tests/integration/conftest.py``; here a fixture of that name fails the test with the reason.
Every unit test also runs with the ways out closed: connecting to PostgreSQL, running a
PostgreSQL program through the sandbox, starting a SparkSession, connecting a socket, or a first
import of PySpark or Airflow fails the test at once.  The failure is pytest's own outcome (a
``BaseException``), so no ``except Exception`` in the code under test can swallow it.
"""

from __future__ import annotations

import importlib.abc
import socket
import sys
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import psycopg
import pytest

from airflow_repl.jobs import session as spark_session_module
from airflow_repl.sandbox import Sandbox

#: Fixtures of tests/integration/conftest.py: each starts servers or Spark.
INTEGRATION_FIXTURES = ("sandbox", "spark", "env", "env2", "wal_env", "wal_cluster")
#: Packages a unit test may not import (slow to import, and they start or configure other systems).
FORBIDDEN_IMPORTS = ("pyspark", "airflow")


def _not_here(what: str) -> NoReturn:
    pytest.fail(f"a unit test tried to {what}: such a test belongs in tests/integration", pytrace=False)


def _refuse(what: str) -> Callable[..., NoReturn]:
    def refused(*args: Any, **kwargs: Any) -> NoReturn:
        _not_here(what)

    return refused


def _integration_fixture(name: str) -> Any:
    @pytest.fixture(name=name)
    def fixture() -> NoReturn:
        _not_here(f"use the fixture {name!r}, which starts servers or Spark")

    return fixture


for _name in INTEGRATION_FIXTURES:
    globals()[f"_{_name}_is_integration_only"] = _integration_fixture(_name)


class _RefuseImports(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname.partition(".")[0] in FORBIDDEN_IMPORTS:
            _not_here(f"import {fullname}")


@pytest.fixture(autouse=True)
def _no_servers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    connect = _refuse("connect to PostgreSQL")
    monkeypatch.setattr(psycopg, "connect", connect)
    monkeypatch.setattr(psycopg.Connection, "connect", classmethod(connect))
    monkeypatch.setattr(psycopg.AsyncConnection, "connect", classmethod(connect))
    for method in ("start", "add_wal_cluster", "restart_cluster", "_run", "_ensure_user"):
        monkeypatch.setattr(Sandbox, method, _refuse(f"start or run a sandbox cluster (Sandbox.{method})"))
    monkeypatch.setattr(spark_session_module, "spark_session", _refuse("start a SparkSession"))
    monkeypatch.setattr(socket.socket, "connect", _refuse("open a network connection"))
    monkeypatch.setattr(socket.socket, "connect_ex", _refuse("open a network connection"))
    finder = _RefuseImports()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
