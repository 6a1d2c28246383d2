"""The metrics the agent operators send from a run's summary (airflow_repl.operators.metrics):
which, with which names and tags, hostile names made safe, and a ``[metrics]`` setting Airflow
rejects is one warning line, not a failed run.  (A real StatsD listener receives them from real
runs in tests/integration/test_dag_alerts.py.)"""

from __future__ import annotations

import logging

import pytest

from airflow_repl.operators import metrics

DISTRIBUTION = {
    "subscriptions": [
        {
            "subscriber": "sub1",
            "transactions": 2,
            "commands": 5,
            "lag_seconds": 1.5,
            "backlog_at_end": {"transactions": 1, "commands": 4},
            "seconds": 0.25,
        },
        {"subscriber": "broken", "status": "failed", "exit_code": 4},
    ],
    "transactions": 2,
    "commands": 5,
}


def test_a_distribution_run_sends_per_subscription_metrics_and_skips_failed_subscribers():
    sent = metrics._per_run("distribution", "p", DISTRIBUTION)
    tags = {"publication": "p", "subscriber": "sub1"}
    assert sent == [
        ("transactions", 2.0, tags),
        ("commands", 5.0, tags),
        ("lag_seconds", 1.5, tags),
        ("pending_commands", 4.0, tags),
        ("duration", 0.25, tags),
    ]


def test_log_reader_and_snapshot_runs_send_publication_metrics():
    tags = {"publication": "p"}
    assert metrics._per_run("logreader", "p", {"transactions": 3, "commands": 7, "seconds": 1}) == [
        ("transactions", 3.0, tags),
        ("commands", 7.0, tags),
        ("duration", 1.0, tags),
    ]
    assert metrics._per_run("snapshot", "p", {"rows": 10, "initialized": ["a", "b"]}) == [
        ("rows", 10.0, tags),
        ("initialized", 2, tags),
    ]


@pytest.mark.parametrize(
    ("name", "part"),
    [("shop", "shop"), ("a.b", "a__b"), ("x y\n--;", "x_y_--_"), ("é", "_"), ("go/*", "go__")],
)
def test_names_are_one_safe_part_of_a_dotted_metric_name(name, part):
    assert metrics.name_part(name) == part


def test_a_metrics_setting_airflow_rejects_is_one_warning_line(monkeypatch, caplog):
    from airflow.sdk._shared.observability.metrics.base_stats_logger import NoStatsLogger
    from airflow.sdk.observability import stats
    from airflow.sdk.observability.metrics import stats_utils

    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_ON", "True")
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_PORT", "eighty-one")
    stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=False)
    try:
        with caplog.at_level(logging.WARNING, logger=metrics.__name__):
            assert metrics.emit_run("logreader", "p", {"transactions": 1, "commands": 1})  # no exception
            metrics.emit_failure("distribution", "p", ["sub1"])
    finally:
        stats.initialize(factory=NoStatsLogger, export_legacy_names=False)
    lines = [r.getMessage() for r in caplog.records if r.name == metrics.__name__]
    assert len(lines) == 2 and all(len(line.splitlines()) == 1 for line in lines)
    assert lines[0].startswith("airflow-repl: metrics not sent: ") and "statsd_port" in lines[0]
    assert "eighty-one" in lines[0] and "[metrics] settings" in lines[0]
