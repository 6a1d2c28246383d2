"""jobs.local_tasks: the stand-in for a SparkSession the CLI's Snapshot Agent uses without a master."""

from __future__ import annotations

import threading
import time

import pytest

from airflow_repl.jobs import local_tasks, session


def test_tasks_run_in_parallel_threads_and_results_keep_the_tasks_order():
    tasks = local_tasks.LocalTasks(2)
    context = tasks.sparkContext
    assert context.defaultParallelism == 2
    seen: set[str] = set()
    both = threading.Barrier(2, timeout=10)  # two tasks must be running at once to pass it

    def work(i: int) -> int:
        seen.add(threading.current_thread().name)
        if i < 2:
            both.wait()
        time.sleep(0.01 * (5 - i))  # later tasks finish first
        return i * i

    assert context.parallelize(range(5), 5).map(work).map(lambda x: x + 1).collect() == [1, 2, 5, 10, 17]
    assert len(seen) == 2 and threading.current_thread().name not in seen
    assert context.parallelize([], 1).map(work).collect() == []


def test_a_failing_task_raises_its_own_error_and_the_tasks_not_started_are_cancelled():
    context = local_tasks.LocalTasks(1).sparkContext
    ran: list[int] = []

    def work(i: int) -> int:
        ran.append(i)
        time.sleep(0.02)
        if i == 1:
            raise ValueError("task 1 failed")
        return i

    with pytest.raises(ValueError, match="task 1 failed"):
        context.parallelize(range(50), 50).map(work).collect()
    assert ran[:2] == [0, 1] and len(ran) < 10


def test_accumulators_add_from_many_threads():
    context = local_tasks.LocalTasks(4).sparkContext
    acc = context.accumulator(5)
    context.parallelize(range(400), 400).map(lambda _: acc.add(2)).collect()
    assert acc.value == 805


def test_the_snapshot_runs_in_threads_only_outside_spark_submit_without_a_named_master(monkeypatch):
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    monkeypatch.delenv("AIRFLOW_REPL_SPARK_MASTER", raising=False)
    assert session.in_process()
    monkeypatch.setenv("AIRFLOW_REPL_SPARK_MASTER", "local[2]")
    assert not session.in_process()
    monkeypatch.delenv("AIRFLOW_REPL_SPARK_MASTER")
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "12345")
    assert not session.in_process()
