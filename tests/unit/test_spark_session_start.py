"""Starting the Snapshot Agent's local SparkSession in the background, and the partitions a
local master gives, without starting Spark."""

from __future__ import annotations

import os
import threading

import pytest

from airflow_repl.jobs import session


@pytest.mark.parametrize(
    "master, cores",
    [
        ("local", 1),
        ("local[2]", 2),
        ("local[16]", 16),
        ("local[3,4]", 3),
        ("local[*]", os.cpu_count() or 1),
        ("local[0]", 1),
        ("spark://host:7077", None),
        ("yarn", None),
        ("k8s://https://api:6443", None),
        ("local[x]", None),
    ],
)
def test_local_parallelism(master, cores):
    assert session.local_parallelism(master) == cores


def test_the_session_is_waited_for_on_first_use(monkeypatch):
    release = threading.Event()

    class Session:
        applicationId = "local-1"

    def start(app_name, master=None):
        assert app_name == "app"
        release.wait(5)
        return Session()

    monkeypatch.setattr(session, "spark_session", start)
    starting = session.StartingSession("app")
    assert not starting._done.is_set()  # still starting: the caller goes on meanwhile
    release.set()
    assert starting.applicationId == "local-1"
    assert isinstance(starting.result(), Session)


def test_a_failed_start_is_raised_where_the_session_is_used(monkeypatch):
    def start(app_name, master=None):
        raise RuntimeError("Java gateway process exited before sending its port number")

    monkeypatch.setattr(session, "spark_session", start)
    starting = session.StartingSession("app")
    with pytest.raises(RuntimeError, match="Java gateway"):
        _ = starting.sparkContext
    with pytest.raises(RuntimeError, match="Java gateway"):
        starting.result()
