"""Triggers of the quiescing sensors: poll an engine check
(:mod:`airflow_repl.engine.monitoring.quiescing`) until it is done, without holding a worker slot.

``serialize()`` holds only the topology file's path, the publication, the ids and positions
waited for, the poll interval and the deadline: the servers are resolved in ``run()``, through
:class:`~airflow_repl.hooks.replication.ReplicationHook` (Airflow connection ids), never stored.
The checks are synchronous (psycopg): ``run()`` runs each in a thread (``asyncio.to_thread``).

Events: ``{"status": "success" | "failed" | "timeout" | "error", "message": ..., "position": ...}``
(``failed``: the check found what waiting cannot mend, e.g. a health check's critical breach).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_repl.engine.errors import redact
from airflow_repl.engine.monitoring import quiescing
from airflow_repl.hooks.replication import ReplicationHook


class Polled(Protocol):
    """What a check returns (:class:`~airflow_repl.engine.monitoring.quiescing.WaitStatus`,
    :class:`~airflow_repl.engine.monitoring.health.Health`)."""

    @property
    def done(self) -> bool: ...
    @property
    def failed(self) -> bool: ...
    @property
    def message(self) -> str: ...
    @property
    def position(self) -> str | None: ...


class PollTrigger(BaseTrigger):
    """Runs :meth:`check` every ``poll_interval`` seconds until it is done, it fails (or finds
    what cannot be waited for), or ``end_time`` (seconds since the epoch) passes."""

    def __init__(
        self, *, topology_path: str, publication: str, poll_interval: float = 30.0, end_time: float | None = None
    ) -> None:
        super().__init__()
        self.topology_path, self.publication = topology_path, publication
        self.poll_interval, self.end_time = poll_interval, end_time

    def _kwargs(self) -> dict[str, Any]:
        return {
            "topology_path": self.topology_path,
            "publication": self.publication,
            "poll_interval": self.poll_interval,
            "end_time": self.end_time,
        }

    def check(self) -> Polled:
        raise NotImplementedError

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            try:
                status = await asyncio.to_thread(self.check)
            except Exception as exc:  # a bad topology, an unknown token, a server down: the sensor fails with it
                yield TriggerEvent({"status": "error", "message": redact(f"{type(exc).__name__}: {exc}")})
                return
            event = {"message": status.message, "position": status.position}
            if status.done:
                yield TriggerEvent({"status": "success", **event})
                return
            if status.failed:
                yield TriggerEvent({"status": "failed", **event})
                return
            if self.end_time is not None and time.time() >= self.end_time:
                yield TriggerEvent({"status": "timeout", **event})
                return
            self.log.info("%s", status.message)
            await asyncio.sleep(self.poll_interval)


class TracerTokenTrigger(PollTrigger):
    """Waits until tracer token ``token_id`` reached every (or each named) subscriber."""

    def __init__(self, *, token_id: int, subscribers: list[str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.token_id, self.subscribers = int(token_id), subscribers

    def serialize(self) -> tuple[str, dict[str, Any]]:
        kwargs = {**self._kwargs(), "token_id": self.token_id, "subscribers": self.subscribers}
        return f"{type(self).__module__}.{type(self).__qualname__}", kwargs

    def check(self) -> quiescing.WaitStatus:
        topo = ReplicationHook(self.topology_path).get_topology()
        return quiescing.check_token_arrived(topo, self.publication, self.token_id, self.subscribers)


class TopologyQuiescedTrigger(PollTrigger):
    """Waits until the topology is quiesced up to ``position`` (or tracer token ``token_id``)."""

    def __init__(self, *, position: str | None = None, token_id: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.position, self.token_id = position, (int(token_id) if token_id is not None else None)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        kwargs = {**self._kwargs(), "position": self.position, "token_id": self.token_id}
        return f"{type(self).__module__}.{type(self).__qualname__}", kwargs

    def check(self) -> quiescing.WaitStatus:
        topo = ReplicationHook(self.topology_path).get_topology()
        return quiescing.check_quiesced(topo, self.publication, position=self.position, token_id=self.token_id)
