"""Operators that run airflow-repl agents as Spark applications.

Each operator is a :class:`~airflow.providers.apache.spark.operators.spark_submit.SparkSubmitOperator`
that submits ``airflow_repl/jobs/agent_job.py``.  The topology, with passwords resolved from
Airflow connections, reaches the job through a temporary 0600 file named on the command line,
never through the command line itself; the run's summary is returned (pushed to XCom) and
sent as metrics through Airflow's own (:mod:`airflow_repl.operators.metrics`).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import AssetAlias, BaseHook
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_repl.engine.errors import ReplError, failure_line
from airflow_repl.engine.model.topology import Topology
from airflow_repl.engine.postgres.addresses import TableAddress
from airflow_repl.engine.runtime import continuous as continuous_mode
from airflow_repl.hooks.replication import ReplicationHook
from airflow_repl.jobs import agent_job, class_archive
from airflow_repl.jobs.agent_job import failure
from airflow_repl.operators import lineage, metrics

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage

JOB_PATH = str(Path(agent_job.__file__).resolve())


SPARK_LOG_LEVELS = ("ALL", "TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF")


def read_outcome(result: Path, agent: str, submit_error: Exception | None = None, *, log=None) -> dict:
    """The summary the agent job wrote to ``result``; a failure it wrote there becomes
    ``AirflowFailException`` (not retried: bad topology or input, not initialized, delivery
    error, internal error) or ``AirflowException`` (retried: lost connection, busy agent, lock
    timeout), with the agent's one-line message."""
    if not result.exists():
        if submit_error is not None:
            raise AirflowException(
                f"the {agent} agent did not report an outcome (the Spark application failed "
                f"before it ran: {submit_error}); see the spark-submit output above"
            )
        raise AirflowException(
            f"the {agent} agent finished without writing its outcome; see the Spark driver log above"
        )
    outcome = json.loads(result.read_text())
    if outcome.get("status") != "failed":
        outcome.pop("status", None)
        return outcome
    if log is not None:
        for failed in [outcome, *outcome.get("failures", [])]:
            if failed.get("traceback"):
                log.info("traceback of the internal error, for the bug report:\n%s", failed["traceback"])
        if outcome.get("summary"):  # some subscribers failed: what the others did (the reasons follow, once)
            log.info("%s agent summary: %s", agent, _without_reasons(outcome["summary"]))
    raise task_failure(agent, outcome)


def _without_reasons(summary: dict) -> dict:
    """A summary whose failed subscribers' entries keep only their name, class and exit code."""
    kept = ("subscriber", "status", "error_class", "exit_code")
    shown = {k: v for k, v in summary.items() if k != "failures"}
    if isinstance(summary.get("subscriptions"), list):
        shown["subscriptions"] = [
            {k: v for k, v in s.items() if k in kept} if s.get("status") == "failed" else s
            for s in summary["subscriptions"]
        ]
    return shown


def task_failure(agent: str, outcome: dict) -> AirflowException:
    """The Airflow exception for a failed outcome: retried only when a retry can fix it.  A run
    in which some subscribers failed says which, a line each."""
    failures = outcome.get("failures")
    if failures:
        message = f"{agent} agent failed at {len(failures)} subscriber(s) (exit code {outcome.get('exit_code')}):\n"
        message += "\n".join(failure_line(f) for f in failures)
    else:
        message = (
            f"{agent} agent failed ({outcome.get('error_class')}, exit code {outcome.get('exit_code')}): "
            f"{outcome.get('message')}"
        )
    if outcome.get("retryable"):
        return AirflowException(f"{message} [retryable]")
    return AirflowFailException(message)


class MissingSparkConnection(RuntimeError):
    """The Spark connection the operator names does not exist."""


class UnsupportedDeployMode(AirflowFailException):
    """The Spark connection or the operator asks for cluster deploy mode (not retried)."""


