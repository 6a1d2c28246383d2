"""Routine upkeep of a topology, hourly (docs/operators.md, docs/retention.md, docs/tracer-tokens.md):

* ``wal_retention`` (:class:`~airflow_repl.sensors.wal_retention.WalRetentionSensor`, as a guard):
  fails at once, naming the size and what to do, when the publication's slot retains more WAL at
  the publisher than the limit (a Log Reader that stopped running fills the publisher's disk);
* ``cleanup`` (:class:`~airflow_repl.operators.retention.CleanupOperator`): deletes the commands
  every subscription has received and expires subscriptions idle past the maximum retention;
* ``post_tracer_token`` then ``tracer_delivered``
  (:class:`~airflow_repl.operators.tracer.PostTracerTokenOperator`,
  :class:`~airflow_repl.sensors.quiescing.TracerTokenSensor`): a token travels behind everything
  committed before it, carried by the agents of the replication DAG (``airflow_repl_scheduled``
  or ``airflow_repl_continuous``); the sensor waits (rescheduled, or deferred with
  ``deferrable``) until every subscriber has it, and its latency per hop is then in
  ``airflow-repl tracer history``.  A sensor that times out says which subscription is behind.

Settings: ``AIRFLOW_REPL_MAX_WAL_MB`` (the guard's limit, default 1024) and
``AIRFLOW_REPL_TRACER_POKE_SECONDS`` (how often the sensor checks, default 60).
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG
from repl_common import PUBLICATION, TOPOLOGY

from airflow_repl.operators.retention import CleanupOperator
from airflow_repl.operators.tracer import PostTracerTokenOperator
from airflow_repl.sensors.quiescing import TracerTokenSensor
from airflow_repl.sensors.wal_retention import WalRetentionSensor

MAX_WAL_MB = int(os.environ.get("AIRFLOW_REPL_MAX_WAL_MB", "1024"))
POKE_SECONDS = float(os.environ.get("AIRFLOW_REPL_TRACER_POKE_SECONDS", "60"))

with DAG(
    dag_id="airflow_repl_maintenance",
    description="WAL retention guard, cleanup of delivered commands, tracer-token latency",
    schedule="@hourly",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["airflow-repl", "example"],
) as dag:
    common = {"topology": TOPOLOGY, "publication": PUBLICATION}
    wal_retention = WalRetentionSensor(
        task_id="wal_retention", max_wal_mb=MAX_WAL_MB, fail_when_exceeded=True, **common
    )
    cleanup = CleanupOperator(task_id="cleanup", **common)
    token = PostTracerTokenOperator(task_id="post_tracer_token", **common)
    delivered = TracerTokenSensor(
        task_id="tracer_delivered",
        token_id="{{ ti.xcom_pull(task_ids='post_tracer_token') }}",
        poke_interval=POKE_SECONDS,
        timeout=3600,
        mode="reschedule",
        **common,
    )
    wal_retention >> cleanup
    token >> delivered
