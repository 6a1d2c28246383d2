"""The HTML report's pure rendering and the progress lines' text, without servers."""

from __future__ import annotations

import html
import re
from datetime import datetime, timedelta, timezone
from html.parser import HTMLParser

import pytest

from airflow_repl.engine.errors import ReplError
from airflow_repl.engine.runtime import progress_lines
from airflow_repl.presentation.report_html import ReportData, bar_chart, render

T0 = datetime(2026, 11, 23, 13, 0, tzinfo=timezone.utc)
EVIL = "<script>alert('x')</script>"


def _status(subscriber: str, pending: int, error: str | None = None, failed: bool = False) -> dict:
    return {
        "publication": "p",
        "subscriber": subscriber,
        "status": "active",
        "backlog": {"transactions": pending, "commands": pending * 2},
        "delivered": {"xact_seqno": "0/1A2B3C", "commit_time": T0.isoformat()},
        "last_runs": {
            "distribution": {
                "status": "failed" if failed else "succeeded",
                "finished_at": T0.isoformat(),
                "message": None,
            },
            "logreader": None,
        },
        "last_error": {"at": T0.isoformat(), "message": error} if error else None,
        "expires_at": None,
    }


def _run(run_id: int, agent: str, status: str = "succeeded", **kw) -> dict:
    return {
        "run_id": run_id,
        "agent": agent,
        "publication": "p",
        "subscriber": kw.get("subscriber"),
        "started_at": kw.get("finished_at", T0 + timedelta(seconds=2)) - timedelta(seconds=2),
        "finished_at": kw.get("finished_at", T0 + timedelta(seconds=2)),
        "status": status,
        "transactions": kw.get("transactions", 10),
        "commands": kw.get("commands", 40),
        "rows_copied": kw.get("rows_copied", 0),
        "message": kw.get("message"),
        "backlog_at_start": kw.get("backlog"),
        "backlog_at_end": kw.get("left"),
    }


def _data() -> ReportData:
    return ReportData(
        "topo.yaml",
        T0,
        status=[_status("sub1", 0), _status(EVIL, 7, error=f"relation {EVIL} does not exist", failed=True)],
        runs=[
            _run(1, "snapshot", rows_copied=1000),
            _run(2, "logreader"),
            _run(3, "distribution", subscriber="sub1", backlog={"transactions": 10, "commands": 40}),
            _run(
                4,
                "distribution",
                "failed",
                subscriber=EVIL,
                message="boom & <b>",
                backlog={"transactions": 7, "commands": 14},
            ),
        ],
        conflicts=[
            {
                "detected_at": T0,
                "publication": "p",
                "subscriber": "sub1",
                "article": "items",
                "key": {"id": 1},
                "kind": "update/update",
                "policy": "pub wins",
                "outcome": "publisher wins",
                "agent": "queuereader",
            }
        ],
        errors=[
            {
                "occurred_at": T0,
                "agent": "distribution",
                "publication": "p",
                "subscriber": EVIL,
                "article": "items",
                "xact_seqno": "0/1",
                "sqlstate": "42P01",
                "skipped": False,
                "message": f"relation {EVIL} does not exist",
            }
        ],
    )


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)

    def handle_data(self, data):
        self.text.append(data)


def test_the_page_is_self_contained_and_escapes_every_value():
    page = render(_data())
    parsed = _Tags()
    parsed.feed(page)
    assert "script" not in parsed.tags and "link" not in parsed.tags and "img" not in parsed.tags
    assert not re.search(r"(src|href)=", page) and "@import" not in page and "url(" not in page
    assert EVIL not in page and html.escape(EVIL) in page
    assert "boom &amp; &lt;b&gt;" in page
    text = " ".join(parsed.text)
    assert f"relation {EVIL} does not exist" in text  # shown as text
    assert parsed.tags.count("svg") == 5 and parsed.tags.count("table") == 4


def test_the_page_shows_status_backlog_throughput_conflicts_and_errors():
    page = render(_data())
    assert (
        "<b>7</b>pending transactions" in page and "<b>1</b>subscriptions whose last run failed or was blocked" in page
    )
    assert "Conflicts (1)" in page and "update/update" in page and "Errors (1)" in page
    assert "7 tx" in page and "10 tx" in page  # backlog now, backlog at a run's start
    assert "500 /s" in page and "20 /s" in page  # 1000 rows in 2 s, 40 commands in 2 s
    assert "2026-11-23 13:00:00+00:00" in page


def test_an_empty_distribution_database_says_so():
    page = render(ReportData("t", T0))
    assert "no subscriptions in the distribution database" in page and "no errors recorded" in page
    assert page.count("nothing to show yet") == 5


def test_bar_lengths_are_proportional():
    svg = bar_chart("c", [("a", 10.0, "ok", "t"), ("b", 5.0, "bad", "t")], "tx")
    widths = [float(w) for w in re.findall(r"<rect class='\w+' x='\d+' y='[\d.]+' width='([\d.]+)'", svg)]
    assert widths[0] == pytest.approx(2 * widths[1]) and widths[0] > 0


