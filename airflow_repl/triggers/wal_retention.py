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
    """Fires ``success`` when the slot retains at most the limit, ``timeout`` at ``deadline``
    (epoch seconds; None: never) with the last measurement, ``error`` when it cannot measure."""

    def __init__(
        self,
        topology: str,
        publication: str,
        max_wal_mb: int | None = None,
        poll_interval: float = 60.0,
        deadline: float | None = None,
    ) -> None:
        super().__init__()
        self.topology, self.publication, self.max_wal_mb = topology, publication, max_wal_mb
        self.poll_interval, self.deadline = poll_interval, deadline

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "topology": self.topology,
                "publication": self.publication,
                "max_wal_mb": self.max_wal_mb,
                "poll_interval": self.poll_interval,
                "deadline": self.deadline,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            try:
                found = await asyncio.to_thread(measure, self.topology, self.publication, self.max_wal_mb)
            except ReplError as exc:
                yield TriggerEvent({"status": "error", "message": str(exc)})
                return
            if not found.exceeded:
                yield TriggerEvent({"status": "success", "retention": found.to_dict(), "message": found.message()})
                return
            if self.deadline is not None and time.time() >= self.deadline:
                yield TriggerEvent({"status": "timeout", "retention": found.to_dict(), "message": found.message()})
                return
            self.log.info("%s; polling again in %ss", found.message(), self.poll_interval)
            await asyncio.sleep(self.poll_interval)
