"""The HTML page of ``airflow-repl report``: one self-contained page (inline CSS, inline SVG
charts; no script, font, image or style sheet from the network) made by the Jinja2 templates
beside this module (``templates/report.html.j2``, its tables and charts in
``templates/parts.html.j2``).

Owns the page's layout: summary, status table (the rows of
:mod:`~airflow_repl.presentation.status_rows`, as ``airflow-repl status`` shows them), charts
(backlog per subscription, backlog at the start of recent Distribution Agent runs, and, over
time, one chart per kind of throughput: delivered commands/s per subscription, Log Reader
commands/s, snapshot rows/s), recent runs, conflicts and errors.  A Distribution Agent run that
left a backlog behind is drawn as a warning, not a clean success.  :mod:`airflow_repl.engine.monitoring.report` reads
the data; :func:`write` reads it and writes the page.

Every value the templates write is escaped: autoescape is on, and the environment's ``finalize``
escapes each value as :func:`html.escape` does (quotes too, ``'`` as ``&#x27;``) before it
reaches the page.
"""

from __future__ import annotations

import dataclasses
import html
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from airflow_repl.engine.errors import ReplError
from airflow_repl.engine.model.topology import Topology
from airflow_repl.engine.monitoring import report
from airflow_repl.engine.monitoring.report import ReportData
from airflow_repl.presentation.status_rows import COLUMNS, CONFLICT_COLUMNS, Cell, StatusRow, run_state

__all__ = ["ReportData", "bar_chart", "render", "time_chart", "write"]

#: How much of a last error's message the status table shows (the errors table has it whole).
ERROR_WIDTH = 240


def _escaped(value: Any) -> Markup:
    """A value as the page writes it: None as nothing, the rest as escaped text; a part the
    templates made already (a macro's output) as it is."""
    if isinstance(value, Markup):
        return value
    return Markup(html.escape("" if value is None else str(value)))


_TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("airflow_repl.presentation", "templates"),
    autoescape=True,
    finalize=_escaped,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


@dataclass(frozen=True)
class Table:
    headers: Sequence[str]
    rows: list[list[Cell]]
    empty: str  # said instead of an empty table


@dataclass(frozen=True)
class Bar:
    """One bar of a chart, placed."""

    label: str
    state: str  # its CSS class
    tip: str
    top: int  # its row's y
    length: str
    value_x: str  # where the value's text starts, after the bar
    value: str


@dataclass(frozen=True)
class Chart:
    caption: str
    unit: str
    bars: list[Bar]
    width: int = 560
    label_width: int = 170
    row: int = 20
    value_width: int = 90

    @property
    def height(self) -> int:
        return self.row * len(self.bars) + 6


@dataclass(frozen=True)
class Point:
    """One run on a chart over time, placed."""

    x: str
    y: str
    state: str  # its CSS class: ok, warn (it left a backlog behind), bad, run
    tip: str


@dataclass(frozen=True)
class Series:
    name: str
    css: str  # its line's CSS class (s0, s1, ...)
    points: list[Point]

    @property
    def path(self) -> str:
        return " ".join(f"{p.x},{p.y}" for p in self.points)


@dataclass(frozen=True)
class TimeChart:
    """A chart over time: x the time a run ended, y its throughput; one series per line."""

    caption: str
    series: list[Series]
    x_ticks: list[tuple[str, str, str]]  # (x, label, text-anchor)
    y_ticks: list[tuple[str, str]]  # (y, label)
    width: int = 560
    height: int = 210
    left: int = 64
    right: int = 14
    top: int = 10
    bottom: int = 40

    @property
    def base(self) -> int:
        return self.height - self.bottom


#: The most series a chart over time draws (the busiest subscriptions; the rest are left out).
MOST_SERIES = 8


