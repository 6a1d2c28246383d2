"""Settings shared by the example DAGs (environment variables with sensible defaults), and the
arguments of their agent tasks: retries with exponential back-off and an alert when one fails."""

from __future__ import annotations

import json
import os
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import BaseNotifier

TOPOLOGY = os.environ.get("AIRFLOW_REPL_TOPOLOGY", str(Path(__file__).with_name("demo_topology.yaml")))
PUBLICATION = os.environ.get("AIRFLOW_REPL_PUBLICATION", "shop")
SPARK_CONN_ID = os.environ.get("AIRFLOW_REPL_SPARK_CONN_ID", "spark_default")
#: The publication with queued updating subscriptions (repl_updatable.py, repl_updatable_continuous.py).
UPDATABLE_PUBLICATION = os.environ.get("AIRFLOW_REPL_UPDATABLE_PUBLICATION", PUBLICATION)
#: The subscriber table the asset-scheduled example DAG (repl_on_replicated_table.py) waits for,
#: as its Postgres asset URI: postgres://host:port/database/schema/table, with the host, port and
#: database of the subscriber's connection as written there (see docs/assets-and-lineage.md).
REPLICATED_ORDERS = os.environ.get("AIRFLOW_REPL_ORDERS_ASSET", "postgres://localhost:5432/reporting/public/orders")

#: Seconds before an agent task's first retry (then doubled at each: exponential back-off).
RETRY_DELAY_SECONDS = float(os.environ.get("AIRFLOW_REPL_RETRY_DELAY_SECONDS", "60"))
#: Where ReplicationAlert posts a failed task's alert (JSON), e.g. a chat's incoming webhook;
#: unset: the alert is only logged.
ALERT_WEBHOOK = os.environ.get("AIRFLOW_REPL_ALERT_WEBHOOK")


class ReplicationAlert(BaseNotifier):
    """An ``on_failure_callback`` through Airflow's notifier interface: once a task has failed
    for good (no retry left, or a failure a retry cannot fix), log one line naming the DAG, the
    task, its try and the reason, and post it as JSON to ``webhook`` when one is set.  Replace
    it by a provider's notifier (Slack, SMTP, ...) as you like: they take the same place."""

    template_fields = ("webhook",)

    def __init__(self, webhook: str | None = None) -> None:
        super().__init__()
        self.webhook = webhook

    def notify(self, context: Any) -> None:
        ti = context["ti"]
        reason = " ".join(str(context.get("exception") or "no exception").split())
        alert = {
            "dag_id": ti.dag_id,
            "task_id": ti.task_id,
            "run_id": ti.run_id,
            "try_number": ti.try_number,
            "reason": reason,
            "text": f"airflow-repl: task {ti.dag_id}.{ti.task_id} failed (try {ti.try_number}): {reason}",
        }
        self.log.error("%s", alert["text"])
        if self.webhook:
            request = urllib.request.Request(
                self.webhook, data=json.dumps(alert).encode(), headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=10):
                pass


#: The alert of every example task that fails for good.
ALERT = ReplicationAlert(ALERT_WEBHOOK)

#: The arguments of every agent task in the example DAGs: a retryable failure (an agent's exit
#: code 5: a lost connection, a busy agent, a lock timeout; the operators raise AirflowException)
#: is retried three times with exponential back-off (RETRY_DELAY_SECONDS, then twice and four
#: times that, at most 30 minutes); the others (exit codes 1-4: bad input, not initialized, a
#: delivery error, an internal error; AirflowFailException) fail at once.  A task that fails for
#: good alerts through ReplicationAlert.
AGENT_TASK_ARGS: dict[str, Any] = {
    "retries": 3,
    "retry_delay": timedelta(seconds=RETRY_DELAY_SECONDS),
    "retry_exponential_backoff": 2.0,
    "max_retry_delay": timedelta(minutes=30),
    "on_failure_callback": ALERT,
}
