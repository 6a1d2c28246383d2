"""The HTML page of ``airflow-repl report``: a pure function from the report's data to one
self-contained page (inline CSS, inline SVG charts; no script, font, image or style sheet from
the network), every value escaped with :func:`html.escape`.

Owns the page's layout: summary, status table, charts (backlog per subscription, backlog at the
start of recent Distribution Agent runs, throughput of recent runs), recent runs, conflicts and
errors.  :mod:`~airflow_repl.engine.agents.report` reads the data.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

#: Bar colours by run outcome (CSS classes of the bars).
_CLASSES = {"succeeded": "ok", "failed": "bad", "running": "run", "abandoned": "warn"}

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#1f2933;background:#f7f9fb}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}p.meta{color:#52606d;margin:0 0 16px}
.cards{display:flex;gap:12px;flex-wrap:wrap}.card{background:#fff;border:1px solid #d9e2ec;border-radius:6px;
padding:10px 16px;min-width:120px}.card b{display:block;font-size:22px}.card.bad b{color:#c62828}
table{border-collapse:collapse;background:#fff;font-size:13px;width:100%}
th,td{border:1px solid #d9e2ec;padding:4px 8px;text-align:left;vertical-align:top}th{background:#eef2f7}
td.n{text-align:right;font-variant-numeric:tabular-nums}td.bad,span.bad{color:#c62828;font-weight:600}
td.ok{color:#2e7d32}.charts{display:flex;gap:16px;flex-wrap:wrap}
figure{background:#fff;border:1px solid #d9e2ec;border-radius:6px;margin:0;padding:8px}
figcaption{font-size:13px;font-weight:600;margin-bottom:4px}svg text{font-size:11px;fill:#1f2933}
rect.ok{fill:#4c9f70}rect.bad{fill:#d64545}rect.run{fill:#3f7fbf}rect.warn{fill:#e0a030}rect.q{fill:#3f7fbf}
p.none{color:#52606d;font-style:italic}
"""


@dataclass(frozen=True)
class ReportData:
    """What the page shows: the status of every subscription (``SubscriptionStatus.to_json()``
    dicts), recent runs (``progress.recent_runs``), conflicts (``dist_conflicts.list_conflicts``) and
    errors (``progress.recent_errors``)."""

    title: str
    generated_at: datetime
    status: list[dict[str, Any]] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    conflicts: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)


def render(data: ReportData) -> str:
    """The whole page."""
    title = f"airflow-repl report: {data.title}"
    body = "".join(
        [
            f"<h1>{_e(title)}</h1><p class='meta'>generated at {_e(_time(data.generated_at))}</p>",
            _cards(data),
            "<h2>Subscriptions</h2>",
            _status_table(data.status),
            "<h2>Backlog and throughput</h2><div class='charts'>",
            _backlog_chart(data.status),
            _backlog_runs_chart(data.runs),
            _throughput_chart(data.runs),
            "</div><h2>Recent runs</h2>",
            _runs_table(data.runs),
            f"<h2>Conflicts ({len(data.conflicts)})</h2>",
            _conflicts_table(data.conflicts),
            f"<h2>Errors ({len(data.errors)})</h2>",
            _errors_table(data.errors),
        ]
    )
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>{body}</body></html>\n"
    )


