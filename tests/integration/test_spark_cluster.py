"""The agents, unchanged, on a real Spark standalone cluster (a master and two workers of one
core each, from the installed PySpark): the operators spark-submit them through a ``spark://``
Airflow connection, in client deploy mode.  The snapshot's partitions are read on both workers,
then one distribution delivers to three subscribers in parallel; every subscriber matches.

Two spark-submit runs only (each starts a driver and two executors); the Log Reader needs no
Spark and runs in the test process.  Airflow is imported inside the test (see
test_operator_failures.py).
"""

from __future__ import annotations

import json

import pytest
import yaml
from harness import Env

from airflow_repl.engine.agents import log_reader_agent
from airflow_repl.engine.subscriber import validation
from airflow_repl.hooks.connections import load_topology

pytestmark = pytest.mark.e2e

ROWS = 110_000  # over 2 x ROWS_PER_PARTITION: 3 key ranges, read by 2 one-core executors

#: What a cluster of 2 one-core workers needs to spread the first tasks: the driver waits (up
#: to 2 min) until both executors registered, so no partition runs before the second one is up.
CLUSTER_CONF = {
    "spark.cores.max": "2",
    "spark.scheduler.minRegisteredResourcesRatio": "1.0",
    "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
    "spark.executor.memory": "512m",
    "spark.driver.host": "127.0.0.1",
    "spark.ui.enabled": "false",
    # JVMs that start fast on a small, busy machine: no optimizing JIT, one GC thread
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
}


def _topology_file(env: Env) -> str:
    doc = {
        **env.servers(),
        "publications": [{"name": "p", "articles": [{"table": "public.items"}]}],
        "subscriptions": [{"publication": "p", "subscriber": name} for name in env.subs],
    }
    path = env.tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def _executor_ids(names: list[str]) -> set[str]:
    """The executor ids of ``host/id`` names."""
    return {name.rsplit("/", 1)[1] for name in names}


def test_snapshot_and_parallel_distribution_on_a_standalone_cluster(env3, spark_cluster, monkeypatch):
    from airflow_repl.operators.agents import DistributionAgentOperator, SnapshotAgentOperator

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CLUSTER", spark_cluster.master_url)
    env3.run(env3.pub, "CREATE TABLE items (id bigint PRIMARY KEY, n int NOT NULL, t text)")
    env3.run(env3.pub, "INSERT INTO items SELECT g, g %% 97, md5(g::text) FROM generate_series(1, %s) g", (ROWS,))
    topo_path = _topology_file(env3)
    options = {"topology": topo_path, "publication": "p", "conn_id": "spark_cluster", "conf": CLUSTER_CONF}

    snap = SnapshotAgentOperator(task_id="snapshot", **options).execute({})
    app_id = snap["spark_application_id"]
    assert app_id.startswith("app-"), snap  # a standalone application, not local mode
    assert snap["rows"] == ROWS and snap["partitions"] == 3 and sorted(snap["initialized"]) == ["sub1", "sub2", "sub3"]
    on_workers = spark_cluster.executor_workers(app_id)
    read_by = {on_workers[e] for e in _executor_ids(snap["read_executors"])}
    assert len(read_by) == 2, (snap, on_workers)  # the partitions were read on both workers
    assert len({on_workers[e] for e in _executor_ids(snap["load_executors"])}) == 2, (snap, on_workers)

    env3.run(env3.pub, "UPDATE items SET n = n + 1, t = 'changed' WHERE id % 50 = 0")
    env3.run(env3.pub, "DELETE FROM items WHERE id % 333 = 0")
    env3.run(env3.pub, "INSERT INTO items SELECT g, 0, NULL FROM generate_series(%s, %s) g", (ROWS + 1, ROWS + 500))
    topo = load_topology(topo_path)
    read = log_reader_agent.run_log_reader(topo, "p")
    assert read["transactions"] == 3, read

    delivered = DistributionAgentOperator(task_id="distribution", **options).execute({})
    assert delivered["spark_application_id"].startswith("app-"), delivered
    by_subscriber = {s["subscriber"]: s for s in delivered["subscriptions"]}
    assert sorted(by_subscriber) == ["sub1", "sub2", "sub3"], delivered
    assert all(s["transactions"] == 3 for s in by_subscriber.values()), json.dumps(delivered)
    on_workers = spark_cluster.executor_workers(delivered["spark_application_id"])
    assert all(e in on_workers for e in _executor_ids([s["executor"] for s in by_subscriber.values()])), (
        delivered,
        on_workers,
    )  # each subscription was delivered by an executor of the cluster, not the driver
    for name in env3.subs:
        report = validation.compare(topo, "p", name)
        assert all(r["match"] for r in report), validation.format_report(report)
