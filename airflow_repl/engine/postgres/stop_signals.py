"""Stopping a long-running loop on SIGINT or SIGTERM within its interval, whatever it waits on.

While a :class:`StopSignals` is entered in the main thread, SIGINT (Ctrl-C) and SIGTERM (how Airflow
and process managers stop a process) only note that they came (:attr:`StopSignals.received`); the
loop looks at it between its steps and ends cleanly.  What it waits on meanwhile is cut short:

* its own waits (a sleep, a LISTEN's notifications, the pause between two connection attempts)
  are cut into slices of :data:`SLICE` seconds that look at the flag (:meth:`StopSignals.wait`);
* a statement still running ``cancel_after`` seconds after the signal (a lock wait, a long
  statement, a wait on a server that has just restarted) is cancelled, and so is every statement
  started after it until the block ends: a watchdog thread sends PostgreSQL's cancel request on
  each watched connection, and the statement returns at once with ``QueryCanceled``
  (SQLSTATE 57014; :func:`cancelled`), which the loop takes as its end.

In another thread (a Spark task, a test's thread) no handler is installed: the block then only
offers :meth:`StopSignals.request` and :meth:`StopSignals.wait`.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable
from types import FrameType, TracebackType
from typing import Any

import psycopg

log = logging.getLogger(__name__)

#: A wait is cut into slices this long (seconds), so that a signal ends it promptly.
SLICE = 0.2
#: The signals that stop a loop, by the name a summary gives them.
SIGNALS = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}
#: SQLSTATE of a statement cancelled by a cancel request.
QUERY_CANCELED = "57014"


class StopSignals:
    """SIGINT and SIGTERM as a flag while entered (see the module's documentation).
    ``watched``: the connections whose statements are cancelled ``cancel_after`` seconds after
    the signal (None: never); ``also``: another reason to stop, asked by the watchdog every
    slice (e.g. the parent process gone), taken as a signal."""

    def __init__(
        self,
        watched: Callable[[], Iterable[psycopg.Connection[Any]]] = tuple,
        cancel_after: float | None = None,
        also: Callable[[], str | None] | None = None,
    ) -> None:
        self.watched, self.cancel_after, self.also = watched, cancel_after, also
        #: the signal that came (``SIGINT``, ``SIGTERM``) or the reason given to :meth:`request`
        self.received: str | None = None
        self._at: float | None = None
        self._previous: dict[int, Any] = {}
        self._ended = threading.Event()
        self._watchdog: threading.Thread | None = None

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                self._previous[signum] = signal.signal(signum, self._on_signal)
        if self.cancel_after is not None:
            self._watchdog = threading.Thread(target=self._watch, name="stop-signals", daemon=True)
            self._watchdog.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._ended.set()
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
        if self._watchdog is not None:
            self._watchdog.join(5)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.request(SIGNALS.get(signal.Signals(signum), str(signum)))  # only a flag: the loop ends at its next step

    def request(self, why: str) -> None:
        """Stop as on a signal (the first reason given is kept)."""
        if self.received is None:
            self.received, self._at = why, time.monotonic()

    def stopped(self) -> bool:
        """Whether a stop was requested (a signal came)."""
        return self.received is not None

    def wait(self, seconds: float, until: Callable[[float], bool] | None = None) -> bool:
        """Wait up to ``seconds``, in slices; True as soon as a stop is requested.  ``until``:
        waits up to the seconds it is given and says whether what the loop waits for came, which
        ends the wait too (e.g. a notification)."""
        deadline = time.monotonic() + seconds
        while self.received is None and (left := deadline - time.monotonic()) > 0:
            if until is None:
                time.sleep(min(left, SLICE))
            elif until(min(left, SLICE)):
                break
        return self.received is not None

    def _watch(self) -> None:
        """Cancel the watched connections' statements from ``cancel_after`` seconds after the
        stop on, every slice, until the block ends."""
        assert self.cancel_after is not None
        while not self._ended.wait(SLICE / 4):
            if self.received is None and self.also is not None and (why := self.also()) is not None:
                self.request(why)
            if self._at is None or time.monotonic() - self._at < self.cancel_after:
                continue
            for conn in list(self.watched()):
                if conn.closed or conn.pgconn.transaction_status != psycopg.pq.TransactionStatus.ACTIVE:
                    continue
                try:
                    conn.cancel_safe(timeout=SLICE * 5)
                    log.debug("stopping (%s): cancelled the statement running on %s", self.received, conn)
                except psycopg.Error as exc:  # the server went away meanwhile: the statement fails anyway
                    log.debug("stopping (%s): could not cancel a statement: %s", self.received, exc)


def cancelled(exc: BaseException) -> bool:
    """Whether ``exc`` is (or was raised from) a statement cancelled by a cancel request."""
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            return False
        if getattr(seen, "sqlstate", None) == QUERY_CANCELED:
            return True
        seen = seen.__cause__ or seen.__context__
    return False