# ---------------------------------------------------------------------- pieces
def _e(value: Any) -> str:
    """A value as escaped text (None: an empty cell)."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        return html.escape(_time(value))
    if isinstance(value, (dict, list)):
        return html.escape(json.dumps(value, default=str, sort_keys=True))
    return html.escape(str(value))


def _time(value: datetime | str | None) -> str:
    """``2026-11-23 13:00:05+00:00``: a time (or its ISO text) to the second."""
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value).isoformat(sep=" ", timespec="seconds")
        except ValueError:
            return value
    return value.isoformat(sep=" ", timespec="seconds") if value is not None else ""


def _cards(data: ReportData) -> str:
    pending = sum(s["backlog"]["transactions"] for s in data.status)
    failed = sum(1 for s in data.status if _failed(s))
    cards = [
        ("subscriptions", len(data.status), False),
        ("pending transactions", pending, False),
        ("subscriptions whose last run failed", failed, failed > 0),
        ("conflicts", len(data.conflicts), False),
        ("errors", len(data.errors), len(data.errors) > 0),
    ]
    items = "".join(f"<div class='card{' bad' if bad else ''}'><b>{n}</b>{_e(label)}</div>" for label, n, bad in cards)
    return f"<div class='cards'>{items}</div>"


def _failed(status: dict[str, Any]) -> bool:
    runs = status.get("last_runs") or {}
    return any((r or {}).get("status") == "failed" for r in runs.values())


def _table(headers: Iterable[str], rows: list[list[tuple[Any, str]]], empty: str) -> str:
    """A table of (value, css class) cells; ``empty`` when there are no rows."""
    if not rows:
        return f"<p class='none'>{_e(empty)}</p>"
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td class='{c}'>{_e(v)}</td>" if c else f"<td>{_e(v)}</td>" for v, c in row) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _run_cell(run: dict[str, Any] | None) -> tuple[str, str]:
    if not run:
        return "never", ""
    return f"{run['status']} {_time(run.get('finished_at'))}".strip(), _CLASSES.get(run["status"], "")


def _status_table(status: list[dict[str, Any]]) -> str:
    headers = ["publication", "subscriber", "status", "pending tx", "pending cmds", "delivered", "commit time"]
    headers += ["distribution", "logreader", "last error", "expires at"]
    rows = []
    for s in status:
        error = s.get("last_error") or {}
        rows.append(
            [
                (s["publication"], ""),
                (s["subscriber"], ""),
                (s["status"], "ok" if s["status"] == "active" else "bad"),
                (s["backlog"]["transactions"], "n"),
                (s["backlog"]["commands"], "n"),
                (s["delivered"]["xact_seqno"] or "-", ""),
                (_time(s["delivered"]["commit_time"]) or "-", ""),
                _run_cell(s["last_runs"]["distribution"]),
                _run_cell(s["last_runs"]["logreader"]),
                (_cut(f"{_time(error.get('at'))} {error.get('message', '')}".strip()) or "-", "bad" if error else ""),
                (_time(s.get("expires_at")) or "-", ""),
            ]
        )
    return _table(headers, rows, "no subscriptions in the distribution database")


def _cut(text: str, most: int = 240) -> str:
    """Long text cut (the errors table has it whole)."""
    return text if len(text) <= most else text[: most - 1] + "…"


def _runs_table(runs: list[dict[str, Any]]) -> str:
    headers = ["run", "agent", "publication", "subscriber", "started", "seconds", "status"]
    headers += ["transactions", "commands", "rows copied", "message"]
    rows = [
        [
            (r["run_id"], "n"),
            (r["agent"], ""),
            (r["publication"], ""),
            (r["subscriber"] or "", ""),
            (r["started_at"], ""),
            (_seconds_text(r), "n"),
            (r["status"], _CLASSES.get(r["status"], "")),
            (r["transactions"], "n"),
            (r["commands"], "n"),
            (r["rows_copied"], "n"),
            (r["message"] or "", ""),
        ]
        for r in reversed(runs)
    ]
    return _table(headers, rows, "no agent runs recorded")


def _conflicts_table(conflicts: list[dict[str, Any]]) -> str:
    headers = ["detected", "publication", "subscriber", "article", "key", "kind", "policy", "outcome", "agent"]
    keys = ["detected_at", "publication", "subscriber", "article", "key", "kind", "policy", "outcome", "agent"]
    rows = [[(c.get(k), "") for k in keys] for c in reversed(conflicts)]
    return _table(headers, rows, "no conflicts recorded")


def _errors_table(errors: list[dict[str, Any]]) -> str:
    headers = ["occurred", "agent", "publication", "subscriber", "article", "xact_seqno", "sqlstate", "message"]
    keys = ["occurred_at", "agent", "publication", "subscriber", "article", "xact_seqno", "sqlstate"]
    rows = [[(e.get(k), "") for k in keys] + [(_error_text(e), "bad")] for e in errors]
    return _table(headers, rows, "no errors recorded")


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
#: One bar: its label, value, CSS class and tooltip.
Bar = tuple[str, float, str, str]


def bar_chart(caption: str, bars: list[Bar], unit: str) -> str:
    """A horizontal bar chart as an inline SVG figure (``role='img'``, labelled by ``caption``)."""
    if not bars:
        return f"<figure><figcaption>{_e(caption)}</figcaption><p class='none'>nothing to show yet</p></figure>"
    width, label_w, row, value_w = 560, 170, 20, 90
    top = max(b[1] for b in bars) or 1.0
    height = row * len(bars) + 6
    parts = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' role='img' "
        f"aria-label='{_e(caption)}' viewBox='0 0 {width} {height}'>"
    ]
    for i, (label, value, css, tip) in enumerate(bars):
        y = 3 + i * row
        length = (width - label_w - value_w) * value / top
        parts.append(
            f"<g><title>{_e(tip)}</title><text x='{label_w - 6}' y='{y + 13}' text-anchor='end'>{_e(label[:28])}</text>"
            f"<rect class='{css}' x='{label_w}' y='{y + 2}' width='{length:.1f}' height='{row - 5}'/>"
            f"<text x='{label_w + length + 4:.1f}' y='{y + 13}'>{_e(_number(value))} {_e(unit)}</text></g>"
        )
    parts.append("</svg>")
    return f"<figure><figcaption>{_e(caption)}</figcaption>{''.join(parts)}</figure>"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.1f}"


def _backlog_chart(status: list[dict[str, Any]]) -> str:
    bars = [
        (
            f"{s['publication']} / {s['subscriber']}",
            float(s["backlog"]["transactions"]),
            "q",
            f"{s['backlog']['transactions']} transactions, {s['backlog']['commands']} commands pending",
        )
        for s in status
    ]
    return bar_chart("Backlog now (pending transactions per subscription)", bars, "tx")


def _backlog_runs_chart(runs: list[dict[str, Any]]) -> str:
    bars = [
        (
            f"#{r['run_id']} {r['subscriber'] or ''}",
            float(r["backlog_at_start"]["transactions"]),
            _CLASSES.get(r["status"], "q"),
            f"run {r['run_id']} ({r['status']}), {_time(r['started_at'])}: "
            f"{r['backlog_at_start']['transactions']} transactions pending at its start, {r['transactions']} delivered",
        )
        for r in runs
        if r["agent"] == "distribution" and isinstance(r.get("backlog_at_start"), dict)
    ]
    return bar_chart("Backlog at the start of recent Distribution Agent runs", bars[-15:], "tx")


def _throughput_chart(runs: list[dict[str, Any]]) -> str:
    bars = []
    for r in runs:
        seconds = _seconds(r)
        amount = r["rows_copied"] if r["agent"] == "snapshot" else r["commands"]
        if not seconds or not amount:
            continue
        what = "rows" if r["agent"] == "snapshot" else "commands"
        bars.append(
            (
                f"#{r['run_id']} {r['agent']} {r['subscriber'] or ''}".strip(),
                amount / seconds,
                _CLASSES.get(r["status"], "q"),
                f"run {r['run_id']} ({r['status']}): {amount} {what} in {seconds:.1f}s",
            )
        )
    return bar_chart("Throughput of recent runs (commands or rows per second)", bars[-15:], "/s")
