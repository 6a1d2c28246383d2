"""``airflow-repl``: run agents against a topology file, like SQL Server's agent executables.

The agent subcommands call the same entry point the operators spark-submit
(:func:`airflow_repl.jobs.agent_job.run_agent`), in a local SparkSession.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import shlex
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from airflow_repl import __version__
from airflow_repl.engine.codegen import dialect as codegen_dialect
from airflow_repl.engine.errors import (
    INTERNAL_EXIT_CODE,
    USAGE_EXIT_CODE,
    DifferencesFound,
    ReplError,
    SubscribersFailed,
    failure_line,
)
from airflow_repl.engine.model import topology
from airflow_repl.engine.postgres import connections
from airflow_repl.engine.provisioning import deploy, drop, plan, update_mode
from airflow_repl.engine.runtime import continuous as continuous_mode
from airflow_repl.engine.runtime import registry
from airflow_repl.engine.runtime.lifecycle import as_engine_error
from airflow_repl.engine.subscriber import validation
from airflow_repl.jobs import continuous_options, session

PROG = "airflow-repl"

DESCRIPTION = """\
Run SQL Server-style transactional replication for PostgreSQL from a topology file:
deploy it, run each agent once (snapshot, logreader, distribution, queuereader) in a
local SparkSession, validate subscribers, and manage retention, tracer tokens and
schema changes. 'airflow-repl <command> --help' explains each command's options."""

EPILOG = """\
connections:
  Every server in the topology (publisher, distributor, subscribers) is either a
  postgresql:// (or postgres://) URI, e.g. postgresql://repl@db1:5432/shop, or the
  id of an Airflow Postgres connection, e.g. repl_publisher. A connection id is
  looked up the way Airflow does it (airflow connections get): the configured
  secrets backend ([secrets] backend), then the environment variable
  AIRFLOW_CONN_<ID> (the id in upper case; a postgres:// URI or Airflow's JSON
  form), then Airflow's metadata database. Every extra of the connection that is a
  libpq parameter (application_name, sslmode, target_session_attrs, options, ...)
  reaches libpq, as with PostgresHook. Every server is resolved before a command
  runs; passwords are never printed. See docs/connections.md.

exit codes:
  0    success (the summary, if any, is JSON on standard output)
  1    internal error: a bug; run again with -v for the traceback and report it
  2    replication or topology error: bad topology, option values the topology
       contradicts, server settings, expired subscriptions, ...; for status: a
       subscription whose last run failed or whose backlog exceeds --max-pending
  3    not initialized: run the Snapshot Agent (or apply) first
  4    delivery error: a command could not be applied at a subscriber
  5    retryable: a server cannot be reached or went away, or the agent is busy
  6    validate found differences between the publisher and a subscriber
  64   usage error: unknown option, missing argument or bad option value
  130  interrupted (Ctrl-C)
  When some of several subscribers fail (each a Spark task), the others go on;
  each failed one is a line naming it, and the exit code is the lowest non-zero
  one among them (so 5 only when a retry can fix every one).
  See docs/errors.md for every message."""

ISO_EXAMPLE = "2026-11-23T13:00:00+00:00"


def iso_time(value: str) -> str:
    """An ``--until`` / ``--since`` value: checked to be ISO-8601 (kept as given)."""
    from datetime import datetime

    try:
        datetime.fromisoformat(value.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an ISO-8601 time: use e.g. {ISO_EXAMPLE} (a time without offset is UTC)"
        ) from None
    return value


def _number(kind: type[int] | type[float], minimum: float, inclusive: bool) -> Any:
    """An argparse ``type`` accepting numbers of ``kind`` above ``minimum`` (or equal, if ``inclusive``)."""
    bound = f"{'>=' if inclusive else '>'} {minimum:g}"

    def check(value: str) -> int | float:
        try:
            number = kind(value)
        except ValueError:
            number = math.nan
        if not math.isfinite(number) or number < minimum or (number == minimum and not inclusive):
            raise argparse.ArgumentTypeError(f"{value!r} is not {'an integer' if kind is int else 'a number'} {bound}")
        return number

    return check


