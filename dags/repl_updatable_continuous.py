"""Continuous updatable subscriptions: the Queue Reader, Log Reader and Distribution Agents run
side by side, each continuously, so that a change made at a queued updating subscriber reaches
the publisher about ``poll_interval`` seconds after its commit, and the other subscribers a few
poll intervals later, instead of at the next scheduled run (``airflow_repl_updatable``).

At each subscriber the Queue Reader and the Distribution Agent take turns, one queued
transaction or one batch at a time, so the two continuous tasks never write there together and
never keep each other out for a whole window.  Airflow's ``@continuous`` schedule starts a new
DAG run as soon as the last one ends; each task ends cleanly after ``max_run_seconds`` with its
summary in XCom.  Three Spark applications stay open for the whole window (and, with several
subscribers, one task slot per subscriber for each of the Queue Reader and the Distribution
Agent).  See docs/continuous.md and docs/updatable-subscriptions.md.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG
from repl_common import AGENT_TASK_ARGS, SPARK_CONN_ID, TOPOLOGY, UPDATABLE_PUBLICATION

from airflow_repl.operators.agents import (
    DistributionAgentOperator,
    LogReaderAgentOperator,
    QueueReaderAgentOperator,
)

POLL_INTERVAL = 1.0  # seconds between looks when idle: the lag each agent adds, at most
MAX_RUN_SECONDS = 600  # each task ends cleanly after ten minutes; the next DAG run takes over

with DAG(
    dag_id="airflow_repl_updatable_continuous",
    description="Queue Reader, Log Reader and Distribution Agents in continuous mode, side by side",
    schedule="@continuous",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["airflow-repl", "example", "updatable"],
) as dag:
    # Three parallel tasks, no dependency: each agent takes what the one before it stored while
    # all three run.
    common = {
        "topology": TOPOLOGY,
        "publication": UPDATABLE_PUBLICATION,
        "conn_id": SPARK_CONN_ID,
        "continuous": True,
        "poll_interval": POLL_INTERVAL,
        "max_run_seconds": MAX_RUN_SECONDS,
    }
    QueueReaderAgentOperator(task_id="queue_reader", **common, **AGENT_TASK_ARGS)
    LogReaderAgentOperator(task_id="log_reader", **common, **AGENT_TASK_ARGS)
    DistributionAgentOperator(task_id="distribution", **common, **AGENT_TASK_ARGS)
