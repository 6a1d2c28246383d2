"""``airflow-repl status --check``: each subscription's status compared with its monitoring
thresholds (topology keys, docs/monitoring.md), as Replication Monitor's warnings do, with the
exit codes of monitoring plugins: 0 ok, 1 warning, 2 critical.

:func:`breaches` and :func:`check` are pure: they read the
:class:`~airflow_repl.engine.monitoring.status.SubscriptionStatus` records that ``status`` made.  A
threshold fires at its value and above, not below.  A failed or blocked last run (the rule
``status`` fails on, :func:`~airflow_repl.engine.monitoring.status.problems`) is critical.
:func:`subscription_health` reads the distributor (through ``status``) for the
``ReplicationHealthSensor``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from airflow_repl.engine.errors import ReplError
from airflow_repl.engine.model.topology import Topology
from airflow_repl.engine.monitoring.status import SubscriptionStatus, problems, subscription_status

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


def check(topology: Topology, rows: list[SubscriptionStatus], now: datetime) -> list[Breach]:
    """Every breach of ``rows``, each subscription against its own thresholds
    (:meth:`~airflow_repl.engine.model.topology.Topology.thresholds`)."""
    found = []
    for row in rows:
        pub = topology.publications.get(row.sub.publication)
        limits = topology.thresholds(row.sub.publication, row.sub.subscriber)
        found += breaches(row, limits, pub.max_retention_hours if pub is not None else None, now)
    return found


@dataclass(frozen=True)
class Health:
    """The health of a publication's subscriptions (or of the named ones), as the
    ``ReplicationHealthSensor`` waits for it: ``done`` when no threshold is reached, ``failed``
    when one is critical (a failed or blocked last run, critical latency)."""

    publication: str
    checked: int  # how many subscriptions were checked
    found: tuple[Breach, ...]
    position: None = None  # a sensor returns it (XCom); health waits for no position

    @property
    def done(self) -> bool:
        return not self.found

    @property
    def failed(self) -> bool:
        return level(list(self.found)) == CRITICAL

    @property
    def message(self) -> str:
        if self.done:
            return f"OK: {self.checked} subscription(s) of publication {self.publication!r} within their thresholds"
        return "; ".join(" ".join(b.line.split()) for b in self.found)


def subscription_health(topology: Topology, publication: str, subscribers: list[str] | None = None) -> Health:
    """The health of ``publication``'s subscriptions (only ``subscribers``, when given) now."""
    rows = subscription_status(topology, publication)
    if subscribers:
        rows = [r for r in rows if r.sub.subscriber in subscribers]
    if not rows:
        which = f"of subscriber(s) {', '.join(map(repr, subscribers))} " if subscribers else ""
        raise ReplError(
            f"no subscription {which}to publication {publication!r} in the distribution database to check: "
            f"apply the topology and run the Snapshot Agent first, or name a subscriber of the publication"
        )
    return Health(publication, len(rows), tuple(check(topology, rows, datetime.now(timezone.utc))))


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