def write(
    topology: Topology, path: Path | None, publication: str | None = None, title: str = "topology", fmt: str = "html"
) -> ReportData:
    """Write the page (``fmt`` html) or the data it shows (json) to ``path``, or print it when
    ``path`` is None (a missing folder is refused before anything is read)."""
    if path is not None and not path.parent.is_dir():
        raise ReplError(f"cannot write the report to {str(path)!r}: folder {str(path.parent)!r} does not exist")
    data = report.collect(topology, publication, title)
    text = render(data) if fmt == "html" else to_json(data) + "\n"
    if path is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        path.write_text(text, encoding="utf-8")
    return data


def to_json(data: ReportData) -> str:
    """The report's data as JSON: title, generated_at, status, runs, conflicts, errors."""
    return json.dumps(dataclasses.asdict(data), indent=2, default=str)


def render(data: ReportData) -> str:
    """The whole page."""
    rows = [StatusRow.from_json(s) for s in data.status]
    failed = sum(1 for row in rows if row.failed)
    cards = [
        ("subscriptions", len(rows), False),
        ("pending transactions", sum(row.pending_transactions for row in rows), False),
        ("subscriptions whose last run failed or was blocked", failed, failed > 0),
        ("conflicts", len(data.conflicts), False),
        ("errors", len(data.errors), len(data.errors) > 0),
    ]
    page = _TEMPLATES.get_template("report.html.j2").render(
        title=f"airflow-repl report: {data.title}",
        generated_at=_time(data.generated_at),
        cards=cards,
        status=Table(
            COLUMNS,
            [row.cells(_time, ERROR_WIDTH) for row in rows],
            "no subscriptions in the distribution database",
        ),
        charts=[_backlog_chart(rows), _backlog_runs_chart(data.runs)],
        time_charts=_throughput_charts(data.runs),
        runs=_runs_table(data.runs),
        conflicts=_conflicts_table(data.conflicts),
        errors=_errors_table(data.errors),
    )
    return page + "\n"


def bar_chart(caption: str, bars: list[tuple[str, float, str, str]], unit: str) -> str:
    """A horizontal bar chart as an inline SVG figure (``role='img'``, labelled by ``caption``);
    ``bars``: (label, value, CSS class, tooltip)."""
    return str(_TEMPLATES.get_template("parts.html.j2").module.bar_chart(_chart(caption, bars, unit)))  # type: ignore[attr-defined]


def time_chart(caption: str, series: dict[str, list[tuple[datetime, float, str, str]]], unit: str) -> str:
    """A chart over time as an inline SVG figure; ``series``: name -> (time, value, CSS class,
    tooltip) of each point."""
    return str(_TEMPLATES.get_template("parts.html.j2").module.time_chart(_time_chart(caption, series, unit)))  # type: ignore[attr-defined]


