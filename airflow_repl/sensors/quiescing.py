"""Sensors for quiescing a topology (before a schema change, say), in the pattern of the official
providers: ``execute`` pokes once and, when not done and ``deferrable`` (default
``[operators] default_deferrable``), defers to a trigger of :mod:`airflow_repl.triggers.quiescing`
that polls asynchronously; ``execute_complete`` fails the task on an error or timeout event.

The checks are the engine's (:mod:`airflow_repl.engine.monitoring.quiescing`); a sensor that times
out says which subscription is behind, by how many transactions, and which agent to run.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator, conf
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSensorTimeout

from airflow_repl.engine.monitoring import quiescing
from airflow_repl.hooks.replication import ReplicationHook
from airflow_repl.triggers.quiescing import Polled, PollTrigger, TopologyQuiescedTrigger, TracerTokenTrigger


class _ReplicationSensor(BaseSensorOperator):
    """Pokes an engine check; defers to its trigger when asked to."""

    template_fields: Sequence[str] = ("topology", "publication")
    ui_color = "#e8f5d7"

    def __init__(
        self,
        *,
        topology: str,
        publication: str,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.topology, self.publication, self.deferrable = topology, publication, deferrable
        self.last_status: Polled | None = None

    def check(self, topo: Any) -> Polled:
        raise NotImplementedError

    def trigger(self, end_time: float) -> PollTrigger:
        raise NotImplementedError

    def poke(self, context: Any) -> bool:
        self.last_status = status = self.check(ReplicationHook(self.topology).get_topology())
        if status.failed:  # waiting cannot mend it: fail at once, not retried
            raise AirflowFailException(f"{self.task_id} failed: {status.message}")
        self.log.info("%s", status.message)
        return status.done

    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            try:
                super().execute(context)
            except AirflowSensorTimeout as exc:
                raise AirflowSensorTimeout(f"{exc}: {self._behind()}") from None
            return self.last_status.position if self.last_status is not None else None
        if self.poke(context):
            return self.last_status.position if self.last_status is not None else None
        self.defer(
            trigger=self.trigger(time.time() + self.timeout),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout + 2 * self.poke_interval),  # the trigger's own deadline comes first
        )

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> Any:
        """The trigger's event: success returns the position waited for (XCom); failed (not
        retried), timeout and error fail."""
        event = event or {"status": "error", "message": "the trigger sent no event"}
        if event.get("status") == "success":
            self.log.info("%s", event.get("message"))
            return event.get("position")
        if event.get("status") == "failed":
            raise AirflowFailException(f"{self.task_id} failed: {event.get('message')}")
        if event.get("status") == "timeout":
            raise AirflowSensorTimeout(f"{self.task_id} timed out after {self.timeout} s: {event.get('message')}")
        raise AirflowException(f"{self.task_id} failed: {event.get('message')}")

    def _behind(self) -> str:
        return self.last_status.message if self.last_status is not None else "not checked yet"


class TracerTokenSensor(_ReplicationSensor):
    """Waits until a tracer token reached every subscriber it is meant for (or the named ones).

    :param topology: path of the topology YAML file. (templated)
    :param publication: the token's publication. (templated)
    :param token_id: the token, e.g. ``{{ ti.xcom_pull(task_ids='post_token') }}`` from a
        :class:`~airflow_repl.operators.tracer.PostTracerTokenOperator`. (templated)
    :param subscribers: only these subscribers (default: every one the token is meant for). (templated)
    :param deferrable: defer to :class:`~airflow_repl.triggers.quiescing.TracerTokenTrigger`
        between checks (default: ``[operators] default_deferrable``).
    """

    template_fields: Sequence[str] = (*_ReplicationSensor.template_fields, "token_id", "subscribers")

    def __init__(self, *, token_id: int | str, subscribers: list[str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.token_id, self.subscribers = token_id, subscribers

    def check(self, topo: Any) -> quiescing.WaitStatus:
        return quiescing.check_token_arrived(topo, self.publication, int(self.token_id), self.subscribers)

    def trigger(self, end_time: float) -> PollTrigger:
        return TracerTokenTrigger(
            topology_path=self.topology,
            publication=self.publication,
            token_id=int(self.token_id),
            subscribers=self.subscribers,
            poll_interval=self.poke_interval,
            end_time=end_time,
        )


class TopologyQuiescedSensor(_ReplicationSensor):
    """Waits until everything committed at the publisher up to a position has been read and
    delivered to every active subscription, every queued-updating queue is empty and no
    immediate-updating transaction is in doubt.  The position is the publisher's WAL position
    when the sensor first pokes (kept in the trigger's arguments across deferral), or the
    commit of tracer token ``token_id``.  Returns the position (XCom).

    :param topology: path of the topology YAML file. (templated)
    :param publication: the publication. (templated)
    :param token_id: quiesce up to this tracer token instead. (templated)
    :param deferrable: defer to :class:`~airflow_repl.triggers.quiescing.TopologyQuiescedTrigger`
        between checks (default: ``[operators] default_deferrable``).
    """

    template_fields: Sequence[str] = (*_ReplicationSensor.template_fields, "token_id")

    def __init__(self, *, token_id: int | str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if self.mode == "reschedule" and token_id is None:
            raise ValueError(
                f"{self.task_id}: TopologyQuiescedSensor in mode='reschedule' would take a new position at each "
                f"reschedule; use poke mode, deferrable=True, or give a token_id"
            )
        self.token_id = token_id
        self.position: str | None = None  # taken at the first poke (without a token)

    def _token(self) -> int | None:
        return int(self.token_id) if self.token_id not in (None, "", "None") else None

    def check(self, topo: Any) -> quiescing.WaitStatus:
        token = self._token()
        if token is None and self.position is None:
            self.position = quiescing.start_position(topo, self.publication)
            self.log.info("quiescing publication %s up to the publisher's position %s", self.publication, self.position)
        return quiescing.check_quiesced(
            topo, self.publication, position=None if token is not None else self.position, token_id=token
        )

    def trigger(self, end_time: float) -> PollTrigger:
        token = self._token()
        return TopologyQuiescedTrigger(
            topology_path=self.topology,
            publication=self.publication,
            position=None if token is not None else self.position,
            token_id=token,
            poll_interval=self.poke_interval,
            end_time=end_time,
        )
