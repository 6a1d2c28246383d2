"""The text table of ``airflow-repl status``: a header line and one line per subscription, its
cells those of :class:`~airflow_repl.presentation.status_rows.StatusRow`, laid out by
``tabulate``."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from tabulate import tabulate

from airflow_repl.engine.monitoring.status import SubscriptionStatus
from airflow_repl.presentation.status_rows import COLUMNS, CONFLICT_COLUMNS, StatusRow

#: How much of a last error's message the table shows (the JSON has it whole).
ERROR_WIDTH = 60


def format_table(rows: list[SubscriptionStatus]) -> str:
    """The status as a text table: a header and one row per subscription, then a line per
    warning (``warning: ...``)."""
    lines = [list(COLUMNS)]
    status_rows = [StatusRow.from_json(row.to_json()) for row in rows]
    for row in status_rows:
        lines.append([cell.text for cell in row.cells(_time, ERROR_WIDTH)])
    # the header as the first row: tabulate pads the columns of a table with headers by two more
    table = tabulate(lines, tablefmt="plain", disable_numparse=True, stralign="left")
    warnings = [f"warning: {' '.join(r.warning.split())}" for r in status_rows if r.warning]
    return "\n".join([line.rstrip() for line in table.splitlines()] + warnings)


def format_conflicts(conflicts: list[dict[str, Any]]) -> str:
    """The conflicts as a text table, oldest first: a header and one line per conflict (names
    with line breaks or other characters that are not printable shown escaped, on one line)."""
    if not conflicts:
        return "no conflicts recorded"
    lines = [[h for h, _ in CONFLICT_COLUMNS]]
    for conflict in conflicts:
        lines.append([_cell(conflict.get(key)) for _, key in CONFLICT_COLUMNS])
    table = tabulate(lines, tablefmt="plain", disable_numparse=True, stralign="left")
    return "\n".join(line.rstrip() for line in table.splitlines())


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        text = _time(value)
    elif isinstance(value, dict | list):
        text = json.dumps(value, default=str, sort_keys=True, ensure_ascii=False)
    else:
        text = str(value)
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _time(value: datetime) -> str:
    return value.isoformat(timespec="seconds")
