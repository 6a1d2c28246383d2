"""Status at a glance (``airflow-repl status``): per subscription, its state at the
distributor (``paused`` for a paused active one), backlog, lag in seconds (and the latest tracer
token's latency per hop), delivered watermark, the last run of
the agents that serve it, how the Distribution Agent applies each article (``apply``), its last error and when it would expire under the publication's
maximum retention, with a warning once most of that retention has passed.

:func:`subscription_status` reads the distributor; :func:`problems`, :func:`run_failed` and
:meth:`SubscriptionStatus.to_json` are pure.  The text table and the HTML page are drawn from
the JSON by :mod:`airflow_repl.presentation`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from airflow_repl.engine.model.topology import Topology
from airflow_repl.engine.monitoring import tracer
from airflow_repl.engine.postgres import connections
from airflow_repl.engine.provisioning import pausing
from airflow_repl.engine.state import dist_history, dist_schema, progress

#: A run with one of these outcomes makes ``status`` exit non-zero (``blocked``: a run refused
#: before it did its work, its message naming the fix).
FAILED_RUNS = frozenset({"failed", "blocked"})
#: ``status`` warns of a subscription's expiry once this share of the maximum retention has
#: passed without delivery while a transaction waits for it.
EXPIRY_WARNING_SHARE = 0.8


def run_failed(outcome: str | None) -> bool:
    """Whether a run with this outcome failed: ``status`` then exits non-zero, and both its table
    and the HTML report show the subscription's run as failed."""
    return outcome in FAILED_RUNS


@dataclass(frozen=True)
class SubscriptionStatus:
    """One subscription's status (see the module)."""

    sub: progress.SubscriptionRow
    distribution: progress.LastRun | None
    logreader: progress.LastRun | None
    last_error: tuple[datetime, str] | None
    expires_at: datetime | None  # None: nothing waits for it, or it expired already
    warning: str | None = None  # its expiry nears (:func:`expiry_warning`)
    lag_seconds: float | None = None  # :func:`lag_seconds`, when the status was read
    tracer: progress.HistoryRow | None = None  # the latest tracer token that reached the subscriber
    #: how the latest Distribution Agent run applies (applied) each article: ``{"article", "apply", "why"}``
    apply: list[dict[str, str]] | None = None

    def to_json(self) -> dict[str, Any]:
        s = self.sub
        return {
            "publication": s.publication,
            "subscriber": s.subscriber,
            "status": state(s),
            "paused": s.paused,
            "backlog": {"transactions": s.backlog_transactions, "commands": s.backlog_commands},
            "delivered": {"xact_seqno": s.delivered_xact_seqno, "commit_time": _iso(s.delivered_commit_time)},
            "lag": {
                "seconds": self.lag_seconds,
                "oldest_pending_commit_time": _iso(s.oldest_pending_commit),
                "tracer": tracer.latency(self.tracer).to_json() if self.tracer is not None else None,
            },
            "last_runs": {"distribution": _run(self.distribution), "logreader": _run(self.logreader)},
            "apply": self.apply,
            "last_error": {"at": _iso(self.last_error[0]), "message": self.last_error[1]} if self.last_error else None,
            "expires_at": _iso(self.expires_at),
            "warning": self.warning,
        }


def state(row: progress.SubscriptionRow) -> str:
    """The state ``status`` shows: ``paused`` for a paused active subscription, its status
    otherwise (``pending, paused``: a paused one not initialized yet)."""
    if not row.paused:
        return row.status
    return "paused" if row.status == "active" else f"{row.status}, paused"


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _run(run: progress.LastRun | None) -> dict[str, Any] | None:
    if run is None:
        return None
    return {"status": run.status, "finished_at": _iso(run.finished_at), "message": run.message}


def lag_seconds(row: progress.SubscriptionRow, now: datetime) -> float | None:
    """The subscription's lag: the age, at ``now``, of the oldest transaction stored for it and
    not delivered yet (its commit time at the publisher); 0 when it is caught up; None when it
    has no backlog to measure (expired, or not initialized yet)."""
    if row.oldest_pending_commit is not None:
        return pending_age(row.oldest_pending_commit, now)
    return 0.0 if row.status == "active" else None


