"""Scheduled replication: every interval, the Log Reader Agent stores what the publisher
committed, and the Distribution Agent delivers the transactions committed up to the end of the
run's data interval (point-in-time delivery: a backfill replays history interval by interval).
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, CronDataIntervalTimetable
from repl_common import PUBLICATION, SPARK_CONN_ID, TOPOLOGY

from airflow_repl.operators.agents import DistributionAgentOperator, LogReaderAgentOperator

with DAG(
    dag_id="airflow_repl_scheduled",
    description="Log Reader Agent then Distribution Agent, every 10 minutes",
    schedule=CronDataIntervalTimetable("*/10 * * * *", timezone="UTC"),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
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
    log_reader >> distribution
