"""One writer at a time at a queued updating subscriber: the Distribution Agent's batches and
the Queue Reader's transactions take turns there.

Both agents write at such a subscriber: the Distribution Agent applies the publisher's changes
(converging with the subscriber's own, :mod:`~airflow_repl.engine.subscriber.convergence`), and
the Queue Reader compensates the rows of a transaction the publisher rejected and records the
ones it took (``airflow_repl.queue_taken``).  Each reasons about the subscriber as the other left
it, so their writes must never interleave.  They take turns on a session advisory lock at the
subscriber (``airflow_repl.subscriber_writer.<publication>``): the Distribution Agent holds it for
one batch (from locking the watermark to its commit), the Queue Reader for one queued
transaction (from reading its commands to dequeuing it, the publisher's transaction between).
Any interleaving of the two agents is therefore one of a chain of one-batch Distribution Agent
runs and one-transaction Queue Reader runs, which the agents' guarantees already cover; and a
continuous Distribution Agent no longer keeps the Queue Reader out for its whole run, nor the
other way round.

A Snapshot Agent initializing a queued subscriber holds the turn there for its whole run, from
before its slot's consistent point to the subscription's activation: a queued transaction the
Queue Reader applied at the publisher after that point would reach neither the snapshot nor,
being the subscriber's own, the subscriber, whose tables the snapshot replaces.

A turn is waited for, not refused: the other agent's turn is one batch or one transaction.  The
wait polls every :data:`POLL` seconds, so that a continuous run told to end (SIGTERM, its
maximum run time) stops waiting and ends cleanly.  The lock is the session's: a process that
dies releases it with its connection.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import pq

from airflow_repl.engine.postgres import advisory_locks

log = logging.getLogger(__name__)

#: Seconds between two tries while the other agent has its turn.
POLL = 0.05
#: After this many seconds of waiting, one INFO line says who is waited for.
SAY_AFTER = 5.0


class Turns:
    """The writer turns of one agent at one subscriber, on its connection there."""

    def __init__(self, conn: psycopg.Connection[Any], publication: str) -> None:
        self.conn, self.publication = conn, publication
        self.held = False

    def take(self, must_end: Callable[[], bool] = lambda: False) -> bool:
        """Wait for this agent's turn and take it (True); False, without it, when ``must_end``
        says the run ends meanwhile.  Call it with no transaction open on the connection."""
        started = said = time.monotonic()
        while True:
            if advisory_locks.try_writer_turn(self.conn, self.publication):
                self.held = True
                return True
            if must_end():
                return False
            if time.monotonic() - said >= SAY_AFTER:
                said = time.monotonic()
                log.info(
                    "waiting %.0fs for another agent to finish its turn writing at the subscriber (publication %r)",
                    said - started,
                    self.publication,
                )
            time.sleep(POLL)

    def give_back(self) -> None:
        """End the turn.  A transaction still open (a failed batch) is rolled back first; a
        connection that is gone took the lock with it."""
        if not self.held:
            return
        self.held = False
        if self.conn.closed or self.conn.broken:
            return
        try:
            if self.conn.info.transaction_status != pq.TransactionStatus.IDLE:
                self.conn.rollback()
            advisory_locks.release_writer_turn(self.conn, self.publication)
        except psycopg.OperationalError as exc:  # the server went away: so did the lock
            log.debug("the subscriber's writer lock went with its connection: %s", exc)
