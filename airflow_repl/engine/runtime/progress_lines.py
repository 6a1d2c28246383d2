"""Progress lines of long agent runs: one INFO log line at most every few seconds, so that the
Spark job's and the operator's logs show how far a long snapshot, read or delivery is.

* Snapshot Agent: rows copied per article out of the rows the partition plan counted, with a
  percentage (:func:`snapshot_line`);
* Log Reader Agent: transactions and commands read, and the LSN reached against the
  publisher's current WAL end (:func:`log_reader_line`);
* Distribution Agent: transactions and commands delivered out of the subscription's backlog
  (:func:`delivery_line`).

The interval is :data:`INTERVAL_VARIABLE` (seconds, default :data:`DEFAULT_INTERVAL`; 0 logs a
line after every batch).  Owns the interval, the throttle (:class:`Lines`) and the lines' text;
the agents say when a batch ended and what the counts are.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from typing import Any

from airflow_repl.engine.errors import ReplError
from airflow_repl.engine.runtime.lifecycle import AgentRun

log = logging.getLogger(__name__)

#: The environment variable that sets the interval between two progress lines (seconds).
INTERVAL_VARIABLE = "AIRFLOW_REPL_PROGRESS_INTERVAL"
#: The interval when the variable is not set (seconds).
DEFAULT_INTERVAL = 5.0


def interval() -> float:
    """The interval between two progress lines: :data:`INTERVAL_VARIABLE`, checked."""
    raw = os.environ.get(INTERVAL_VARIABLE, "").strip()
    if not raw:
        return DEFAULT_INTERVAL
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds < math.inf:
        raise ReplError(
            f"{INTERVAL_VARIABLE}={raw!r} is not a number of seconds: use e.g. 5 (0: a progress line after every batch)"
        )
    return seconds


class Lines:
    """The progress lines of one run: :meth:`due` at most once every ``every`` seconds (the
    first time ``every`` seconds after the run started), :meth:`log` writes one."""

    def __init__(self, run: AgentRun, every: float | None = None) -> None:
        self.run = run
        self.every = interval() if every is None else every
        self._last = time.monotonic()

    def due(self) -> bool:
        """Is a line due now?  (When it is, the next one is due ``every`` seconds later.)"""
        now = time.monotonic()
        if now - self._last < self.every:
            return False
        self._last = now
        return True

    def log(self, text: str) -> None:
        log.info("%s for %s: %s", self.run.label, self.run.where(), text)


def percent(done: int, total: int) -> str:
    """``42%`` (floored, so that 100% means done); ``?%`` when the total is unknown."""
    if total <= 0:
        return "100%" if done == 0 and total == 0 else "?%"
    return f"{min(100, done * 100 // total)}%"


def snapshot_line(what: str, copied: int, total: int, verb: str = "copied") -> str:
    """``article 'orders': 100000 of 250000 rows copied (40%)`` (``what``: ``article 'orders'``)."""
    return f"{what}: {copied} of {total} rows {verb} ({percent(copied, total)})"


def delivery_line(transactions: int, commands: int, pending_transactions: int, pending_commands: int) -> str:
    """What a Distribution Agent run delivered out of the backlog (delivered + still pending)."""
    backlog_tx, backlog_cmds = transactions + pending_transactions, commands + pending_commands
    return (
        f"delivered {transactions} of {backlog_tx} transactions ({percent(transactions, backlog_tx)}), "
        f"{commands} of {backlog_cmds} commands; {pending_transactions} transactions pending"
    )


def log_reader_line(transactions: int, commands: int, batches: int, reached: str, wal_end: str, behind: int) -> str:
    """What a Log Reader run read, and where it is against the publisher's WAL end."""
    return (
        f"read {transactions} transactions, {commands} commands in {batches} batches; "
        f"LSN {reached} reached, WAL end {wal_end} ({_size(max(0, behind))} behind)"
    )


def _size(n: int) -> str:
    """``512 bytes``, ``3.2 MB``."""
    value, unit = float(n), "bytes"
    for bigger in ("kB", "MB", "GB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{n} bytes" if unit == "bytes" else f"{value:.1f} {unit}"


class Counted:
    """Rows copied per key (an article, or an article at a subscriber) by a Spark job: each
    task adds its rows to its key's accumulator when it ends, and a watcher thread logs a line
    (:func:`snapshot_line`) per key that moved, at most every interval, while the job runs.
    ``with Counted(lines, spark_context, totals, "copied") as counted:`` then tasks call
    ``counted.accumulators[key].add(rows)``."""

    def __init__(self, lines: Lines, spark_context: Any, totals: dict[str, int], verb: str) -> None:
        self.lines, self.totals, self.verb = lines, totals, verb
        self.accumulators = {key: spark_context.accumulator(0) for key in totals}
        self._logged = dict.fromkeys(totals, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="airflow-repl-progress", daemon=True)

    def __enter__(self) -> Counted:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if exc[0] is None:
            self._report()

    def _watch(self) -> None:
        while not self._stop.wait(max(0.1, min(self.lines.every, 1.0))):
            self._report()

    def _report(self) -> None:
        done = {key: int(acc.value) for key, acc in self.accumulators.items()}
        moved = [key for key, rows in done.items() if rows != self._logged[key]]
        if not moved or not self.lines.due():
            return
        for key in moved:
            self._logged[key] = done[key]
            self.lines.log(snapshot_line(key, done[key], self.totals[key], self.verb))
