"""End to end through Airflow: the example DAGs run with dag.test(), their operators
spark-submit the real agent application in Spark local mode."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pendulum
import pytest
from harness import AIRFLOW_HOME
from psycopg.conninfo import conninfo_to_dict

from airflow_repl import demo, demo_updatable, demo_workload
from airflow_repl.engine.subscriber import validation
from airflow_repl.hooks.connections import load_topology

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def airflow_env(sandbox, tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    conninfos = {
        "publisher": sandbox.create_database("publisher", "e2e_shop", recreate=True),
        "distributor": sandbox.create_database("publisher", "e2e_dist", recreate=True),
        "subscriber": sandbox.create_database("subscriber", "e2e_copy", recreate=True),
    }
    demo_workload.create(conninfos["publisher"], customers=2000, products=200, orders=3000)
    demo.prepare_environment(root, conninfos, airflow_home=AIRFLOW_HOME)
    demo.migrate_airflow_db()
    return conninfos


def _xcom(task_id: str, dag_id: str) -> dict:
    with sqlite3.connect(AIRFLOW_HOME / "airflow.db") as db:
        rows = db.execute(
            "SELECT value FROM xcom WHERE dag_id = ? AND task_id = ? AND key = 'return_value' ORDER BY timestamp DESC",
            (dag_id, task_id),
        ).fetchall()
    assert rows, f"no XCom return value for {dag_id}.{task_id}"
    value = rows[0][0]
    if isinstance(value, (str, bytes)):  # a JSON document (a number comes back as one)
        value = json.loads(value if isinstance(value, str) else value.decode())
    return json.loads(value) if isinstance(value, str) else value


def _why_not_success(dr, capfd, dist_conninfo: str) -> str:
    """What to print when a DagRun did not succeed: task states, the agents' own history and
    the error lines of the captured output (the Spark INFO chatter is left out)."""
    import psycopg

    lines = [f"DagRun {dr.dag_id} ended {getattr(dr.state, 'value', dr.state)}"]
    try:
        lines += [f"  task {ti.task_id}: {getattr(ti.state, 'value', ti.state)}" for ti in dr.get_task_instances()]
        with psycopg.connect(dist_conninfo) as conn:
            if conn.execute("SELECT to_regclass('airflow_repl.agent_history')").fetchone()[0]:
                lines += [
                    f"  agent run {r}"
                    for r in conn.execute(
                        "SELECT agent, status, message FROM airflow_repl.agent_history ORDER BY run_id"
                    )
                ]
    except Exception as exc:  # the explanation must never hide the failure it explains
        lines.append(f"  (could not read the task states or agent history: {exc!r})")
    out, err = capfd.readouterr()
    sys.stdout.write(out)
    sys.stderr.write(err)
    keep = [
        ln
        for ln in (out + err).splitlines()
        if any(w in ln for w in ("Error", "ERROR", "Traceback", "Exception", "error:", "FAILED", "failed"))
        and " INFO " not in ln
    ]
    return "\n".join(lines + keep[-40:])


def _succeeded(dr) -> bool:
    return str(getattr(dr.state, "value", dr.state)) == "success"


def test_every_example_dag_imports_without_errors(airflow_env):
    from airflow.models.dagbag import DagBag

    bag = DagBag(dag_folder=str(demo.DAGS))
    assert bag.import_errors == {}
    assert {"airflow_repl_initial_sync", "airflow_repl_scheduled", "airflow_repl_schema_change"} <= set(bag.dag_ids)


def test_example_dags_replicate_through_spark_submit(airflow_env, capfd):
    initial = demo.load_dag("repl_initial_sync.py")
    scheduled = demo.load_dag("repl_scheduled.py")
    dr = initial.test()
    assert _succeeded(dr), _why_not_success(dr, capfd, airflow_env["distributor"])
    snap = _xcom("snapshot", "airflow_repl_initial_sync")
    assert snap["initialized"] == ["reporting"] and snap["rows"] > 10000
    assert snap["spark_application_id"].startswith("local-")
    workload = demo_workload.Workload(airflow_env["publisher"], pause=0)
    committed = workload.run(transactions=400)
    assert committed == 400 and not workload.errors, (committed, workload.errors[:5])
    interval_start = demo.current_interval_start(datetime.now(timezone.utc)) + timedelta(minutes=10)
    dr = scheduled.test(logical_date=pendulum.instance(interval_start))
    assert _succeeded(dr), _why_not_success(dr, capfd, airflow_env["distributor"])
    delivered = _xcom("distribution", "airflow_repl_scheduled")
    read = _xcom("log_reader", "airflow_repl_scheduled")
    # (some workload transactions change no row, e.g. an update of a deleted order)
    assert 0 < read["transactions"] <= committed, (read, committed)
    assert delivered["transactions"] == read["transactions"], (delivered, read, dr.data_interval_end)
    topo = load_topology(demo.DAGS / "demo_topology.yaml")
    report = validation.compare(topo, "shop", "reporting")
    assert all(r["match"] for r in report), validation.format_report(report)
    # the password reached the jobs, but never a command line or a log line
    password = conninfo_to_dict(topo.publisher.conninfo)["password"]
    assert len(password) > 10
    out, err = capfd.readouterr()
    assert "Spark-Submit cmd: spark-submit" in out + err and "--conf spark.log.level=WARN" in out + err
    assert " INFO DAGScheduler" not in out + err  # the driver ran at WARN: no scheduler chatter
    assert password not in out + err


def test_schema_change_dag_with_the_workload_writing_before_and_after(airflow_env, capfd):
    """The example schema-change DAG (tracer token -> agents -> quiesce sensor -> schema change ->
    agents -> regenerate procedures) while the workload writes, then a scheduled cycle: the
    subscriber has the new column, with the rows written before and after it."""
    import psycopg

    dag = demo.load_dag("repl_schema_change.py")
    scheduled = demo.load_dag("repl_scheduled.py")
    workload = demo_workload.Workload(airflow_env["publisher"], pause=0.01).start()
    try:
        dr = dag.test(run_conf={"sql": "ALTER TABLE public.orders ADD COLUMN channel text NOT NULL DEFAULT 'web'"})
    finally:
        committed = workload.stop()
    assert _succeeded(dr), _why_not_success(dr, capfd, airflow_env["distributor"])
    assert committed > 0 and not workload.errors, workload.errors[:3]
    change = _xcom("schema_change", "airflow_repl_schema_change")
    assert change["kind"] == "add_column" and change["articles"] == ["shop.orders"]
    assert _xcom("resume_distribution", "airflow_repl_schema_change")["subscriptions"][0]["schema_changes"] == 1
    assert _xcom("regenerate_procedures", "airflow_repl_schema_change")["subscribers"]["reporting"]
    with psycopg.connect(airflow_env["publisher"], autocommit=True) as conn:  # rows using the new column
        conn.execute("UPDATE orders SET channel = 'app' WHERE id % 7 = 0")
        conn.execute(
            "INSERT INTO orders (id, customer_id, status, ordered_at, channel) VALUES (9000001, 1, 'new', now(), 'shop')"
        )
    interval_start = demo.current_interval_start(datetime.now(timezone.utc)) + timedelta(minutes=20)
    dr = scheduled.test(logical_date=pendulum.instance(interval_start))
    assert _succeeded(dr), _why_not_success(dr, capfd, airflow_env["distributor"])
    topo = load_topology(demo.DAGS / "demo_topology.yaml")
    report = validation.compare(topo, "shop", "reporting")
    assert all(r["match"] for r in report), validation.format_report(report)
    with psycopg.connect(airflow_env["subscriber"]) as conn:
        counts = dict(conn.execute("SELECT channel, count(*) FROM orders GROUP BY channel").fetchall())
    assert counts.get("shop") == 1 and counts.get("app", 0) > 0 and counts.get("web", 0) > 0


class _Cycles:
    """Runs the Log Reader and the Distribution Agent again and again in a thread, as a scheduled
    or continuous replication DAG would beside the maintenance DAG, until stopped."""

    def __init__(self, topo) -> None:
        import threading

        self.topo, self.stop, self.errors = topo, threading.Event(), []
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        from airflow_repl.engine.agents import distribution_agent, log_reader_agent

        while not self.stop.wait(0.3):
            try:
                log_reader_agent.run_log_reader(self.topo, "shop")
                distribution_agent.run_distribution(self.topo, "shop", "reporting")
            except Exception as exc:  # reported by the test
                self.errors.append(exc)
                return

    def __enter__(self) -> _Cycles:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)


def test_maintenance_dag_guards_wal_cleans_up_and_measures_a_tracer_token(airflow_env, capfd, monkeypatch):
    """The example DAG ``airflow_repl_maintenance``: the WAL guard passes under its limit, the
    cleanup deletes only what every subscription has, and the tracer-token sensor (rescheduled
    between pokes) succeeds once the agents, running beside it, delivered the token."""
    from airflow_repl.engine.agents import tracer

    monkeypatch.setenv("AIRFLOW_REPL_TRACER_POKE_SECONDS", "1")
    dag = demo.load_dag("repl_maintenance.py")
    topo = load_topology(demo.DAGS / "demo_topology.yaml")
    with _Cycles(topo) as cycles:
        dr = dag.test()
    assert not cycles.errors, cycles.errors
    assert _succeeded(dr), _why_not_success(dr, capfd, airflow_env["distributor"])
    wal = _xcom("wal_retention", "airflow_repl_maintenance")
    assert wal["exceeded"] is False and wal["limit_mb"] == 1024, wal
    assert {"transactions_deleted", "commands_deleted"} <= set(_xcom("cleanup", "airflow_repl_maintenance"))
    token = _xcom("post_tracer_token", "airflow_repl_maintenance")
    rows = [r for r in tracer.tracer_history(topo, "shop", token) if r.subscriber == "reporting"]
    assert rows and rows[0].subscriber_at is not None and rows[0].total is not None, rows


def test_missing_spark_connection_fails_clearly_instead_of_yarn(airflow_env):
    from airflow_repl.operators.agents import LogReaderAgentOperator, MissingSparkConnection

    op = LogReaderAgentOperator(
        task_id="log_reader",
        topology=str(demo.DAGS / "demo_topology.yaml"),
        publication="shop",
        conn_id="no_such_spark",
    )
    with pytest.raises(MissingSparkConnection, match=r"Spark connection 'no_such_spark' is not defined.*YARN"):
        op.execute({})
    assert op._hook is None  # nothing was submitted


def test_unknown_topology_connection_names_the_connection(airflow_env, tmp_path):
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_repl.operators.agents import LogReaderAgentOperator

    bad = tmp_path / "t.yaml"
    bad.write_text((demo.DAGS / "demo_topology.yaml").read_text().replace("repl_publisher", "no_such_pg"))
    op = LogReaderAgentOperator(task_id="log_reader", topology=str(bad), publication="shop")
    # a bad topology fails the task without retries, with the one-line message
    with pytest.raises(
        AirflowFailException, match="connection id 'no_such_pg' is not defined: set the environment variable"
    ):
        op.execute({})


def test_provider_is_registered_with_airflow(airflow_env):
    out = subprocess.run(
        [sys.executable, "-m", "airflow", "providers", "list", "-o", "json"], capture_output=True, text=True, check=True
    ).stdout
    packages = {p["package_name"] for p in json.loads(out[out.index("[") :])}
    assert "airflow-repl" in packages


def test_spark_log_level_defaults_to_warn_and_user_conf_wins():
    from airflow_repl.operators.agents import DistributionAgentOperator

    quiet = DistributionAgentOperator(task_id="d1", topology="t.yaml", publication="p")
    assert quiet._spark_conf()["spark.log.level"] == "WARN"
    chatty = DistributionAgentOperator(task_id="d2", topology="t.yaml", publication="p", spark_log_level="INFO")
    assert chatty._spark_conf()["spark.log.level"] == "INFO"
    mine = DistributionAgentOperator(
        task_id="d3",
        topology="t.yaml",
        publication="p",
        conf={"spark.log.level": "ERROR", "spark.sql.shuffle.partitions": "4"},
    )
    conf = mine._spark_conf()
    assert conf["spark.log.level"] == "ERROR" and conf["spark.sql.shuffle.partitions"] == "4"
    assert conf["spark.pyspark.python"] == sys.executable
    with pytest.raises(ValueError, match="spark_log_level 'LOUD' of task 'd4' is not a Spark log level: use one of"):
        DistributionAgentOperator(task_id="d4", topology="t.yaml", publication="p", spark_log_level="LOUD")


def test_updatable_dag_runs_the_queue_reader_through_spark_submit(airflow_env, sandbox, monkeypatch, capfd):
    """The example DAG ``airflow_repl_updatable`` (queue reader -> log reader -> distribution),
    run by Airflow through spark-submit (the demo's last part): a queued subscriber's change
    reaches the publisher and the other queued subscriber, and a conflict at the other one is
    resolved by its policy (publisher wins); all three end equal."""
    conninfos = dict(airflow_env)
    for branch in demo_updatable.BRANCHES:
        conninfos[branch] = sandbox.create_database("subscriber", f"e2e_{branch}", recreate=True)
    for var, uri in demo_updatable.connection_ids(conninfos).items():
        monkeypatch.setenv(var, uri)
    assert demo_updatable.run(demo, conninfos)
    summary = _xcom("queue_reader", "airflow_repl_updatable")
    assert {s["subscriber"] for s in summary["subscriptions"]} == set(demo_updatable.BRANCHES), summary
    assert summary["conflicts"] == 1, summary
    out, err = capfd.readouterr()
    assert "Spark-Submit cmd: spark-submit" in out + err
