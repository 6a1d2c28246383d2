"""Continuous mode: an agent's ordinary loop, repeated until a maximum run time, SIGTERM or SIGINT.

A continuous run is one agent run (one lock, one ``agent_history`` row) whose loop does not end
when nothing is pending: it sleeps ``poll_interval`` seconds and looks again.  It ends cleanly,
with the ordinary success summary, when ``max_run_seconds`` have passed (so that Airflow can start
the next run), when the process receives SIGTERM (how Airflow stops a task) or SIGINT (Ctrl-C) or,
in a spark-submit driver, when its parent process goes away (Airflow's ``on_kill`` kills
spark-submit).  After a signal it ends within one ``poll_interval``, whatever it waits on: its
sleeps and waits are cut into slices; a batch being applied is finished and committed first if it
can be within half an interval, else its statement (a lock wait, a long statement) is cancelled
(:mod:`~airflow_repl.engine.postgres.stop_signals`), the batch rolled back, and the run recorded
as succeeded up to its last committed batch (:class:`~airflow_repl.engine.runtime.lifecycle.Stopped`;
the next run delivers the rest).  The agents' guarantees are untouched: this module only decides
whether the loop takes another turn, between batches, where everything is committed.

A continuous run ends its summary with ``continuous``: the options, the rounds that found
nothing pending, and ``ended_by`` (``max_run_seconds``, ``SIGTERM``, ``SIGINT``, ``parent process
gone`` or the agent's own reason, :attr:`Loop.check`); a run whose batch in flight was rolled back
at the stop says so in ``rolled_back``.

Owns the options (:func:`options`, checked: one clear line for a bad value; their command-line
form, :func:`add_arguments`, and which agents take them, :func:`check_request`), the clock and the
stop signal (:class:`Loop`), and the progress of a long run: the run's step, a DEBUG log line and
the history row's counts, at most every :data:`PROGRESS_EVERY` seconds (the INFO progress lines are
:mod:`~airflow_repl.engine.runtime.progress_lines`').
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from airflow_repl.engine.errors import ReplError
from airflow_repl.engine.postgres import connections
from airflow_repl.engine.postgres.stop_signals import SLICE, StopSignals
from airflow_repl.engine.runtime import registry
from airflow_repl.engine.runtime.lifecycle import AgentRun
from airflow_repl.engine.state import dist_history

log = logging.getLogger(__name__)

#: Defaults of a continuous run (seconds).
POLL_INTERVAL = 1.0
MAX_RUN_SECONDS = 3600.0
#: At most one progress log line and history update this often (seconds).
PROGRESS_EVERY = 5.0
#: How a run ends when its parent process went away (see stop_when_orphaned).
_PARENT_GONE = "parent process gone"
#: The parent process a continuous run watches (see stop_when_orphaned); empty: none.
_watched_parent: list[int] = []


def stop_when_orphaned() -> None:
    """End this process's continuous runs cleanly, like SIGTERM, when its parent process goes
    away.  spark-submit runs the Python driver as a child of its JVM, and stopping the JVM
    (Airflow's ``on_kill`` kills spark-submit) leaves that child running; the job calls this."""
    _watched_parent[:] = [os.getppid()]


def _orphaned() -> bool:
    return bool(_watched_parent) and os.getppid() != _watched_parent[0]


#: How a run in a Spark task ends when the application's driver stops (see DriverStop).
_DRIVER_STOPPED = "driver stopped"
#: The driver a continuous run in a Spark task watches: (the distributor's conninfo, the key of
#: the driver's lock); empty: none.
_watched_driver: list[tuple[str, str]] = []
#: When the watched driver was last looked at, and whether it was found stopped.
_driver_seen: list[Any] = [0.0, False]
#: The driver is looked at this often (seconds): a connection to the distributor each time.
DRIVER_CHECK_EVERY = 0.5


class DriverStop:
    """The driver's side of continuous runs in Spark tasks (several subscribers): while they run
    it holds a lock at the distributor (an advisory lock on a key of its own).  SIGTERM or SIGINT
    in the driver releases it, and so does the driver's end, however it ends (its connection
    closes); each task's run (:func:`stop_with_driver`) then ends as on a signal within about a
    second, with ``ended_by: "driver stopped"``, and the driver collects their summaries."""

    def __init__(self, distributor: str) -> None:
        self.distributor, self.key = distributor, f"airflow_repl.driver.{uuid.uuid4().hex}"
        self.stop = StopSignals()
        self._conn: psycopg.Connection[Any] | None = None
        self._done = threading.Event()
        self._watch = threading.Thread(target=self._release_on_stop, name="driver-stop", daemon=True)

    def __enter__(self) -> DriverStop:
        self._conn = connections.connect(self.distributor, "distributor", autocommit=True)
        self._conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (self.key,))
        self.stop.__enter__()
        self._watch.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        self._watch.join(5)
        self.stop.__exit__(*exc)
        if self._conn is not None:
            self._conn.close()

    def _release_on_stop(self) -> None:
        while not self._done.wait(SLICE):
            if self.stop.stopped() and self._conn is not None:
                log.info("%s: stopping the continuous runs of the Spark tasks", self.stop.received)
                self._conn.close()  # the lock goes with the session
                return


