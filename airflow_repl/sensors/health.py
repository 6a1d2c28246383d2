"""ReplicationHealthSensor: gate a DAG's work on fresh replicated data.  It waits until none of
the monitoring thresholds of ``airflow-repl status --check`` (docs/monitoring.md) is reached for
a publication's subscriptions (or the named ones):

* healthy (``status --check`` would print ``OK``): the sensor succeeds;
* a warning (latency at or above ``warn_latency_seconds``, pending commands, expiration
  percent): it keeps waiting, poking or deferred to
  :class:`~airflow_repl.triggers.health.ReplicationHealthTrigger`, and at ``timeout`` fails with
  the breach lines;
* critical (a failed or blocked last run, latency at or above ``critical_latency_seconds``): it
  fails at once with the breach lines (``AirflowFailException``, not retried): a blocked run
  needs the command its message names, and a subscription that far behind is what an alert is
  for, not something to wait out silently.

The checks are the engine's (:func:`airflow_repl.engine.monitoring.health.subscription_health`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from airflow_repl.engine.errors import ReplError
from airflow_repl.engine.monitoring import health
from airflow_repl.sensors.quiescing import _ReplicationSensor
from airflow_repl.triggers.health import ReplicationHealthTrigger
from airflow_repl.triggers.quiescing import PollTrigger


class ReplicationHealthSensor(_ReplicationSensor):
    """Waits until a publication's subscriptions (or ``subscribers``) are within their
    monitoring thresholds; fails at once on a critical breach.

    :param topology: path of the topology YAML file. (templated)
    :param publication: the publication. (templated)
    :param subscribers: only these subscribers (default: every subscription of the
        publication). (templated)
    :param deferrable: defer to :class:`~airflow_repl.triggers.health.ReplicationHealthTrigger`
        between checks (default: ``[operators] default_deferrable``).
    """

    template_fields: Sequence[str] = (*_ReplicationSensor.template_fields, "subscribers")
    ui_color = "#d7f5e3"

    def __init__(self, *, subscribers: list[str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.subscribers = subscribers

    def check(self, topo: Any) -> health.Health:
        try:
            return health.subscription_health(topo, self.publication, self.subscribers)
        except ReplError as exc:  # nothing to check, an unknown publication: waiting cannot mend it
            raise AirflowFailException(f"{self.task_id} failed: {exc}") from None

    def trigger(self, end_time: float) -> PollTrigger:
        return ReplicationHealthTrigger(
            topology_path=self.topology,
            publication=self.publication,
            subscribers=self.subscribers,
            poll_interval=self.poke_interval,
            end_time=end_time,
        )