POSITIVE_INT = _number(int, 0, inclusive=False)
POSITIVE_FLOAT = _number(float, 0, inclusive=False)
NON_NEGATIVE_FLOAT = _number(float, 0, inclusive=True)


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


def validation_ranges(value: str) -> int:
    """A ``validate --ranges`` value: an integer from 1 to the engine's maximum."""
    number = POSITIVE_INT(value)
    if number > validation.MAX_RANGES:
        raise argparse.ArgumentTypeError(f"{value!r} is above the maximum of {validation.MAX_RANGES} ranges")
    return int(number)


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


def _cmd_agent(args: argparse.Namespace) -> dict[str, Any]:
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
        _print_result(exc.summary)
        raise


def _cmd_apply(args: argparse.Namespace) -> dict[str, Any]:
    """Carry out the plan (docs/operations.md, "Plan and apply"); the plan carried out is the summary."""
    topo = _load(args)
    return plan.apply(topo, [args.publication] if args.publication else None, allow_drop=args.allow_drop).to_dict()


def _cmd_plan(args: argparse.Namespace) -> None:
    """What apply would do, from the servers, changing nothing."""
    topo = _load(args)
    the_plan = plan.plan(topo, [args.publication] if args.publication else None)
    print(the_plan.to_json() if args.output == "json" else the_plan.format_table())


def _cmd_drop(args: argparse.Namespace) -> dict[str, Any]:
    """Drop an article, a subscription or a publication (docs/operations.md, "Drop"); the names
    are those deployed, which the topology file may no longer list."""
    topo = _load(args)
    if args.what == "article":
        return drop.drop_article(topo, args.publication, args.article)
    if args.what == "subscription":
        return drop.drop_subscription(topo, args.publication, args.subscriber)
    return drop.drop_publication(topo, args.publication, with_subscriptions=args.with_subscriptions)


def _cmd_set_update_mode(args: argparse.Namespace) -> dict[str, Any]:
    topo = _load(args)
    return update_mode.set_update_mode(topo, _publication(topo, args.publication), args.subscriber, args.mode)


def _cmd_pause(args: argparse.Namespace) -> dict[str, Any]:
    """Pause or resume one subscription (docs/operations.md)."""
    from airflow_repl.engine.provisioning import pausing

    topo = _load(args)
    pub = _publication(topo, args.publication)
    act = pausing.pause_subscription if args.command == "pause" else pausing.resume_subscription
    return act(topo, pub, args.subscriber)


def _cmd_resolve_in_doubt(args: argparse.Namespace) -> dict[str, Any]:
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


def _cmd_validate(args: argparse.Namespace) -> None:
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
        _print_validation(exc.summary, args.output)
        raise
    _print_validation(result, args.output)
    if not result["match"]:
        raise DifferencesFound(f"{validation.differences_line(pub, result['subscribers'])} (see the report above)")


def _print_validation(result: dict[str, Any], output: str) -> None:
    """``validate``'s report: JSON, or a text report per subscriber validated."""
    if output == "json":
        _print_result(result)
        return
    print(
        "\n\n".join(f"subscriber {s}:\n{validation.format_report(rows)}" for s, rows in result["subscribers"].items()),
        flush=True,
    )


def _cmd_conflicts(args: argparse.Namespace) -> list[dict[str, Any]] | None:
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


def _cmd_tracer(args: argparse.Namespace) -> Any:
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


def _cmd_cleanup(args: argparse.Namespace) -> dict[str, Any]:
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


def _cmd_wal_retention(args: argparse.Namespace) -> dict[str, Any]:
    """The WAL the publication's slot retains; an error (exit code 2) above the limit."""
    from airflow_repl.engine.monitoring import wal_retention

    topo = _load(args)
    found = wal_retention.measure(topo, _publication(topo, args.publication), args.max_wal_mb)
    if found.exceeded:
        raise ReplError(found.message())
    return found.to_dict()


def _cmd_status(args: argparse.Namespace) -> None:
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