def stop_with_driver(watched: tuple[str, str] | None) -> None:
    """Executor side: this task's continuous run ends when the driver's :class:`DriverStop`
    lock (the distributor's conninfo and the key) is gone (None: watch no driver)."""
    _watched_driver[:] = [watched] if watched is not None else []
    _driver_seen[:] = [0.0, False]


def _driver_stopped() -> bool:
    """Whether the watched driver released its lock (looked at every DRIVER_CHECK_EVERY seconds;
    a distributor that cannot be reached says nothing: the run finds out by itself)."""
    if not _watched_driver or _driver_seen[1] or time.monotonic() - _driver_seen[0] < DRIVER_CHECK_EVERY:
        return bool(_driver_seen[1])
    _driver_seen[0] = time.monotonic()
    conninfo, key = _watched_driver[0]
    try:
        with connections.connect(conninfo, "distributor", autocommit=True, connect_timeout=2) as conn:
            row = conn.execute("SELECT pg_try_advisory_lock_shared(hashtext(%s))", (key,)).fetchone()
    except (ReplError, psycopg.Error):
        return False
    _driver_seen[1] = bool(row and row[0])  # taken: the driver's lock is gone
    return bool(_driver_seen[1])


def _why_stop() -> str | None:
    """A reason to stop besides a signal: the parent process or the Spark driver gone."""
    if _orphaned():
        return _PARENT_GONE
    return _DRIVER_STOPPED if _driver_stopped() else None


@dataclass(frozen=True)
class Continuous:
    """The options of a continuous run."""

    poll_interval: float = POLL_INTERVAL
    max_run_seconds: float = MAX_RUN_SECONDS


def options(
    continuous: bool, poll_interval: float | None = None, max_run_seconds: float | None = None
) -> Continuous | None:
    """The run's continuous options (None: an ordinary run), checked."""
    if not continuous:
        given = [
            n for n, v in (("poll_interval", poll_interval), ("max_run_seconds", max_run_seconds)) if v is not None
        ]
        if given:
            raise ReplError(f"{' and '.join(given)} apply to continuous runs only: add continuous (--continuous)")
        return None
    poll = POLL_INTERVAL if poll_interval is None else _seconds("poll_interval (--poll-interval)", poll_interval)
    most = (
        MAX_RUN_SECONDS if max_run_seconds is None else _seconds("max_run_seconds (--max-run-seconds)", max_run_seconds)
    )
    return Continuous(poll, most)


def _seconds(name: str, value: Any) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise ReplError(f"{name} {value!r} is not a positive number of seconds: use e.g. 1 (or 3600 for the run time)")
    return seconds


def refuse_until(until: object, opts: Continuous | None) -> None:
    """A point-in-time delivery ends at ``until``; a continuous one follows the publisher."""
    if until is not None and opts is not None:
        raise ReplError(
            "until (--until) and continuous (--continuous) cannot be combined: a continuous Distribution Agent "
            "follows the publisher; use until for point-in-time runs only"
        )


#: The agents that can run continuously, by the name they are run under.
AGENTS = registry.CONTINUOUS


def check_request(agent: str, until: str | None, given: dict[str, Any] | None) -> None:
    """Continuous options given to ``agent`` (``run_*`` keyword arguments), checked before
    anything runs."""
    if not given:
        return
    if agent not in AGENTS:
        raise ReplError(
            f"the {agent} agent has no continuous mode: only {', '.join(AGENTS[:-1])} and {AGENTS[-1]} run continuously"
        )
    refuse_until(until, options(**given))


