"""The operators retry only what a retry can fix: they run the real agent application with
spark-submit (Spark local mode) and read its result file.  A non-retryable failure (here: a
subscription that was never initialized) is ``AirflowFailException``; a retryable one (an
unreachable server) is an ordinary ``AirflowException``.  The task log carries the agent's
one-line message, not a stack.

Airflow is imported inside the tests: Airflow reads its configuration at first import, and the
end-to-end tests configure it first (see test_airflow_e2e.py).
"""

from __future__ import annotations

import json

import pytest
import yaml

from airflow_repl import cli
from airflow_repl.engine.errors import ConnectionLost
from airflow_repl.engine.postgres.connections import to_uri
from airflow_repl.jobs import agent_job


@pytest.fixture
def spark_conn(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL", json.dumps({"conn_type": "spark", "host": "local[1]"}))
    return "spark_local"


def _task_output(capfd) -> str:
    """What the task printed, without the "--- Logging error ---" reports of Python's logging
    about handlers an earlier test left on closed streams (they are the test session's, not the
    task's)."""
    out, err = capfd.readouterr()
    kept = []
    for i, chunk in enumerate((out + err).split("--- Logging error ---")):
        if i and "\nArguments:" in chunk:
            chunk = chunk.split("\nArguments:", 1)[1].split("\n", 1)[-1]
        kept.append(chunk)
    return "".join(kept)


def _topology(env, tmp_path, **overrides) -> str:
    doc = {
        "publisher": to_uri(env.pub),
        "distributor": to_uri(env.dist),
        "subscribers": {"sub1": to_uri(env.sub)},
        "snapshot_folder": str(tmp_path / "snaps"),
        "publications": [{"name": "p", "articles": [{"table": "public.orders"}]}],
        "subscriptions": [{"publication": "p", "subscriber": "sub1"}],
        **overrides,
    }
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_not_initialized_fails_the_task_without_retry(env, tmp_path, spark_conn, capfd):
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_repl.operators.agents import DistributionAgentOperator

    env.run(env.pub, "CREATE TABLE orders (id int PRIMARY KEY, v text)")
    topo = _topology(env, tmp_path)
    assert cli.main(["apply", "-t", topo]) == 0
    op = DistributionAgentOperator(task_id="deliver", topology=topo, publication="p", conn_id=spark_conn)
    with pytest.raises(
        AirflowFailException, match=r"exit code 3.*subscriber 'sub1' has no snapshot of publication 'p'"
    ):
        op.execute({})
    output = _task_output(capfd)
    assert "Traceback" not in output
    assert "has no snapshot" not in output  # the reason is the task's error, once: not also in the job's output


def test_a_broken_subscriber_fails_the_task_once_and_the_others_are_delivered(env2, spark, tmp_path, spark_conn, capfd):
    """Two subscribers, each a Spark task of the job: sub2's table is gone.  sub1 is delivered;
    the task fails (not retried) with one line naming sub2, which appears once in the task's log
    and error together; no Python or Java stack."""
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_repl.operators.agents import DistributionAgentOperator

    env = env2
    env.run(env.pub, "CREATE TABLE orders (id int PRIMARY KEY, v text); INSERT INTO orders VALUES (1, 'a')")
    topo = _topology(
        env,
        tmp_path,
        subscribers={name: to_uri(ci) for name, ci in env.subs.items()},
        subscriptions=[{"publication": "p", "subscriber": name} for name in env.subs],
    )
    assert cli.main(["snapshot", "-t", topo]) == 0
    env.run(env.pub, "UPDATE orders SET v = 'b'")
    assert cli.main(["logreader", "-t", topo]) == 0
    env.run(env.subs["sub2"], "DROP TABLE orders")
    capfd.readouterr()
    op = DistributionAgentOperator(task_id="deliver", topology=topo, publication="p", conn_id=spark_conn)
    with pytest.raises(AirflowFailException) as info:
        op.execute({})
    message = str(info.value)
    assert message.startswith("distribution agent failed at 1 subscriber(s) (exit code 4):\n"), message
    line = message.splitlines()[1]
    assert line.startswith("subscriber 'sub2': cannot apply update") and 'relation "public.orders"' in line
    output = _task_output(capfd)
    for noise in ("Traceback", "at java.", "PythonException", "TaskSetManager"):
        assert noise not in output, output
    assert (output + message).count('relation "public.orders" does not exist') == 1, output
    assert env.rows(env.subs["sub1"], "SELECT v FROM orders") == [("b",)]


def test_an_unreachable_server_fails_the_task_for_a_retry(env, tmp_path, spark_conn, capfd):
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from airflow_repl.operators.agents import LogReaderAgentOperator

    topo = _topology(env, tmp_path, distributor="postgresql://postgres@127.0.0.1:1/nowhere")
    op = LogReaderAgentOperator(task_id="read", topology=topo, publication="p", conn_id=spark_conn)
    with pytest.raises(AirflowException) as info:
        op.execute({})
    assert not isinstance(info.value, AirflowFailException)
    assert "cannot connect to the distributor at postgres@127.0.0.1:1/nowhere" in str(info.value)
    assert "Traceback" not in _task_output(capfd)


def test_a_bad_topology_fails_before_spark_submit_without_retry(env, tmp_path, spark_conn):
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_repl.operators.agents import DistributionAgentOperator

    topo = _topology(env, tmp_path)
    op = DistributionAgentOperator(task_id="deliver", topology=topo, publication="nope", conn_id=spark_conn)
    with pytest.raises(AirflowFailException, match="unknown publication 'nope'"):
        op.execute({})


def test_result_file_outcomes(tmp_path):
    """Every outcome the job writes maps to the right Airflow exception (pure logic)."""
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from airflow_repl.operators.agents import read_outcome

    path = tmp_path / "result.json"
    agent_job.write_result(str(path), agent_job.failure(ConnectionLost("lost connection to the publisher")))
    with pytest.raises(AirflowException) as info:
        read_outcome(path, "logreader")
    assert not isinstance(info.value, AirflowFailException) and "[retryable]" in str(info.value)
    try:
        {}["x"]
    except KeyError as exc:
        agent_job.write_result(str(path), agent_job.failure(exc))
    with pytest.raises(AirflowFailException, match=r"internal error \(KeyError\)"):
        read_outcome(path, "logreader")
    agent_job.write_result(str(path), {"status": "succeeded", "transactions": 3})
    assert read_outcome(path, "logreader") == {"transactions": 3}
    with pytest.raises(AirflowException, match="did not report an outcome"):
        read_outcome(tmp_path / "missing.json", "logreader", RuntimeError("spark-submit failed"))


def test_cluster_deploy_mode_is_refused_before_anything_is_submitted(monkeypatch):
    from airflow_repl.operators.agents import SnapshotAgentOperator, UnsupportedDeployMode

    conn = {"conn_type": "spark", "host": "spark://127.0.0.1", "port": 7077, "extra": {"deploy-mode": "cluster"}}
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CLUSTER_MODE", json.dumps(conn))
    op = SnapshotAgentOperator(task_id="snap", topology="t.yaml", publication="p", conn_id="spark_cluster_mode")
    with pytest.raises(UnsupportedDeployMode, match=r"cluster deploy mode.*Use client deploy mode"):
        op.execute({})
    assert op._hook is None  # nothing was submitted
    op = SnapshotAgentOperator(
        task_id="snap", topology="t.yaml", publication="p", conn_id="spark_cluster_mode", deploy_mode="client"
    )
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CLUSTER_MODE", json.dumps({**conn, "extra": {}}))
    op._check_spark_connection()  # client mode passes