def _cmd_report(args: argparse.Namespace) -> dict[str, Any] | None:
    """One self-contained HTML page: status, backlog and throughput charts, conflicts, errors (docs/report.md)."""

    from airflow_repl.presentation import report_html

    topo = _load(args)
    path = Path(args.file).expanduser().resolve() if args.file else None
    data = report_html.write(topo, path, args.publication, Path(args.topology).name, args.output)
    if path is None:  # the page (or its data) was printed
        return None
    return {"report": str(path), "subscriptions": len(data.status), "runs": len(data.runs), "errors": len(data.errors)}


def _cmd_script_procs(args: argparse.Namespace) -> None:
    topo = _load(args)
    pub = _publication(topo, args.publication)
    dialect = codegen_dialect.dialect(args.dialect)
    with connections.connect(topo.publisher.require("publisher"), "publisher") as conn:
        articles = deploy.resolve_publication(conn, topo.publication(pub), dialect.SERVER)
    print(dialect.publication_script(articles), end="")
    return None


def _cmd_schema_change(args: argparse.Namespace) -> dict[str, Any]:
    from airflow_repl.engine.monitoring.quiescing import require_quiesced
    from airflow_repl.engine.provisioning.schema_change import schema_change

    topo = _load(args)
    pub = _publication(topo, args.publication)
    if args.quiesced_token is not None:
        require_quiesced(topo, pub, args.quiesced_token, "the schema change")
    return schema_change(topo, pub, args.sql, include_in_filter=args.include_in_filter)


def _cmd_register_script(args: argparse.Namespace) -> dict[str, Any]:
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


def _cmd_regenerate_procs(args: argparse.Namespace) -> dict[str, Any]:
    from airflow_repl.engine.provisioning.procedure_regeneration import regenerate_procedures

    topo = _load(args)
    pub = _publication(topo, args.publication)
    return regenerate_procedures(topo, pub, subscribers=_subscribers(topo, pub, args.subscriber), articles=args.article)


def _cmd_sandbox(args: argparse.Namespace) -> dict[str, Any] | None:
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
        sb.stop()
    elif args.action == "destroy":
        sb.destroy()
    elif args.action == "status":
        return sb.status()
    return None


def _cmd_demo(args: argparse.Namespace) -> None:
    from airflow_repl import demo

    sys.exit(demo.main(["--root", args.root, "--cycles", str(args.cycles)]))


class _Parser(argparse.ArgumentParser):
    """Usage errors are one line too: ``airflow-repl: error: ...`` and exit code 64 (EX_USAGE)."""

    def error(self, message: str) -> NoReturn:
        where = self.prog.removeprefix(PROG).strip()
        print(f"{PROG}: error: {where + ': ' if where else ''}{message} (see '{self.prog} --help')", file=sys.stderr)
        sys.exit(USAGE_EXIT_CODE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG, description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}", help="print the version")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="debug logging; an error's extra lines and tracebacks too"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_topology_commands(sub)
    _add_agent_commands(sub)
    _add_updating_commands(sub)
    _add_pause_commands(sub)
    _add_drop_command(sub)
    p = _with_topology(
        sub.add_parser("validate", help="list the rows that differ at subscribers, on Spark (exit 6 on differences)")
    )
    p.add_argument("--subscriber", action="append", help=_SUBSCRIBERS_HELP)
    p.add_argument("--output", "-o", choices=["table", "json"], default="table", help="a text report or JSON")
    p.add_argument(
        "--max-keys",
        type=_number(int, 0, True),
        default=validation.MAX_KEYS,
        help=f"differing keys listed per article and subscriber (default {validation.MAX_KEYS}; counts are complete)",
    )
    p.add_argument(
        "--ranges",
        type=validation_ranges,
        help=f"key-hash ranges per article compared before rows are read (default {validation.RANGES}, "
        f"at most {validation.MAX_RANGES})",
    )
    p.set_defaults(func=_cmd_validate)
    p = _with_topology(
        sub.add_parser("conflicts", help="list the conflicts the Queue Reader and the Distribution Agent recorded")
    )
    p.add_argument("--subscriber", help="only this subscriber's conflicts")
    p.add_argument("--article", help="only this article's conflicts")
    p.add_argument(
        "--since", type=iso_time, help=f"only conflicts detected at or after this ISO-8601 time, e.g. {_ISO_HELP}"
    )
    p.add_argument("--output", "-o", choices=["table", "json"], default="table", help="a text table or JSON")
    p.set_defaults(func=_cmd_conflicts)
    _add_tracer_command(sub)
    _add_monitoring_commands(sub)
    _add_retention_commands(sub)
    p = _with_topology(sub.add_parser("script-procs", help="print the generated procedures"))
    p.add_argument(
        "--dialect",
        choices=list(codegen_dialect.dialects()),
        default="postgresql",
        help="tsql scripts the procedures for SQL Server subscribers (script only); mariadb for MariaDB and "
        "MySQL subscribers, a script for the mariadb client",
    )
    p.set_defaults(func=_cmd_script_procs)
    _add_schema_commands(sub)
    _add_sandbox_commands(sub)
    for choice in sub._choices_actions:  # each command's --help starts with what it does
        sub.choices[choice.dest].description = f"{choice.help[0].upper()}{choice.help[1:]}." if choice.help else None
    return parser


