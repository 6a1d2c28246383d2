"""``status -o prometheus`` without servers: every metric parses back through
prometheus_client's own parser with its labels, a blocked run is critical, and a value that is
not known is left out, not written as a number it is not.  (Names are limited to lower-case
letters, digits and underscores by the topology, so a label needs no escaping.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from prometheus_client.parser import text_string_to_metric_families

from airflow_repl.engine.model import topology
from airflow_repl.engine.monitoring import status
from airflow_repl.engine.state.progress import LastRun, SubscriptionRow
from airflow_repl.presentation.status_prometheus import METRICS, exposition

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
PUB, SUB = "shop_eu", "reporting_1"


def test_every_metric_parses_back_with_its_labels_and_unknown_values_are_left_out():
    topo = topology.from_dict(
        {
            "publisher": "postgresql://u@127.0.0.1:1/pub",
            "distributor": "postgresql://u@127.0.0.1:1/dist",
            "subscribers": {SUB: "postgresql://u@127.0.0.1:1/s1", "new": "postgresql://u@127.0.0.1:1/s2"},
            "publications": [{"name": PUB, "articles": ["public.items"], "warn_pending_commands": 3}],
            "subscriptions": [{"publication": PUB, "subscriber": SUB}, {"publication": PUB, "subscriber": "new"}],
        }
    )
    behind = status.SubscriptionStatus(
        SubscriptionRow(PUB, SUB, "active", "0/10", T0, 2, 3, T0, T0, False, T0),
        LastRun(7, "blocked", T0, T0 + timedelta(seconds=1), "refused"),
        None,
        None,
        T0 + timedelta(hours=2),
        lag_seconds=42.5,
    )
    pending = status.SubscriptionStatus(
        SubscriptionRow(PUB, "new", "pending", None, None, 0, 0, None, None, False), None, None, None, None
    )
    families = {f.name: f for f in text_string_to_metric_families(exposition(topo, [behind, pending], T0))}
    assert set(families) == set(METRICS)
    samples = {(f.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    who = (("publication", PUB), ("subscriber", SUB))
    assert samples[("airflow_repl_subscription_lag_seconds", who)] == 42.5
    assert samples[("airflow_repl_subscription_pending_commands", who)] == 3
    assert samples[("airflow_repl_subscription_health", who)] == 2  # a blocked last run is critical
    assert samples[("airflow_repl_last_run_info", (("agent", "distribution"), ("outcome", "blocked"), *who))] == 1
    assert samples[("airflow_repl_last_run_failed", (("agent", "distribution"), *who))] == 1
    new = (("publication", PUB), ("subscriber", "new"))
    assert samples[("airflow_repl_subscription_active", new)] == 0
    assert ("airflow_repl_subscription_lag_seconds", new) not in samples  # not initialized: no lag to measure
    assert [s.labels["subscriber"] for s in families["airflow_repl_subscription_expiration_percent"].samples] == [SUB]
