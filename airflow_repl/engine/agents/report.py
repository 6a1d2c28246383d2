"""``airflow-repl report``: one self-contained HTML page of a topology's replication (the status
table, backlog and throughput of recent runs as charts, conflicts and errors).

:func:`collect` reads the distribution database (it changes nothing and takes no agent lock);
:func:`~airflow_repl.engine.agents.report_html.render` makes the page; :func:`write` does both.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from airflow_repl.engine.agents import status
from airflow_repl.engine.agents.report_html import ReportData, render
from airflow_repl.engine.errors import ReplError
from airflow_repl.engine.model.topology import Topology
from airflow_repl.engine.postgres import connections
from airflow_repl.engine.state import dist_conflicts, progress

#: How many recent runs, conflicts and errors the page shows.
RECENT = 50


def collect(topology: Topology, publication: str | None = None, title: str = "topology") -> ReportData:
    """The report's data for ``publication`` (every publication: None)."""
    rows = status.subscription_status(topology, publication)  # an unknown publication -> TopologyError
    with connections.connect(topology.distributor.require("distributor"), "distributor") as dist:
        runs = progress.recent_runs(dist, publication, RECENT)
        conflicts = dist_conflicts.list_conflicts(dist, publication=publication)[-RECENT:]
        errors = progress.recent_errors(dist, publication, RECENT)
    name = f"{title}, publication {publication}" if publication else title
    return ReportData(name, datetime.now(timezone.utc), [r.to_json() for r in rows], runs, conflicts, errors)


def write(topology: Topology, path: Path, publication: str | None = None, title: str = "topology") -> ReportData:
    """Write the page to ``path`` (refused, before anything is read, when its folder is missing)."""
    if not path.parent.is_dir():
        raise ReplError(f"cannot write the report to {str(path)!r}: folder {str(path.parent)!r} does not exist")
    data = collect(topology, publication, title)
    path.write_text(render(data), encoding="utf-8")
    return data
