"""End to end through Airflow: the example DAGs run with dag.test(), their operators
spark-submit the real agent application in Spark local mode."""

from __future__ import annotations

import json
import os
import re
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


DOWNSTREAM = "airflow_repl_on_replicated_orders"  # dags/repl_on_replicated_table.py
TABLES = ("public.customers", "public.order_lines", "public.orders", "public.products")


def _set_paused(dag_id: str, paused: bool) -> None:
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import update

    with create_session() as session:
        assert session.execute(update(DagModel).where(DagModel.dag_id == dag_id).values(is_paused=paused)).rowcount == 1


def _asset_events(dag_id: str, task_id: str) -> dict[str, dict]:
    """The latest run's asset events of a task: asset URI -> extra."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        run_id = session.scalar(
            select(AssetEvent.source_run_id)
            .where(AssetEvent.source_dag_id == dag_id, AssetEvent.source_task_id == task_id)
            .order_by(AssetEvent.id.desc())
            .limit(1)
        )
        rows = session.execute(
            select(AssetModel.uri, AssetEvent.extra)
            .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
            .where(AssetEvent.source_dag_id == dag_id, AssetEvent.source_task_id == task_id)
            .where(AssetEvent.source_run_id == run_id)
        ).all()
    events = {uri: extra for uri, extra in rows}  # noqa: C416 (Row objects, not pairs, to a type checker)
    assert len(events) == len(rows), rows  # one event per table
    return events


def _subscriber_uri(env: dict, table: str) -> str:
    from airflow_repl.engine.postgres.addresses import table_address

    return table_address(env["subscriber"], table).uri


def _check_snapshot_events(env: dict, snap: dict) -> None:
    """One asset event per table the snapshot initialized, with its rows and position."""
    events = _asset_events("airflow_repl_initial_sync", "snapshot")
    assert set(events) == {_subscriber_uri(env, t) for t in TABLES}, events
    assert sum(e["rows"] for e in events.values()) == snap["rows"]
    assert {(e["subscriber"], e["watermark"], e["snapshot_id"]) for e in events.values()} == {
        ("reporting", snap["consistent_lsn"], snap["snapshot_id"])
    }


def _check_distribution_events(env: dict, delivered: dict) -> None:
    """One asset event per table that received transactions, with the counts the run reports,
    no password anywhere, and the downstream DAG scheduled on public.orders queued and due."""
    from airflow.models.asset import AssetDagRunQueue, AssetModel
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    (sub,) = delivered["subscriptions"]
    expected = {_subscriber_uri(env, t): c for t, c in sub["tables"].items() if c["transactions"]}
    events = _asset_events("airflow_repl_scheduled", "distribution")
    assert set(events) == set(expected) and _subscriber_uri(env, "public.orders") in events, (events, sub)
    for uri, extra in events.items():
        assert extra == {
            "agent": "distribution",
            "publication": "shop",
            "subscriber": "reporting",
            "transactions": expected[uri]["transactions"],
            "commands": expected[uri]["commands"],
            "watermark": sub["last_xact_seqno"],
        }
    assert max(e["transactions"] for e in events.values()) <= delivered["transactions"]
    assert sum(e["transactions"] for e in events.values()) >= delivered["transactions"]
    password = conninfo_to_dict(env["subscriber"])["password"]
    assert password not in json.dumps(events) + json.dumps(list(events))
    with create_session() as session:
        queued = session.scalars(
            select(AssetModel.uri)
            .join(AssetDagRunQueue, AssetDagRunQueue.asset_id == AssetModel.id)
            .where(AssetDagRunQueue.target_dag_id == DOWNSTREAM)
        ).all()
        assert queued == [_subscriber_uri(env, "public.orders")]
        _, triggered = DagModel.dags_needing_dagruns(session)  # the scheduler's own test for asset-triggered runs
        assert DOWNSTREAM in triggered


def _check_openlineage_events(env: dict, output: str) -> None:
    """The console transport's events of the Distribution Agent's task: START and COMPLETE, the
    publisher's tables in, the subscriber's tables out (OpenLineage's Postgres naming)."""
    from airflow_repl.engine.postgres.addresses import table_address

    events = []
    for line in output.splitlines():
        start = line.find('{"eventTime"')
        if start >= 0 and "airflow_repl_scheduled.distribution" in line:
            events.append(json.loads(line[start : line.rindex("}") + 1]))
    assert {e["eventType"] for e in events} >= {"START", "COMPLETE"}, output[-5000:]
    expected_in = {
        (table_address(env["publisher"], t).namespace, table_address(env["publisher"], t).name) for t in TABLES
    }
    expected_out = {
        (table_address(env["subscriber"], t).namespace, table_address(env["subscriber"], t).name) for t in TABLES
    }
    for event in events:
        assert {(d["namespace"], d["name"]) for d in event["inputs"]} == expected_in, event
        assert {(d["namespace"], d["name"]) for d in event["outputs"]} == expected_out, event
    password = conninfo_to_dict(env["publisher"])["password"]
    assert password not in json.dumps(events)


def _succeeded(dr) -> bool:
    return str(getattr(dr.state, "value", dr.state)) == "success"


def test_every_example_dag_imports_without_errors(airflow_env):
    from airflow.models.dagbag import DagBag

    bag = DagBag(dag_folder=str(demo.DAGS))
    assert bag.import_errors == {}
    assert {"airflow_repl_initial_sync", "airflow_repl_scheduled", "airflow_repl_schema_change", DOWNSTREAM} <= set(
        bag.dag_ids
    )


def test_example_dags_replicate_through_spark_submit(airflow_env, capfd, monkeypatch):
    initial = demo.load_dag("repl_initial_sync.py")
    scheduled = demo.load_dag("repl_scheduled.py")
    dr = initial.test()
    assert _succeeded(dr), _why_not_success(dr, capfd, airflow_env["distributor"])
    snap = _xcom("snapshot", "airflow_repl_initial_sync")
    assert snap["initialized"] == ["reporting"] and snap["rows"] > 10000
    assert snap["spark_application_id"].startswith("local-")
    _check_snapshot_events(airflow_env, snap)
    _set_paused(DOWNSTREAM, False)  # asset-triggered runs are queued only for unpaused DAGs, as in production
    workload = demo_workload.Workload(airflow_env["publisher"], pause=0)
    committed = workload.run(transactions=400)
    assert committed == 400 and not workload.errors, (committed, workload.errors[:5])
    interval_start = demo.current_interval_start(datetime.now(timezone.utc)) + timedelta(minutes=10)
    monkeypatch.setenv("AIRFLOW_REPL_PROGRESS_INTERVAL", "0")  # a progress line after every batch
    dr = scheduled.test(logical_date=pendulum.instance(interval_start), run_conf={"validate_every": 1})
    assert _succeeded(dr), _why_not_success(dr, capfd, airflow_env["distributor"])
    assert _xcom("validate", "airflow_repl_scheduled")["match"] is True  # validate_every 1: every run validates
    delivered = _xcom("distribution", "airflow_repl_scheduled")
    read = _xcom("log_reader", "airflow_repl_scheduled")
    # (some workload transactions change no row, e.g. an update of a deleted order)
    assert 0 < read["transactions"] <= committed, (read, committed)
    assert delivered["transactions"] == read["transactions"], (delivered, read, dr.data_interval_end)
    _check_distribution_events(airflow_env, delivered)
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
    # the agents' progress lines reach the task log through spark-submit
    assert re.search(r"read \d+ transactions, \d+ commands in \d+ batches; LSN", out + err), out[-3000:]
    assert re.search(r"delivered \d+ of \d+ transactions \(", out + err), out[-3000:]


def test_an_empty_cycle_emits_no_asset_event_and_reports_openlineage(airflow_env, tmp_path):
    """After the cycle above (which queued the downstream DAG), the scheduler creates that run
    and clears its queue; a scheduled cycle with nothing to deliver then emits no asset event,
    so nothing queues the downstream DAG again.  That cycle runs in ``airflow dags test`` with
    the OpenLineage console transport: the Distribution Agent's events name the publisher's
    tables as inputs and the subscriber's as outputs."""
    from airflow.models.asset import AssetDagRunQueue, AssetEvent
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import delete, func, select

    with create_session() as session:
        assert session.scalar(select(func.count()).select_from(AssetDagRunQueue)), "the cycle above queued nothing"
        session.execute(delete(AssetDagRunQueue))  # what the scheduler does when it creates the queued runs
        before = session.scalar(select(func.max(AssetEvent.id)))
    logical = demo.current_interval_start(datetime.now(timezone.utc)) + timedelta(minutes=30)
    run_env = {
        **os.environ,
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "console"}),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "airflow-repl-tests",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
    }
    argv = [sys.executable, "-m", "airflow", "dags", "test", "airflow_repl_scheduled", logical.isoformat()]
    argv += ["--conf", json.dumps({"validate_every": 0})]  # a cycle of the agents only (no validation task)
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        env=run_env,
        timeout=600,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    assert _xcom("distribution", "airflow_repl_scheduled")["transactions"] == 0, output[-3000:]
    with create_session() as session:
        new_events = session.scalars(select(AssetEvent).where(AssetEvent.id > before)).all()
        assert new_events == [], [(e.source_task_id, e.extra) for e in new_events]
        assert session.scalar(select(func.count()).select_from(AssetDagRunQueue)) == 0
        _, triggered = DagModel.dags_needing_dagruns(session)
        assert DOWNSTREAM not in triggered
    _check_openlineage_events(airflow_env, output)


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
    dr = scheduled.test(logical_date=pendulum.instance(interval_start), run_conf={"validate_every": 0})
    assert _succeeded(dr), _why_not_success(dr, capfd, airflow_env["distributor"])
    assert _task_states(dr)["validate"] == "skipped"  # validate_every 0: never
    topo = load_topology(demo.DAGS / "demo_topology.yaml")
    report = validation.compare(topo, "shop", "reporting")
    assert all(r["match"] for r in report), validation.format_report(report)
    with psycopg.connect(airflow_env["subscriber"]) as conn:
        counts = dict(conn.execute("SELECT channel, count(*) FROM orders GROUP BY channel").fetchall())
    assert counts.get("shop") == 1 and counts.get("app", 0) > 0 and counts.get("web", 0) > 0


