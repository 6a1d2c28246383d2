"""The pure parts of ``airflow-repl status``: the table, the JSON, expiry and the exit reasons."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow_repl.engine.monitoring import status
from airflow_repl.engine.state.progress import LastRun, SubscriptionRow
from airflow_repl.presentation import status_table

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def _row(subscriber: str, backlog: int, run_status: str | None, error: str | None = None) -> status.SubscriptionStatus:
    sub = SubscriptionRow("p", subscriber, "active", "0/16B3748", T0, backlog, backlog * 3, T0, T0 if backlog else None)
    run = LastRun(7, run_status, T0, T0 + timedelta(seconds=5), "boom\nline 2") if run_status else None
    return status.SubscriptionStatus(sub, run, None, (T0, error) if error else None, status.expires_at(sub, 72.0))


def test_table_has_a_header_and_one_row_per_subscription():
    text = status_table.format_table([_row("s1", 2, "succeeded"), _row("s2", 0, None, "relation  missing\nmore")])
    lines = text.splitlines()
    assert len(lines) == 3 and lines[0].startswith("publication  subscriber  status")
    assert lines[1].split()[:5] == ["p", "s1", "active", "2", "6"] and "succeeded" in lines[1]
    assert "never" in lines[2] and "relation missing more" in lines[2]


def test_json_and_expiry():
    data = _row("s1", 2, "failed").to_json()
    assert data["backlog"] == {"transactions": 2, "commands": 6}
    assert data["delivered"] == {"xact_seqno": "0/16B3748", "commit_time": T0.isoformat()}
    assert data["last_runs"]["distribution"]["status"] == "failed" and data["last_runs"]["logreader"] is None
    assert data["expires_at"] == (T0 + timedelta(hours=72)).isoformat() and data["last_error"] is None
    assert _row("s1", 0, None).to_json()["expires_at"] is None


def test_problems_name_the_subscription_and_the_reason():
    rows = [_row("s1", 2, "failed"), _row("s2", 5, "succeeded"), _row("s3", 0, None)]
    found = status.problems(rows, max_pending=3)
    assert found == [
        "'s1' of publication 'p': the Distribution Agent's last run failed (boom line 2)",
        "'s2' of publication 'p': 5 transactions pending, above --max-pending 3",
    ]
    assert status.problems(rows[1:], None) == []


def _pending(state: str, oldest: datetime | None) -> SubscriptionRow:
    return SubscriptionRow(
        "p", "s1", state, "0/10", T0, 1 if oldest else 0, 1 if oldest else 0, T0, oldest, False, oldest
    )


def test_lag_is_the_age_of_the_oldest_undelivered_transaction():
    assert status.lag_seconds(_pending("active", T0), T0 + timedelta(seconds=90.25)) == 90.25
    assert status.lag_seconds(_pending("active", None), T0) == 0.0  # caught up
    assert status.lag_seconds(_pending("active", T0), T0 - timedelta(seconds=2)) == 0.0  # the publisher's clock ahead
    assert status.lag_seconds(_pending("expired", None), T0) is None  # nothing to measure


def test_lag_in_the_json_and_the_table():
    row = status.SubscriptionStatus(_pending("active", T0), None, None, None, None, lag_seconds=12.345)
    assert row.to_json()["lag"] == {"seconds": 12.345, "oldest_pending_commit_time": T0.isoformat(), "tracer": None}
    header, line = status_table.format_table([row]).splitlines()
    assert header.split()[7:9] == ["lag", "s"] and line.split()[5] == "12.3"


def test_the_conflicts_table_keeps_each_conflict_on_one_line_whatever_the_names():
    hostile = {
        "conflict_id": 1,
        "detected_at": datetime(2026, 11, 23, 13, 0, 5, tzinfo=UTC),
        "publication": "p",
        "subscriber": "sub\nDROP TABLE x; --",
        "article": "tab\tle ärtikel",
        "key": {"id": 1, "name": "a\nb"},
        "kind": "update/update",
        "policy": "publisher wins",
        "outcome": "publisher",
        "agent": "queuereader",
    }
    header, line, *rest = status_table.format_conflicts([hostile, {**hostile, "subscriber": None}]).splitlines()
    assert header.split()[:4] == ["detected", "publication", "subscriber", "article"]
    assert line.startswith("2026-11-23T13:00:05+00:00  p ") and "sub\\nDROP TABLE x; --" in line
    assert "tab\\tle ärtikel" in line and '{"id": 1, "name": "a\\nb"}' in line
    assert len(rest) == 1 and status_table.format_conflicts([]) == "no conflicts recorded"