def test_progress_line_texts():
    assert (
        progress_lines.snapshot_line("article 'orders'", 100, 400) == "article 'orders': 100 of 400 rows copied (25%)"
    )
    assert progress_lines.delivery_line(10, 20, 20, 40) == (
        "delivered 10 of 30 transactions (33%), 20 of 60 commands; 20 transactions pending"
    )
    line = progress_lines.log_reader_line(5, 9, 2, "0/100", "0/300100", 3 << 20)
    assert line == "read 5 transactions, 9 commands in 2 batches; LSN 0/100 reached, WAL end 0/300100 (3.0 MB behind)"
    assert progress_lines.percent(0, 0) == "100%" and progress_lines.percent(3, 0) == "?%"


@pytest.mark.parametrize("value", ["soon", "-1", "inf", "nan"])
def test_a_bad_interval_is_one_clear_error(monkeypatch, value):
    monkeypatch.setenv(progress_lines.INTERVAL_VARIABLE, value)
    with pytest.raises(ReplError, match=f"AIRFLOW_REPL_PROGRESS_INTERVAL='{value}' is not a number of seconds"):
        progress_lines.interval()


def test_the_interval_defaults_and_zero_means_every_batch(monkeypatch):
    monkeypatch.delenv(progress_lines.INTERVAL_VARIABLE, raising=False)
    assert progress_lines.interval() == progress_lines.DEFAULT_INTERVAL
    monkeypatch.setenv(progress_lines.INTERVAL_VARIABLE, "0")
    assert progress_lines.interval() == 0


def _figure(page: str, caption: str) -> str:
    found = re.search(r"<figure><figcaption>" + re.escape(caption) + r"</figcaption>.*?</figure>", page, re.S)
    assert found, caption
    return found[0]


def test_throughput_is_drawn_over_time_one_chart_per_kind_and_a_line_per_subscription():
    at = [T0 + timedelta(minutes=m) for m in (0, 10, 20, 30)]
    runs = [
        _run(1, "snapshot", rows_copied=1000, finished_at=at[0]),
        _run(2, "distribution", subscriber="a", commands=20, finished_at=at[1]),
        _run(3, "distribution", subscriber="b", commands=80, finished_at=at[2]),
        _run(4, "distribution", subscriber="a", commands=40, finished_at=at[3]),
    ]
    page = render(ReportData("t", T0, runs=runs))
    delivered = _figure(page, "Delivered commands per second, per subscription")
    snapshot = _figure(page, "Snapshot Agent: rows copied per second")
    assert "rows" not in delivered and "500 /s" in snapshot and "40 /s" in delivered  # apart: own axes
    lines = re.findall(r"<g class='series s\d'><title>(.*?)</title>\s*<polyline points='(.*?)'/>", delivered)
    assert {name for name, _ in lines} == {"p / a", "p / b"}
    a_points = [tuple(map(float, xy.split(","))) for xy in dict(lines)["p / a"].split()]
    b_x = float(dict(lines)["p / b"].split(",")[0])
    assert len(a_points) == 2 and a_points[0][0] < b_x < a_points[1][0]  # x is time: b's run between a's two
    assert a_points[1][1] < a_points[0][1]  # a faster run is drawn higher (smaller y)
    assert _time_labels(delivered) == ["2026-11-23 13:10:00+00:00", "2026-11-23 13:30:00+00:00"]


def test_a_large_throughput_axis_label_fits_the_left_margin():
    # a snapshot of 162,000 rows in 0.96 s: the label "168935.5 /s" was wider than the 60 px
    # margin and the page showed "68935.5 /s" above "84467.7 /s"
    runs = [_run(1, "snapshot", rows_copied=337871, finished_at=T0)]
    snapshot = _figure(render(ReportData("t", T0, runs=runs)), "Snapshot Agent: rows copied per second")
    labels = re.findall(r"text-anchor='end'>([^<]*/s)</text>", snapshot)
    assert labels == ["0 /s", "84k /s", "169k /s"]
    assert all(len(label) <= 8 for label in labels)


def _time_labels(figure: str) -> list[str]:
    return re.findall(r"text-anchor='(?:start|end|middle)'>(2026-[^<]*)</text>", figure)


def test_a_run_that_left_a_backlog_behind_is_not_drawn_as_a_clean_success():
    runs = [
        _run(1, "distribution", subscriber="s", commands=0, transactions=0, backlog={"transactions": 3, "commands": 3}),
        _run(2, "distribution", subscriber="s", commands=6, transactions=2, left={"transactions": 1, "commands": 2}),
        _run(3, "distribution", subscriber="s", commands=6, transactions=3, backlog={"transactions": 3, "commands": 6}),
    ]
    page = render(ReportData("t", T0, runs=runs))
    circles = re.findall(r"<circle class='(\w+)'[^>]*><title>run (\d) \((.*?)\)", page)
    assert {run: (css, status) for css, run, status in circles} == {
        "1": ("warn", "succeeded, 3 transactions left pending"),  # delivered 0 of 3 pending
        "2": ("warn", "succeeded, 1 transactions left pending"),
        "3": ("ok", "succeeded"),
    }
    cells = re.findall(r"<td class='(\w+)'>(succeeded[^<]*)</td>", page)
    assert cells == [
        ("ok", "succeeded"),
        ("warn", "succeeded, 1 transactions left pending"),
        ("warn", "succeeded, 3 transactions left pending"),
    ]
    backlog_bars = re.findall(
        r"<rect class='(\w+)'", _figure(page, "Backlog at the start of recent Distribution Agent runs")
    )
    assert backlog_bars == ["warn", "ok"]  # runs 1 and 3 kept their backlog at start
