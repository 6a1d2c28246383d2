"""ValidationOperator: compares a publication's subscribers with the publisher (the ``validate``
entry of the agent job, submitted as a Spark application like the agents) and fails its task
when a subscriber differs, after pushing the report to XCom."""

from __future__ import annotations

from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from airflow_repl.engine.subscriber import validation
from airflow_repl.operators.agents import _AgentOperator


class ValidationOperator(_AgentOperator):
    """Validate ``publication`` at its subscribers (or ``subscribers``): per article, the rows
    missing, extra or different at each subscriber, found with Spark over key-hash ranges
    (docs/validation.md).  The report is the task's ``return_value`` XCom, whether or not
    anything differs; when something differs the task then fails (``AirflowFailException``, not
    retried) with one line per differing article.

    :param topology: path of the topology YAML file. (templated)
    :param publication: publication to validate. (templated)
    :param subscribers: validate only these subscribers. (templated)
    :param max_keys: differing keys listed per article and subscriber (the counts are complete).
    :param ranges: key-hash ranges per article (default: the engine's, 1024).
    :param conn_id: Spark connection id (must exist; no silent YARN fallback).
    :param spark_log_level: log level of the Spark driver (``spark.log.level``).
    """

    agent = "validate"
    ui_color = "#e3f5d7"

    def __init__(self, *, max_keys: int = validation.MAX_KEYS, ranges: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if max_keys < 0 or (ranges is not None and not 1 <= ranges <= validation.MAX_RANGES):
            raise ValueError(
                f"task {kwargs.get('task_id')!r}: max_keys must be >= 0 and ranges from 1 to "
                f"{validation.MAX_RANGES} (got max_keys {max_keys} and ranges {ranges})"
            )
        self.max_keys, self.ranges = max_keys, ranges

    def _extra_args(self) -> list[str]:
        return ["--max-keys", str(self.max_keys)] + (["--ranges", str(self.ranges)] if self.ranges else [])

    def execute(self, context: Any) -> dict[str, Any]:  # type: ignore[override]
        report = super().execute(context)
        if report.get("match", True):
            return report
        context["ti"].xcom_push(key="return_value", value=report)
        line = validation.differences_line(report["publication"], report["subscribers"])
        raise AirflowFailException(f"{line}; the report (with the first differing keys) is this task's XCom")
