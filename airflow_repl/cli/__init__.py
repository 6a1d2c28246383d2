"""``airflow-repl``: run agents against a topology file, like SQL Server's agent executables.

The agent subcommands call the same entry point the operators spark-submit
(:func:`airflow_repl.jobs.agent_job.run_agent`), in a local SparkSession.

Owns: ``parser`` (every command and its options), ``commands`` (what each command does),
``arguments`` (argument types: times, numbers, ranges; the program's name), ``output`` (results
on standard output) and this module's :func:`main` (options checked together, logging, one
line per error with its exit code: :func:`report_error`).  ``python -m airflow_repl.cli`` runs
:func:`main` (``__main__``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback

from airflow_repl.cli.arguments import PROG
from airflow_repl.cli.commands import cmd_agent, cmd_drop, cmd_status
from airflow_repl.cli.output import print_result
from airflow_repl.cli.parser import build_parser
from airflow_repl.engine.errors import (
    INTERNAL_EXIT_CODE,
    USAGE_EXIT_CODE,
    ReplError,
    SubscribersFailed,
    failure_line,
    redact,
)
from airflow_repl.engine.runtime import continuous as continuous_mode
from airflow_repl.engine.runtime.lifecycle import as_engine_error
from airflow_repl.jobs import continuous_options, session

__all__ = ["build_parser", "main", "report_error"]


def report_error(exc: BaseException, verbose: bool = False) -> int:
    """Print one line for ``exc`` on stderr and return its exit code (1 for a bug, with the
    traceback only when ``verbose``)."""
    exc = as_engine_error(exc) if isinstance(exc, Exception) else exc
    if isinstance(exc, SubscribersFailed):  # a line per failed subscriber (the others succeeded)
        for failed in exc.failures:
            rest = redact(str(failed.get("message") or "")).strip().splitlines()[1:]
            if verbose:  # a server log tail, an internal error's traceback: shown only when asked for
                print(str(failed.get("traceback") or "") + "\n".join(rest), file=sys.stderr)
            more = f" ({len(rest)} more line(s) with -v)" if rest and not verbose else ""
            print(f"{PROG}: error: {redact(failure_line(failed))}{more}", file=sys.stderr)
        return exc.exit_code
    if isinstance(exc, ReplError):
        lines = redact(str(exc)).strip().splitlines() or [type(exc).__name__]
        if verbose and len(lines) > 1:  # e.g. a server log tail: shown only when asked for
            print("\n".join(lines[1:]), file=sys.stderr)
        more = f" ({len(lines) - 1} more line(s) with -v)" if len(lines) > 1 and not verbose else ""
        print(f"{PROG}: error: {lines[0]}{more}", file=sys.stderr)
        return exc.exit_code
    if verbose:
        traceback.print_exception(exc, file=sys.stderr)
    detail = redact(" ".join(str(exc).split())) or "no message"
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
    if args.func is cmd_drop:
        wrong = _DROP_OPTIONS[args.what](args)
        if wrong:
            parser.error(f"drop {args.what} {wrong}")
    if args.func is cmd_status and args.output == "prometheus" and (args.check or args.max_pending is not None):
        parser.error(
            f"status -o prometheus takes no {'--check' if args.check else '--max-pending'}: it writes the metrics "
            f"and exits 0; alert on them, or run status --check (or -o json --max-pending N) for an exit code"
        )
    if args.func is not cmd_agent:
        return
    try:
        continuous_mode.check_request(
            args.command, getattr(args, "until", None), continuous_options.from_arguments(args)
        )
    except ReplError as exc:
        parser.error(str(exc))


#: The exit code of a command whose standard output was closed by its reader (``| head``), as a
#: shell reports a process ended by SIGPIPE (128 + 13).
CLOSED_OUTPUT_EXIT_CODE = 141


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv``; its exit code.  Standard output closed by its reader (``airflow-repl
    ... | head``) ends it quietly with :data:`CLOSED_OUTPUT_EXIT_CODE`, as other command-line
    tools end, not with a traceback (an agent run stopped this way is recorded in its history)."""
    try:
        code = _main(argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # what is still buffered for the closed output must not fail again when Python exits
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return CLOSED_OUTPUT_EXIT_CODE


def _main(argv: list[str] | None) -> int:
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
    except BrokenPipeError:
        raise  # the output's reader is gone (main)
    except Exception as exc:
        return report_error(exc, args.verbose)
    print_result(result)
    return 0
