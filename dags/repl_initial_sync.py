"""Initial synchronization: snapshot the publication, then deliver what was written meanwhile.

Run it when subscriptions are added: the snapshot initializes only subscriptions that are not
active yet, so re-running it is harmless.  To rebuild active subscribers, run
``airflow-repl snapshot --reinitialize`` or give the snapshot task ``reinitialize=True``.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG
from repl_common import AGENT_TASK_ARGS, PUBLICATION, SPARK_CONN_ID, TOPOLOGY

from airflow_repl.operators.agents import DistributionAgentOperator, LogReaderAgentOperator, SnapshotAgentOperator

with DAG(
    dag_id="airflow_repl_initial_sync",
    description="Snapshot Agent, then Log Reader and Distribution Agents",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["airflow-repl", "example"],
) as dag:
    snapshot = SnapshotAgentOperator(
        task_id="snapshot",
        topology=TOPOLOGY,
        publication=PUBLICATION,
        conn_id=SPARK_CONN_ID,
        **AGENT_TASK_ARGS,
    )
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
        conn_id=SPARK_CONN_ID,
        **AGENT_TASK_ARGS,
    )
    snapshot >> log_reader >> distribution
