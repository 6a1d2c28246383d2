"""``airflow-repl status --check``: each subscription's status compared with its monitoring
thresholds (topology keys, docs/monitoring.md), as Replication Monitor's warnings do, with the
exit codes of monitoring plugins: 0 ok, 1 warning, 2 critical.

Pure: it reads the :class:`~airflow_repl.engine.monitoring.status.SubscriptionStatus` records that
``status`` made.  A threshold fires at its value and above, not below.  A failed or blocked last
run (the rule ``status`` fails on, :func:`~airflow_repl.engine.monitoring.status.problems`) is
critical.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from airflow_repl.engine.monitoring.status import SubscriptionStatus, problems

OK, WARNING, CRITICAL = 0, 1, 2
LEVELS = {OK: "OK", WARNING: "WARNING", CRITICAL: "CRITICAL"}


@dataclass(frozen=True)
class Breach:
    """One threshold a subscription reached: its level and its line."""

    level: int
    line: str


def breaches(
    row: SubscriptionStatus, thresholds: dict[str, float | int], max_retention_hours: float | None, now: datetime
) -> list[Breach]:
    """Every threshold ``row`` reached, and its failed or blocked last run."""
    s = row.sub
    name = f"subscriber {s.subscriber!r} of publication {s.publication!r}"
    found = [Breach(CRITICAL, f"CRITICAL: {why}") for why in problems([row], None)]
    lag = row.lag_seconds
    critical, warn = thresholds.get("critical_latency_seconds"), thresholds.get("warn_latency_seconds")
    if lag is not None and critical is not None and lag >= critical:
        found.append(
            Breach(CRITICAL, f"CRITICAL: {name}: lag {lag:g}s, at or above critical_latency_seconds {critical:g}")
        )
    elif lag is not None and warn is not None and lag >= warn:
        found.append(Breach(WARNING, f"WARNING: {name}: lag {lag:g}s, at or above warn_latency_seconds {warn:g}"))
    pending = thresholds.get("warn_pending_commands")
    if pending is not None and s.backlog_commands >= pending:
        found.append(
            Breach(
                WARNING,
                f"WARNING: {name}: {s.backlog_commands} commands pending, at or above warn_pending_commands {pending}",
            )
        )
    share = thresholds.get("warn_expiration_percent")
    used = expiration_percent(row.expires_at, max_retention_hours, now)
    if share is not None and used is not None and used >= share:
        found.append(
            Breach(
                WARNING,
                f"WARNING: {name}: {used:.1f}% of max_retention_hours used towards expiry at "
                f"{row.expires_at.isoformat(timespec='seconds') if row.expires_at else '-'}, at or above "
                f"warn_expiration_percent {share:g}; run the Distribution Agent for it",
            )
        )
    return found


def expiration_percent(expires_at: datetime | None, max_retention_hours: float | None, now: datetime) -> float | None:
    """How much of the maximum retention has passed towards ``expires_at``, in percent (None:
    nothing waits, so nothing expires)."""
    if expires_at is None or not max_retention_hours:
        return None
    limit = timedelta(hours=max_retention_hours)
    return max(0.0, (now - (expires_at - limit)) / limit * 100)


def level(found: list[Breach]) -> int:
    """The exit code: the highest level found (0: none)."""
    return max((b.level for b in found), default=OK)
