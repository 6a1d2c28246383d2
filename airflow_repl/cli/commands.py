"""What each ``airflow-repl`` command does: one function per command, over the engine (and the
presentation for ``status`` and ``report``); the topology and publication they work on."""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from airflow_repl.cli.output import print_result, print_validation
from airflow_repl.engine.codegen import dialect as codegen_dialect
from airflow_repl.engine.errors import (
    DifferencesFound,
    ReplError,
    SubscribersFailed,
)
from airflow_repl.engine.model import topology
from airflow_repl.engine.postgres import connections
from airflow_repl.engine.provisioning import deploy, drop, plan, update_mode
from airflow_repl.engine.subscriber import validation
from airflow_repl.jobs import continuous_options


def airflow_lookup(conn_id: str) -> str:
    """A connection id through Airflow's own lookup (secrets backend, ``AIRFLOW_CONN_<ID>``, metadata
    database); Airflow is imported only when a topology names a server by connection id."""
    first = "airflow_repl.hooks.connections" not in sys.modules
    with _own_logging():  # the import configures Airflow's logging ...
        from airflow_repl.hooks.connections import airflow_home
        from airflow_repl.hooks.connections import airflow_lookup as lookup
    if first:  # once, with -v: which Airflow (its home, so its metadata database) answers
        logging.getLogger(__name__).debug(
            "connection ids are looked up through Airflow: the secrets backend, AIRFLOW_CONN_<ID>, then the "
            "metadata database of %s",
            airflow_home(),
        )
    with _own_logging():  # ... and the lookup logs through it
        return lookup(conn_id)


@contextmanager
def _own_logging() -> Iterator[None]:
    """Importing Airflow configures logging for Airflow's processes (its handler on stdout, its
    levels): the command line keeps its own (stderr, stdout for results), and Airflow's notes about
    its own setup (config file read, no Fernet key) show only with -v."""
    root, airflow_logger = logging.getLogger(), logging.getLogger("airflow")
    handlers, level = root.handlers[:], root.level
    quiet = logging.DEBUG if level <= logging.DEBUG else logging.ERROR
    airflow_logger.setLevel(quiet)
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        airflow_logger.setLevel(quiet)


def _load(args: argparse.Namespace) -> topology.Topology:
    return connections.resolve_topology(topology.load(args.topology), airflow_lookup)


def _publication(topo: topology.Topology, name: str | None) -> str:
    if name:
        topo.publication(name)
        return name
    if len(topo.publications) == 1:
        return next(iter(topo.publications))
    raise ReplError(
        f"the topology has several publications ({', '.join(topo.publications)}): choose one with --publication"
    )


def _subscribers(topo: topology.Topology, publication: str, names: list[str] | None) -> list[str]:
    """The named subscribers (all of the publication's by default); an unknown one is an error."""
    for name in names or []:
        topo.subscription(publication, name)
    return names or [s.subscriber for s in topo.subscriptions_of(publication)]


def cmd_agent(args: argparse.Namespace) -> dict[str, Any]:
    from airflow_repl.jobs.agent_job import run_agent

    until = getattr(args, "until", None)
    continuous = continuous_options.from_arguments(args)  # checked by _check_options before anything runs
    topo = _load(args)
    publication = _publication(topo, args.publication)
    if args.subscriber:
        _subscribers(topo, publication, args.subscriber)
    try:
        return run_agent(
            args.command,
            topo,
            publication,
            subscribers=args.subscriber,
            until=until,
            reinitialize=getattr(args, "reinitialize", False),
            article=getattr(args, "article", None),
            continuous=continuous,
        )
    except SubscribersFailed as exc:  # every subscriber's summary first, then a line per failure
        print_result(exc.summary)
        raise


def cmd_apply(args: argparse.Namespace) -> dict[str, Any]:
    """Carry out the plan (docs/operations.md, "Plan and apply"); the plan carried out is the summary."""
    topo = _load(args)
    return plan.apply(topo, [args.publication] if args.publication else None, allow_drop=args.allow_drop).to_dict()


def cmd_plan(args: argparse.Namespace) -> None:
    """What apply would do, from the servers, changing nothing."""
    topo = _load(args)
    the_plan = plan.plan(topo, [args.publication] if args.publication else None)
    print(the_plan.to_json() if args.output == "json" else the_plan.format_table())


def cmd_drop(args: argparse.Namespace) -> dict[str, Any]:
    """Drop an article, a subscription or a publication (docs/operations.md, "Drop"); the names
    are those deployed, which the topology file may no longer list."""
    topo = _load(args)
    if args.what == "article":
        return drop.drop_article(topo, args.publication, args.article)
    if args.what == "subscription":
        return drop.drop_subscription(topo, args.publication, args.subscriber)
    return drop.drop_publication(topo, args.publication, with_subscriptions=args.with_subscriptions)


def cmd_set_update_mode(args: argparse.Namespace) -> dict[str, Any]:
    topo = _load(args)
    return update_mode.set_update_mode(topo, _publication(topo, args.publication), args.subscriber, args.mode)


