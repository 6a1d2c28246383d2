"""The PySpark application behind every agent.

``spark-submit agent_job.py <agent> --spec FILE --result FILE [options]``

``--spec`` names a JSON file (mode 0600, written by the operator or CLI) holding the topology
with resolved connection strings, so that no password ever appears on the spark-submit command
line.  The job deletes the file as soon as it has read it.  ``--result`` receives the run's
outcome as JSON, in every case:

* ``{"status": "succeeded", ...summary}`` (the operators push the summary to XCom);
* ``{"status": "failed", "error_class", "exit_code", "retryable", "message"}``, and the job
  exits with the error class's exit code (see :mod:`airflow_repl.engine.errors`).  The
  operators turn a non-retryable failure into ``AirflowFailException`` and a retryable one
  (lost connection, busy agent, lock timeout) into an ordinary, retried task failure.  A run
  over several subscribers in which some failed (:class:`~airflow_repl.engine.errors.SubscribersFailed`)
  adds ``failures`` (each failed subscriber's outcome) and ``summary`` (every subscriber's).

Without ``--result`` the job prints a failure's lines on stderr (one per failed subscriber);
with it, the operator reports them, once.

Owns the job's side of every agent: :data:`AGENTS`, the table from an agent's name to its
entry (which starts a SparkSession only when the agent needs one), :func:`run_agent` (the one
entry point of spark-submit, the CLI and the tests) and the result file.  The agents
themselves are in :mod:`airflow_repl.engine.agents`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from airflow_repl.engine.errors import (
    INTERNAL_EXIT_CODE,
    DifferencesFound,
    ReplError,
    SubscribersFailed,
    failure_line,
    redact,
)
from airflow_repl.engine.model.topology import Topology, from_dict
from airflow_repl.engine.runtime import continuous as continuous_mode
from airflow_repl.engine.runtime import lifecycle, registry
from airflow_repl.engine.subscriber import validation
from airflow_repl.jobs import continuous_options, local_tasks
from airflow_repl.jobs.executors import executor_id

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("airflow_repl.job")


@dataclass(frozen=True)
class Request:
    """One run of an agent, as spark-submit, the CLI or a test asks for it."""

    topology: Topology
    publication: str
    subscribers: list[str] | None = None
    until: str | None = None  # deliver transactions committed up to this ISO-8601 time
    reinitialize: bool = False
    #: Log Reader, Distribution, Queue Reader: run_* keyword arguments of continuous mode
    continuous: dict[str, Any] | None = None
    validation: dict[str, Any] | None = None  # validate: keyword arguments of validation.validate (ranges, max_keys)
    article: str | None = None  # snapshot with reinitialize: copy this article alone again


#: An agent's entry: runs it for the request, in the given SparkSession or (None) one it starts
#: if it needs one; returns its summary and the session it ran in (None: it needed none).
Entry = Callable[[Request, "SparkSession | None"], "tuple[dict[str, Any], SparkSession | None]"]


def _snapshot(req: Request, spark: SparkSession | None) -> tuple[dict[str, Any], SparkSession | None]:
    from airflow_repl.jobs import session

    for name in req.subscribers or []:  # an unknown subscriber is refused before Spark starts (seconds)
        req.topology.subscription(req.publication, name)
    max_partitions, starting, in_threads = None, None, False
    if spark is None and session.in_process():
        # no master named outside spark-submit (the CLI): a local application would only add its
        # start; the tasks run in threads here, as many as cores (jobs.local_tasks)
        threads = os.cpu_count() or 1
        spark = cast("SparkSession", local_tasks.LocalTasks(threads))
        max_partitions, in_threads = 2 * threads, True
    elif spark is None:
        # A local JVM starts while the agent checks, creates the slot and plans the partitions
        # (none of which needs Spark); their number then comes from the local master's cores.
        master = None if session.under_spark_submit() else session.default_master()
        starting = session.StartingSession(f"airflow-repl-snapshot-{req.publication}")
        cores = session.local_parallelism(master) if master else None
        max_partitions = 2 * cores if cores else None
        spark = cast("SparkSession", starting)
    from airflow_repl.engine.agents import snapshot_agent  # only the Snapshot Agent's runs pay the import

    summary = snapshot_agent.run_snapshot(
        req.topology,
        req.publication,
        spark,
        subscribers=req.subscribers,
        reinitialize=req.reinitialize,
        article=req.article,
        max_partitions=max_partitions,
        identify=executor_id,
        import_ahead=in_threads,
    )
    if in_threads:
        return {**summary, "tasks": "threads"}, None
    return {**summary, "tasks": "spark"}, starting.result() if starting is not None else spark


# Each agent's module is imported by its entry: a run imports the agent it runs, not the others
# (the CLI's Snapshot Agent starts without the Distribution Agent's modules).
def _logreader(req: Request, spark: SparkSession | None) -> tuple[dict[str, Any], SparkSession | None]:
    from airflow_repl.engine.agents import log_reader_agent

    return log_reader_agent.run_log_reader(req.topology, req.publication, **(req.continuous or {})), spark


def _distribution(req: Request, spark: SparkSession | None) -> tuple[dict[str, Any], SparkSession | None]:
    """Every named subscription (all by default), each delivered to its own end."""
    names = req.subscribers or [s.subscriber for s in req.topology.subscriptions_of(req.publication)]
    return _each_subscriber("distribution", req, names, spark)


def _queuereader(req: Request, spark: SparkSession | None) -> tuple[dict[str, Any], SparkSession | None]:
    """Every named subscription (by default the publication's queued updating ones), each
    subscriber's queue read to its own end."""
    topo, publication = req.topology, req.publication
    names = req.subscribers or [s.subscriber for s in topo.subscriptions_of(publication) if s.update_mode.queued]
    return _each_subscriber("queuereader", req, names, spark)


def _run_one(
    agent: str, topo: Topology, publication: str, subscriber: str, until: str | None, continuous: dict[str, Any] | None
) -> dict[str, Any]:
    """One subscriber's run of a per-subscriber agent, with the subscriber in its summary."""
    options = continuous or {}
    if agent == "distribution":
        from airflow_repl.engine.agents import distribution_agent

        summary = distribution_agent.run_distribution(topo, publication, subscriber, until=until, **options)
    else:
        from airflow_repl.engine.agents import queue_reader_agent

        summary = queue_reader_agent.run_queue_reader(topo, publication, subscriber, **options)
    return {"subscriber": subscriber, **summary}


def _each_subscriber(
    agent: str, req: Request, names: list[str], spark: SparkSession | None
) -> tuple[dict[str, Any], SparkSession | None]:
    """The one runner of every per-subscriber agent (:mod:`~airflow_repl.engine.runtime.registry`):
    one subscriber in this process; several in parallel, one Spark task each, each to its own
    end (:func:`_on_its_own`: one subscriber's failure is its outcome, the others go on)."""
    topo, publication = req.topology, req.publication
    for name in names:
        topo.subscription(publication, name)  # unknown subscription -> error before anything runs
    if len(names) <= 1:
        results = [_run_one(agent, topo, publication, n, req.until, req.continuous) for n in names]
    else:
        from airflow_repl.jobs.session import spark_session

        spark = spark or spark_session(f"airflow-repl-{agent}-{publication}")
        _refuse_too_few_slots(spark, req, names, agent)
        spec, until, continuous = topo.to_dict(with_secrets=True), req.until, req.continuous

        def one(name: str, driver: tuple[str, str] | None) -> dict[str, Any]:  # on an executor
            return _on_its_own(
                name, lambda: _run_one(agent, from_dict(spec), publication, name, until, continuous), driver
            )

        with _driver_stop(req) as driver:
            results = _map_on_spark(spark, lambda n: one(n, driver), names)
    return _per_subscriber(results, registry.AGENTS[agent].counted, spark), spark


def _on_its_own(
    subscriber: str, work: Callable[[], dict[str, Any]], driver: tuple[str, str] | None = None
) -> dict[str, Any]:
    """Executor side: one subscriber's work, whose failure is returned as its outcome
    (:func:`failure`: class, exit code, one-line message) instead of raised.  A task that raises
    makes Spark retry it and then abort the job, cancelling the other subscribers' tasks midway
    and printing the Python and Java stacks: each subscriber's work ends on its own instead (its
    run, when it began, has recorded the failure in its history and error rows).  ``driver``: a
    continuous run ends when the driver stops (:class:`~airflow_repl.engine.runtime.continuous.DriverStop`)."""
    continuous_mode.stop_with_driver(driver)
    try:
        return {**work(), "status": "succeeded", "executor": executor_id()}
    except Exception as exc:
        return {"subscriber": subscriber, **failure(exc), "executor": executor_id()}
    finally:
        continuous_mode.stop_with_driver(None)


@contextmanager
def _driver_stop(req: Request) -> Iterator[tuple[str, str] | None]:
    """For continuous runs in Spark tasks: what each task watches to end when the driver stops
    (SIGTERM, SIGINT, or its end); None for other runs."""
    if not (req.continuous and req.continuous.get("continuous")):
        yield None
        return
    distributor = req.topology.distributor.require("distributor")
    with continuous_mode.DriverStop(distributor) as stop:
        yield distributor, stop.key


def _per_subscriber(
    results: list[dict[str, Any]], counted: tuple[str, ...], spark: SparkSession | None
) -> dict[str, Any]:
    """The run's summary from each subscriber's (the counts add up the ones that succeeded);
    :class:`SubscribersFailed`, carrying it, when any failed."""
    done = [r for r in results if r.get("status") != "failed"]
    summary = {"subscriptions": results, **{key: sum(r[key] for r in done) for key in counted}}
    paused = [r["subscriber"] for r in done if r.get("paused")]  # skipped: paused (airflow-repl resume)
    if paused:
        summary["paused"] = paused
    failures = [r for r in results if r.get("status") == "failed"]
    if failures:
        if spark is not None:
            summary["spark_application_id"] = spark.sparkContext.applicationId
        raise SubscribersFailed(summary, failures)
    return summary


def _refuse_too_few_slots(spark: SparkSession, req: Request, names: list[str], agent: str) -> None:
    """Continuous runs for several subscribers are Spark tasks that last the whole run: one task
    slot each, or some would wait for the others to end."""
    slots = spark.sparkContext.defaultParallelism
    if req.continuous and req.continuous.get("continuous") and len(names) > slots:
        work = registry.AGENTS[agent].work.format(publication=req.publication)
        raise ReplError(
            f"continuous {work} {len(names)} subscribers needs {len(names)} "
            f"Spark tasks at once, and the application has {slots} task slots: give it more cores (e.g. local[{len(names)}] "
            f"or spark.cores.max) or run one {registry.label(agent)} per group of subscribers (--subscriber)"
        )


def _map_on_spark(spark: SparkSession, f: Callable[[Any], Any], items: list[Any]) -> list[Any]:
    """``f`` over ``items``, one Spark task each, results in order; a task's failure, wrapped by
    Spark, is raised as the engine's own error."""
    try:
        return spark.sparkContext.parallelize(items, len(items)).map(f).collect()
    except Exception as exc:
        unwrapped = lifecycle.unwrap_spark_error(exc)
        if unwrapped is exc:
            raise
        raise unwrapped from None


def _validate(req: Request, spark: SparkSession | None) -> tuple[dict[str, Any], SparkSession | None]:
    """Compare the publisher with every named subscriber (all by default) over key ranges, the
    tasks of both passes on Spark (see :mod:`airflow_repl.engine.subscriber.validation`); the
    SparkSession starts only once the input is checked."""
    topo, publication = req.topology, req.publication
    names = req.subscribers or [s.subscriber for s in topo.subscriptions_of(publication)]
    for name in names:
        topo.subscription(publication, name)  # unknown subscription -> error before anything runs
    session = [spark]

    def on_spark(f: Callable[[Any], Any], tasks: list[Any]) -> list[Any]:
        from airflow_repl.jobs.session import spark_session

        active = session[0] = session[0] or spark_session(f"airflow-repl-validate-{publication}")
        return _map_on_spark(active, f, tasks) if tasks else []

    failed: dict[str, ReplError] = {}  # with several subscribers, each one's failure is its own
    collect = failed if len(names) > 1 else None
    report = validation.validate(topo, publication, names, on_spark, **(req.validation or {}), failures=collect)
    summary = {"publication": publication, "match": validation.matches(report) and not failed, "subscribers": report}
    if failed:  # the ones that could not be validated, and the ones that differ: a line each
        differing = [
            {**failure(DifferencesFound(validation.differences_line(publication, {name: rows}))), "subscriber": name}
            for name, rows in report.items()
            if not validation.matches({name: rows})
        ]
        failures = [{"subscriber": name, **failure(exc)} for name, exc in failed.items()] + differing
        summary["failures"] = failures
        raise SubscribersFailed(summary, failures)
    return summary, session[0]


#: The agents, by the name the CLI, the operators and spark-submit use.  A new agent is one
#: entry here (and its module in airflow_repl.engine.agents).
AGENTS: dict[str, Entry] = {
    "snapshot": _snapshot,
    "logreader": _logreader,
    "distribution": _distribution,
    "queuereader": _queuereader,
    "validate": _validate,
}


def run_agent(
    agent: str,
    topo: Topology,
    publication: str,
    *,
    subscribers: list[str] | None = None,
    until: str | None = None,
    reinitialize: bool = False,
    spark: SparkSession | None = None,
    continuous: dict[str, Any] | None = None,
    validation: dict[str, Any] | None = None,
    article: str | None = None,
) -> dict[str, Any]:
    """Run one agent; the same entry point serves spark-submit, the CLI and the tests.
    ``continuous``: the Log Reader's or Distribution Agent's continuous mode, as keyword
    arguments (``continuous``, ``poll_interval``, ``max_run_seconds``); ``validation``: the
    ``validate`` entry's ``ranges`` and ``max_keys``."""
    if agent not in AGENTS:
        raise ReplError(f"unknown agent {agent!r}; choose one of {', '.join(AGENTS)}")
    topo.publication(publication)  # unknown publication -> clear error
    if until is not None:
        from airflow_repl.engine.agents import distribution_agent

        distribution_agent.parse_until(until)  # a bad time -> clear error before anything runs
    continuous_mode.check_request(agent, until, continuous)  # bad continuous options: before anything runs
    if article is not None:  # one line, before Spark starts
        if agent != "snapshot":
            raise ReplError(f"--article is an option of the snapshot agent, not of the {agent} agent")
        from airflow_repl.engine.agents import snapshot_agent

        snapshot_agent.check_article(topo, publication, article, reinitialize)
    request = Request(topo, publication, subscribers, until, reinitialize, continuous, validation, article)
    result, spark = AGENTS[agent](request, spark)
    if spark is not None:
        result["spark_application_id"] = spark.sparkContext.applicationId
    return result


def failure(exc: BaseException) -> dict[str, Any]:
    """The result-file outcome of a failed run (one line of message, no password)."""
    exc = lifecycle.as_engine_error(exc) if isinstance(exc, Exception) else exc
    if isinstance(exc, ReplError):
        outcome = {
            "status": "failed",
            "error_class": type(exc).__name__,
            "exit_code": exc.exit_code,
            "retryable": exc.retryable,
            "message": redact(str(exc)),
        }
        if isinstance(exc, SubscribersFailed):  # each failed subscriber's outcome, and the others' summaries
            outcome |= {"failures": exc.failures, "summary": exc.summary}
        return outcome
    detail = redact(" ".join(str(exc).split())) or "no message"
    return {
        "status": "failed",
        "error_class": type(exc).__name__,
        "exit_code": INTERNAL_EXIT_CODE,
        "retryable": False,
        "message": f"internal error ({type(exc).__name__}): {detail}; this is a bug, please report it",
        "traceback": redact("".join(traceback.format_exception(exc))),
    }


def error_lines(outcome: dict[str, Any]) -> list[str]:
    """A failed outcome's lines: one per failed subscriber of a run over several, else its message."""
    if outcome.get("failures"):
        return [redact(failure_line(f)) for f in outcome["failures"]]
    return [outcome["message"]]


def write_result(path: str, outcome: dict[str, Any]) -> None:
    """Write the outcome atomically (a reader never sees half a file)."""
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps(outcome, default=str))
    os.replace(tmp, path)


