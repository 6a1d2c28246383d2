"""A schema change on a live topology, as a routine DAG run (SPEC section 5):

1. post a tracer token at the publisher;
2. run the Log Reader and Distribution Agents, which carry it to every subscriber;
3. wait until the topology is quiesced up to the token (everything committed before it read
   and delivered everywhere, queues empty, nothing in doubt);
4. run the schema change at the publisher (refused if a subscription fell behind the token
   meanwhile), replicated in commit order with the data changes around it;
5. resume the agents: the Distribution Agent changes each subscriber table and regenerates
   the article's procedures in the commit that delivers the change;
6. regenerate procedures on demand everywhere (generated ones, and custom ones through their
   registered scripts), so every subscriber ends with procedures for the new columns.

Trigger it with the statement as a parameter, e.g.
``airflow dags trigger airflow_repl_schema_change -c '{"sql": "ALTER TABLE public.orders ADD COLUMN channel text"}'``.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Param
from repl_common import AGENT_TASK_ARGS, PUBLICATION, SPARK_CONN_ID, TOPOLOGY

from airflow_repl.operators.agents import DistributionAgentOperator, LogReaderAgentOperator
from airflow_repl.operators.schema import RegenerateProceduresOperator, SchemaChangeOperator
from airflow_repl.operators.tracer import PostTracerTokenOperator
from airflow_repl.sensors.quiescing import TopologyQuiescedSensor

TOKEN = "{{ ti.xcom_pull(task_ids='post_tracer_token') }}"

with DAG(
    dag_id="airflow_repl_schema_change",
    description="tracer token -> agents -> quiesce sensor -> schema change -> agents -> regenerate procedures",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    params={
        "sql": Param(
            "ALTER TABLE public.orders ADD COLUMN channel text NOT NULL DEFAULT 'web'",
            type="string",
            description="one ALTER TABLE of a published table (see docs/schema-changes.md)",
        )
    },
    tags=["airflow-repl", "example"],
) as dag:
    common = {"topology": TOPOLOGY, "publication": PUBLICATION}
    token = PostTracerTokenOperator(task_id="post_tracer_token", **common)
    log_reader = LogReaderAgentOperator(task_id="log_reader", conn_id=SPARK_CONN_ID, **common, **AGENT_TASK_ARGS)
    distribution = DistributionAgentOperator(task_id="distribution", conn_id=SPARK_CONN_ID, **common, **AGENT_TASK_ARGS)
    quiesced = TopologyQuiescedSensor(
        task_id="quiesced",
        topology=TOPOLOGY,
        publication=PUBLICATION,
        token_id=TOKEN,
        poke_interval=5,
        timeout=600,
    )
    change = SchemaChangeOperator(task_id="schema_change", sql="{{ params.sql }}", quiesced_token=TOKEN, **common)
    resume_log_reader = LogReaderAgentOperator(
        task_id="resume_log_reader", conn_id=SPARK_CONN_ID, **common, **AGENT_TASK_ARGS
    )
    resume_distribution = DistributionAgentOperator(
        task_id="resume_distribution", conn_id=SPARK_CONN_ID, **common, **AGENT_TASK_ARGS
    )
    regenerate = RegenerateProceduresOperator(task_id="regenerate_procedures", **common)
    token >> log_reader >> distribution >> quiesced >> change >> resume_log_reader >> resume_distribution >> regenerate