class _AgentOperator(SparkSubmitOperator):
    agent = ""
    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "topology", "publication", "subscribers")
    ui_color = "#d7e8f5"

    def __init__(
        self,
        *,
        topology: str,
        publication: str,
        subscribers: list[str] | None = None,
        conn_id: str = "spark_default",
        name: str | None = None,
        spark_log_level: str = "WARN",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            application=JOB_PATH, conn_id=conn_id, name=name or f"airflow-repl-{self.agent}-{publication}", **kwargs
        )
        if spark_log_level.upper() not in SPARK_LOG_LEVELS:
            raise ValueError(
                f"spark_log_level {spark_log_level!r} of task {kwargs.get('task_id')!r} is not a Spark "
                f"log level: use one of {', '.join(SPARK_LOG_LEVELS)}"
            )
        self.spark_log_level = spark_log_level.upper()
        self.topology = topology
        self.publication = publication
        self.subscribers = subscribers
        #: the user gave the driver's Java options: no class archive (jobs.class_archive) then
        self.own_java_options = "spark.driver.extraJavaOptions" in (self.conf or {})

    def _extra_args(self) -> list[str]:
        return []

    def _spark_conf(self) -> dict:
        """The job's Spark settings: this Python for driver and workers, the driver's log level,
        then whatever the user set in ``conf`` (which wins)."""
        return {
            "spark.pyspark.python": sys.executable,
            "spark.pyspark.driver.python": sys.executable,
            "spark.log.level": self.spark_log_level,
            "spark.ui.showConsoleProgress": "false",  # a progress bar has no place in a task log
            **(self.conf or {}),
        }

    def _check_spark_connection(self) -> None:
        try:
            conn = BaseHook.get_connection(self._conn_id)
        except Exception:
            raise MissingSparkConnection(
                f"Spark connection {self._conn_id!r} is not defined, so {self.task_id!r} would be submitted "
                f"to YARN by default. Create it, e.g. AIRFLOW_CONN_{self._conn_id.upper()}="
                f'\'{{"conn_type": "spark", "host": "local[2]"}}\' for local mode, or '
                f"'spark://master-host:7077' for a standalone cluster."
            ) from None
        deploy_mode = self._deploy_mode or conn.extra_dejson.get("deploy-mode")
        if deploy_mode == "cluster":
            raise UnsupportedDeployMode(
                f"task {self.task_id!r} would run the {self.agent} agent's Spark driver in cluster deploy mode "
                f"(Spark connection {self._conn_id!r}), but the driver must run beside the operator: it reads "
                f"the topology spec and writes its outcome as files on the Airflow worker. Use client deploy "
                f"mode: remove deploy-mode from the connection's extras (and deploy_mode from the task)"
            )

    # SparkSubmitOperator.execute returns None; ours returns the agent's result, which Airflow
    # pushes as the task's XCom (BaseOperator.execute may return any value).
    def execute(self, context: Any) -> dict[str, Any]:  # type: ignore[override]
        self._check_spark_connection()
        try:
            topo = ReplicationHook(self.topology).get_topology()
            topo.publication(self.publication)
        except ReplError as exc:  # the topology is checked before anything is submitted
            raise task_failure(self.agent, failure(exc)) from None
        env = dict(self.env_vars or {})
        if shutil.which("spark-submit") is None:  # e.g. Airflow started from a venv without activation
            env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        self.env_vars = env
        self.conf = self._spark_conf()
        archive = None if self.own_java_options else class_archive.plan()
        if archive is not None:  # the driver JVM (client mode: here) starts from the class archive, or writes it
            self.conf["spark.driver.extraJavaOptions"] = archive.options
        with tempfile.TemporaryDirectory(prefix="airflow-repl-") as tmp:
            spec = ReplicationHook.write_spec(topo, tmp)
            result = Path(tmp) / "result.json"
            args = [self.agent, "--spec", str(spec), "--result", str(result), "--publication", self.publication]
            for sub in self.subscribers or []:
                args += ["--subscriber", sub]
            self.application_args = args + self._extra_args()
            self._hook = None  # rebuild the hook with these arguments
            submit_error: Exception | None = None
            try:
                super().execute(context)
            except Exception as exc:
                submit_error = exc
            finally:
                if archive is not None:  # spark-submit has returned: its JVM has exited
                    archive.keep()
            try:
                summary = read_outcome(result, self.agent, submit_error, log=self.log)
            except AirflowException:
                metrics.emit_failure(self.agent, self.publication, metrics.failed_subscribers(result))
                raise
        self.log.info("%s agent summary: %s", self.agent, summary)
        metrics.emit_run(self.agent, self.publication, summary)
        self._after_run(context, topo, summary)
        return summary

    def _after_run(self, context: Any, topo: Topology, summary: dict[str, Any]) -> None:
        """What the operator does with a successful run's summary besides returning it."""


