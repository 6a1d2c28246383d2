"""ApplyTopologyOperator: ``airflow-repl apply`` from a DAG (docs/operators.md).

Applying is a few statements at the publisher, the distributor and (for drops) the subscribers,
so it runs in the task itself rather than as a Spark application; the topology is resolved
through :class:`~airflow_repl.hooks.replication.ReplicationHook` like the agent operators'.
The plan carried out (docs/operations.md, "Plan and apply") is returned (pushed to XCom).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator

from airflow_repl.engine.errors import ReplError
from airflow_repl.engine.provisioning import plan
from airflow_repl.hooks.replication import ReplicationHook
from airflow_repl.jobs.agent_job import failure
from airflow_repl.operators.agents import task_failure


class ApplyTopologyOperator(BaseOperator):
    """Apply the topology file (or one of its publications): the task fails, changing nothing,
    when the plan drops a publication, an article or a subscription, unless ``allow_drop``.
    Returns the plan carried out: ``{"actions": [{kind, object, publication, name, details,
    removes}, ...], "drops": n}``."""

    template_fields: Sequence[str] = ("topology", "publication")
    ui_color = "#e6f0d7"

    def __init__(
        self, *, topology: str, publication: str | None = None, allow_drop: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.topology, self.publication, self.allow_drop = topology, publication, allow_drop

    def execute(self, context: Any) -> dict[str, Any]:
        try:
            topo = ReplicationHook(self.topology).get_topology()
            publications = [self.publication] if self.publication else None
            return plan.apply(topo, publications, allow_drop=self.allow_drop).to_dict()
        except ReplError as exc:  # not retried unless a retry can help (busy, lost connection)
            raise task_failure("apply", failure(exc)) from None
