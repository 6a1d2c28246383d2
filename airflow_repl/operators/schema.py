"""Operators for schema changes and procedures: run one replicated ALTER TABLE at the publisher
(:class:`SchemaChangeOperator`) and regenerate procedures at subscribers on demand
(:class:`RegenerateProceduresOperator`).

They run in the Airflow worker (no Spark application: each is a few statements), resolve the
topology's servers through Airflow connections (:class:`~airflow_repl.hooks.replication.ReplicationHook`)
and return a summary, pushed to XCom.  Engine errors fail the task without retries, with the
engine's one-line message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_repl.engine.errors import ReplError
from airflow_repl.engine.model.topology import Topology
from airflow_repl.hooks.replication import ReplicationHook


def _topology(path: str, publication: str) -> Topology:
    topo = ReplicationHook(path).get_topology()
    topo.publication(publication)
    return topo


def _fail(exc: ReplError) -> AirflowException:
    """Bad input and delivery errors are not retried: the same run would fail the same way."""
    return AirflowFailException(str(exc).splitlines()[0])


class SchemaChangeOperator(BaseOperator):
    """Run one supported ALTER TABLE of a published table at the publisher and replicate it in
    commit order (``airflow-repl schema-change``).

    :param topology: path of the topology YAML file.
    :param publication: a publication that publishes the table.
    :param sql: the statement (templated), e.g. ``ALTER TABLE public.t ADD COLUMN c text``, or the
        path of a ``.sql`` file holding it (found in the DAG's folder or ``template_searchpath``,
        rendered as a template too).
    :param include_in_filter: an added column joins articles with a column filter too.
    :param quiesced_token: refuse the change unless the topology is quiesced up to this tracer
        token (templated; e.g. the XCom of a PostTracerTokenOperator): a subscription that fell
        behind it since the quiesce sensor passed fails the task, naming it and the agent to run.
    """

    template_fields: Sequence[str] = ("topology", "publication", "sql", "quiesced_token")
    template_ext: Sequence[str] = (".sql",)
    template_fields_renderers: ClassVar[dict[str, str]] = {"sql": "sql"}
    ui_color = "#f5e3d7"

    def __init__(
        self,
        *,
        topology: str,
        publication: str,
        sql: str,
        include_in_filter: bool = False,
        quiesced_token: int | str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.topology, self.publication, self.sql = topology, publication, sql
        self.include_in_filter, self.quiesced_token = include_in_filter, quiesced_token

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow_repl.engine.monitoring.quiescing import require_quiesced
        from airflow_repl.engine.provisioning.schema_change import schema_change

        try:
            topo = _topology(self.topology, self.publication)
            if self.quiesced_token not in (None, "", "None"):
                require_quiesced(topo, self.publication, int(str(self.quiesced_token)), "the schema change")
            summary = schema_change(topo, self.publication, self.sql, include_in_filter=self.include_in_filter)
        except ReplError as exc:
            raise _fail(exc) from None
        self.log.info("schema change replicated: %s", summary)
        return summary


class RegenerateProceduresOperator(BaseOperator):
    """Regenerate the procedures of a publication's articles at its subscribers now
    (``airflow-repl regenerate-procs``): generated procedures are recreated, custom ones by
    their registered scripts.  A subscriber that fails is named; the others are done.

    :param topology: path of the topology YAML file.
    :param publication: the publication.
    :param subscribers: the subscribers (default: all of the publication's).
    :param articles: the articles (default: all).
    """

    template_fields: Sequence[str] = ("topology", "publication", "subscribers", "articles")
    ui_color = "#f5e3d7"

    def __init__(
        self,
        *,
        topology: str,
        publication: str,
        subscribers: list[str] | None = None,
        articles: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.topology, self.publication = topology, publication
        self.subscribers, self.articles = subscribers, articles

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow_repl.engine.provisioning.procedure_regeneration import regenerate_procedures

        try:
            topo = _topology(self.topology, self.publication)
            return regenerate_procedures(topo, self.publication, subscribers=self.subscribers, articles=self.articles)
        except ReplError as exc:
            raise _fail(exc) from None
