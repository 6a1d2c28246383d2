"""Lag in seconds in ``airflow-repl status`` against real servers: the age of the oldest
undelivered transaction grows while the Distribution Agent does not run and is 0 once it has;
the latest tracer token's latency per hop is shown once one arrived."""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml
from harness import items_topology_file, setup_items
from prometheus_client.parser import text_string_to_metric_families

from airflow_repl import cli
from airflow_repl.engine.agents import distribution_agent, log_reader_agent
from airflow_repl.engine.monitoring import tracer
from airflow_repl.presentation.status_rows import COLUMNS


def _lag(topo_file: str, capsys) -> dict:
    capsys.readouterr()
    assert cli.main(["status", "-t", topo_file, "-o", "json"]) == 0
    return json.loads(capsys.readouterr().out)[0]["lag"]


def test_lag_grows_while_the_distribution_agent_does_not_run_and_is_0_after(env, spark, tmp_path, capsys):
    topo = setup_items(env, spark, 10)
    topo_file = items_topology_file(env, tmp_path)
    assert _lag(topo_file, capsys) == {"seconds": 0.0, "oldest_pending_commit_time": None, "tracer": None}

    env.run(env.pub, "UPDATE items SET v = 'x' WHERE id = 1")
    log_reader_agent.run_log_reader(topo, "p")
    first = _lag(topo_file, capsys)
    time.sleep(1.5)
    env.run(env.pub, "UPDATE items SET v = 'y' WHERE id = 2")  # a newer transaction: the oldest one counts
    log_reader_agent.run_log_reader(topo, "p")
    second = _lag(topo_file, capsys)
    assert first["seconds"] > 0 and second["seconds"] >= first["seconds"] + 1.4
    assert second["oldest_pending_commit_time"] == first["oldest_pending_commit_time"] is not None

    token = tracer.post_tracer_token(topo, "p")
    log_reader_agent.run_log_reader(topo, "p")
    distribution_agent.run_distribution(topo, "p", "sub1")
    caught_up = _lag(topo_file, capsys)
    assert caught_up["seconds"] == 0.0 and caught_up["oldest_pending_commit_time"] is None
    hops = caught_up["tracer"]
    assert hops["token_id"] == token and hops["subscriber"] == "sub1"
    assert 0 <= hops["publisher_to_distributor"] <= hops["total"] and hops["distributor_to_subscriber"] >= 0

    assert cli.main(["status", "-t", topo_file]) == 0
    header, row = capsys.readouterr().out.splitlines()[:2]
    assert "lag s" in header and row.split()[COLUMNS.index("lag s")] == "0"


def test_status_check_warns_at_a_threshold_and_is_ok_once_delivered(env, spark, tmp_path, capsys):
    topo = setup_items(env, spark, 10)
    path = tmp_path / "thresholds.yaml"
    data = yaml.safe_load(Path(items_topology_file(env, tmp_path)).read_text())
    data["publications"][0].update(warn_pending_commands=2, critical_latency_seconds=3600)
    data["publications"].append({"name": "q", "articles": ["public.items"]})  # no subscription
    path.write_text(yaml.safe_dump(data))
    env.run(env.pub, "UPDATE items SET v = 'x' WHERE id <= 2")  # 2 commands
    log_reader_agent.run_log_reader(topo, "p")
    capsys.readouterr()
    assert cli.main(["status", "-t", str(path), "--check"]) == 1
    out = capsys.readouterr()
    assert out.out.splitlines() == [
        "WARNING: subscriber 'sub1' of publication 'p': 2 commands pending, at or above warn_pending_commands 2"
    ]
    assert out.err.strip() == "airflow-repl: error: status --check: WARNING, 1 breach(es)"

    distribution_agent.run_distribution(topo, "p", "sub1")
    assert cli.main(["status", "-t", str(path), "--check"]) == 0
    assert capsys.readouterr().out.splitlines() == ["OK: 1 subscription(s) within their thresholds"]

    assert cli.main(["status", "-t", str(path), "-p", "q", "--check"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "found no subscription to check" in err[0]


def test_status_prometheus_parses_with_prometheus_client_and_carries_every_subscription(env2, spark, tmp_path, capsys):
    topo = setup_items(env2, spark, 10)
    path = tmp_path / "thresholds.yaml"
    data = yaml.safe_load(Path(items_topology_file(env2, tmp_path)).read_text())
    data["publications"][0].update(warn_pending_commands=2, max_retention_hours=10)
    path.write_text(yaml.safe_dump(data))
    env2.run(env2.pub, "UPDATE items SET v = 'x' WHERE id <= 2")  # 1 transaction of 2 commands
    log_reader_agent.run_log_reader(topo, "p")
    distribution_agent.run_distribution(topo, "p", "sub1")  # sub2 stays behind
    capsys.readouterr()
    assert cli.main(["status", "-t", str(path), "-o", "prometheus"]) == 0
    text = capsys.readouterr().out
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert {f.type for f in families.values()} == {"gauge"}

    def value(name: str, subscriber: str, **labels) -> float:
        (found,) = [
            s.value
            for s in families[name].samples
            if s.labels["subscriber"] == subscriber and s.labels.items() >= labels.items()
        ]
        return found

    for name in ("airflow_repl_subscription_pending_commands", "airflow_repl_subscription_health"):
        assert {(s.labels["publication"], s.labels["subscriber"]) for s in families[name].samples} == {
            ("p", "sub1"),
            ("p", "sub2"),
        }
    assert value("airflow_repl_subscription_pending_commands", "sub1") == 0
    assert value("airflow_repl_subscription_pending_commands", "sub2") == 2
    assert value("airflow_repl_subscription_pending_transactions", "sub2") == 1
    assert value("airflow_repl_subscription_lag_seconds", "sub1") == 0
    assert value("airflow_repl_subscription_lag_seconds", "sub2") > 0
    assert value("airflow_repl_subscription_health", "sub1") == 0
    assert value("airflow_repl_subscription_health", "sub2") == 1  # the warning of status --check
    assert 0 <= value("airflow_repl_subscription_expiration_percent", "sub2") < 1
    assert [s.labels["subscriber"] for s in families["airflow_repl_subscription_expiration_percent"].samples] == [
        "sub2"
    ]  # nothing waits for sub1: no expiry to measure
    assert value("airflow_repl_last_run_info", "sub1", agent="distribution", outcome="succeeded") == 1
    assert value("airflow_repl_last_run_failed", "sub1", agent="distribution") == 0
    assert value("airflow_repl_last_run_info", "sub2", agent="logreader", outcome="succeeded") == 1
    assert value("airflow_repl_last_run_finished_timestamp_seconds", "sub1", agent="distribution") > 1.7e9