def pending_age(oldest_pending_commit: datetime, now: datetime) -> float:
    """The lag of a subscription whose oldest undelivered transaction committed at
    ``oldest_pending_commit``: its age at ``now``, in seconds (never negative)."""
    return round(max((now - oldest_pending_commit).total_seconds(), 0.0), 3)


def expires_at(row: progress.SubscriptionRow, max_retention_hours: float) -> datetime | None:
    """When the cleanup would expire an active subscription (both its last synchronization and
    its oldest waiting transaction older than the maximum retention); None when nothing waits."""
    if row.status != "active" or row.waiting_since is None:
        return None
    limit = timedelta(hours=max_retention_hours)
    return max(row.last_sync or row.waiting_since, row.waiting_since) + limit


def expiry_warning(
    row: progress.SubscriptionRow, expiry: datetime | None, max_retention_hours: float, now: datetime
) -> str | None:
    """A warning once more than :data:`EXPIRY_WARNING_SHARE` of the maximum retention has passed
    towards the subscription's ``expiry`` (:func:`expires_at`), or None."""
    if expiry is None or now < expiry - timedelta(hours=max_retention_hours * (1 - EXPIRY_WARNING_SHARE)):
        return None
    name = f"subscription of subscriber {row.subscriber!r} to publication {row.publication!r}"
    fix = (
        f"resume it ({pausing.resume_command(row.publication, row.subscriber)}) and run the Distribution Agent"
        if row.paused
        else "run the Distribution Agent for it"
    )
    return (
        f"{name}{' (paused)' if row.paused else ''} expires at {expiry.isoformat(timespec='seconds')}: more than "
        f"{EXPIRY_WARNING_SHARE:.0%} of max_retention_hours ({max_retention_hours:g}) has passed without delivery; "
        f"{fix} before then, or raise max_retention_hours"
    )


def subscription_status(topology: Topology, publication: str | None = None) -> list[SubscriptionStatus]:
    """The status of every subscription of ``publication`` (all publications: None)."""
    if publication is not None:
        topology.publication(publication)  # an unknown publication -> TopologyError
    with connections.connect(topology.distributor.require("distributor"), "distributor") as dist:
        dist_schema.require_deployed(dist)
        result = []
        now = datetime.now(timezone.utc)
        tokens: dict[str, list[progress.HistoryRow]] = {}
        for row in progress.subscription_rows(dist, publication):
            pub = topology.publications.get(row.publication)
            expiry = expires_at(row, pub.max_retention_hours) if pub is not None else None
            if row.publication not in tokens:
                tokens[row.publication] = progress.history(dist, row.publication)
            arrived = [t for t in tokens[row.publication] if t.subscriber == row.subscriber and t.subscriber_at]
            result.append(
                SubscriptionStatus(
                    row,
                    progress.last_run(dist, "distribution", row.publication, row.subscriber),
                    progress.last_run(dist, "logreader", row.publication, None),
                    progress.last_error(dist, row.publication, row.subscriber),
                    expiry,
                    expiry_warning(row, expiry, pub.max_retention_hours, now) if pub is not None else None,
                    lag_seconds(row, now),
                    arrived[-1] if arrived else None,
                    dist_history.last_apply_paths(dist, row.publication, row.subscriber),
                )
            )
        return result


def problems(rows: list[SubscriptionStatus], max_pending: int | None) -> list[str]:
    """Why ``status`` fails, one phrase per subscription: a failed last run or a backlog above ``max_pending``."""
    found = []
    for r in rows:
        name = f"{r.sub.subscriber!r} of publication {r.sub.publication!r}"
        for agent, run in (("Distribution Agent", r.distribution), ("Log Reader", r.logreader)):
            if run is not None and run_failed(run.status):
                how = "was blocked" if run.status == "blocked" else "failed"
                found.append(
                    f"{name}: the {agent}'s last run {how} ({' '.join((run.message or 'no message').split())})"
                )
        if max_pending is not None and r.sub.backlog_transactions > max_pending:
            found.append(
                f"{name}: {r.sub.backlog_transactions} transactions pending, above --max-pending {max_pending}"
            )
    return found
