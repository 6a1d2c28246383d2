"""CleanupOperator: runs the cleanup agent (docs/retention.md) in the Airflow worker.

The cleanup is a few SQL statements at the distribution database, so it runs in the task itself
rather than as a Spark application; the topology is resolved through
:class:`~airflow_repl.hooks.replication.ReplicationHook` like the agent operators'.  Its summary
(transactions_deleted, commands_deleted, expired, held_by, ...) is returned (pushed to XCom).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator

from airflow_repl.engine.agents import cleanup_agent
from airflow_repl.engine.errors import ReplError
from airflow_repl.hooks.replication import ReplicationHook
from airflow_repl.jobs.agent_job import failure
from airflow_repl.operators.agents import task_failure


class CleanupOperator(BaseOperator):
    """Expire the publication's subscriptions idle past the maximum retention and delete the
    commands every subscription has that are older than the minimum retention (hours; default:
    the publication's ``min_retention_hours`` / ``max_retention_hours``)."""

    template_fields: Sequence[str] = ("topology", "publication")
    ui_color = "#f5e6d7"

    def __init__(
        self,
        *,
        topology: str,
        publication: str,
        min_retention_hours: float | None = None,
        max_retention_hours: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.topology, self.publication = topology, publication
        self.min_retention_hours, self.max_retention_hours = min_retention_hours, max_retention_hours

    def execute(self, context: Any) -> dict[str, Any]:
        try:
            topo = ReplicationHook(self.topology).get_topology()
            return cleanup_agent.run_cleanup(
                topo,
                self.publication,
                min_retention_hours=self.min_retention_hours,
                max_retention_hours=self.max_retention_hours,
            )
        except ReplError as exc:  # not retried unless a retry can help (busy, lost connection)
            raise task_failure("cleanup", failure(exc)) from None