class _AssetsAndLineage(_AgentOperator):
    """An agent that changes subscriber tables: asset events for the tables a run changed, on
    the alias ``airflow-repl:<publication>`` it adds to its outlets, and OpenLineage facets
    (inputs: the publisher's tables; outputs: the subscribers' tables).  See
    :mod:`airflow_repl.operators.lineage` and docs/assets-and-lineage.md."""

    def __init__(self, *, publication: str, outlets: Any = None, **kwargs: Any) -> None:
        given = list(outlets) if isinstance(outlets, list | tuple) else [outlets] if outlets is not None else []
        # a templated publication has its alias once rendered (render_template_fields); a plain one now,
        # so that the DAG's serialized outlets name it
        self.asset_alias: AssetAlias | None = (
            None if lineage.is_templated(publication) else lineage.asset_alias(publication)
        )
        alias = [self.asset_alias] if self.asset_alias is not None else []
        super().__init__(publication=publication, outlets=[*given, *alias], **kwargs)
        self._changed: list[tuple[TableAddress, dict[str, Any]]] | None = None

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        """Render the templated fields, then name the alias after the rendered publication
        (``publication='{{ params.pub }}'`` adds its events to ``airflow-repl:<the pub param>``)."""
        super().render_template_fields(context, jinja_env)
        rendered = lineage.asset_alias(self.publication)
        self.outlets = [o for o in self.outlets if o != self.asset_alias] + [rendered]
        self.asset_alias = rendered

    def _after_run(self, context: Any, topo: Topology, summary: dict[str, Any]) -> None:
        self._changed = lineage.changed_tables(self.agent, topo, self.publication, summary)
        if self.asset_alias is None:  # execute called without rendering (outside a task run)
            self.asset_alias = lineage.asset_alias(self.publication)
        if "outlet_events" in context:  # outside a task run (execute called directly) there is nowhere to emit
            lineage.emit(context, self.asset_alias, self._changed)
        self.log.info(
            "asset events for %d subscriber table(s) on alias %r: %s",
            len(self._changed),
            self.asset_alias.name,
            ", ".join(address.uri for address, _ in self._changed) or "none changed",
        )

    def get_openlineage_facets_on_start(self) -> OperatorLineage:
        topo = ReplicationHook(self.topology).get_topology()
        return lineage.operator_lineage(
            topo, self.publication, lineage.served_subscribers(topo, self.publication, self.subscribers)
        )

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> OperatorLineage:
        topo = ReplicationHook(self.topology).get_topology()
        rows = lineage.rows_per_table(self._changed) if self._changed is not None else None
        return lineage.operator_lineage(
            topo, self.publication, lineage.served_subscribers(topo, self.publication, self.subscribers), rows
        )


