"""ReplicationHealthTrigger: polls, asynchronously, the health of a publication's subscriptions
(the thresholds of ``airflow-repl status --check``) until none is reached (the deferred half of
:class:`~airflow_repl.sensors.health.ReplicationHealthSensor`).

Events are those of :class:`~airflow_repl.triggers.quiescing.PollTrigger`: ``success`` when
healthy, ``failed`` at a critical breach (a failed or blocked last run, critical latency), with
its lines, ``timeout`` at ``end_time`` with the warnings still reached, ``error`` when it cannot
check.  ``serialize()`` holds the topology file's path, the publication and subscriber names and
the timing only.
"""

from __future__ import annotations

from typing import Any

from airflow_repl.engine.monitoring import health
from airflow_repl.hooks.replication import ReplicationHook
from airflow_repl.triggers.quiescing import PollTrigger


class ReplicationHealthTrigger(PollTrigger):
    """Waits until no monitoring threshold of ``publication``'s subscriptions (or of
    ``subscribers``) is reached."""

    def __init__(self, *, subscribers: list[str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.subscribers = subscribers

    def serialize(self) -> tuple[str, dict[str, Any]]:
        kwargs = {**self._kwargs(), "subscribers": self.subscribers}
        return f"{type(self).__module__}.{type(self).__qualname__}", kwargs

    def check(self) -> health.Health:
        topo = ReplicationHook(self.topology_path).get_topology()
        return health.subscription_health(topo, self.publication, self.subscribers)
