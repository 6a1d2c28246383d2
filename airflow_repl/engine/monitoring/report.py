"""The data of ``airflow-repl report``, one self-contained HTML page of a topology's replication
(the status table, backlog and throughput of recent runs as charts, conflicts and errors).

:func:`collect` reads the distribution database (it changes nothing and takes no agent lock);
:mod:`airflow_repl.presentation.report_html` makes the page from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from airflow_repl.engine.model.topology import Topology
from airflow_repl.engine.monitoring import status
from airflow_repl.engine.postgres import connections
from airflow_repl.engine.state import dist_conflicts, progress

#: How many recent runs, conflicts and errors the page shows.
RECENT = 50


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


def collect(topology: Topology, publication: str | None = None, title: str = "topology") -> ReportData:
    """The report's data for ``publication`` (every publication: None)."""
    rows = status.subscription_status(topology, publication)  # an unknown publication -> TopologyError
    with connections.connect(topology.distributor.require("distributor"), "distributor") as dist:
        runs = progress.recent_runs(dist, publication, RECENT)
        conflicts = dist_conflicts.list_conflicts(dist, publication=publication)[-RECENT:]
        errors = progress.recent_errors(dist, publication, RECENT)
    name = f"{title}, publication {publication}" if publication else title
    return ReportData(name, datetime.now(timezone.utc), [r.to_json() for r in rows], runs, conflicts, errors)
