"""Updatable subscriptions (queued updating): every interval, the Queue Reader Agent applies
the changes queued at the subscribers at the publisher (conflicts resolved by the publication's
conflict_policy and listed by ``airflow-repl conflicts``), the Log Reader Agent stores what the
publisher committed (those changes among it), and the Distribution Agent delivers it to every
subscriber but the one each change came from.

The publication of the topology file must allow queued updating (``allow_queued_tran: true``)
and its subscriptions use ``update_mode: queued tran``; see docs/updatable-subscriptions.md.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, CronDataIntervalTimetable
from repl_common import AGENT_TASK_ARGS, SPARK_CONN_ID, TOPOLOGY, UPDATABLE_PUBLICATION

from airflow_repl.operators.agents import (
    DistributionAgentOperator,
    LogReaderAgentOperator,
    QueueReaderAgentOperator,
)

with DAG(
    dag_id="airflow_repl_updatable",
    description="Queue Reader Agent, Log Reader Agent, then Distribution Agent, every 10 minutes",
    schedule=CronDataIntervalTimetable("*/10 * * * *", timezone="UTC"),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["airflow-repl", "example", "updatable"],
) as dag:
    queue_reader = QueueReaderAgentOperator(
        task_id="queue_reader",
        topology=TOPOLOGY,
        publication=UPDATABLE_PUBLICATION,
        conn_id=SPARK_CONN_ID,
        **AGENT_TASK_ARGS,
    )
    log_reader = LogReaderAgentOperator(
        task_id="log_reader",
        topology=TOPOLOGY,
        publication=UPDATABLE_PUBLICATION,
        conn_id=SPARK_CONN_ID,
        **AGENT_TASK_ARGS,
    )
    distribution = DistributionAgentOperator(
        task_id="distribution",
        topology=TOPOLOGY,
        publication=UPDATABLE_PUBLICATION,
        until="{{ data_interval_end }}",
        conn_id=SPARK_CONN_ID,
        **AGENT_TASK_ARGS,
    )
    queue_reader >> log_reader >> distribution
