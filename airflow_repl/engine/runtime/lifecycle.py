"""One agent run, from lock to history row: the lifecycle every agent shares.

Owns, for the Snapshot, Log Reader and Distribution Agents alike: the agent's session lock,
its ``agent_history`` row (and marking runs left 'running' by dead agents 'abandoned'), the
step the run is at (progress, and what a failure message names), error classification, and
the summary the run returns for the operator (result file, XCom) and writes to its history.

::

    with AgentRun("logreader", publication) as run:
        dist = run.connect(topology.distributor.require("distributor"), "distributor")
        run.lock(dist)                    # another agent of this kind running -> AgentBusy
        ...checks that change nothing...
        run.begin(dist)                   # the agent_history row; stale 'running' rows -> 'abandoned'
        run.counts = totals               # running totals, written to the history row if the run fails
        run.step = "reading the slot"     # progress (logged at DEBUG), named by a lost-connection message
        ...work...
        return run.succeed(totals)        # history 'succeeded', one log line, "seconds" added

Leaving the block with an exception marks the run failed (history and error rows), runs the
agent's cleanups, closes every connection the run opened and re-raises, translated:

* a server that went away (crash, restart, network) becomes :class:`ConnectionLost`
  "lost connection to the publisher (host:port) during reading the slot; the run is recorded
  as failed; run it again".  When the distributor itself is gone the failure cannot be
  recorded: the next run marks the row 'abandoned' (it holds the lock, so the row's agent is
  dead);
* a lock wait that timed out becomes :class:`AgentBusy` (both are retryable);
* an error raised inside a Spark task (which reaches the driver wrapped in a Java exception
  carrying the Python traceback) becomes the engine error it was, or ConnectionLost.

A run that stops before :meth:`AgentRun.begin` (a check refused it: articles changed, expired,
not initialized, an unfinished drop; or a subscriber could not be reached) gets a history row
too, with an error row, as long as the distributor was reached: nothing blocked is invisible to
``status``.  Before or after :meth:`AgentRun.begin`, the row's outcome is the error class's
(``outcome``): ``blocked`` for a refusal whose message names the fix (a subscriber's types
that differ, checked after the row began, too), ``failed`` for an error.  Another agent holding the lock (AgentBusy) leaves no row.

Everything else is re-raised as it is.  Messages never carry a password: servers are named
by role and host:port only.

Writing a new agent (a Queue Reader, a cleanup agent)
-----------------------------------------------------
A new agent is one module in this package with only its own logic:

1. a ``run_<agent>(topology, publication, ...) -> dict`` function that opens
   ``with AgentRun("<agent>", publication[, subscriber]) as run:`` and register it once in
   :data:`airflow_repl.engine.runtime.registry.AGENTS`;
2. inside, open every connection with :meth:`AgentRun.connect` (or watch one opened elsewhere
   with :meth:`AgentRun.track`), take the lock with :meth:`AgentRun.lock`, make the checks
   that change nothing, then :meth:`AgentRun.begin`; name each step with ``run.step = ...``
   (or :meth:`AgentRun.spark_step` for work done in Spark tasks); register what must be undone
   on failure in ``run.cleanups``; keep the running totals in ``run.counts``;
3. its questions to the distribution database are functions of
   the ``airflow_repl.engine.state.dist_*`` modules, one per entity (and of ``subscriber_state`` at a subscriber),
   never SQL in the agent;
4. end with ``return run.succeed(summary)``; raise an :mod:`~airflow_repl.engine.errors`
   class for every failure the operator can act on (the rest is classified here);
5. add one entry to :data:`airflow_repl.jobs.agent_job.AGENTS` (and an operator, if Airflow
   should run it).
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, ParamSpec, Protocol

import psycopg
from psycopg import conninfo as pg_conninfo

from airflow_repl.engine import errors
from airflow_repl.engine.errors import AgentBusy, ConnectionLost, DeliveryError, ReplError, ServerLost
from airflow_repl.engine.postgres import advisory_locks, connections
from airflow_repl.engine.postgres.stop_signals import cancelled
from airflow_repl.engine.runtime import registry
from airflow_repl.engine.state import dist_history, dist_publications

log = logging.getLogger(__name__)
_P = ParamSpec("_P")


#: SQLSTATE classes/codes that mean the server or the connection went away.
_LOST_SQLSTATE_PREFIXES = ("08", "57P01", "57P02", "57P03")
#: An engine error raised inside a Spark task, as it appears in the driver's exception text.
_SPARK_ENGINE_ERROR = re.compile(r"airflow_repl\.engine\.errors\.(\w+): (.+)")
_SPARK_PSYCOPG_ERROR = re.compile(r"psycopg\.(?:errors\.)?(\w+): (.+)")


def host_port(conninfo: str) -> str:
    """``host:port`` of a connection string (never its password)."""
    try:
        params = pg_conninfo.conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return "?"
    return f"{params.get('host', 'localhost')}:{params.get('port', '5432')}"


class Stopped(Exception):
    """A continuous run stopped by SIGTERM or SIGINT while a statement was still running: the
    statement was cancelled, what it was part of rolled back, and the run recorded as succeeded
    up to its last committed batch.  Not an error: the agent returns ``summary``."""

    def __init__(self, summary: dict[str, Any]) -> None:
        super().__init__(f"stopped by {summary.get('continuous', {}).get('ended_by')}")
        self.summary = summary


def ends_when_stopped(run_agent: Callable[_P, dict[str, Any]]) -> Callable[_P, dict[str, Any]]:
    """An agent's ``run_*`` function that returns the summary of a run :class:`Stopped` midway."""

    @functools.wraps(run_agent)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> dict[str, Any]:
        try:
            return run_agent(*args, **kwargs)
        except Stopped as stopped:
            return stopped.summary

    return run


