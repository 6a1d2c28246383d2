"""``airflow-repl status -o prometheus``: the status of every subscription in the Prometheus
text exposition format, written by ``prometheus_client`` (a collector of gauge families,
rendered by ``generate_latest``), for a node-exporter textfile collector or a scrape.

Every sample is labelled by ``publication`` and ``subscriber`` (the last runs also by
``agent``); a value that is not known (no lag for a subscription not initialized, no expiry when
nothing waits) is left out rather than written as a number it is not.  The metric names are
listed in :data:`METRICS` and in docs/monitoring.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from airflow_repl.engine.model.topology import Topology
from airflow_repl.engine.monitoring import health
from airflow_repl.engine.monitoring.status import SubscriptionStatus, run_failed, state

LABELS = ["publication", "subscriber"]
RUN_LABELS = [*LABELS, "agent"]
#: name -> help of every metric written (the ``_info`` one's value is always 1, its outcome a label).
METRICS = {
    "airflow_repl_subscription_lag_seconds": "age of the oldest transaction stored for the subscription and not "
    "delivered yet (0: caught up)",
    "airflow_repl_subscription_pending_commands": "commands stored for the subscription and not delivered yet",
    "airflow_repl_subscription_pending_transactions": "transactions stored for the subscription and not delivered yet",
    "airflow_repl_subscription_health": "status --check's level: 0 ok, 1 warning, 2 critical",
    "airflow_repl_subscription_active": "1 when the subscription is active and not paused",
    "airflow_repl_subscription_expiration_percent": "share of max_retention_hours passed towards the subscription's "
    "expiry while a transaction waits for it",
    "airflow_repl_last_run_info": "an agent's last run serving the subscription; its outcome is the label",
    "airflow_repl_last_run_failed": "1 when an agent's last run serving the subscription failed or was blocked",
    "airflow_repl_last_run_finished_timestamp_seconds": "when an agent's last run serving the subscription finished",
}


class _StatusCollector(Collector):
    def __init__(self, topology: Topology, rows: list[SubscriptionStatus], now: datetime) -> None:
        self.topology, self.rows, self.now = topology, rows, now

    def collect(self) -> Iterator[Metric]:
        g = {name: GaugeMetricFamily(name, text, labels=LABELS) for name, text in METRICS.items()}
        g["airflow_repl_last_run_info"] = GaugeMetricFamily(
            "airflow_repl_last_run_info", METRICS["airflow_repl_last_run_info"], labels=[*RUN_LABELS, "outcome"]
        )
        for name in ("airflow_repl_last_run_failed", "airflow_repl_last_run_finished_timestamp_seconds"):
            g[name] = GaugeMetricFamily(name, METRICS[name], labels=RUN_LABELS)
        for row in self.rows:
            s = row.sub
            labels = [s.publication, s.subscriber]
            if row.lag_seconds is not None:
                g["airflow_repl_subscription_lag_seconds"].add_metric(labels, row.lag_seconds)
            g["airflow_repl_subscription_pending_commands"].add_metric(labels, s.backlog_commands)
            g["airflow_repl_subscription_pending_transactions"].add_metric(labels, s.backlog_transactions)
            g["airflow_repl_subscription_health"].add_metric(
                labels, health.level(health.check(self.topology, [row], self.now))
            )
            g["airflow_repl_subscription_active"].add_metric(labels, 1 if state(s) == "active" else 0)
            pub = self.topology.publications.get(s.publication)
            used = health.expiration_percent(row.expires_at, pub.max_retention_hours if pub else None, self.now)
            if used is not None:
                g["airflow_repl_subscription_expiration_percent"].add_metric(labels, round(used, 3))
            for agent, run in (("distribution", row.distribution), ("logreader", row.logreader)):
                if run is None:
                    continue
                g["airflow_repl_last_run_info"].add_metric([*labels, agent, run.status], 1)
                g["airflow_repl_last_run_failed"].add_metric([*labels, agent], 1 if run_failed(run.status) else 0)
                if run.finished_at is not None:
                    g["airflow_repl_last_run_finished_timestamp_seconds"].add_metric(
                        [*labels, agent], run.finished_at.timestamp()
                    )
        yield from g.values()


def exposition(topology: Topology, rows: list[SubscriptionStatus], now: datetime) -> str:
    """The rows' metrics in the Prometheus text exposition format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_StatusCollector(topology, rows, now))
    return generate_latest(registry).decode()