def _task_states(dr) -> dict[str, str]:
    return {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in dr.get_task_instances()}


def test_validation_task_fails_with_the_differing_keys_in_xcom(airflow_env, capfd):
    """The scheduled DAG's validation (validate_every 1; the agents' tasks marked successful):
    a subscriber that differs fails the task, whose XCom holds the report, without a password."""
    import psycopg

    scheduled = demo.load_dag("repl_scheduled.py")
    sub = airflow_env["subscriber"]
    with psycopg.connect(sub, autocommit=True) as conn:
        saved, city3 = conn.execute(
            "SELECT (SELECT row_to_json(c) FROM customers c WHERE id = 2), (SELECT row_to_json(c) FROM customers c WHERE id = 3)"
        ).fetchone()
        conn.execute("DELETE FROM customers WHERE id = 2; UPDATE customers SET city = NULL WHERE id = 3")
    try:
        interval_start = demo.current_interval_start(datetime.now(timezone.utc)) + timedelta(minutes=90)
        dr = scheduled.test(
            logical_date=pendulum.instance(interval_start),
            run_conf={"validate_every": 1},
            mark_success_pattern="^(log_reader|distribution)$",
        )
    finally:
        with psycopg.connect(sub, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO customers SELECT * FROM json_populate_record(NULL::customers, %s::json)",
                (json.dumps(saved),),
            )
            conn.execute(
                "UPDATE customers c SET city = p.city FROM json_populate_record(NULL::customers, %s::json) p "
                "WHERE c.id = 3",
                (json.dumps(city3),),
            )
    assert _task_states(dr)["validate"] == "failed", _why_not_success(dr, capfd, airflow_env["distributor"])
    report = _xcom("validate", "airflow_repl_scheduled")
    assert report["match"] is False and report["publication"] == "shop"
    rows = {r["article"]: r for r in report["subscribers"]["reporting"]}
    assert rows["customers"]["differences"] == [
        {"key": "(2)", "difference": "missing at the subscriber"},
        {"key": "(3)", "difference": "values differ"},
    ]
    assert rows["orders"]["match"] is True and rows["products"]["match"] is True
    password = conninfo_to_dict(load_topology(demo.DAGS / "demo_topology.yaml").publisher.conninfo)["password"]
    assert password not in json.dumps(report)
    out, err = capfd.readouterr()
    assert "found differences at reporting/customers (1 missing, 0 extra, 1 different)" in out + err


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
    from airflow_repl.engine.monitoring import tracer

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
        AirflowFailException,
        match=r"connection id 'no_such_pg' is not defined \(looked up in the metadata database of AIRFLOW_HOME=.*\): set the",
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


