"""``status --check``'s pure rule: each threshold fires at its boundary and not below, a
subscription's keys override its publication's, bad threshold keys are one clear line."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from airflow_repl.engine.errors import TopologyError
from airflow_repl.engine.model import topology
from airflow_repl.engine.monitoring import health, status
from airflow_repl.engine.state.progress import LastRun, SubscriptionRow

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def topo(publication_keys: dict, subscription_keys: dict | None = None) -> topology.Topology:
    return topology.from_dict(
        {
            "publisher": "postgresql://u@127.0.0.1:1/pub",
            "distributor": "postgresql://u@127.0.0.1:1/dist",
            "subscribers": {"s1": "postgresql://u@127.0.0.1:1/s1", "s2": "postgresql://u@127.0.0.1:1/s2"},
            "publications": [{"name": "p", "articles": ["public.items"], **publication_keys}],
            "subscriptions": [
                {"publication": "p", "subscriber": "s1", **(subscription_keys or {})},
                {"publication": "p", "subscriber": "s2"},
            ],
        }
    )


def _row(lag: float = 0.0, commands: int = 0, expires_at: datetime | None = None, run: str = "succeeded"):
    sub = SubscriptionRow("p", "s1", "active", "0/10", T0, 1, commands, T0, T0, False, T0)
    last = LastRun(1, run, T0, T0, "the articles changed: run airflow-repl snapshot")
    return status.SubscriptionStatus(sub, last, None, None, expires_at, lag_seconds=lag)


def _levels(row, **limits) -> list[int]:
    return [b.level for b in health.breaches(row, limits, 10.0, T0)]


def test_latency_warns_and_is_critical_at_its_boundary_not_below():
    limits = {"warn_latency_seconds": 30, "critical_latency_seconds": 60}
    assert _levels(_row(lag=29.999), **limits) == []
    assert _levels(_row(lag=30), **limits) == [health.WARNING]
    assert _levels(_row(lag=59.9), **limits) == [health.WARNING]
    assert _levels(_row(lag=60), **limits) == [health.CRITICAL]  # critical only, not both


def test_pending_commands_warn_at_the_boundary_not_below():
    assert _levels(_row(commands=99), warn_pending_commands=100) == []
    found = health.breaches(_row(commands=100), {"warn_pending_commands": 100}, 10.0, T0)
    assert [b.level for b in found] == [health.WARNING] and "100 commands pending" in found[0].line


def test_expiration_percent_warns_at_the_boundary_not_below():
    # max_retention_hours 10: an expiry 2 hours away means 80% used
    assert health.expiration_percent(T0 + timedelta(hours=2), 10.0, T0) == pytest.approx(80.0)
    assert _levels(_row(expires_at=T0 + timedelta(hours=2, seconds=1)), warn_expiration_percent=80) == []
    assert _levels(_row(expires_at=T0 + timedelta(hours=2)), warn_expiration_percent=80) == [health.WARNING]
    assert _levels(_row(expires_at=None), warn_expiration_percent=0) == []  # nothing waits: nothing expires


def test_a_blocked_or_failed_run_is_critical_and_no_threshold_is_ok():
    found = health.breaches(_row(run="blocked"), {}, 10.0, T0)
    assert [b.level for b in found] == [health.CRITICAL] and "was blocked" in found[0].line
    assert "airflow-repl snapshot" in found[0].line
    assert health.breaches(_row(lag=1e6, commands=10**6), {}, 10.0, T0) == []
    assert health.level([]) == health.OK and health.level([*found, health.Breach(1, "w")]) == health.CRITICAL


def test_a_subscription_overrides_its_publication():
    t = topo({"warn_latency_seconds": 30, "warn_pending_commands": 5}, {"warn_latency_seconds": 10})
    assert t.thresholds("p", "s1") == {"warn_latency_seconds": 10, "warn_pending_commands": 5}
    assert t.thresholds("p", "s2") == {"warn_latency_seconds": 30, "warn_pending_commands": 5}
    assert t.thresholds("p", "gone") == t.thresholds("p", "s2")
    assert "warn_latency_seconds" not in t.subscription("p", "s1").options()  # not an agent option


@pytest.mark.parametrize(
    ("publication_keys", "subscription_keys", "message"),
    [
        ({"warn_latency_seconds": -1}, None, "warn_latency_seconds: -1 is out of range"),
        ({}, {"critical_latency_seconds": -0.5}, "critical_latency_seconds: -0.5 is out of range"),
        ({"warn_pending_commands": -3}, None, "warn_pending_commands: -3 is out of range"),
        ({"warn_expiration_percent": 101}, None, "warn_expiration_percent: 101 is out of range"),
        ({"warn_latency_secs": 5}, None, "warn_latency_secs"),
        ({}, {"critical_lag": 5}, "critical_lag"),
    ],
)
def test_bad_thresholds_are_one_clear_line(publication_keys, subscription_keys, message):
    with pytest.raises(TopologyError, match=message) as caught:
        topo(publication_keys, subscription_keys)
    assert len(str(caught.value).splitlines()) == 1


def test_check_uses_each_subscriptions_own_thresholds_and_health_says_what_a_sensor_does():
    t = topo({"warn_pending_commands": 5}, {"warn_pending_commands": 2})
    s1 = _row(commands=3)
    s2 = status.SubscriptionStatus(
        dataclasses.replace(s1.sub, subscriber="s2"), None, None, None, None, lag_seconds=0.0
    )
    found = health.check(t, [s1, s2], T0)
    assert [b.line for b in found] == [
        "WARNING: subscriber 's1' of publication 'p': 3 commands pending, at or above warn_pending_commands 2"
    ]
    warned = health.Health("p", 2, tuple(found))
    assert (warned.done, warned.failed, warned.message) == (False, False, found[0].line)
    critical = health.Health("p", 2, (*found, *health.breaches(_row(run="failed"), {}, 10.0, T0)))
    assert critical.failed and critical.message.startswith(found[0].line + "; CRITICAL: 's1' of publication 'p'")
    ok = health.Health("p", 2, ())
    assert (
        ok.done and not ok.failed and ok.message == "OK: 2 subscription(s) of publication 'p' within their thresholds"
    )
