"""Scheduled replication: every interval, the Log Reader Agent stores what the publisher
committed, and the Distribution Agent delivers the transactions committed up to the end of the
run's data interval (point-in-time delivery: a backfill replays history interval by interval).

Every ``validate_every`` intervals (a DAG param, 6 by default: once an hour; 0: never) the
ValidationOperator then compares the subscribers with the publisher and fails the run, with the
differing keys in its XCom, when one differs; in the other runs that task is skipped.
"""

from __future__ import annotations

from datetime import datetime

import pendulum
from airflow.providers.standard.operators.python import ShortCircuitOperator
from airflow.sdk import DAG, CronDataIntervalTimetable, Param
from repl_common import PUBLICATION, SPARK_CONN_ID, TOPOLOGY

from airflow_repl.operators.agents import DistributionAgentOperator, LogReaderAgentOperator
from airflow_repl.operators.validation import ValidationOperator

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
        task_id="log_reader", topology=TOPOLOGY, publication=PUBLICATION, conn_id=SPARK_CONN_ID
    )
    distribution = DistributionAgentOperator(
        task_id="distribution",
        topology=TOPOLOGY,
        publication=PUBLICATION,
        until="{{ data_interval_end }}",
        conn_id=SPARK_CONN_ID,
    )
    due = ShortCircuitOperator(task_id="validation_due", python_callable=validation_due)
    validate = ValidationOperator(task_id="validate", topology=TOPOLOGY, publication=PUBLICATION, conn_id=SPARK_CONN_ID)
    log_reader >> distribution >> due >> validate
