"""One status row drawn by both outputs: the text table of ``airflow-repl status`` and the
Subscriptions table of the HTML report show the same cells, and which run counts as failed is
the engine's one rule."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from airflow_repl.engine.monitoring import status
from airflow_repl.engine.state.progress import LastRun, SubscriptionRow
from airflow_repl.presentation import report_html, status_table
from airflow_repl.presentation.status_rows import COLUMNS, StatusRow

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
LONG = "cannot apply update on article 'orders' (public.orders) key (id)=(1): the row was not found"


def _status(subscriber: str, outcome: str | None, error: str | None = None, finished: bool = True):
    sub = SubscriptionRow("p", subscriber, "active", "0/16B3748", T0, 3, 9, T0, T0)
    run = LastRun(7, outcome, T0, T0 + timedelta(seconds=5) if finished else None, "boom") if outcome else None
    return status.SubscriptionStatus(sub, run, None, (T0, error) if error else None, status.expires_at(sub, 72.0))


def _page(rows: list[status.SubscriptionStatus]) -> str:
    return report_html.render(report_html.ReportData("t", T0, status=[r.to_json() for r in rows]))


def _one_time_format(text: str) -> str:
    """The table writes ISO times (``T``), the page a space: the same time either way."""
    return re.sub(r"(\d{4}-\d\d-\d\d)[T ](\d\d:\d\d:\d\d)", r"\1@\2", text)


def test_the_text_table_and_the_page_show_the_same_cells():
    rows = [_status("s1", "succeeded"), _status("s2", "failed", "relation  missing\nmore"), _status("s3", None)]
    lines = _one_time_format(status_table.format_table(rows)).splitlines()
    page_rows = re.findall(r"<tr><td>p</td>.*?</tr>", _one_time_format(_page(rows)))
    assert len(lines) == len(page_rows) + 1 == 4
    for line, page_row in zip(lines[1:], page_rows, strict=True):
        assert re.split(r" {2,}", line) == re.findall(r"<td[^>]*>(.*?)</td>", page_row)
    assert "relation missing more" in lines[2] and "failed 2026-11-23@12:00:05+00:00" in lines[2]


def test_a_cut_error_is_marked_and_a_running_run_shows_no_dash():
    line = status_table.format_table([_status("s1", "running", LONG, finished=False)]).splitlines()[1]
    assert "(public.orders) key…" in line and LONG not in line
    assert re.search(r"\brunning {2,}never\b", line)
    assert (
        StatusRow.from_json(_status("s1", "running", finished=False).to_json())
        .cells(str, 60)[COLUMNS.index("distribution")]
        .text
        == "running"
    )


def test_which_run_counts_as_failed_is_the_engines_one_rule(monkeypatch):
    rows = [_status("s1", "abandoned")]
    assert status.problems(rows, None) == [] and "<b>0</b>subscriptions whose last run failed or was blocked" in _page(
        rows
    )
    monkeypatch.setattr(status, "FAILED_RUNS", frozenset({"failed", "abandoned"}))
    assert status.problems(rows, None) == ["'s1' of publication 'p': the Distribution Agent's last run failed (boom)"]
    page = _page(rows)
    assert "<b>1</b>subscriptions whose last run failed or was blocked" in page and "<td class='bad'>abandoned " in page
