"""How much WAL a publication's replication slot keeps at the publisher, against the
publication's limit (``max_slot_wal_mb`` in the topology).

A logical slot keeps every WAL segment from its ``restart_lsn`` on, so a Log Reader that runs
too rarely (or a long transaction at the publisher) makes the publisher's disk fill up; past
``max_slot_wal_keep_size`` PostgreSQL invalidates the slot and every subscription must be
reinitialized.  The Log Reader Agent warns (:func:`warn_if_exceeded`: a log line and the
``wal_retention_warning`` field of its summary); :func:`measure` serves the CLI
(``airflow-repl wal-retention``) and ``WalRetentionSensor``.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

import psycopg

from airflow_repl.engine.errors import NotInitialized, ReplError
from airflow_repl.engine.model.topology import Topology
from airflow_repl.engine.postgres import connections, slots
from airflow_repl.engine.state import dist_publications

log = logging.getLogger(__name__)

#: Bytes in one MB of ``max_slot_wal_mb`` (MiB, as PostgreSQL's ``max_slot_wal_keep_size``).
MB = 1024 * 1024


@dataclass(frozen=True)
class WalRetention:
    """The WAL one publication's slot retains, and the limit it is held to (None: no limit)."""

    publication: str
    slot: str
    retained_bytes: int
    limit_mb: int | None

    @property
    def retained_mb(self) -> float:
        return round(self.retained_bytes / MB, 1)

    @property
    def exceeded(self) -> bool:
        return self.limit_mb is not None and self.retained_bytes > self.limit_mb * MB

    def message(self) -> str:
        """One line: how much is retained against the limit, and what to do when it is exceeded."""
        limit = f"{self.limit_mb} MB" if self.limit_mb is not None else "no limit"
        head = (
            f"the replication slot {self.slot!r} of publication {self.publication!r} retains "
            f"{self.retained_mb} MB of WAL at the publisher"
        )
        if not self.exceeded:
            return f"{head} (limit: {limit})"
        return (
            f"{head}, above its limit of {limit} (max_slot_wal_mb): run the Log Reader Agent (more often) "
            f"and look for a long-running transaction at the publisher; a slot past the server's "
            f"max_slot_wal_keep_size is invalidated and its subscriptions must then be reinitialized"
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "retained_mb": self.retained_mb, "exceeded": self.exceeded}


def wal_limit(topology: Topology, publication: str, limit_mb: int | None = None) -> int | None:
    """The limit in MB: ``limit_mb`` when given, else the publication's ``max_slot_wal_mb``."""
    pub = topology.publication(publication)  # an unknown publication is refused first
    if limit_mb is None:
        return pub.max_slot_wal_mb
    if isinstance(limit_mb, bool) or limit_mb < 1:
        raise ReplError(f"the WAL retention limit {limit_mb!r} is not a whole number of MB >= 1: give e.g. 1024")
    return limit_mb


def measure_slot(pub: psycopg.Connection[Any], publication: str, slot: str, limit_mb: int | None) -> WalRetention:
    """Measure the slot on ``pub`` (the publisher; the caller ends the transaction)."""
    retained = slots.retained_wal_bytes(pub, slot)
    if retained is None:
        raise NotInitialized(
            f"publication {publication!r} has no replication slot {slot!r} at the publisher: run the "
            f"Snapshot Agent first (if the slot was dropped, reinitialize every subscription)"
        )
    return WalRetention(publication, slot, retained, limit_mb)


def measure(topology: Topology, publication: str, limit_mb: int | None = None) -> WalRetention:
    """The WAL the publication's slot retains now, against ``limit_mb`` (default: the
    publication's ``max_slot_wal_mb``).  Changes nothing."""
    limit = wal_limit(topology, publication, limit_mb)
    with connections.connect(topology.distributor.require("distributor"), "distributor") as dist:
        slot = dist_publications.slot_name(dist, publication)
    with connections.connect(topology.publisher.require("publisher"), "publisher") as pub:
        return measure_slot(pub, publication, slot, limit)


def warn_if_exceeded(
    pub: psycopg.Connection[Any], topology: Topology, publication: str, slot: str, totals: dict[str, Any]
) -> None:
    """The Log Reader's check: ``slot_retained_wal_mb`` in its summary and, above the
    publication's ``max_slot_wal_mb``, a warning (logged, and ``wal_retention_warning``)."""
    found = measure_slot(pub, publication, slot, wal_limit(topology, publication))
    pub.commit()
    totals["slot_retained_wal_mb"] = found.retained_mb
    if found.exceeded:
        totals["wal_retention_warning"] = found.message()
        log.warning("%s", found.message())
