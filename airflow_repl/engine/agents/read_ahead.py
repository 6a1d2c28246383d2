"""The Distribution Agent's read-ahead (batches applied by net change): while one batch is applied at the
subscriber, the next one's transactions and commands are read from the distribution database, on
a connection and a thread of their own, and its net change is prepared there
(:func:`~airflow_repl.engine.subscriber.bulk_apply.prepare`: the commands' JSON decoded, netted
per key, made array parameters), so that the subscriber's work and the rest overlap instead of
taking turns.

What is read ahead is only a guess at the next batch: it is read after the watermark the batch
being applied will leave, and the agent uses it only when the watermark it then locks at the
subscriber is that one and the batch it cuts is the same transactions (otherwise it reads them as
before).  One read asks for the pending transactions of several batches
(:data:`BATCHES_PER_READ`); those after the batch it cut are kept for the next read, which then
reads only its batch's commands (one round trip), when it is after that batch.  Reading is all
this module does: the subscriber's watermark lock, the distributor's retention lock (which
refuses an expired subscription after the read, as it does after the agent's own), the
application and the commits stay with the agent's loop, in their order.  A failed read ahead is
dropped: the agent's own read then meets the failure and reports it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import psycopg

from airflow_repl.engine.runtime import gc_pause
from airflow_repl.engine.state import dist_transactions
from airflow_repl.engine.state.dist_transactions import CommandRow, PendingTransaction
from airflow_repl.engine.subscriber import bulk_apply

log = logging.getLogger(__name__)


#: A batch's net change, or why it has none (it is then applied command by command): at a
#: PostgreSQL subscriber this; at a MariaDB one its own (``P``).
Prepared = bulk_apply.Prepared | bulk_apply.NotNetApplicable
P = TypeVar("P")
#: Makes it from the batch's commands, in the worker thread.
Prepare = Callable[[list[CommandRow], list[PendingTransaction]], P]


#: How many batches' transactions one read of the pending transactions asks for: what is left
#: after a batch's cut is kept for the next cuts (their commands are then read in one round trip
#: each, the transactions not asked again) while it still holds a whole batch (``size``).
BATCHES_PER_READ = 4


@dataclass(frozen=True)
class Read(Generic[P]):
    """What was read after watermark ``after``: the pending transactions (``size`` at most), the
    batch cut from them, (unless that batch is a schema change's or too large to hold) its net
    change, and the pending transactions read after the batch (kept for the next read; at most
    ``size`` times :data:`BATCHES_PER_READ` small rows, no commands)."""

    after: str
    pending: list[PendingTransaction]
    batch: list[PendingTransaction]
    prepared: P | None
    rest: list[PendingTransaction] = field(default_factory=list)

    def prepared_for(self, txns: list[PendingTransaction]) -> P | None:
        """The net change, when ``txns`` is the batch it was prepared for."""
        if not txns or [t.xact for t in txns] != [t.xact for t in self.batch]:
            return None
        return self.prepared


class ReadAhead(Generic[P]):
    """One read at a time, on ``conn`` (autocommit, used by nothing else), in a worker thread.
    The pending transactions a read found after its batch are kept for the next read, when it
    is after that batch (:meth:`start`), and thrown away otherwise."""

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        publication: str,
        size: int,
        cut: Callable[[list[PendingTransaction]], list[PendingTransaction]],
        prepare: Prepare[P],
    ) -> None:
        self.conn, self.publication, self.size, self.cut, self.prepare = conn, publication, size, cut, prepare
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="airflow-repl-read-ahead")
        self._job: tuple[str, Future[Read[P]]] | None = None
        #: the pending transactions the last read taken found after its batch, and that batch's end
        self._kept: tuple[str, list[PendingTransaction]] | None = None
        self.used = 0  # batches whose commands came from a read ahead

    def start(self, after: str) -> None:
        """Read the transactions after ``after`` (those kept, when they follow it) and the batch
        they begin."""
        self._wait()
        kept, self._kept = self._kept, None
        known = kept[1] if kept is not None and kept[0] == after else None
        self._job = (after, self._pool.submit(self._read, after, known))

    def take(self, after: str) -> Read[P] | None:
        """The read after ``after``, when the last one started was that (waiting for it to
        finish); None otherwise or when it failed."""
        job, self._job = self._job, None
        self._kept = None
        if job is None:
            return None
        started_after, future = job
        try:
            read = future.result()
        except Exception as exc:  # the agent's own read meets it again, and reports it
            log.debug("the read ahead after %s failed: %s", started_after, exc)
            return None
        if started_after != after or not read.pending:
            return None
        if read.batch:
            self._kept = (read.batch[-1].xact, read.rest)
        return read

    def close(self) -> int:
        """Wait for a read still under way, and stop the thread (the run closes the connection);
        how many batches came from a read ahead."""
        self._wait()
        self._pool.shutdown(wait=True)
        return self.used

    def _wait(self) -> None:
        job, self._job = self._job, None
        if job is not None:
            try:
                job[1].result()
            except Exception:
                pass

    def _read(self, after: str, known: list[PendingTransaction] | None) -> Read[P]:
        """The read and the net change, without the cyclic garbage collector (they allocate an
        object or more per command, and the batch applied meanwhile pauses it only until it
        commits: :mod:`~airflow_repl.engine.runtime.gc_pause`)."""
        with gc_pause.paused():
            return self._read_batch(after, known)

    def _read_batch(self, after: str, known: list[PendingTransaction] | None) -> Read[P]:
        """``known``: the pending transactions after ``after`` a read before kept (used when
        they hold a whole batch; otherwise asked again)."""
        if known is None or len(known) < self.size:
            known = dist_transactions.pending_transactions(
                self.conn, self.publication, after, self.size * BATCHES_PER_READ
            )
        pending = known[: self.size]
        batch = self.cut(pending)
        rest = known[len(batch) :]
        commands = sum(t.command_count for t in batch)
        if not batch or batch[0].schema_change or commands > bulk_apply.CHUNK_COMMANDS:
            return Read(after, pending, batch, None, rest)  # applied otherwise, or chunk by chunk as it is read
        rows = dist_transactions.batch_commands_list(self.conn, self.publication, batch[0].xact, batch[-1].xact)
        if len(rows) != commands:  # not what the transactions say they hold: the agent reads them itself
            return Read(after, pending, batch, None, rest)
        return Read(after, pending, batch, self.prepare(rows, batch), rest)