# ---------------------------------------------------------------------- text of the cells
def _text(value: Any) -> str:
    """A value as a cell shows it (None: an empty cell)."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        return _time(value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str, sort_keys=True)
    return str(value)


def _time(value: datetime | str | None) -> str:
    """``2026-11-23 13:00:05+00:00``: a time (or its ISO text) to the second."""
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value).isoformat(sep=" ", timespec="seconds")
        except ValueError:
            return value
    return value.isoformat(sep=" ", timespec="seconds") if value is not None else ""


# ---------------------------------------------------------------------- tables
def _runs_table(runs: list[dict[str, Any]]) -> Table:
    headers = ["run", "agent", "publication", "subscriber", "started", "seconds", "status"]
    headers += ["transactions", "commands", "rows copied", "message"]
    rows = [
        [
            Cell(_text(r["run_id"]), "n"),
            Cell(_text(r["agent"])),
            Cell(_text(r["publication"])),
            Cell(_text(r["subscriber"])),
            Cell(_text(r["started_at"])),
            Cell(_seconds_text(r), "n"),
            Cell(_status_text(r), _run_look(r)),
            Cell(_text(r["transactions"]), "n"),
            Cell(_text(r["commands"]), "n"),
            Cell(_text(r["rows_copied"]), "n"),
            Cell(_text(r["message"])),
        ]
        for r in reversed(runs)
    ]
    return Table(headers, rows, "no agent runs recorded")


def _conflicts_table(conflicts: list[dict[str, Any]]) -> Table:
    rows = [[Cell(_text(c.get(k))) for _, k in CONFLICT_COLUMNS] for c in reversed(conflicts)]
    return Table([h for h, _ in CONFLICT_COLUMNS], rows, "no conflicts recorded")


def _errors_table(errors: list[dict[str, Any]]) -> Table:
    headers = ["occurred", "agent", "publication", "subscriber", "article", "xact_seqno", "sqlstate", "message"]
    keys = ["occurred_at", "agent", "publication", "subscriber", "article", "xact_seqno", "sqlstate"]
    rows = [[Cell(_text(e.get(k))) for k in keys] + [Cell(_error_text(e), "bad")] for e in errors]
    return Table(headers, rows, "no errors recorded")


def _left_behind(run: dict[str, Any]) -> int:
    """How many transactions a Distribution Agent run left undelivered: its ``backlog_at_end``,
    or (a run recorded before it kept one) its backlog at start less what it delivered."""
    end, start = run.get("backlog_at_end"), run.get("backlog_at_start")
    if isinstance(end, dict):
        return int(end.get("transactions") or 0)
    if isinstance(start, dict):
        return max(0, int(start.get("transactions") or 0) - int(run.get("transactions") or 0))
    return 0


def _run_look(run: dict[str, Any]) -> str:
    """A run's CSS class: its outcome's (:func:`run_state`), but a warning for a run that
    succeeded and left a backlog behind."""
    state = run_state(run["status"])
    return "warn" if state == "ok" and run["agent"] == "distribution" and _left_behind(run) else state


def _status_text(run: dict[str, Any]) -> str:
    left = _left_behind(run) if run["agent"] == "distribution" and run_state(run["status"]) == "ok" else 0
    return f"{run['status']}, {left} transactions left pending" if left else _text(run["status"])


def _error_text(error: dict[str, Any]) -> str:
    return ("(skipped) " if error.get("skipped") else "") + str(error.get("message") or "")


def _seconds(run: dict[str, Any]) -> float | None:
    start, end = run.get("started_at"), run.get("finished_at")
    if not isinstance(start, datetime) or not isinstance(end, datetime):
        return None
    return max(0.0, (end - start).total_seconds())


def _seconds_text(run: dict[str, Any]) -> str:
    seconds = _seconds(run)
    return f"{seconds:.1f}" if seconds is not None else ""


# ---------------------------------------------------------------------- charts (inline SVG)
def _chart(caption: str, bars: list[tuple[str, float, str, str]], unit: str) -> Chart:
    """The chart's bars placed: one row each, lengths proportional to the largest value."""
    chart = Chart(caption, unit, [])
    top = max((b[1] for b in bars), default=0.0) or 1.0
    span = chart.width - chart.label_width - chart.value_width
    placed = []
    for i, (label, value, css, tip) in enumerate(bars):
        length = span * value / top
        x = f"{chart.label_width + length + 4:.1f}"
        placed.append(Bar(label[:28], css, tip, 3 + i * chart.row, f"{length:.1f}", x, _number(value)))
    return Chart(caption, unit, placed)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.1f}"


