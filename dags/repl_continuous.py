"""Continuous replication: the Log Reader and Distribution Agents run side by side, each
continuously, so that a change reaches the subscribers about ``poll_interval`` seconds after the
Log Reader stored it, instead of at the next scheduled run.

Airflow's ``@continuous`` schedule starts a new DAG run as soon as the last one ends, and
``max_active_runs=1`` keeps one at a time.  Each task ends cleanly, with its success summary in
XCom, after ``max_run_seconds`` (or when Airflow stops it with SIGTERM: the batch being applied
is finished first), and the next DAG run starts both again: a run is a window of ten minutes
with a fresh agent history row, not a process that lives forever.

Trade-off: the two tasks hold two Spark applications (driver processes) open for the whole
window, even when the publisher is idle.  Lag while the publisher writes is bounded by about
``poll_interval`` for each agent (the Log Reader looks at once again after a round that stored
transactions; either agent sleeps ``poll_interval`` only when it found nothing), plus the time
to read and apply a batch, plus the seconds between two DAG runs (Spark start-up) once per
window.  See docs/continuous.md.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG
from repl_common import AGENT_TASK_ARGS, PUBLICATION, SPARK_CONN_ID, TOPOLOGY

from airflow_repl.operators.agents import DistributionAgentOperator, LogReaderAgentOperator

POLL_INTERVAL = 1.0  # seconds between looks when idle: the lag the agents add, at most
MAX_RUN_SECONDS = 600  # each task ends cleanly after ten minutes; the next DAG run takes over

with DAG(
    dag_id="airflow_repl_continuous",
    description="Log Reader and Distribution Agents in continuous mode, side by side, ten-minute windows",
    schedule="@continuous",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["airflow-repl", "example"],
) as dag:
    # Two parallel tasks, no dependency: the Distribution Agent delivers what the Log Reader
    # stores while both run.
    LogReaderAgentOperator(
        task_id="log_reader",
        topology=TOPOLOGY,
        publication=PUBLICATION,
        conn_id=SPARK_CONN_ID,
        continuous=True,
        poll_interval=POLL_INTERVAL,
        max_run_seconds=MAX_RUN_SECONDS,
        **AGENT_TASK_ARGS,
    )
    DistributionAgentOperator(
        task_id="distribution",
        topology=TOPOLOGY,
        publication=PUBLICATION,
        conn_id=SPARK_CONN_ID,
        continuous=True,
        poll_interval=POLL_INTERVAL,
        max_run_seconds=MAX_RUN_SECONDS,
        **AGENT_TASK_ARGS,
    )
