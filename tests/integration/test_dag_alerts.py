"""The example scheduled DAG's monitoring, in real ``dag.test()`` runs whose agent tasks
spark-submit the real agents (Spark local mode):

* each agent run's metrics reach Airflow's own metrics: a real UDP socket in the test, set as
  Airflow's StatsD server (``AIRFLOW__METRICS__STATSD_ON`` and the rest), receives what the Log
  Reader and Distribution Agent operators send, named by publication and subscriber; the
  ReplicationHealthSensor passes once the subscription is caught up;
* retries: an agent task that exits 5 (a distributor it cannot reach) is retried with back-off
  until its retries are spent (each failed try counted in ``airflow_repl.logreader.failed``),
  one that exits 2 (an unknown publication) is not; each, once
  failed for good, posts its alert (ReplicationAlert, Airflow's notifier interface) to a real
  HTTP listener.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pendulum
import pytest
import yaml
from harness import items_topology_file, setup_items

from airflow_repl import demo


@pytest.fixture(scope="module")
def airflow_db():
    demo.migrate_airflow_db()  # dag.test() records its runs in Airflow's database


@pytest.fixture
def scheduled(monkeypatch):
    """A loader of the example scheduled DAG for a topology file and publication: repl_common
    is imported again, so the DAG reads this test's settings."""
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL", json.dumps({"conn_type": "spark", "host": "local[1]"}))
    monkeypatch.setenv("AIRFLOW_REPL_SPARK_CONN_ID", "spark_local")
    monkeypatch.setenv("AIRFLOW_REPL_RETRY_DELAY_SECONDS", "0.5")
    monkeypatch.syspath_prepend(str(demo.DAGS))  # as Airflow's DAG folder is

    def load(topology: str, publication: str):
        monkeypatch.setenv("AIRFLOW_REPL_TOPOLOGY", topology)
        monkeypatch.setenv("AIRFLOW_REPL_PUBLICATION", publication)
        monkeypatch.delitem(sys.modules, "repl_common", raising=False)
        return demo.load_dag("repl_scheduled.py")

    return load


def run(dag, minutes_ahead: int):
    """One run whose data interval ends after every commit so far (``until`` delivers them)."""
    start = demo.current_interval_start(datetime.now(timezone.utc)) + timedelta(minutes=minutes_ahead)
    return dag.test(logical_date=pendulum.instance(start), run_conf={"validate_every": 0})


def tries(dr) -> dict[str, tuple[str, int]]:
    return {ti.task_id: (str(getattr(ti.state, "value", ti.state)), ti.try_number) for ti in dr.get_task_instances()}


@pytest.fixture
def statsd(monkeypatch):
    """A UDP socket as Airflow's StatsD server; Airflow's metrics set up from the ``[metrics]``
    settings as its task runner does (``stats.initialize``), and reset after."""
    from airflow.sdk._shared.observability.metrics.base_stats_logger import NoStatsLogger
    from airflow.sdk.observability import stats
    from airflow.sdk.observability.metrics import stats_utils

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.2)
    for key, value in {
        "STATSD_ON": "True",
        "STATSD_HOST": "127.0.0.1",
        "STATSD_PORT": str(sock.getsockname()[1]),
        "STATSD_PREFIX": "airflow",
    }.items():
        monkeypatch.setenv(f"AIRFLOW__METRICS__{key}", value)
    stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=False)
    yield sock
    stats.initialize(factory=NoStatsLogger, export_legacy_names=False)
    sock.close()


def _lines(sock: socket.socket) -> list[str]:
    """Every metric line the socket received so far."""
    lines: list[str] = []
    while True:
        try:
            lines += sock.recv(65536).decode().splitlines()
        except TimeoutError:
            return lines


def received(sock: socket.socket) -> dict[str, str]:
    """The airflow-repl metrics the socket received: name -> value|type."""
    return {ln.split(":")[0]: ln.split(":", 1)[1] for ln in _lines(sock) if ln.startswith("airflow.airflow_repl.")}


