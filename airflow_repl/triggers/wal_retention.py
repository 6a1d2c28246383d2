"""WalRetentionTrigger: polls, asynchronously, how much WAL a publication's slot retains until it
is at most the limit (the deferred half of
:class:`~airflow_repl.sensors.wal_retention.WalRetentionSensor`).

Its state is the topology file's path, the publication, the limit and the timing: never a
connection string or a password (servers are resolved from the topology and Airflow's
connections each time it polls).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_repl.engine.errors import ReplError
from airflow_repl.engine.monitoring import wal_retention
from airflow_repl.hooks.replication import ReplicationHook


def measure(topology_path: str, publication: str, max_wal_mb: int | None) -> wal_retention.WalRetention:
    """The slot's retention now (servers resolved through the topology and Airflow connections)."""
    topo = ReplicationHook(topology_path).get_topology()
    return wal_retention.measure(topo, publication, max_wal_mb)


class WalRetentionTrigger(BaseTrigger):
    """Fires ``success`` when the slot retains at most the limit, ``timeout`` at ``end_time``
    (epoch seconds; None: never) with the last measurement, ``error`` when it cannot measure.

    Its arguments are named as those of the quiescing triggers (``topology_path``, ``end_time``);
    ``topology`` and ``deadline``, their names before 0.2.0, are still accepted, so a trigger
    serialized by an older version resumes after an upgrade."""

    def __init__(
        self,
        topology_path: str | None = None,
        publication: str = "",
        max_wal_mb: int | None = None,
        poll_interval: float = 60.0,
        end_time: float | None = None,
        *,
        topology: str | None = None,
        deadline: float | None = None,
    ) -> None:
        super().__init__()
        path = topology_path if topology_path is not None else topology
        if path is None or not publication:
            raise TypeError("WalRetentionTrigger takes a topology_path and a publication")
        self.topology_path, self.publication, self.max_wal_mb = path, publication, max_wal_mb
        self.poll_interval, self.end_time = poll_interval, end_time if end_time is not None else deadline

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "topology_path": self.topology_path,
                "publication": self.publication,
                "max_wal_mb": self.max_wal_mb,
                "poll_interval": self.poll_interval,
                "end_time": self.end_time,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            try:
                found = await asyncio.to_thread(measure, self.topology_path, self.publication, self.max_wal_mb)
            except ReplError as exc:
                yield TriggerEvent({"status": "error", "message": str(exc)})
                return
            if not found.exceeded:
                yield TriggerEvent({"status": "success", "retention": found.to_dict(), "message": found.message()})
                return
            if self.end_time is not None and time.time() >= self.end_time:
                yield TriggerEvent({"status": "timeout", "retention": found.to_dict(), "message": found.message()})
                return
            self.log.info("%s; polling again in %ss", found.message(), self.poll_interval)
            await asyncio.sleep(self.poll_interval)
