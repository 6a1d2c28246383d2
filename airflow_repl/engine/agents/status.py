"""Status at a glance (``airflow-repl status``): per subscription, its state at the
distributor, backlog, delivered watermark, the last run of the agents that serve it, its last
error and when it would expire under the publication's maximum retention.

:func:`subscription_status` reads the distributor; :func:`format_table`, :func:`problems` and
:meth:`SubscriptionStatus.to_json` are pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from airflow_repl.engine.model.topology import Topology
from airflow_repl.engine.postgres import connections
from airflow_repl.engine.state import dist_schema, progress

#: A run with one of these outcomes makes ``status`` exit non-zero.
FAILED_RUNS = frozenset({"failed"})


@dataclass(frozen=True)
class SubscriptionStatus:
    """One subscription's status (see the module)."""

    sub: progress.SubscriptionRow
    distribution: progress.LastRun | None
    logreader: progress.LastRun | None
    last_error: tuple[datetime, str] | None
    expires_at: datetime | None  # None: nothing waits for it, or it expired already

    def to_json(self) -> dict[str, Any]:
        s = self.sub
        return {
            "publication": s.publication,
            "subscriber": s.subscriber,
            "status": s.status,
            "backlog": {"transactions": s.backlog_transactions, "commands": s.backlog_commands},
            "delivered": {"xact_seqno": s.delivered_xact_seqno, "commit_time": _iso(s.delivered_commit_time)},
            "last_runs": {"distribution": _run(self.distribution), "logreader": _run(self.logreader)},
            "last_error": {"at": _iso(self.last_error[0]), "message": self.last_error[1]} if self.last_error else None,
            "expires_at": _iso(self.expires_at),
        }


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _run(run: progress.LastRun | None) -> dict[str, Any] | None:
    if run is None:
        return None
    return {"status": run.status, "finished_at": _iso(run.finished_at), "message": run.message}


def expires_at(row: progress.SubscriptionRow, max_retention_hours: float) -> datetime | None:
    """When the cleanup would expire an active subscription (both its last synchronization and
    its oldest waiting transaction older than the maximum retention); None when nothing waits."""
    if row.status != "active" or row.waiting_since is None:
        return None
    limit = timedelta(hours=max_retention_hours)
    return max(row.last_sync or row.waiting_since, row.waiting_since) + limit


def subscription_status(topology: Topology, publication: str | None = None) -> list[SubscriptionStatus]:
    """The status of every subscription of ``publication`` (all publications: None)."""
    if publication is not None:
        topology.publication(publication)  # an unknown publication -> TopologyError
    with connections.connect(topology.distributor.require("distributor"), "distributor") as dist:
        dist_schema.require_deployed(dist)
        result = []
        for row in progress.subscription_rows(dist, publication):
            pub = topology.publications.get(row.publication)
            result.append(
                SubscriptionStatus(
                    row,
                    progress.last_run(dist, "distribution", row.publication, row.subscriber),
                    progress.last_run(dist, "logreader", row.publication, None),
                    progress.last_error(dist, row.publication, row.subscriber),
                    expires_at(row, pub.max_retention_hours) if pub is not None else None,
                )
            )
        return result


def problems(rows: list[SubscriptionStatus], max_pending: int | None) -> list[str]:
    """Why ``status`` fails, one phrase per subscription: a failed last run or a backlog above ``max_pending``."""
    found = []
    for r in rows:
        name = f"{r.sub.subscriber!r} of publication {r.sub.publication!r}"
        for agent, run in (("Distribution Agent", r.distribution), ("Log Reader", r.logreader)):
            if run is not None and run.status in FAILED_RUNS:
                found.append(
                    f"{name}: the {agent}'s last run failed ({' '.join((run.message or 'no message').split())})"
                )
        if max_pending is not None and r.sub.backlog_transactions > max_pending:
            found.append(
                f"{name}: {r.sub.backlog_transactions} transactions pending, above --max-pending {max_pending}"
            )
    return found


_HEADER = (
    "publication",
    "subscriber",
    "status",
    "pending tx",
    "pending cmds",
    "delivered",
    "commit time",
    "distribution",
    "logreader",
    "last error",
    "expires at",
)


def format_table(rows: list[SubscriptionStatus]) -> str:
    """The status as a text table: a header and one row per subscription."""
    lines = [_HEADER] + [_cells(r) for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(_HEADER))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines)


def _cells(r: SubscriptionStatus) -> tuple[str, ...]:
    s = r.sub
    error = f"{_time(r.last_error[0])} {' '.join(r.last_error[1].split())[:60]}" if r.last_error else "-"
    return (
        s.publication,
        s.subscriber,
        s.status,
        str(s.backlog_transactions),
        str(s.backlog_commands),
        s.delivered_xact_seqno or "-",
        _time(s.delivered_commit_time),
        _run_cell(r.distribution),
        _run_cell(r.logreader),
        error,
        _time(r.expires_at),
    )


def _time(value: datetime | None) -> str:
    return value.isoformat(timespec="seconds") if value is not None else "-"


def _run_cell(run: progress.LastRun | None) -> str:
    return f"{run.status} {_time(run.finished_at)}" if run is not None else "never"