def _add_topology_commands(sub: argparse._SubParsersAction[_Parser]) -> None:
    """``apply`` and ``plan`` (docs/operations.md)."""
    p = _with_topology(sub.add_parser("apply", help="validate and deploy the topology: carry out its plan"))
    p.add_argument(
        "--allow-drop",
        action="store_true",
        help="drop what the topology file no longer lists (publications, articles, subscriptions); refused without it",
    )
    p.set_defaults(func=_cmd_apply)
    p = _with_topology(
        sub.add_parser("plan", help="list what apply would create, alter, drop or need reinitialized; changes nothing")
    )
    p.add_argument("--output", "-o", choices=["table", "json"], default="table", help="one line per action, or JSON")
    p.set_defaults(func=_cmd_plan)


def _add_monitoring_commands(sub: argparse._SubParsersAction[_Parser]) -> None:
    """``status`` and ``report`` (docs/status.md, docs/report.md)."""
    p = _with_topology(
        sub.add_parser("status", help="backlog, watermark, last runs, errors and expiry per subscription")
    )
    p.add_argument(
        "--output",
        "-o",
        choices=["table", "json", "prometheus"],
        default="table",
        help="a text table, JSON, or the Prometheus text exposition format (docs/monitoring.md; exit 0 once written)",
    )
    p.add_argument(
        "--max-pending", type=_number(int, 0, True), help="exit 2 when a backlog is above this many transactions"
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="compare each subscription with its thresholds (docs/monitoring.md): one line per breach; "
        "exit 0 ok, 1 warning, 2 critical",
    )
    p.set_defaults(func=_cmd_status)
    p = _with_topology(
        sub.add_parser("report", help="write one self-contained HTML page: status, backlog and throughput, errors")
    )
    p.add_argument(
        "--output",
        "-o",
        type=_report_format,
        choices=["html", "json"],
        default="html",
        help="html (default): the page; json: the data it shows",
    )
    p.add_argument("--file", "-f", help="write the report to this file (and print a summary); default: print it")
    p.set_defaults(func=_cmd_report)


def _report_format(value: str) -> str:
    """``report -o``: the format; a file name there (the option's meaning before 0.2.0) says where it went."""
    if value in ("html", "json"):
        return value
    raise argparse.ArgumentTypeError(
        f"{value!r} is not a format: -o is html or json; write the report to a file with --file {value}"
    )


_SUBSCRIBERS_HELP = "only this subscriber (repeatable; default: every subscriber of the publication)"
_ISO_HELP = f"{ISO_EXAMPLE} (no offset: UTC)"