class SnapshotAgentOperator(_AssetsAndLineage):
    """Run the Snapshot Agent: a consistent snapshot of ``publication`` and initialization of its
    subscriptions that are not active yet (all of them with ``reinitialize``).

    :param topology: path of the topology YAML file. (templated)
    :param publication: publication to snapshot. (templated)
    :param subscribers: initialize only these subscribers. (templated)
    :param reinitialize: re-initialize subscriptions that are already active.
    :param conn_id: Spark connection id (must exist; no silent YARN fallback).
    :param spark_log_level: log level of the Spark driver (``spark.log.level``); WARN by default
        so task logs show the agent, not Spark's scheduler chatter.
    """

    agent = "snapshot"

    def __init__(self, *, reinitialize: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reinitialize = reinitialize

    def _extra_args(self) -> list[str]:
        return ["--reinitialize"] if self.reinitialize else []


class _ContinuousMixin:
    """``continuous``, ``poll_interval`` and ``max_run_seconds``, passed to the job (checked
    when the DAG is parsed: a bad value is one clear error there)."""

    def _init_continuous(self, continuous: bool, poll_interval: float | None, max_run_seconds: float | None) -> None:
        continuous_mode.options(continuous, poll_interval, max_run_seconds)
        self.continuous, self.poll_interval, self.max_run_seconds = continuous, poll_interval, max_run_seconds

    def _continuous_args(self) -> list[str]:
        args = ["--continuous"] if self.continuous else []
        if self.poll_interval is not None:
            args += ["--poll-interval", str(self.poll_interval)]
        if self.max_run_seconds is not None:
            args += ["--max-run-seconds", str(self.max_run_seconds)]
        return args


class _ContinuousAgentOperator(_ContinuousMixin, _AgentOperator):
    """An agent whose only extra parameters are continuous mode's."""

    def __init__(
        self,
        *,
        continuous: bool = False,
        poll_interval: float | None = None,
        max_run_seconds: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._init_continuous(continuous, poll_interval, max_run_seconds)

    def _extra_args(self) -> list[str]:
        return self._continuous_args()


class LogReaderAgentOperator(_ContinuousAgentOperator):
    """Run the Log Reader Agent: move committed transactions of ``publication`` from the
    publisher's WAL into the distribution database.

    :param topology: path of the topology YAML file. (templated)
    :param publication: publication to read. (templated)
    :param continuous: keep reading what is committed later, until ``max_run_seconds`` or
        SIGTERM (the task ends with the success summary; see docs/continuous.md).
    :param poll_interval: seconds between looks at the publisher when idle (continuous; default 1).
    :param max_run_seconds: end a continuous run after this many seconds (default 3600).
    :param conn_id: Spark connection id (must exist; no silent YARN fallback).
    :param spark_log_level: log level of the Spark driver (``spark.log.level``); WARN by default
        so task logs show the agent, not Spark's scheduler chatter.
    """

    agent = "logreader"


class DistributionAgentOperator(_ContinuousMixin, _AssetsAndLineage):
    """Run the Distribution Agent: deliver pending transactions of ``publication`` to its
    subscribers (or ``subscribers``), in commit order, exactly once.

    :param topology: path of the topology YAML file. (templated)
    :param publication: publication to deliver. (templated)
    :param subscribers: deliver only to these subscribers. (templated)
    :param until: deliver only transactions committed up to this time, e.g.
        ``"{{ data_interval_end }}"`` for point-in-time delivery in backfills; not with
        ``continuous``. (templated)
    :param continuous: keep delivering what the Log Reader stores later, until
        ``max_run_seconds`` or SIGTERM (the task ends with the success summary; see
        docs/continuous.md).
    :param poll_interval: seconds between looks at the distribution database when idle
        (continuous; default 1).
    :param max_run_seconds: end a continuous run after this many seconds (default 3600).
    :param conn_id: Spark connection id (must exist; no silent YARN fallback).
    :param spark_log_level: log level of the Spark driver (``spark.log.level``); WARN by default
        so task logs show the agent, not Spark's scheduler chatter.
    """

    agent = "distribution"
    template_fields: Sequence[str] = (*_AssetsAndLineage.template_fields, "until")

    def __init__(
        self,
        *,
        until: str | None = None,
        continuous: bool = False,
        poll_interval: float | None = None,
        max_run_seconds: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.until = until
        self._init_continuous(continuous, poll_interval, max_run_seconds)
        continuous_mode.refuse_until(until, continuous_mode.options(continuous, poll_interval, max_run_seconds))

    def _extra_args(self) -> list[str]:
        return (["--until", str(self.until)] if self.until else []) + self._continuous_args()


class QueueReaderAgentOperator(_ContinuousAgentOperator):
    """Run the Queue Reader Agent (queued updating subscriptions): apply the transactions queued
    at the subscribers of ``publication`` at the publisher, in each subscriber's commit order,
    exactly once, resolving conflicts by the publication's ``conflict_policy``.  Several
    subscribers' queues are read in parallel, one Spark task each.  The summary (transactions,
    commands, conflicts per subscriber) is pushed to XCom; conflicts are listed by
    ``airflow-repl conflicts``.

    :param topology: path of the topology YAML file. (templated)
    :param publication: publication whose subscribers' queues are read. (templated)
    :param subscribers: read only these subscribers' queues (default: every queued updating
        subscription of the publication). (templated)
    :param continuous: keep applying what the subscribers queue later, until
        ``max_run_seconds`` or SIGTERM (the task ends with the success summary; see
        docs/continuous.md); it takes turns with the Distribution Agent at each subscriber.
    :param poll_interval: seconds between looks at the queues when they are empty (continuous;
        default 1).
    :param max_run_seconds: end a continuous run after this many seconds (default 3600).
    :param conn_id: Spark connection id (must exist; no silent YARN fallback).
    :param spark_log_level: log level of the Spark driver (``spark.log.level``); WARN by default
        so task logs show the agent, not Spark's scheduler chatter.
    """

    agent = "queuereader"