def cmd_pause(args: argparse.Namespace) -> dict[str, Any]:
    """Pause or resume one subscription (docs/operations.md)."""
    from airflow_repl.engine.provisioning import pausing

    topo = _load(args)
    pub = _publication(topo, args.publication)
    act = pausing.pause_subscription if args.command == "pause" else pausing.resume_subscription
    return act(topo, pub, args.subscriber)


def cmd_resolve_in_doubt(args: argparse.Namespace) -> dict[str, Any]:
    """Finish the transactions immediate subscribers prepared at the publisher (once, or with
    ``--follow`` continuously for one subscriber)."""
    from airflow_repl.engine.subscriber import in_doubt

    topo = _load(args)
    pub = _publication(topo, args.publication)
    if not args.follow:
        return in_doubt.resolve_in_doubt(topo, pub, args.subscriber)
    if args.subscriber is None:
        raise ReplError("resolve-in-doubt --follow needs --subscriber (one resolver per immediate subscriber)")
    try:
        return {args.subscriber: in_doubt.follow(topo, pub, args.subscriber, interval=args.interval)}
    except KeyboardInterrupt:
        return {args.subscriber: "stopped"}


def cmd_validate(args: argparse.Namespace) -> None:
    """Compare the publisher with its subscribers over key ranges on Spark (docs/validation.md);
    the report is printed first, then an error (exit code 6) when anything differs."""
    from airflow_repl.jobs.agent_job import run_agent

    topo = _load(args)
    pub = _publication(topo, args.publication)
    subs = _subscribers(topo, pub, args.subscriber)
    options = {"max_keys": args.max_keys, **({"ranges": args.ranges} if args.ranges else {})}
    try:
        result = run_agent("validate", topo, pub, subscribers=subs, validation=options)
    except SubscribersFailed as exc:  # the others' report first, then a line per subscriber
        print_validation(exc.summary, args.output)
        raise
    print_validation(result, args.output)
    if not result["match"]:
        raise DifferencesFound(f"{validation.differences_line(pub, result['subscribers'])} (see the report above)")


def cmd_conflicts(args: argparse.Namespace) -> list[dict[str, Any]] | None:
    """The conflicts the Queue Reader recorded, oldest first, filtered by the options given: a
    text table, or with ``-o json`` the records."""
    from airflow_repl.engine.agents.distribution_agent import parse_until
    from airflow_repl.engine.state import dist_conflicts
    from airflow_repl.presentation import status_table

    since = parse_until(args.since) if args.since else None  # ISO-8601; without an offset, UTC
    topo = _load(args)
    if args.publication:
        topo.publication(args.publication)
    with connections.connect(topo.distributor.require("distributor"), "distributor") as dist:
        found = dist_conflicts.list_conflicts(
            dist, publication=args.publication, subscriber=args.subscriber, article=args.article, since=since
        )
    if args.output == "json":
        return found
    print(status_table.format_conflicts(found), flush=True)
    return None


def cmd_tracer(args: argparse.Namespace) -> Any:
    """``tracer post`` prints the new token's id; ``tracer history`` its latency per subscriber."""
    from airflow_repl.engine.monitoring import tracer

    topo = _load(args)
    pub = _publication(topo, args.publication)
    if args.action == "post":
        if args.token is not None or args.output != "table":
            raise ReplError("tracer post takes no --token or --output: they are options of 'tracer history'")
        print(tracer.post_tracer_token(topo, pub))
        return None
    rows = tracer.tracer_history(topo, pub, args.token)
    print(tracer.history_json(rows) if args.output == "json" else tracer.format_history(rows))
    return None


def cmd_cleanup(args: argparse.Namespace) -> dict[str, Any]:
    """Expire idle subscriptions and delete what every subscription has (docs/retention.md)."""
    from airflow_repl.engine.agents import cleanup_agent

    topo = _load(args)
    pub = _publication(topo, args.publication)
    return cleanup_agent.run_cleanup(
        topo,
        pub,
        min_retention_hours=args.min_retention,
        max_retention_hours=args.max_retention,
        batch_commands=args.batch_commands,
    )


def cmd_wal_retention(args: argparse.Namespace) -> dict[str, Any]:
    """The WAL the publication's slot retains; an error (exit code 2) above the limit."""
    from airflow_repl.engine.monitoring import wal_retention

    topo = _load(args)
    found = wal_retention.measure(topo, _publication(topo, args.publication), args.max_wal_mb)
    if found.exceeded:
        raise ReplError(found.message())
    return found.to_dict()


def cmd_status(args: argparse.Namespace) -> None:
    """Per subscription: backlog, watermark, last runs, last error, expiry (docs/status.md); printed
    first, then an error (exit code 2) when a last run failed or a backlog is above --max-pending."""
    from airflow_repl.engine.monitoring import status
    from airflow_repl.presentation import status_table

    topo = _load(args)
    rows = status.subscription_status(topo, args.publication)
    if args.check:
        _check_status(topo, rows)
        return
    if args.output == "prometheus":  # the metrics carry the failed runs: written, exit 0, for a collector
        from datetime import datetime, timezone

        from airflow_repl.presentation import status_prometheus

        print(status_prometheus.exposition(topo, rows, datetime.now(timezone.utc)), end="")
        return
    if args.output == "json":
        print(json.dumps([r.to_json() for r in rows], indent=2))
    else:
        print(status_table.format_table(rows))
    found = status.problems(rows, args.max_pending)
    if found:
        raise ReplError("; ".join(found))