class StoppingLoop(Protocol):
    """What a run asks of its continuous loop (:class:`~airflow_repl.engine.runtime.continuous.Loop`)."""

    def stopped_by(self) -> str | None: ...

    def summary(self, totals: dict[str, Any]) -> dict[str, Any]: ...


class _Lost(ConnectionLost):
    """A lost connection, before its message says what became of the run (see AgentRun)."""


@dataclass
class _Server:
    conn: psycopg.Connection[Any]
    role: str
    conninfo: str


def is_connection_loss(exc: BaseException) -> bool:
    """True for psycopg errors that mean the server or the connection went away."""
    if isinstance(exc, psycopg.InterfaceError):
        return True
    if not isinstance(exc, psycopg.OperationalError) or isinstance(exc, psycopg.errors.LockNotAvailable):
        return False
    state = exc.sqlstate
    return state is None or state.startswith(_LOST_SQLSTATE_PREFIXES)


def _is_spark_error(exc: BaseException) -> bool:
    return type(exc).__module__.split(".")[0] in ("py4j", "pyspark")


def engine_error_in(text: str) -> ReplError | None:
    """The engine error a Spark task raised, rebuilt from the Python traceback that the
    driver's exception text carries (the last one named, the one the task ended with)."""
    for name, message in reversed(_SPARK_ENGINE_ERROR.findall(text)):
        cls = getattr(errors, name, None)
        if isinstance(cls, type) and issubclass(cls, ReplError):
            return cls(message.strip())
    return None


def as_engine_error(exc: Exception) -> Exception:
    """For code outside an agent run (apply, validate, the job's driver): a Spark error
    carrying an engine error becomes that error; a lost connection becomes ConnectionLost."""
    exc = unwrap_spark_error(exc)
    if is_connection_loss(exc):
        return ConnectionLost(f"lost a connection to a server ({first_line(exc)}); run it again")
    return exc


def unwrap_spark_error(exc: Exception) -> Exception:
    """``exc``, or the engine error it carries when it is a Spark error wrapping one."""
    if _is_spark_error(exc):
        return engine_error_in(str(exc)) or exc
    return exc