def _read_spec(path: str) -> Topology:
    spec_path = Path(path)
    try:
        spec = json.loads(spec_path.read_text())
    except (OSError, ValueError) as exc:
        raise ReplError(f"cannot read the job's topology spec {path}: {exc}") from None
    finally:
        try:
            spec_path.unlink()
        except OSError:
            pass
    return from_dict(spec)


def _validation_options(args: argparse.Namespace) -> dict[str, Any] | None:
    """The ``validate`` entry's options given on the command line (None for the other agents)."""
    if args.agent != "validate":
        return None
    given = {"ranges": args.ranges, "max_keys": args.max_keys}
    return {k: v for k, v in given.items() if v is not None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agent_job.py")
    parser.add_argument("agent", choices=list(AGENTS))
    parser.add_argument("--spec", required=True, help="JSON file with the resolved topology")
    parser.add_argument("--result", help="where to write the run's outcome (JSON)")
    parser.add_argument("--publication", required=True)
    parser.add_argument("--subscriber", action="append", help="limit to these subscribers")
    parser.add_argument("--until", help="deliver transactions committed up to this ISO-8601 time")
    parser.add_argument("--reinitialize", action="store_true")
    parser.add_argument("--article", help="snapshot with --reinitialize: copy this article alone again")
    continuous_options.add_arguments(parser)
    parser.add_argument("--ranges", type=int, help="validate: key ranges per article")
    parser.add_argument("--max-keys", type=int, help="validate: differing keys listed per article and subscriber")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        topo = _read_spec(args.spec)
        if args.continuous:
            continuous_mode.stop_when_orphaned()  # spark-submit's JVM stopped: end cleanly, not orphaned
        result = run_agent(
            args.agent,
            topo,
            args.publication,
            subscribers=args.subscriber,
            until=args.until or None,
            reinitialize=args.reinitialize,
            article=args.article,
            continuous=continuous_options.from_arguments(args),
            validation=_validation_options(args),
        )
        outcome, code = {"status": "succeeded", **result}, 0
        if result.get("match") is False:  # validate found differences: the report, and exit code 6
            code = DifferencesFound.exit_code
        log.info("%s agent finished: %s", args.agent, json.dumps(result, default=str))
    except Exception as exc:
        outcome = failure(exc)
        code = outcome["exit_code"]
        if not args.result:  # with a result file, the operator reports the failure, once
            for line in error_lines(outcome):
                print(f"airflow-repl: error: {line}", file=sys.stderr)
    if args.result:
        try:
            write_result(args.result, outcome)
        except OSError as exc:  # e.g. a continuous run stopped by Airflow, whose task removed the folder
            log.warning("could not write the result file %s: %s", args.result, exc)
    return code


if __name__ == "__main__":
    sys.exit(main())
