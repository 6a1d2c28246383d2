"""One subscription's status as both outputs show it: the text table of ``airflow-repl status``
(:mod:`~airflow_repl.presentation.status_table`) and the status table of the HTML report
(:mod:`~airflow_repl.presentation.report_html`).

A :class:`StatusRow` is made from the status record both outputs get
(:meth:`~airflow_repl.engine.monitoring.status.SubscriptionStatus.to_json`), and gives its cells in
the order of :data:`COLUMNS`, each with its state: which run is failed (the engine's rule,
:func:`~airflow_repl.engine.monitoring.status.run_failed`), which subscription is no longer active,
which cell is a number.  The outputs differ only in how a time is written and how much of the
last error is shown.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from airflow_repl.engine.monitoring.status import run_failed

#: The columns of both tables.
COLUMNS = (
    "publication",
    "subscriber",
    "status",
    "pending tx",
    "pending cmds",
    "lag s",
    "delivered",
    "commit time",
    "distribution",
    "logreader",
    "last error",
    "expires at",
)

#: The conflicts table of ``airflow-repl conflicts`` and of the report: (header, record key).
CONFLICT_COLUMNS = (
    ("detected", "detected_at"),
    ("publication", "publication"),
    ("subscriber", "subscriber"),
    ("article", "article"),
    ("key", "key"),
    ("kind", "kind"),
    ("policy", "policy"),
    ("outcome", "outcome"),
    ("agent", "agent"),
)

#: A run's state by its outcome, besides failed (the CSS classes of the report's cells and bars).
_RUN_STATES = {"succeeded": "ok", "running": "run", "abandoned": "warn", "paused": "warn"}


#: A subscription's state cell by its status: active is well, paused is a warning (it was asked
#: for, and its backlog waits), every other status a problem.
_STATUS_STATES = {"active": "ok", "paused": "warn"}


def run_state(outcome: str) -> str:
    """A run's state: ``bad`` when it failed, ``ok``, ``run``, ``warn`` or nothing."""
    return "bad" if run_failed(outcome) else _RUN_STATES.get(outcome, "")


def cut(text: str, most: int) -> str:
    """``text`` on one line (runs of white space as one space), cut to ``most`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= most else text[: most - 1] + "…"


@dataclass(frozen=True)
class Cell:
    """One cell: its text and its state (``ok``, ``bad``, ``run``, ``warn``; ``n``: a number)."""

    text: str
    state: str = ""


@dataclass(frozen=True)
class LastRun:
    outcome: str
    finished_at: datetime | None


@dataclass(frozen=True)
class StatusRow:
    """One subscription (see the module)."""

    publication: str
    subscriber: str
    status: str
    pending_transactions: int
    pending_commands: int
    delivered: str | None
    commit_time: datetime | None
    distribution: LastRun | None
    logreader: LastRun | None
    error_at: datetime | None
    error: str | None
    expires_at: datetime | None
    warning: str | None = None  # its expiry nears
    lag_seconds: float | None = None  # age of its oldest undelivered transaction (0: caught up)

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> StatusRow:
        """The row of one status record (``SubscriptionStatus.to_json()``)."""
        runs = record["last_runs"]
        error = record.get("last_error")
        return cls(
            record["publication"],
            record["subscriber"],
            record["status"],
            record["backlog"]["transactions"],
            record["backlog"]["commands"],
            record["delivered"]["xact_seqno"],
            _datetime(record["delivered"]["commit_time"]),
            _last_run(runs["distribution"]),
            _last_run(runs["logreader"]),
            _datetime(error["at"]) if error else None,
            (error["message"] or "") if error else None,
            _datetime(record.get("expires_at")),
            record.get("warning"),
            (record.get("lag") or {}).get("seconds"),
        )

    @property
    def failed(self) -> bool:
        """Whether the last run of an agent serving the subscription failed."""
        return any(run is not None and run_failed(run.outcome) for run in (self.distribution, self.logreader))

    def cells(self, time: Callable[[datetime], str], error_width: int) -> list[Cell]:
        """The row's cells in the order of :data:`COLUMNS`: times written by ``time``, the last
        error's message cut to ``error_width`` characters."""

        def at(value: datetime | None) -> str:
            return time(value) if value is not None else "-"

        def run_cell(run: LastRun | None) -> Cell:
            if run is None:
                return Cell("never")
            text = f"{run.outcome} {time(run.finished_at)}" if run.finished_at is not None else run.outcome
            return Cell(text, run_state(run.outcome))

        error = Cell("-")
        if self.error is not None:
            error = Cell(f"{at(self.error_at)} {cut(self.error, error_width)}".rstrip(), "bad")
        return [
            Cell(self.publication),
            Cell(self.subscriber),
            Cell(self.status, _STATUS_STATES.get(self.status, "bad")),
            Cell(str(self.pending_transactions), "n"),
            Cell(str(self.pending_commands), "n"),
            Cell("-" if self.lag_seconds is None else f"{round(self.lag_seconds, 1):g}", "n"),
            Cell(self.delivered or "-"),
            Cell(at(self.commit_time)),
            run_cell(self.distribution),
            run_cell(self.logreader),
            error,
            Cell(at(self.expires_at)),
        ]


def _datetime(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def _last_run(run: dict[str, Any] | None) -> LastRun | None:
    return LastRun(run["status"], _datetime(run.get("finished_at"))) if run else None