def _with_topology(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--topology", "-t", required=True, help="topology YAML file")
    p.add_argument("--publication", "-p", help="publication (optional when there is only one)")
    return p


def _add_drop_command(sub: argparse._SubParsersAction[_Parser]) -> None:
    """``drop article|subscription|publication`` (docs/operations.md)."""
    p = sub.add_parser("drop", help="drop an article, a subscription or a publication, and what it installed")
    p.add_argument("what", choices=list(drop.KINDS), help="what to drop")
    p.add_argument("--topology", "-t", required=True, help="topology YAML file (its servers)")
    p.add_argument("--publication", "-p", required=True, help="the publication (as deployed)")
    p.add_argument("--article", help="drop article: the article to drop")
    p.add_argument("--subscriber", help="drop subscription: the subscriber whose subscription to drop")
    p.add_argument(
        "--with-subscriptions",
        action="store_true",
        help="drop publication: drop its subscriptions first (refused without it while it has any)",
    )
    p.set_defaults(func=_cmd_drop)


def _add_updating_commands(sub: argparse._SubParsersAction[_Parser]) -> None:
    """``set-update-mode`` and ``resolve-in-doubt`` (docs/updatable-subscriptions.md)."""
    p = _with_topology(
        sub.add_parser("set-update-mode", help="switch a failover subscription between immediate and queued updating")
    )
    p.add_argument("--subscriber", required=True, help="the failover subscriber to switch")
    p.add_argument("--mode", required=True, choices=sorted(update_mode.TARGETS), help="the updating mode to switch to")
    p.set_defaults(func=_cmd_set_update_mode)
    p = _with_topology(
        sub.add_parser("resolve-in-doubt", help="finish immediate subscribers' transactions prepared at the publisher")
    )
    p.add_argument("--subscriber", help="one subscriber (default: every immediate subscriber of the publication)")
    p.add_argument(
        "--follow",
        action="store_true",
        help="keep resolving: at each subscriber commit, and every interval, until SIGTERM or Ctrl-C",
    )
    p.add_argument(
        "--interval", type=POSITIVE_FLOAT, default=60.0, help="seconds between two rounds with --follow (default 60)"
    )
    p.set_defaults(func=_cmd_resolve_in_doubt)


def _add_pause_commands(sub: argparse._SubParsersAction[_Parser]) -> None:
    """``pause`` and ``resume`` (docs/operations.md)."""
    for name, what in (
        ("pause", "pause one subscription: the Distribution Agent skips it, its commands are kept"),
        ("resume", "resume a paused subscription: the next Distribution Agent run delivers its backlog"),
    ):
        p = _with_topology(sub.add_parser(name, help=what))
        p.add_argument("--subscriber", required=True, help=f"the subscriber whose subscription to {name}")
        p.set_defaults(func=_cmd_pause)


def _add_sandbox_commands(sub: argparse._SubParsersAction[_Parser]) -> None:
    """``sandbox`` and ``demo``."""
    p = sub.add_parser("sandbox", help="the embedded PostgreSQL sandbox")
    p.add_argument(
        "action",
        choices=["start", "stop", "status", "destroy", "init-demo", "env"],
        help="what to do with the sandbox: init-demo starts it and makes the demo's databases, schema and rows; "
        "env prints the shell exports (connections with their password) for eval",
    )
    p.add_argument("--root", default=".sandbox", help="the sandbox's folder (default .sandbox)")
    p.set_defaults(func=_cmd_sandbox)
    p = sub.add_parser("demo", help="run the end-to-end demo on the sandbox")
    p.add_argument("--root", default=".sandbox", help="the sandbox's folder (default .sandbox)")
    p.add_argument(
        "--cycles", type=POSITIVE_INT, default=2, help="replication cycles while the workload runs (default 2)"
    )
    p.set_defaults(func=_cmd_demo)


def _add_schema_commands(sub: argparse._SubParsersAction[_Parser]) -> None:
    """``schema-change``, ``register-script`` and ``regenerate-procs``."""
    p = _with_topology(
        sub.add_parser("schema-change", help="run one ALTER TABLE of a published table and replicate it in order")
    )
    p.add_argument("--sql", required=True, help='the statement, e.g. "ALTER TABLE public.t ADD COLUMN c text"')
    p.add_argument(
        "--include-in-filter",
        action="store_true",
        help="an added column joins articles with a column filter too (also list it in the topology file)",
    )
    p.add_argument(
        "--quiesced-token",
        type=POSITIVE_INT,
        help="refuse unless everything up to this tracer token reached every subscriber (queues drained)",
    )
    p.set_defaults(func=_cmd_schema_change)
    p = _with_topology(
        sub.add_parser("register-script", help="register the script regenerating an article's custom procedures")
    )
    p.add_argument("--article", required=True, help="the article whose procedures the script regenerates")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--sql-file", help="a SQL template ({{table}}, {{columns}}, {{proc_ins}}, ... placeholders)")
    how.add_argument("--python", help="module:function, called as function(connection, article, subscriber)")
    how.add_argument("--drop", action="store_true", help="unregister the article's script")
    p.set_defaults(func=_cmd_register_script)
    p = _with_topology(
        sub.add_parser("regenerate-procs", help="regenerate the articles' procedures at subscribers now")
    )
    p.add_argument("--subscriber", action="append", help=_SUBSCRIBERS_HELP)
    p.add_argument("--article", action="append", help="only this article (repeatable; default: every article)")
    p.set_defaults(func=_cmd_regenerate_procs)


def _agent_parser(sub: argparse._SubParsersAction[_Parser], name: str, more: str = "") -> argparse.ArgumentParser:
    """The command running the registered agent ``name``, with the continuous options when it
    has continuous mode (:mod:`~airflow_repl.engine.runtime.registry`)."""
    agent = registry.AGENTS[name]
    p = _with_topology(sub.add_parser(name, help=f"run the {agent.label}{more}"))
    if agent.continuous:
        continuous_options.add_arguments(p)
    p.set_defaults(func=_cmd_agent)
    return p


def _add_agent_commands(sub: argparse._SubParsersAction[_Parser]) -> None:
    """``snapshot``, ``logreader``, ``distribution`` and ``queuereader``: one agent run each."""
    p = _agent_parser(sub, "snapshot")
    p.add_argument("--subscriber", action="append", help=_SUBSCRIBERS_HELP)
    p.add_argument("--reinitialize", action="store_true", help="re-initialize active subscriptions too")
    p.add_argument(
        "--article", help="with --reinitialize: copy only this article again, on its own (the others keep flowing)"
    )
    _agent_parser(sub, "logreader").set_defaults(subscriber=None)
    p = _agent_parser(sub, "distribution")
    p.add_argument("--subscriber", action="append", help=_SUBSCRIBERS_HELP)
    p.add_argument(
        "--until", type=iso_time, help=f"deliver transactions committed up to this ISO-8601 time, e.g. {_ISO_HELP}"
    )
    p = _agent_parser(sub, "queuereader", " (queued updating)")
    p.add_argument("--subscriber", action="append", help="limit to these subscribers (default: the queued ones)")


def _add_tracer_command(sub: argparse._SubParsersAction[_Parser]) -> None:
    """``tracer post`` and ``tracer history``."""
    p = _with_topology(sub.add_parser("tracer", help="post a tracer token, or list the tokens' latency"))
    p.add_argument("action", choices=["post", "history"], help="post a new token, or show the tokens' history")
    p.add_argument("--token", type=POSITIVE_INT, help="history of this token only")
    p.add_argument("--output", "-o", choices=["table", "json"], default="table", help="history as a table or JSON")
    p.set_defaults(func=_cmd_tracer)


def _add_retention_commands(sub: argparse._SubParsersAction[_Parser]) -> None:
    """``cleanup`` and ``wal-retention`` (docs/retention.md)."""
    p = _with_topology(sub.add_parser("cleanup", help="expire idle subscriptions, delete delivered commands"))
    p.add_argument(
        "--min-retention", type=NON_NEGATIVE_FLOAT, help="hours delivered commands are kept (default: topology, 0)"
    )
    p.add_argument(
        "--max-retention", type=POSITIVE_FLOAT, help="hours before an idle subscription expires (default: 72)"
    )
    p.add_argument(
        "--batch-commands",
        type=POSITIVE_INT,
        default=10000,
        help="commands deleted per distributor transaction (default 10000)",
    )
    p.set_defaults(func=_cmd_cleanup)
    p = _with_topology(sub.add_parser("wal-retention", help="the WAL the publication's slot keeps at the publisher"))
    p.add_argument("--max-wal-mb", type=POSITIVE_INT, help="limit in MB (default: the publication's max_slot_wal_mb)")
    p.set_defaults(func=_cmd_wal_retention)


def report_error(exc: BaseException, verbose: bool = False) -> int:
    """Print one line for ``exc`` on stderr and return its exit code (1 for a bug, with the
    traceback only when ``verbose``)."""
    exc = as_engine_error(exc) if isinstance(exc, Exception) else exc
    if isinstance(exc, SubscribersFailed):  # a line per failed subscriber (the others succeeded)
        for failed in exc.failures:
            rest = connections.redact(str(failed.get("message") or "")).strip().splitlines()[1:]
            if verbose:  # a server log tail, an internal error's traceback: shown only when asked for
                print(str(failed.get("traceback") or "") + "\n".join(rest), file=sys.stderr)
            more = f" ({len(rest)} more line(s) with -v)" if rest and not verbose else ""
            print(f"{PROG}: error: {connections.redact(failure_line(failed))}{more}", file=sys.stderr)
        return exc.exit_code
    if isinstance(exc, ReplError):
        lines = connections.redact(str(exc)).strip().splitlines() or [type(exc).__name__]
        if verbose and len(lines) > 1:  # e.g. a server log tail: shown only when asked for
            print("\n".join(lines[1:]), file=sys.stderr)
        more = f" ({len(lines) - 1} more line(s) with -v)" if len(lines) > 1 and not verbose else ""
        print(f"{PROG}: error: {lines[0]}{more}", file=sys.stderr)
        return exc.exit_code
    if verbose:
        traceback.print_exception(exc, file=sys.stderr)
    detail = connections.redact(" ".join(str(exc).split())) or "no message"
    print(
        f"{PROG}: error: internal error ({type(exc).__name__}): {detail}; this is a bug, please report "
        f"it; run with -v for the traceback",
        file=sys.stderr,
    )
    return INTERNAL_EXIT_CODE


#: What each ``drop`` needs and refuses, as a usage error's words (None: the options fit).
_DROP_OPTIONS = {
    "article": lambda a: (
        None
        if a.article and not (a.subscriber or a.with_subscriptions)
        else "takes --article (and no --subscriber or --with-subscriptions)"
    ),
    "subscription": lambda a: (
        None
        if a.subscriber and not (a.article or a.with_subscriptions)
        else "takes --subscriber (and no --article or --with-subscriptions)"
    ),
    "publication": lambda a: (
        None if not (a.article or a.subscriber) else "takes no --article or --subscriber (only --with-subscriptions)"
    ),
}


def _check_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Combinations of options the command line alone rules out are usage errors too (e.g.
    ``--until`` with ``--continuous``): refused before the topology is read."""
    if args.func is _cmd_drop:
        wrong = _DROP_OPTIONS[args.what](args)
        if wrong:
            parser.error(f"drop {args.what} {wrong}")
    if args.func is _cmd_status and args.output == "prometheus" and (args.check or args.max_pending is not None):
        parser.error(
            f"status -o prometheus takes no {'--check' if args.check else '--max-pending'}: it writes the metrics "
            f"and exits 0; alert on them, or run status --check (or -o json --max-pending N) for an exit code"
        )
    if args.func is not _cmd_agent:
        return
    try:
        continuous_mode.check_request(
            args.command, getattr(args, "until", None), continuous_options.from_arguments(args)
        )
    except ReplError as exc:
        parser.error(str(exc))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        _check_options(parser, args)
    except SystemExit as exc:  # --help, --version, or a usage error already printed as one line
        return exc.code if isinstance(exc.code, int) else USAGE_EXIT_CODE
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    session.quiet_jvm_console(not args.verbose)  # Spark's own output (log4j, Java stacks) only with -v
    if not args.verbose:  # and py4j's notes
        logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        result = args.func(args)
    except KeyboardInterrupt:
        print(
            f"{PROG}: error: interrupted; an agent stopped this way is recorded as abandoned by its next run",
            file=sys.stderr,
        )
        return 130
    except Exception as exc:
        return report_error(exc, args.verbose)
    _print_result(result)
    return 0


def _print_result(result: Any) -> None:
    """A command's result, if any, as JSON on standard output."""
    if result is not None:
        print(json.dumps(result, indent=2, default=str), flush=True)


if __name__ == "__main__":
    sys.exit(main())