@pytest.fixture
def webhook(monkeypatch):
    """A real HTTP listener as ReplicationAlert's webhook: the alerts it received (JSON)."""
    alerts: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            alerts.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("AIRFLOW_REPL_ALERT_WEBHOOK", f"http://127.0.0.1:{server.server_port}/alert")
    yield alerts
    server.shutdown()


def test_agent_runs_send_their_metrics_to_statsd(env, spark, tmp_path, airflow_db, scheduled, statsd):
    setup_items(env, spark, 10)
    env.run(env.pub, "UPDATE items SET v = 'x' WHERE id <= 3")  # 1 transaction, 3 commands
    dr = run(scheduled(items_topology_file(env, tmp_path), "p"), 200)
    assert tries(dr) == {
        "log_reader": ("success", 1),
        "distribution": ("success", 1),
        "replication_healthy": ("success", 1),  # caught up: the sensor passes
        "validation_due": ("success", 1),
        "validate": ("skipped", 0),
    }
    sent = received(statsd)
    assert sent["airflow.airflow_repl.logreader.transactions.p"] == "1|c"
    assert sent["airflow.airflow_repl.logreader.commands.p"] == "3|c"
    assert sent["airflow.airflow_repl.distribution.transactions.p.sub1"] == "1|c"
    assert sent["airflow.airflow_repl.distribution.commands.p.sub1"] == "3|c"
    assert sent["airflow.airflow_repl.distribution.lag_seconds.p.sub1"] == "0.0|g"  # caught up at its end
    assert sent["airflow.airflow_repl.distribution.pending_commands.p.sub1"] == "0.0|g"
    assert sent["airflow.airflow_repl.distribution.duration.p.sub1"].endswith("|ms")
    assert sent["airflow.airflow_repl.distribution.commands"] == "3|c"  # the tagged name (plain StatsD drops tags)


def test_exit_5_is_retried_with_back_off_and_exit_2_is_not_and_both_alert(
    env, tmp_path, airflow_db, scheduled, webhook, statsd
):
    unreachable = tmp_path / "unreachable.yaml"
    data = yaml.safe_load(Path(items_topology_file(env, tmp_path)).read_text())
    data["distributor"] = "postgresql://postgres@127.0.0.1:1/nowhere"  # nothing listens on port 1
    unreachable.write_text(yaml.safe_dump(data))
    dr = run(scheduled(str(unreachable), "p"), 210)
    states = tries(dr)
    assert states["log_reader"] == ("failed", 4), states  # the first try and its 3 retries
    assert states["distribution"][0] == "upstream_failed"
    (alert,) = [a for a in webhook if a["task_id"] == "log_reader"]
    assert alert["try_number"] == 4 and "cannot connect to the distributor" in alert["reason"]
    assert "[retryable]" in alert["reason"]
    failed = [ln for ln in _lines(statsd) if ln.startswith("airflow.airflow_repl.logreader.failed.p:")]
    assert failed == ["airflow.airflow_repl.logreader.failed.p:1|c"] * 4  # each try's failed run counted

    webhook.clear()
    dr = run(scheduled(items_topology_file(env, tmp_path), "nope"), 220)
    states = tries(dr)
    assert states["log_reader"] == ("failed", 1), states  # exit code 2: not retried
    (alert,) = webhook
    assert alert["task_id"] == "log_reader" and alert["try_number"] == 1
    assert "exit code 2" in alert["reason"] and "unknown publication 'nope'" in alert["reason"]


def test_every_agent_task_of_the_example_dags_retries_with_back_off_and_alerts(scheduled):
    from airflow_repl.operators.agents import _AgentOperator

    agent_tasks = 0
    for path in sorted(demo.DAGS.glob("repl_*.py")):
        if path.name == "repl_common.py":
            continue
        dag = demo.load_dag(path.name)
        for task in dag.tasks:
            if isinstance(task, _AgentOperator):
                agent_tasks += 1
                assert (task.retries, task.retry_exponential_backoff, task.max_retry_delay) == (
                    3,
                    2.0,
                    timedelta(minutes=30),
                ), task.task_id
                assert type(task.on_failure_callback[0]).__name__ == "ReplicationAlert", (path.name, task.task_id)
    assert agent_tasks >= 15
