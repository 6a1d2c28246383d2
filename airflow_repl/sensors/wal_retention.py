"""WalRetentionSensor: the WAL a publication's replication slot retains at the publisher,
against a limit (``max_wal_mb``, default the publication's ``max_slot_wal_mb``).

Two uses in a DAG (docs/retention.md):

* ``fail_when_exceeded=True``: a guard.  One measurement; the task fails at once, with the
  retained size, the limit and what to do, when the slot retains more than the limit, and
  succeeds otherwise;
* ``fail_when_exceeded=False`` (the default): a wait.  The sensor succeeds once the slot retains
  at most the limit (the Log Reader has caught up, e.g. before a schema change), and fails at
  ``timeout`` naming the retained size and the limit.  With ``deferrable`` it checks once, then
  defers to :class:`~airflow_repl.triggers.wal_retention.WalRetentionTrigger`.

The measurement is pushed to XCom (publication, slot, retained_bytes, retained_mb, limit_mb,
exceeded).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue, conf
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSensorTimeout

from airflow_repl.engine.errors import ReplError
from airflow_repl.engine.monitoring.wal_retention import WalRetention
from airflow_repl.triggers.wal_retention import WalRetentionTrigger, measure


class WalRetentionSensor(BaseSensorOperator):
    """Waits until (or, with ``fail_when_exceeded``, checks that) the publication's slot retains
    at most ``max_wal_mb`` MB of WAL at the publisher."""

    template_fields: Sequence[str] = ("topology", "publication")
    ui_color = "#e8f0d7"

    def __init__(
        self,
        *,
        topology: str,
        publication: str,
        max_wal_mb: int | None = None,
        fail_when_exceeded: bool = False,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.topology, self.publication, self.max_wal_mb = topology, publication, max_wal_mb
        self.fail_when_exceeded, self.deferrable = fail_when_exceeded, deferrable
        self._last: WalRetention | None = None

    def _measure(self) -> WalRetention:
        try:
            found = measure(self.topology, self.publication, self.max_wal_mb)
        except ReplError as exc:
            raise AirflowFailException(str(exc)) from None
        if found.limit_mb is None:
            raise AirflowFailException(
                f"no WAL retention limit for publication {self.publication!r}: set max_slot_wal_mb for it in "
                f"the topology or give the sensor max_wal_mb"
            )
        self._last = found
        return found

    def poke(self, context: Any) -> PokeReturnValue:
        found = self._measure()
        if found.exceeded and self.fail_when_exceeded:
            raise AirflowFailException(found.message())
        self.log.info("%s", found.message())
        return PokeReturnValue(not found.exceeded, found.to_dict())

    def execute(self, context: Any) -> Any:
        if not self.deferrable or self.fail_when_exceeded:
            try:
                return super().execute(context)
            except AirflowSensorTimeout:
                last = self._last.message() if self._last else "no measurement"
                raise AirflowSensorTimeout(f"timed out after {self.timeout}s: {last}") from None
        first = self.poke(context)
        if first.is_done:
            return first.xcom_value
        self.defer(
            trigger=WalRetentionTrigger(
                topology_path=self.topology,
                publication=self.publication,
                max_wal_mb=self.max_wal_mb,
                poll_interval=self.poke_interval,
                end_time=time.time() + self.timeout,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout + 2 * self.poke_interval),  # the trigger's own deadline comes first
        )

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        """The trigger's event: success -> the measurement; timeout -> fail naming it; error -> fail."""
        if event.get("status") == "success":
            self.log.info("%s", event.get("message"))
            return event.get("retention")
        if event.get("status") == "timeout":
            raise AirflowSensorTimeout(f"timed out after {self.timeout}s: {event.get('message')}")
        raise AirflowException(f"WAL retention of publication {self.publication!r}: {event.get('message')}")