class AgentRun:
    """The lifecycle of one agent run (see the module's documentation)."""

    def __init__(self, agent: str, publication: str, subscriber: str | None = None) -> None:
        self.agent, self.publication, self.subscriber = agent, publication, subscriber
        self.label = registry.label(agent)
        self.started = time.monotonic()
        self._step = "starting"
        #: role of the server a step talks to through Spark tasks (their connections are not ours)
        self.spark_role: tuple[str, str] | None = None
        self.run_id: int | None = None
        self.dist: psycopg.Connection[Any] | None = None
        #: running totals; a failed run's history row takes its transactions and commands from them
        self.counts: dict[str, Any] = {}
        #: what a failed run's history row keeps as details (None: nothing)
        self.details: dict[str, Any] | None = None
        #: called, in order, when the run fails (their own errors are only logged)
        self.cleanups: list[Callable[[], None]] = []
        self._servers: list[_Server] = []
        self._done = False
        #: a continuous run's loop, once entered (it says whether a signal stopped the run)
        self.loop: StoppingLoop | None = None

    # ------------------------------------------------------------------ progress
    @property
    def step(self) -> str:
        """The step the run is at, as a failure message names it ("during <step>")."""
        return self._step

    @step.setter
    def step(self, step: str) -> None:
        """Enter a step done here (not in Spark tasks); logged at DEBUG as the run's progress."""
        self._step, self.spark_role = step, None
        log.debug("%s for %s: %s", self.label, self.where(), step)

    def spark_step(self, step: str, role: str, conninfo: str) -> None:
        """A step whose connections live in Spark tasks: name their server if they are lost."""
        self.step = step
        self.spark_role = (role, conninfo)

    # ------------------------------------------------------------------ connections
    def connect(self, conninfo: str, role: str, **kwargs: Any) -> psycopg.Connection[Any]:
        """Connect (an unreachable server raises ConnectionFailed) and watch the connection."""
        conn = connections.connect(conninfo, role, **kwargs)
        self.track(conn, role, conninfo)
        return conn

    def connections(self) -> list[psycopg.Connection[Any]]:
        """The connections the run watches (the statements a stop cancels)."""
        return [server.conn for server in self._servers]

    def track(self, conn: psycopg.Connection[Any], role: str, conninfo: str) -> None:
        """Watch a connection opened elsewhere: if it breaks, failures name its server, and it
        is closed when the run ends."""
        self._servers.append(_Server(conn, role, conninfo))

    # ------------------------------------------------------------------ lock and history
    def where(self) -> str:
        """What the run is for, as messages name it."""
        to = f" to subscriber {self.subscriber!r}" if self.subscriber else ""
        return f"publication {self.publication!r}{to}"

    def lock(self, conn: psycopg.Connection[Any], of: str | None = None) -> None:
        """Take this agent's session lock for the publication on ``conn`` (released when the
        connection ends, also when the process dies); held by another agent -> AgentBusy.
        ``of``: take that agent's lock instead (the Cleanup Agent takes the Snapshot Agent's at
        the distributor)."""
        if advisory_locks.try_agent_lock(conn, of or self.agent, self.publication):
            return
        if of is not None:
            raise AgentBusy(
                f"the {registry.label(of)} (or another agent writing at the subscriber) is busy with "
                f"{self.where()}, where the {self.label} writes too; wait for it to finish, then run it again"
            )
        raise AgentBusy(
            f"another {self.label} is {'delivering' if self.subscriber else 'running for'} "
            f"{self.where()}; wait for it to finish, then run it again" + registry.lock_note(self.agent)
        )

    def begin(self, dist: psycopg.Connection[Any], *, take_over: bool = True) -> int:
        """Start the history row and mark runs left 'running' by dead agents 'abandoned'.
        Call it holding the lock, after the checks that can fail without changing anything.
        ``take_over`` False: a run that does no work and holds no lock (a paused subscription's)
        leaves the other rows alone."""
        self.dist = dist
        self.run_id = dist_history.start_run(dist, self.agent, self.publication, self.subscriber)
        if take_over:
            dist_history.abandon_stale_runs(dist, self.run_id, self.agent, self.publication, self.subscriber)
        return self.run_id

    def succeed(
        self,
        summary: dict[str, Any],
        *,
        transactions: int | None = None,
        commands: int | None = None,
        rows_copied: int = 0,
        message: str | None = None,
        outcome: str = "succeeded",
    ) -> dict[str, Any]:
        """The run succeeded: ``summary`` (given its ``seconds`` unless it has them) becomes the
        history row's details and the result for the operator, and is logged in one line.
        ``transactions`` and ``commands`` default to the summary's own counts; ``outcome`` is the
        history row's status (``paused``: a Distribution Agent run that skipped its subscription)."""
        summary.setdefault("seconds", round(time.monotonic() - self.started, 3))
        if self.dist is not None and self.run_id is not None:
            dist_history.finish_run(
                self.dist,
                self.run_id,
                outcome,
                transactions=_count(summary, "transactions") if transactions is None else transactions,
                commands=_count(summary, "commands") if commands is None else commands,
                rows_copied=rows_copied,
                message=message,
                details=summary,
            )
        self._done = True
        log.info("%s for %s %s: %s", self.label, self.where(), outcome, message or _summary_line(summary))
        return summary

    # ------------------------------------------------------------------ failure
    def __enter__(self) -> AgentRun:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> Literal[False]:
        try:
            if exc is not None and not self._done and isinstance(exc, Exception):
                self._run_cleanups()
                stopped = self._stopped(exc)
                if stopped is not None:
                    raise stopped from None
                translated = self._translate(exc)
                if isinstance(translated, _Lost):
                    translated = self._lost_outcome(translated)
                elif self.run_id is None:
                    self._record_refusal(translated)
                else:  # a refusal after the row began (a check of the subscribers) is blocked too
                    self._record_failure(translated, outcome_of(translated))
                if translated is not exc:
                    log.debug("%s failed", self.label, exc_info=exc)
                    raise translated from None
        finally:
            self._close_all()
        return False

    def _stopped(self, exc: Exception) -> Stopped | None:
        """A statement cancelled because a signal stopped the continuous run: its work is rolled
        back and the run recorded as succeeded up to there (None: ``exc`` is a failure)."""
        if self.loop is None or self.loop.stopped_by() is None or not cancelled(exc):
            return None
        summary = self.loop.summary(dict(self.counts))
        summary["continuous"]["rolled_back"] = f"the work in flight at the stop ({self.step}); the next run does it"
        try:
            if self.dist is not None and not self.dist.closed:
                self.dist.rollback()
            return Stopped(self.succeed(summary))
        except psycopg.Error as err:  # the distributor went away too: a failure like any other
            log.debug("could not record the stopped %s run: %r", self.label, err)
            return None

    def _lost_outcome(self, lost: _Lost) -> ConnectionLost:
        """The lost-connection message says what became of the run's history row."""
        if self.run_id is None:
            return ConnectionLost(f"{lost}, before the run started; run it again")
        recorded = ConnectionLost(f"{lost}; the run is recorded as failed; run it again")
        if self._record_failure(recorded):
            return recorded
        return ConnectionLost(f"{lost}; the next run will record this run as abandoned; run it again")

    def _run_cleanups(self) -> None:
        for cleanup in self.cleanups:
            try:
                cleanup()
            except Exception as exc:
                log.debug("cleanup after a failed %s run failed: %r", self.label, exc)

    def _lost_server(self) -> _Server | None:
        """The first watched connection that is broken, or that no longer answers."""
        for server in self._servers:
            if server.conn.broken:
                return server
        for server in self._servers:
            if server.conn.closed:
                continue
            try:
                if server.conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
                    server.conn.rollback()
                server.conn.execute("SELECT 1")
                server.conn.rollback()
            except psycopg.Error:
                return server
        return None

    def _lost(self, role: str, conninfo: str) -> _Lost:
        return _Lost(f"lost connection to the {role} ({host_port(conninfo)}) during {self.step}")

    def _translate(self, exc: Exception) -> Exception:
        if isinstance(exc, ServerLost):  # a task lost the server it names: the step and the outcome follow
            return _Lost(f"{exc} during {self.step}")
        if isinstance(exc, ReplError):
            return exc
        if isinstance(exc, psycopg.errors.LockNotAvailable):
            return AgentBusy(
                f"the {self.label} for {self.where()} waited too long for a lock during "
                f"{self.step} (another session holds it); run it again"
            )
        if isinstance(exc, psycopg.errors.ObjectInUse):  # e.g. the slot, still held by a dying session
            return AgentBusy(
                f"the {self.label} for {self.where()} found an object in use by another session "
                f"during {self.step} ({exc.diag.message_primary or first_line(exc)}); run it "
                f"again when that session has ended"
            )
        if is_connection_loss(exc):
            server = self._lost_server()
            if server is not None:
                return self._lost(server.role, server.conninfo)
            if self.spark_role is not None:
                return self._lost(*self.spark_role)
            return _Lost(
                f"lost a connection during {self.step} of the {self.label} for {self.where()} ({first_line(exc)})"
            )
        if _is_spark_error(exc):
            return self._translate_spark(exc)
        return exc

    def _translate_spark(self, exc: Exception) -> Exception:
        text = str(exc)
        engine = engine_error_in(text)
        if engine is not None:
            return self._translate(engine)
        pg = _SPARK_PSYCOPG_ERROR.search(text)
        if pg:
            cls = getattr(psycopg.errors, pg.group(1), None) or getattr(psycopg, pg.group(1), None)
            if (
                isinstance(cls, type)
                and issubclass(cls, (psycopg.OperationalError, psycopg.InterfaceError))
                and not issubclass(cls, psycopg.errors.LockNotAvailable)
            ):
                if self.spark_role is not None:
                    return self._lost(*self.spark_role)
                return _Lost(f"lost a connection in a Spark task during {self.step} ({pg.group(2).strip()})")
        return exc

    def _record_refusal(self, exc: Exception) -> None:
        """A run stopped before :meth:`begin` (a check refused it, a subscriber could not be
        reached): a history row of its own with the error's outcome (``blocked``: a refusal the
        operator must act on, its message naming the fix; ``failed``: an error) and an error row,
        so that ``status`` shows it.  Nothing when the distributor was not reached, when the
        publication is not deployed there, or when another agent holds the lock (that run's own
        row tells)."""
        if isinstance(exc, AgentBusy):
            return
        dist = next(
            (s.conn for s in self._servers if s.role == "distributor" and not s.conn.closed and not s.conn.broken),
            None,
        )
        if dist is None:
            return
        try:
            dist.rollback()
            dist_publications.load_articles(dist, self.publication)  # not deployed: no row for what does not exist
            self.dist, self.run_id = dist, dist_history.start_run(dist, self.agent, self.publication, self.subscriber)
        except errors.NotInitialized:
            dist.rollback()
            return
        except psycopg.Error as err:
            log.debug("could not record the refused %s run: %r", self.label, err)
            return
        self._record_failure(exc, outcome_of(exc))

    def _record_failure(self, exc: Exception, outcome: str = "failed") -> bool:
        """History row ``outcome`` and an error row; False when the distributor cannot be written."""
        if self.dist is None or self.run_id is None or self.dist.closed or self.dist.broken:
            return False
        d = exc if isinstance(exc, DeliveryError) else None
        message = errors.redact(str(exc))
        try:
            self.dist.rollback()
            dist_history.finish_run(
                self.dist,
                self.run_id,
                outcome,
                message=message,
                details=self.details,
                transactions=self.counts.get("transactions", 0),
                commands=self.counts.get("commands", 0),
            )
            dist_history.record_error(
                self.dist,
                run_id=self.run_id,
                agent=self.agent,
                publication=self.publication,
                subscriber=self.subscriber,
                message=message,
                xact_seqno=d.xact_seqno if d else None,
                command_id=d.command_id if d else None,
                article=d.article if d else None,
                sqlstate=d.sqlstate if d else None,
                command=getattr(d, "command", None),
            )
        except psycopg.Error as err:
            log.debug("could not record the failed %s run: %r", self.label, err)
            return False
        return True

    def _close_all(self) -> None:
        for server in self._servers:
            try:
                server.conn.close()
            except Exception:
                pass


def outcome_of(exc: Exception) -> str:
    """The history row's status of a run stopped by ``exc``: the engine error's own
    (``blocked`` or ``failed``, :mod:`airflow_repl.engine.errors`), ``failed`` for anything else."""
    return exc.outcome if isinstance(exc, ReplError) else "failed"


def _count(summary: dict[str, Any], key: str) -> int:
    value = summary.get(key, 0)
    return value if isinstance(value, int) else 0


def _summary_line(summary: dict[str, Any]) -> str:
    """``3 transactions, 10 commands in 0.4s``: the summary's counts, for the log."""
    counts = [f"{v} {k}" for k, v in summary.items() if isinstance(v, int) and not isinstance(v, bool)]
    return f"{', '.join(counts) or 'done'} in {summary.get('seconds', 0):.1f}s"


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