class Loop:
    """Whether an agent's loop takes another turn.  An ordinary run (``opts`` None) never
    waits: :meth:`idle` ends it.  A continuous run sleeps when idle and ends at its maximum run
    time or on SIGTERM or SIGINT (handled while the loop is entered, in the main thread only)."""

    def __init__(self, opts: Continuous | None, run: AgentRun, totals: dict[str, Any]) -> None:
        self.opts, self.run, self.totals = opts, run, totals
        self.started = time.monotonic()
        self.ended_by: str | None = None
        self.rounds = 0
        #: SIGTERM, SIGINT, a parent or driver gone: a flag; a statement still running half an interval later is cancelled
        self.stop = StopSignals(run.connections, opts.poll_interval / 2 if opts is not None else None, _why_stop)
        self._reported = (0, 0)
        self._last_report = self._last_check = self.started
        #: the agent's own reason to end (None: go on), asked when idle and at most every
        #: PROGRESS_EVERY seconds between batches, e.g. article definitions that changed
        self.check: Callable[[], str | None] | None = None

    def __enter__(self) -> Loop:
        if self.opts is not None:
            self.stop.__enter__()
            self.run.loop = self  # a statement cancelled by the stop ends the run cleanly (AgentRun)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.opts is not None:
            self.stop.__exit__(*exc)

    def stopped_by(self) -> str | None:
        """The signal that stopped the run (None: none came)."""
        return self.stop.received

    def go_on(self) -> bool:
        """After a batch (everything committed): another turn, unless the run must end."""
        if self.opts is None:
            return True
        self._report()
        return not self._should_end(time.monotonic() - self._last_check >= PROGRESS_EVERY)

    def idle(self, worked: bool = False, wake: Callable[[float], bool] | None = None) -> bool:
        """Nothing pending: an ordinary run ends (False); a continuous one sleeps
        ``poll_interval`` (not when ``worked``: the last round did work, look again at once)
        and takes another turn, unless it must end.  ``wake``: waits up to the seconds given
        and says whether work came meanwhile, which ends the sleep (a replication stream)."""
        if self.opts is None:
            return False
        self.rounds += 1
        self._report()
        if not worked:
            self._sleep(self.opts.poll_interval, wake)
        return not self._should_end(True)

    def must_end(self) -> bool:
        """While waiting (e.g. for the other writer's turn at a subscriber): whether the run must
        end now (SIGTERM, its maximum run time, its parent gone).  An ordinary run never does."""
        return self.opts is not None and self._should_end(False)

    def summary(self, totals: dict[str, Any]) -> dict[str, Any]:
        """The summary of a continuous run: ``totals`` with how the run ended."""
        if self.opts is not None:
            totals["continuous"] = {
                "poll_interval": self.opts.poll_interval,
                "max_run_seconds": self.opts.max_run_seconds,
                "rounds": self.rounds,
                "ended_by": self.ended_by or self.stop.received or "max_run_seconds",
            }
        return totals

    def _should_end(self, check: bool) -> bool:
        assert self.opts is not None
        if self.stop.received is not None:
            self.ended_by = self.stop.received
        elif _orphaned():
            self.ended_by = _PARENT_GONE
        elif time.monotonic() - self.started >= self.opts.max_run_seconds:
            self.ended_by = "max_run_seconds"
        elif check and self.check is not None:
            self._last_check = time.monotonic()
            self.ended_by = self.check()
        return self.ended_by is not None

    def _sleep(self, seconds: float, wake: Callable[[float], bool] | None = None) -> None:
        assert self.opts is not None
        until = min(time.monotonic() + seconds, self.started + self.opts.max_run_seconds)
        while self.stop.received is None and not _orphaned() and (left := until - time.monotonic()) > 0:
            if wake is None:
                time.sleep(min(left, SLICE))
            elif wake(min(left, SLICE)):
                return

    def _report(self) -> None:
        """The run's step, and (when the counts moved, at most every PROGRESS_EVERY seconds) a
        log line and the history row's counts."""
        counts = (int(self.totals.get("transactions", 0)), int(self.totals.get("commands", 0)))
        elapsed = time.monotonic() - self.started
        self.run.step = f"continuous run ({counts[0]} transactions, {counts[1]} commands so far, {elapsed:.0f}s)"
        if counts == self._reported or time.monotonic() - self._last_report < PROGRESS_EVERY:
            return
        self._reported, self._last_report = counts, time.monotonic()
        log.debug(  # the agents' own progress lines (progress_lines) say more, at INFO
            "%s for %s, continuous: %s transactions, %s commands so far", self.run.label, self.run.where(), *counts
        )
        if self.run.dist is not None and self.run.run_id is not None:
            dist_history.record_run_progress(self.run.dist, self.run.run_id, *counts)
