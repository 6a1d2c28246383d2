"""The continuous options on a command line: the same three for the CLI's agent commands and the
Spark job (``--continuous``, ``--poll-interval``, ``--max-run-seconds``), as the ``run_*``
keyword arguments of :mod:`airflow_repl.engine.runtime.continuous`."""

from __future__ import annotations

import argparse
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--continuous``, ``--poll-interval`` and ``--max-run-seconds`` (the CLI's and the job's)."""
    parser.add_argument(
        "--continuous", action="store_true", help="keep running until --max-run-seconds, SIGTERM or Ctrl-C"
    )
    parser.add_argument("--poll-interval", type=float, help="seconds between looks when idle (continuous; default 1)")
    parser.add_argument("--max-run-seconds", type=float, help="end a continuous run after this (default 3600)")


def from_arguments(args: argparse.Namespace) -> dict[str, Any] | None:
    """The continuous options given on a command line, as ``run_*`` keyword arguments (None:
    none given)."""
    given = {
        "continuous": bool(getattr(args, "continuous", False)),
        "poll_interval": getattr(args, "poll_interval", None),
        "max_run_seconds": getattr(args, "max_run_seconds", None),
    }
    return (
        given
        if given["continuous"] or given["poll_interval"] is not None or given["max_run_seconds"] is not None
        else None
    )
