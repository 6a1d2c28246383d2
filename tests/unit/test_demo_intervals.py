"""The demo's logical dates: a manual run's data interval must end after every commit it makes."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from airflow_repl.demo import current_interval_start


@pytest.mark.parametrize(
    "now",
    [
        datetime(2026, 11, 27, 5, 29, 55, tzinfo=timezone.utc),  # 5 s before a boundary (the CI flake)
        datetime(2026, 11, 27, 5, 30, 0, tzinfo=timezone.utc),  # on a boundary
        datetime(2026, 11, 27, 5, 30, 0, 1, tzinfo=timezone.utc),
        datetime(2026, 11, 27, 23, 59, 59, 999999, tzinfo=timezone.utc),  # across midnight
        datetime(2026, 12, 31, 23, 55, tzinfo=timezone.utc),  # across a year
    ],
)
def test_the_boundary_is_a_whole_interval_ahead_and_on_the_schedule(now: datetime) -> None:
    start = current_interval_start(now)
    assert timedelta(minutes=10) <= start - now <= timedelta(minutes=20)
    assert start.minute % 10 == 0 and start.second == 0 and start.microsecond == 0
    assert start.tzinfo == timezone.utc


def test_another_interval_length() -> None:
    now = datetime(2026, 11, 27, 5, 44, 59, tzinfo=timezone.utc)
    assert current_interval_start(now, minutes=15) == datetime(2026, 11, 27, 6, 0, tzinfo=timezone.utc)