def _check_status(topo: Any, rows: list[Any]) -> None:
    """``status --check``: one line per breach (or one OK line); exit 0, 1 (warning), 2 (critical)."""
    from datetime import datetime, timezone

    from airflow_repl.engine.errors import HealthCheckFailed
    from airflow_repl.engine.monitoring import health

    if not rows:
        raise ReplError(
            "status --check found no subscription to check in the distribution database: apply the topology "
            "and run the Snapshot Agent first, or name a publication that has subscriptions (-p)"
        )
    found = health.check(topo, rows, datetime.now(timezone.utc))
    for breach in found:
        print(" ".join(breach.line.split()))
    code = health.level(found)
    if code == health.OK:
        print(f"OK: {len(rows)} subscription(s) within their thresholds")
        return
    raise HealthCheckFailed(f"status --check: {health.LEVELS[code]}, {len(found)} breach(es)", code)


def cmd_report(args: argparse.Namespace) -> dict[str, Any] | None:
    """One self-contained HTML page: status, backlog and throughput charts, conflicts, errors (docs/report.md)."""

    from airflow_repl.presentation import report_html

    topo = _load(args)
    path = Path(args.file).expanduser().resolve() if args.file else None
    data = report_html.write(topo, path, args.publication, Path(args.topology).name, args.output)
    if path is None:  # the page (or its data) was printed
        return None
    return {"report": str(path), "subscriptions": len(data.status), "runs": len(data.runs), "errors": len(data.errors)}


def cmd_script_procs(args: argparse.Namespace) -> None:
    topo = _load(args)
    pub = _publication(topo, args.publication)
    dialect = codegen_dialect.dialect(args.dialect)
    with connections.connect(topo.publisher.require("publisher"), "publisher") as conn:
        articles = deploy.resolve_publication(conn, topo.publication(pub), dialect.SERVER)
    print(dialect.publication_script(articles), end="")
    return None


def cmd_schema_change(args: argparse.Namespace) -> dict[str, Any]:
    from airflow_repl.engine.monitoring.quiescing import require_quiesced
    from airflow_repl.engine.provisioning.schema_change import schema_change

    topo = _load(args)
    pub = _publication(topo, args.publication)
    if args.quiesced_token is not None:
        require_quiesced(topo, pub, args.quiesced_token, "the schema change")
    return schema_change(topo, pub, args.sql, include_in_filter=args.include_in_filter)


def cmd_register_script(args: argparse.Namespace) -> dict[str, Any]:
    from airflow_repl.engine.provisioning import custom_scripting

    topo = _load(args)
    pub = _publication(topo, args.publication)
    if args.drop:
        return custom_scripting.unregister_script(topo, pub, args.article)
    if args.sql_file:
        try:
            with open(args.sql_file, encoding="utf-8") as fh:
                body = fh.read()
        except OSError as exc:
            raise ReplError(f"--sql-file {args.sql_file}: {exc.strerror}") from None
        return custom_scripting.register_script(topo, pub, args.article, "sql", body)
    return custom_scripting.register_script(topo, pub, args.article, "python", args.python)


def cmd_regenerate_procs(args: argparse.Namespace) -> dict[str, Any]:
    from airflow_repl.engine.provisioning.procedure_regeneration import regenerate_procedures

    topo = _load(args)
    pub = _publication(topo, args.publication)
    return regenerate_procedures(topo, pub, subscribers=_subscribers(topo, pub, args.subscriber), articles=args.article)


def cmd_sandbox(args: argparse.Namespace) -> dict[str, Any] | None:
    from airflow_repl.sandbox import Sandbox

    if args.action == "env":
        from airflow_repl import demo

        for name, value in demo.sandbox_environment(Path(args.root)).items():
            print(f"export {name}={shlex.quote(value)}")
        return None
    if args.action == "init-demo":
        from airflow_repl import demo

        return demo.init_demo(Path(args.root))
    sb = Sandbox(args.root)
    if args.action == "start":
        return {name: connections.describe(ci) for name, ci in sb.start().items()}
    if args.action == "stop":
        if not sb.state_file.exists():
            raise ReplError(f"no sandbox in {args.root}: nothing to stop")
        return sb.stop()
    elif args.action == "destroy":
        sb.destroy()
    elif args.action == "status":
        return sb.status()
    return None


def cmd_demo(args: argparse.Namespace) -> None:
    from airflow_repl import demo

    sys.exit(demo.main(["--root", args.root, "--cycles", str(args.cycles)]))


def report_format(value: str) -> str:
    """``report -o``: the format; a file name there (the option's meaning before 0.2.0) says where it went."""
    if value in ("html", "json"):
        return value
    raise argparse.ArgumentTypeError(
        f"{value!r} is not a format: -o is html or json; write the report to a file with --file {value}"
    )
