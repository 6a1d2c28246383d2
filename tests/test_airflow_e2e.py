"""End to end through Airflow: the example DAGs run with dag.test(), their operators
spark-submit the real agent application in Spark local mode."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import pendulum
import pytest
from psycopg.conninfo import conninfo_to_dict

from airflow_repl import demo, demo_workload
from airflow_repl.engine import topology, validation

from conftest import AIRFLOW_HOME

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def airflow_env(sandbox, tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    conninfos = {"publisher": sandbox.create_database("publisher", "e2e_shop", recreate=True),
                 "distributor": sandbox.create_database("publisher", "e2e_dist", recreate=True),
                 "subscriber": sandbox.create_database("subscriber", "e2e_copy", recreate=True)}
    demo_workload.create(conninfos["publisher"], customers=2000, products=200, orders=3000)
    demo.prepare_environment(root, conninfos, airflow_home=AIRFLOW_HOME)
    demo.migrate_airflow_db()
    return conninfos


def _xcom(task_id: str, dag_id: str) -> dict:
    with sqlite3.connect(AIRFLOW_HOME / "airflow.db") as db:
        rows = db.execute("SELECT value FROM xcom WHERE dag_id = ? AND task_id = ? AND key = 'return_value' "
                          "ORDER BY timestamp DESC", (dag_id, task_id)).fetchall()
    assert rows, f"no XCom return value for {dag_id}.{task_id}"
    value = rows[0][0]
    value = json.loads(value if isinstance(value, str) else value.decode())
    return json.loads(value) if isinstance(value, str) else value


def test_example_dags_replicate_through_spark_submit(airflow_env, capfd):
    initial = demo.load_dag("repl_initial_sync.py")
    scheduled = demo.load_dag("repl_scheduled.py")
    dr = initial.test()
    assert str(getattr(dr.state, "value", dr.state)) == "success"
    snap = _xcom("snapshot", "airflow_repl_initial_sync")
    assert snap["initialized"] == ["reporting"] and snap["rows"] > 10000
    assert snap["spark_application_id"].startswith("local-")
    workload = demo_workload.Workload(airflow_env["publisher"], pause=0).start()
    time.sleep(3)
    committed = workload.stop()
    assert committed > 20 and not workload.errors
    interval_start = demo.current_interval_start(datetime.now(timezone.utc)) + timedelta(minutes=10)
    dr = scheduled.test(logical_date=pendulum.instance(interval_start))
    assert str(getattr(dr.state, "value", dr.state)) == "success"
    delivered = _xcom("distribution", "airflow_repl_scheduled")
    read = _xcom("log_reader", "airflow_repl_scheduled")
    # (some workload transactions change no row, e.g. an update of a deleted order)
    assert 0 < read["transactions"] <= committed and delivered["transactions"] == read["transactions"]
    topo = topology.load(demo.DAGS / "demo_topology.yaml").resolve()
    report = validation.compare(topo, "shop", "reporting")
    assert all(r["match"] for r in report), validation.format_report(report)
    # the password reached the jobs, but never a command line or a log line
    password = conninfo_to_dict(topo.publisher.conninfo)["password"]
    assert len(password) > 10
    out, err = capfd.readouterr()
    assert "Spark-Submit cmd: spark-submit" in out + err
    assert password not in out + err


def test_missing_spark_connection_fails_clearly_instead_of_yarn(airflow_env):
    from airflow_repl.operators.agents import LogReaderAgentOperator, MissingSparkConnection

    op = LogReaderAgentOperator(task_id="log_reader", topology=str(demo.DAGS / "demo_topology.yaml"),
                                publication="shop", conn_id="no_such_spark")
    with pytest.raises(MissingSparkConnection, match="Spark connection 'no_such_spark' is not defined.*YARN"):
        op.execute({})
    assert op._hook is None  # nothing was submitted


def test_unknown_topology_connection_names_the_connection(airflow_env, tmp_path):
    from airflow_repl.engine.errors import TopologyError
    from airflow_repl.operators.agents import LogReaderAgentOperator

    bad = tmp_path / "t.yaml"
    bad.write_text((demo.DAGS / "demo_topology.yaml").read_text().replace("repl_publisher", "no_such_pg"))
    op = LogReaderAgentOperator(task_id="log_reader", topology=str(bad), publication="shop")
    with pytest.raises(TopologyError, match="Airflow connection 'no_such_pg' named in the topology is not defined"):
        op.execute({})


def test_provider_is_registered_with_airflow(airflow_env):
    out = subprocess.run([sys.executable, "-m", "airflow", "providers", "list", "-o", "json"],
                         capture_output=True, text=True, check=True).stdout
    packages = {p["package_name"] for p in json.loads(out[out.index("["):])}
    assert "airflow-repl" in packages
