"""PostTracerTokenOperator: posts a tracer token at the publisher (no Spark application: one
short transaction at the distributor and one at the publisher) and returns its id, which Airflow
pushes to XCom for a :class:`~airflow_repl.sensors.quiescing.TracerTokenSensor` or
:class:`~airflow_repl.sensors.quiescing.TopologyQuiescedSensor` downstream."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_repl.engine.errors import INTERNAL_EXIT_CODE
from airflow_repl.engine.monitoring import tracer
from airflow_repl.hooks.replication import ReplicationHook
from airflow_repl.jobs.agent_job import failure


class PostTracerTokenOperator(BaseOperator):
    """Post a tracer token for ``publication``; returns the token id (XCom).

    :param topology: path of the topology YAML file. (templated)
    :param publication: the publication whose topology the token travels through. (templated)
    """

    template_fields: Sequence[str] = ("topology", "publication")
    ui_color = "#f5e6d7"

    def __init__(self, *, topology: str, publication: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.topology, self.publication = topology, publication

    def execute(self, context: Any) -> int:
        try:
            topo = ReplicationHook(self.topology).get_topology()
            token_id = tracer.post_tracer_token(topo, self.publication)
        except Exception as exc:  # a ReplError, or a driver error as one: retried only when a retry can help
            outcome = failure(exc)
            if outcome["exit_code"] == INTERNAL_EXIT_CODE:
                raise
            cls = AirflowException if outcome["retryable"] else AirflowFailException
            raise cls(f"posting a tracer token failed ({outcome['error_class']}): {outcome['message']}") from None
        self.log.info("posted tracer token %s for publication %s", token_id, self.publication)
        return token_id
