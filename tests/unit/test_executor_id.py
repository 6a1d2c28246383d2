"""Which executor ran a task, from what each cluster manager puts in the executor's environment."""

from __future__ import annotations

import socket

import pytest

from airflow_repl.jobs.executors import executor_id

HOST = socket.gethostname()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "driver"),  # local mode: the task runs in the driver
        ({"SPARK_EXECUTOR_ID": "7"}, "7"),  # Kubernetes
        ({"SPARK_LOG_URL_STDERR": "http://h:8081/logPage/?appId=app-1-0000&executorId=3&logType=stderr"}, "3"),
        ({"CONTAINER_ID": "container_1_0001_01_000002"}, "container_1_0001_01_000002"),  # YARN
    ],
)
def test_executor_id(monkeypatch, env, expected):
    for name in ("SPARK_EXECUTOR_ID", "SPARK_LOG_URL_STDERR", "CONTAINER_ID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert executor_id() == f"{HOST}/{expected}"
