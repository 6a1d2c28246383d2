"""Scheduled replication: every interval, the Log Reader Agent stores what the publisher
committed, and the Distribution Agent delivers the transactions committed up to the end of the
run's data interval (point-in-time delivery: a backfill replays history interval by interval).

Then ReplicationHealthSensor checks the publication's subscriptions against their monitoring
thresholds (docs/monitoring.md): it waits while one is at a warning, up to half an interval, and
fails at once at a critical one (a failed or blocked run, lag at or above
``critical_latency_seconds``), so the run fails and alerts.  Every agent task retries what a
retry can fix, with exponential back-off, and every task that fails for good alerts
(``AGENT_TASK_ARGS`` and ``ReplicationAlert`` in repl_common.py).

Every ``validate_every`` intervals (a DAG param, 6 by default: once an hour; 0: never) the
ValidationOperator then compares the subscribers with the publisher and fails the run, with the
differing keys in its XCom, when one differs; in the other runs that task is skipped.
"""

from __future__ import annotations

from datetime import datetime

import pendulum
from airflow.providers.standard.operators.python import ShortCircuitOperator
from airflow.sdk import DAG, CronDataIntervalTimetable, Param
from repl_common import AGENT_TASK_ARGS, ALERT, PUBLICATION, SPARK_CONN_ID, TOPOLOGY

from airflow_repl.operators.agents import DistributionAgentOperator, LogReaderAgentOperator
from airflow_repl.operators.validation import ValidationOperator
from airflow_repl.sensors.health import ReplicationHealthSensor

INTERVAL_SECONDS = 600


def validation_due(data_interval_end: datetime, params: dict) -> bool:
    """Whether this run's interval is one of every ``validate_every`` (counted from the epoch,
    so with 6 the runs ending on the hour validate)."""
    every = int(params["validate_every"])
    return every > 0 and int(data_interval_end.timestamp()) // INTERVAL_SECONDS % every == 0


with DAG(
    dag_id="airflow_repl_scheduled",
    description="Log Reader Agent then Distribution Agent, every 10 minutes; validation every N runs",
    schedule=CronDataIntervalTimetable("*/10 * * * *", timezone="UTC"),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    params={
        "validate_every": Param(
            6, type="integer", minimum=0, description="validate the subscribers every N runs (0: never)"
        )
    },
    tags=["airflow-repl", "example"],
) as dag:
    log_reader = LogReaderAgentOperator(
        task_id="log_reader",
        topology=TOPOLOGY,
        publication=PUBLICATION,
        conn_id=SPARK_CONN_ID,
        **AGENT_TASK_ARGS,
    )
    distribution = DistributionAgentOperator(
        task_id="distribution",
        topology=TOPOLOGY,
        publication=PUBLICATION,
        until="{{ data_interval_end }}",
        conn_id=SPARK_CONN_ID,
        **AGENT_TASK_ARGS,
    )
    due = ShortCircuitOperator(task_id="validation_due", python_callable=validation_due)
    validate = ValidationOperator(
        task_id="validate", topology=TOPOLOGY, publication=PUBLICATION, conn_id=SPARK_CONN_ID, **AGENT_TASK_ARGS
    )
    healthy = ReplicationHealthSensor(
        task_id="replication_healthy",
        topology=TOPOLOGY,
        publication=PUBLICATION,
        poke_interval=30,
        timeout=INTERVAL_SECONDS // 2,
        on_failure_callback=ALERT,
    )
    log_reader >> distribution >> [healthy, due]
    due >> validate