def _axis_number(value: float) -> str:
    """An axis label short enough for the chart's left margin: 168935.5 is ``169k``."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= 10 * size:
            return f"{value / size:.0f}{suffix}"
    return _number(value)


def _backlog_chart(rows: list[StatusRow]) -> Chart:
    bars = [
        (
            f"{r.publication} / {r.subscriber}",
            float(r.pending_transactions),
            "q",
            f"{r.pending_transactions} transactions, {r.pending_commands} commands pending",
        )
        for r in rows
    ]
    return _chart("Backlog now (pending transactions per subscription)", bars, "tx")


def _backlog_runs_chart(runs: list[dict[str, Any]]) -> Chart:
    bars = [
        (
            f"#{r['run_id']} {r['subscriber'] or ''}",
            float(r["backlog_at_start"]["transactions"]),
            _run_look(r) or "q",
            f"run {r['run_id']} ({_status_text(r)}), {_time(r['started_at'])}: "
            f"{r['backlog_at_start']['transactions']} transactions pending at its start, {r['transactions']} delivered",
        )
        for r in runs
        if r["agent"] == "distribution" and isinstance(r.get("backlog_at_start"), dict)
    ]
    return _chart("Backlog at the start of recent Distribution Agent runs", bars[-15:], "tx")


def _throughput_charts(runs: list[dict[str, Any]]) -> list[TimeChart]:
    """One chart over time per kind of throughput: delivered commands/s (a line per
    subscription), Log Reader commands/s, snapshot rows/s."""
    kinds = [
        ("distribution", "commands", "Delivered commands per second, per subscription", "/s"),
        ("logreader", "commands", "Log Reader: commands read per second", "/s"),
        ("snapshot", "rows_copied", "Snapshot Agent: rows copied per second", "/s"),
    ]
    charts = []
    for agent, amount_key, caption, unit in kinds:
        series: dict[str, list[tuple[datetime, float, str, str]]] = {}
        for r in runs:
            seconds, end = _seconds(r), r.get("finished_at")
            if r["agent"] != agent or not seconds or not isinstance(end, datetime):
                continue
            amount = int(r[amount_key] or 0)
            if agent == "snapshot" and not amount:
                continue  # a snapshot that initialized nothing copied nothing: no throughput to show
            tip = f"run {r['run_id']} ({_status_text(r)}), ended {_time(end)}: {amount} "
            tip += f"{'rows' if agent == 'snapshot' else 'commands'} in {seconds:.1f}s"
            name = f"{r['publication']} / {r['subscriber']}" if agent == "distribution" else str(r["publication"])
            series.setdefault(name, []).append((end, amount / seconds, _run_look(r) or "q", tip))
        charts.append(_time_chart(caption, series, unit))
    return charts


def _time_chart(caption: str, series: dict[str, list[tuple[datetime, float, str, str]]], unit: str) -> TimeChart:
    """The points placed: x by time between the first and the last, y from 0 to the largest
    value; the busiest :data:`MOST_SERIES` series, each sorted by time."""
    chart = TimeChart(caption, [], [], [])
    kept = sorted(series.items(), key=lambda item: -sum(p[1] for p in item[1]))[:MOST_SERIES]
    points = [p for _, ps in kept for p in ps]
    if not points:
        return chart
    first, last = min(p[0] for p in points), max(p[0] for p in points)
    span = (last - first).total_seconds() or 1.0
    top = max(p[1] for p in points) or 1.0
    plot_w, plot_h = chart.width - chart.left - chart.right, chart.base - chart.top

    def x(at: datetime) -> float:
        if last == first:
            return chart.left + plot_w / 2
        return chart.left + plot_w * (at - first).total_seconds() / span

    def y(value: float) -> float:
        return chart.base - plot_h * value / top

    placed = [
        Series(
            name[:60],
            f"s{i}",
            [Point(f"{x(at):.1f}", f"{y(v):.1f}", css, tip) for at, v, css, tip in sorted(ps, key=lambda p: p[0])],
        )
        for i, (name, ps) in enumerate(kept)
    ]
    if last == first:
        x_ticks = [(f"{x(first):.1f}", _time(first), "middle")]
    else:
        x_ticks = [(f"{x(first):.1f}", _time(first), "start"), (f"{x(last):.1f}", _time(last), "end")]
    y_ticks = [(f"{y(v):.1f}", f"{_axis_number(v)} {unit}") for v in (0.0, top / 2, top)]
    return TimeChart(caption, placed, x_ticks, y_ticks)