TEMPLATED_ALIAS_DAG = """
import pendulum
from airflow.sdk import DAG
from repl_common import SPARK_CONN_ID, TOPOLOGY

from airflow_repl.operators.agents import SnapshotAgentOperator

with DAG(
    dag_id="airflow_repl_templated_alias",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    params={"pub": "not-this-one"},
) as dag:
    SnapshotAgentOperator(
        task_id="snapshot",
        topology=TOPOLOGY,
        publication="{{ params.pub }}",
        conn_id=SPARK_CONN_ID,
        reinitialize=True,  # events whatever ran before: every subscription is initialized again
    )
"""


def test_a_templated_publication_names_the_alias_after_rendering(airflow_env, capfd):
    """``publication='{{ params.pub }}'``: the operator's alias is named when the task renders its
    templates, so a real DAG run adds its events to ``airflow-repl:shop``, and no alias is named
    after the template or the parameter's default."""
    from airflow.models.asset import AssetAliasModel
    from airflow.sdk import AssetAlias
    from airflow.utils.session import create_session
    from sqlalchemy import select

    file = demo.DAGS / "test_templated_alias.py"  # dag.test() runs DAGs of the DAGs folder (its bundle)
    file.write_text(TEMPLATED_ALIAS_DAG)
    try:
        dag = demo.load_dag(file.name)
        assert not [o for o in dag.get_task("snapshot").outlets if isinstance(o, AssetAlias)]  # not named yet
        dr = dag.test(run_conf={"pub": "shop"})
    finally:
        file.unlink()
    assert _succeeded(dr), _why_not_success(dr, capfd, airflow_env["distributor"])
    with create_session() as session:
        names = set(session.scalars(select(AssetAliasModel.name)))
        alias = session.scalar(select(AssetAliasModel).where(AssetAliasModel.name == "airflow-repl:shop"))
        assert alias is not None, names
        mine = [e for e in alias.asset_events if e.source_dag_id == "airflow_repl_templated_alias"]
        assert {e.asset.uri for e in mine} == {_subscriber_uri(airflow_env, t) for t in TABLES}, mine
        assert all(e.extra["publication"] == "shop" for e in mine)
    assert not {n for n in names if "{" in n or "not-this-one" in n}, names


def test_the_demos_mariadb_part_replicates_the_shop_to_a_mariadb_subscriber(airflow_env, sandbox, capfd):
    """``make demo``'s last part: the demo publication to the sandbox's MariaDB server (an Airflow
    mysql connection), initialized alone, a burst of changes delivered, counts and checksums equal."""
    from airflow_repl import demo_mariadb

    assert demo_mariadb.run(demo, airflow_env, sandbox.root) is True
    out = capfd.readouterr().out
    assert "skipped" not in out
    for article in ("customers", "products", "orders", "order_lines"):
        assert re.search(rf"^  {article}\s+(\d+)\s+\1\s+(\S+)\s+\2\s+yes$", out, re.MULTILINE), out[-3000:]
    server = sandbox.mariadb()
    with server.connection(demo_mariadb.DATABASE) as conn, conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM customers WHERE name LIKE %s", ("%\U0001f600",))
        assert cur.fetchone()[0] > 0
    password = server.password
    assert password not in (sandbox.root / demo_mariadb.TOPOLOGY_FILE).read_text()
