"""Metrics of every agent run through Airflow's own metrics (``[metrics]``: StatsD, Datadog's
DogStatsD or OpenTelemetry, whatever the deployment configured), sent by the agent operators
after the run, from its summary; the engine knows nothing of them.

Each metric is sent twice: named ``airflow_repl.<agent>.<metric>`` with the tags
``publication`` (and ``subscriber``) for backends that keep tags (OpenTelemetry, DogStatsD,
StatsD with ``statsd_influxdb_enabled``), and named
``airflow_repl.<agent>.<metric>.<publication>[.<subscriber>]`` for plain StatsD, which drops
tags (the topology allows only lower-case letters, digits and underscores in those names;
:func:`name_part` keeps a name one part of the dotted name all the same).  The list is :data:`METRICS` (and
docs/monitoring.md).

Sending never fails a run: a ``[metrics]`` setting Airflow rejects (a StatsD port that is not a
number, say) is one warning line in the task log, naming it.
"""

from __future__ import annotations

import json
import logging
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

try:  # Airflow 3.1+: the Task SDK's metrics
    from airflow.sdk.observability import stats as _stats
except ImportError:  # pragma: no cover - Airflow 3.0
    from airflow.stats import Stats as _stats  # type: ignore[no-redef]

log = logging.getLogger(__name__)

#: (agent, metric): kind and meaning of each metric sent.
METRICS = {
    ("distribution", "transactions"): ("counter", "transactions delivered to the subscriber"),
    ("distribution", "commands"): ("counter", "commands delivered to the subscriber"),
    ("distribution", "lag_seconds"): ("gauge", "the subscription's lag when the run ended (0: caught up)"),
    ("distribution", "pending_commands"): ("gauge", "commands the run left undelivered"),
    ("distribution", "duration"): ("timer", "how long the run took"),
    ("queuereader", "transactions"): ("counter", "queued transactions applied at the publisher"),
    ("queuereader", "commands"): ("counter", "queued commands applied at the publisher"),
    ("queuereader", "conflicts"): ("counter", "conflicts met"),
    ("queuereader", "duration"): ("timer", "how long the run took"),
    ("logreader", "transactions"): ("counter", "transactions read from the publisher's WAL and stored"),
    ("logreader", "commands"): ("counter", "commands read and stored"),
    ("logreader", "duration"): ("timer", "how long the run took"),
    ("snapshot", "rows"): ("counter", "rows copied into the snapshot"),
    ("snapshot", "initialized"): ("counter", "subscriptions the run initialized"),
    ("snapshot", "duration"): ("timer", "how long the run took"),
    ("*", "failed"): ("counter", "failed runs (per failed subscriber, when the run names them)"),
}
_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")


def name_part(name: str) -> str:
    """A publication or subscriber name as one part of a dotted metric name."""
    return _UNSAFE.sub("_", name.replace(".", "__"))


def _send(kind: str, agent: str, metric: str, value: float, tags: dict[str, str]) -> None:
    named = ".".join(["airflow_repl", agent, metric, *(name_part(v) for v in tags.values())])
    for stat, with_tags in ((f"airflow_repl.{agent}.{metric}", tags), (named, None)):
        if kind == "counter":
            _stats.incr(stat, count=int(value), tags=with_tags)
        elif kind == "gauge":
            _stats.gauge(stat, value, tags=with_tags)
        else:
            _stats.timing(stat, timedelta(seconds=value), tags=with_tags)


def _per_run(agent: str, publication: str, summary: dict[str, Any]) -> list[tuple[str, float, dict[str, str]]]:
    """(metric, value, tags) of a successful run's summary."""
    sent: list[tuple[str, float, dict[str, str]]] = []
    if agent in ("distribution", "queuereader"):
        for sub in summary.get("subscriptions", []):
            if sub.get("status") == "failed":
                continue
            tags = {"publication": publication, "subscriber": str(sub["subscriber"])}
            for metric in ("transactions", "commands", "conflicts", "lag_seconds"):
                if (agent, metric) in METRICS and sub.get(metric) is not None:
                    sent.append((metric, float(sub[metric]), tags))
            if agent == "distribution" and isinstance(sub.get("backlog_at_end"), dict):
                sent.append(("pending_commands", float(sub["backlog_at_end"]["commands"]), tags))
            if sub.get("seconds") is not None:
                sent.append(("duration", float(sub["seconds"]), tags))
        return sent
    tags = {"publication": publication}
    if agent == "logreader":
        sent += [(m, float(summary.get(m) or 0), tags) for m in ("transactions", "commands")]
    elif agent == "snapshot":
        sent += [
            ("rows", float(summary.get("rows") or 0), tags),
            ("initialized", len(summary.get("initialized", [])), tags),
        ]
    if summary.get("seconds") is not None:
        sent.append(("duration", float(summary["seconds"]), tags))
    return sent


def emit_run(agent: str, publication: str, summary: dict[str, Any]) -> list[tuple[str, float, dict[str, str]]]:
    """Send the metrics of a successful run; returns what it sent (metric, value, tags)."""
    sent = _per_run(agent, publication, summary)
    _guarded([(METRICS[(agent, m)][0], agent, m, v, t) for m, v, t in sent])
    return sent


def emit_failure(agent: str, publication: str, subscribers: list[str]) -> None:
    """Count a failed run: once per failed subscriber it names, or once for the publication."""
    tags = [{"publication": publication, "subscriber": s} for s in subscribers] or [{"publication": publication}]
    _guarded([("counter", agent, "failed", 1, t) for t in tags])


def failed_subscribers(result: Path) -> list[str]:
    """The subscribers a failed run's result file names as failed (none: it failed as a whole)."""
    try:
        outcome = json.loads(result.read_text())
    except (OSError, ValueError):
        return []
    return [str(f["subscriber"]) for f in outcome.get("failures", []) if f.get("subscriber")]


def _guarded(sends: list[tuple[str, str, str, float, dict[str, str]]]) -> None:
    try:
        for kind, agent, metric, value, tags in sends:
            _send(kind, agent, metric, value, tags)
    except Exception as exc:  # a [metrics] setting Airflow rejects: the run itself is done
        line = " ".join(str(exc).split()) or type(exc).__name__
        log.warning("airflow-repl: metrics not sent: %s; check the [metrics] settings of Airflow's configuration", line)
