"""The ``airflow-repl`` parser: every command and its options, each agent's command from the
agent registry (:mod:`airflow_repl.engine.runtime.registry`)."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from airflow_repl import __version__
from airflow_repl.cli.arguments import (
    ISO_EXAMPLE,
    NON_NEGATIVE_FLOAT,
    POSITIVE_FLOAT,
    POSITIVE_INT,
    PROG,
    iso_time,
    number,
    validation_ranges,
)
from airflow_repl.cli.commands import (
    cmd_agent,
    cmd_apply,
    cmd_cleanup,
    cmd_conflicts,
    cmd_demo,
    cmd_drop,
    cmd_pause,
    cmd_plan,
    cmd_regenerate_procs,
    cmd_register_script,
    cmd_report,
    cmd_resolve_in_doubt,
    cmd_sandbox,
    cmd_schema_change,
    cmd_script_procs,
    cmd_set_update_mode,
    cmd_status,
    cmd_tracer,
    cmd_validate,
    cmd_wal_retention,
    report_format,
)
from airflow_repl.engine.codegen import dialect as codegen_dialect
from airflow_repl.engine.errors import (
    USAGE_EXIT_CODE,
)
from airflow_repl.engine.provisioning import drop, update_mode
from airflow_repl.engine.runtime import registry
from airflow_repl.engine.subscriber import validation
from airflow_repl.jobs import continuous_options

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
  141  standard output closed by its reader (e.g. piped into head)
  When some of several subscribers fail (each a Spark task), the others go on;
  each failed one is a line naming it, and the exit code is the lowest non-zero
  one among them (so 5 only when a retry can fix every one).
  See docs/errors.md for every message."""


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
        type=number(int, 0, True),
        default=validation.MAX_KEYS,
        help=f"differing keys listed per article and subscriber (default {validation.MAX_KEYS}; counts are complete)",
    )
    p.add_argument(
        "--ranges",
        type=validation_ranges,
        help=f"key-hash ranges per article compared before rows are read (default {validation.RANGES}, "
        f"at most {validation.MAX_RANGES})",
    )
    p.set_defaults(func=cmd_validate)
    p = _with_topology(
        sub.add_parser("conflicts", help="list the conflicts the Queue Reader and the Distribution Agent recorded")
    )
    p.add_argument("--subscriber", help="only this subscriber's conflicts")
    p.add_argument("--article", help="only this article's conflicts")
    p.add_argument(
        "--since", type=iso_time, help=f"only conflicts detected at or after this ISO-8601 time, e.g. {_ISO_HELP}"
    )
    p.add_argument("--output", "-o", choices=["table", "json"], default="table", help="a text table or JSON")
    p.set_defaults(func=cmd_conflicts)
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
    p.set_defaults(func=cmd_script_procs)
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
    p.set_defaults(func=cmd_apply)
    p = _with_topology(
        sub.add_parser("plan", help="list what apply would create, alter, drop or need reinitialized; changes nothing")
    )
    p.add_argument("--output", "-o", choices=["table", "json"], default="table", help="one line per action, or JSON")
    p.set_defaults(func=cmd_plan)


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
        "--max-pending", type=number(int, 0, True), help="exit 2 when a backlog is above this many transactions"
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="compare each subscription with its thresholds (docs/monitoring.md): one line per breach; "
        "exit 0 ok, 1 warning, 2 critical",
    )
    p.set_defaults(func=cmd_status)
    p = _with_topology(
        sub.add_parser("report", help="write one self-contained HTML page: status, backlog and throughput, errors")
    )
    p.add_argument(
        "--output",
        "-o",
        type=report_format,
        choices=["html", "json"],
        default="html",
        help="html (default): the page; json: the data it shows",
    )
    p.add_argument("--file", "-f", help="write the report to this file (and print a summary); default: print it")
    p.set_defaults(func=cmd_report)


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
    p.set_defaults(func=cmd_drop)


def _add_updating_commands(sub: argparse._SubParsersAction[_Parser]) -> None:
    """``set-update-mode`` and ``resolve-in-doubt`` (docs/updatable-subscriptions.md)."""
    p = _with_topology(
        sub.add_parser("set-update-mode", help="switch a failover subscription between immediate and queued updating")
    )
    p.add_argument("--subscriber", required=True, help="the failover subscriber to switch")
    p.add_argument("--mode", required=True, choices=sorted(update_mode.TARGETS), help="the updating mode to switch to")
    p.set_defaults(func=cmd_set_update_mode)
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
    p.set_defaults(func=cmd_resolve_in_doubt)


def _add_pause_commands(sub: argparse._SubParsersAction[_Parser]) -> None:
    """``pause`` and ``resume`` (docs/operations.md)."""
    for name, what in (
        ("pause", "pause one subscription: the Distribution Agent skips it, its commands are kept"),
        ("resume", "resume a paused subscription: the next Distribution Agent run delivers its backlog"),
    ):
        p = _with_topology(sub.add_parser(name, help=what))
        p.add_argument("--subscriber", required=True, help=f"the subscriber whose subscription to {name}")
        p.set_defaults(func=cmd_pause)


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
    p.set_defaults(func=cmd_sandbox)
    p = sub.add_parser("demo", help="run the end-to-end demo on the sandbox")
    p.add_argument("--root", default=".sandbox", help="the sandbox's folder (default .sandbox)")
    p.add_argument(
        "--cycles", type=POSITIVE_INT, default=2, help="replication cycles while the workload runs (default 2)"
    )
    p.set_defaults(func=cmd_demo)


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
    p.set_defaults(func=cmd_schema_change)
    p = _with_topology(
        sub.add_parser("register-script", help="register the script regenerating an article's custom procedures")
    )
    p.add_argument("--article", required=True, help="the article whose procedures the script regenerates")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--sql-file", help="a SQL template ({{table}}, {{columns}}, {{proc_ins}}, ... placeholders)")
    how.add_argument("--python", help="module:function, called as function(connection, article, subscriber)")
    how.add_argument("--drop", action="store_true", help="unregister the article's script")
    p.set_defaults(func=cmd_register_script)
    p = _with_topology(
        sub.add_parser("regenerate-procs", help="regenerate the articles' procedures at subscribers now")
    )
    p.add_argument("--subscriber", action="append", help=_SUBSCRIBERS_HELP)
    p.add_argument("--article", action="append", help="only this article (repeatable; default: every article)")
    p.set_defaults(func=cmd_regenerate_procs)


def _agent_parser(sub: argparse._SubParsersAction[_Parser], name: str, more: str = "") -> argparse.ArgumentParser:
    """The command running the registered agent ``name``, with the continuous options when it
    has continuous mode (:mod:`~airflow_repl.engine.runtime.registry`)."""
    agent = registry.AGENTS[name]
    p = _with_topology(sub.add_parser(name, help=f"run the {agent.label}{more}"))
    if agent.continuous:
        continuous_options.add_arguments(p)
    p.set_defaults(func=cmd_agent)
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
    p.set_defaults(func=cmd_tracer)


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
    p.set_defaults(func=cmd_cleanup)
    p = _with_topology(sub.add_parser("wal-retention", help="the WAL the publication's slot keeps at the publisher"))
    p.add_argument("--max-wal-mb", type=POSITIVE_INT, help="limit in MB (default: the publication's max_slot_wal_mb)")
    p.set_defaults(func=cmd_wal_retention)
