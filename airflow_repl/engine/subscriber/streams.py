"""The subscription streams: the connections one delivery applies on at a subscriber, acting
as one transaction.

Owns :class:`Streams`: the connections opened for replication (``session_replication_role =
replica``; with several streams a lock timeout, and a capacity check before any further
connection is opened), rolled back together, and committed together by two-phase commit
(:meth:`Streams.commit_two_phase`); and :func:`recover_prepared`, which finishes a two-phase
commit that a dead agent left behind.

A batch's prepared transactions are named ``airflow_repl|<publication>|<batch>|<last
xact_seqno>|<stream>|<streams>``; stream 0's transaction holds the subscriber's watermark.  The
names and the recovery's decision are :mod:`~airflow_repl.engine.subscriber.two_phase`'s, shared
with MariaDB subscribers.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

import psycopg
from psycopg import sql

from airflow_repl.engine.errors import ReplError
from airflow_repl.engine.state import subscriber_state
from airflow_repl.engine.subscriber import two_phase

log = logging.getLogger(__name__)

#: With several streams, a stream waiting this long for a lock gives up and the batch is
#: replayed on one stream.  Planning keeps conflicting commands on one stream, so only work
#: outside the plan (a custom procedure touching other rows, another session) can wait.
STREAM_LOCK_TIMEOUT = "10s"


class Streams:
    """The connections of one delivery to a subscriber; ``conns[0]`` holds the watermark."""

    def __init__(self, publication: str, subscriber: str, count: int) -> None:
        self.publication, self.subscriber, self.count = publication, subscriber, count
        self.conns: list[psycopg.Connection] = []

    @property
    def first(self) -> psycopg.Connection:
        """Stream 0: the one-stream batches, the replays and the watermark."""
        return self.conns[0]

    def open(self, connect: Callable[[], psycopg.Connection]) -> None:
        """Open ``count`` connections with ``connect`` and make each ready to apply."""
        for i in range(self.count):
            conn = connect()
            self.conns.append(conn)
            if i == 0 and self.count > 1:  # before opening the others
                check_capacity(conn, self.count, self.publication, self.subscriber)
            self._prepare_session(conn)

    def _prepare_session(self, conn: psycopg.Connection) -> None:
        try:
            conn.execute("SET session_replication_role = replica")
            if self.count > 1:
                conn.execute("SELECT set_config('lock_timeout', %s, false)", (STREAM_LOCK_TIMEOUT,))
            conn.commit()
        except psycopg.errors.InsufficientPrivilege:
            raise ReplError(
                f"the login of subscriber {self.subscriber!r} may not set "
                f"session_replication_role; the Distribution Agent needs a superuser login "
                f"(or one granted SET on that parameter) at the subscriber"
            ) from None

    def lost(self) -> bool:
        """True when a connection is gone (the batch cannot be replayed on it)."""
        return any(conn.broken or conn.closed for conn in self.conns)

    def rollback_all(self) -> None:
        """Roll back every stream's open transaction; never raises (it runs on error paths,
        where a connection may be dead: the server rolls a dead session's work back itself)."""
        for conn in self.conns:
            if conn.closed or conn.broken:
                continue
            try:
                if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    conn.rollback()
            except psycopg.Error:
                try:
                    conn.cancel_safe()
                    conn.rollback()
                except psycopg.Error as exc:
                    log.debug("could not roll back a stream of subscriber %r: %r", self.subscriber, exc)

    def commit_two_phase(self, used: int, last: str) -> None:
        """Commit one batch ending at ``last`` on the streams it used, 0..used-1, as one: every
        stream prepares, then every stream commits.  A failed prepare rolls the batch back on
        every stream (it can be replayed); a failed commit never does (recovery finishes it)."""
        batch = uuid.uuid4().hex[:12]
        gids = [two_phase.gid(self.publication, batch, last, i, used) for i in range(used)]
        self._prepare(gids)
        try:
            for conn, gid in zip(self.conns, gids, strict=False):
                _autocommit(conn, sql.SQL("COMMIT PREPARED {}").format(sql.Literal(gid)))
        except psycopg.Error as exc:
            # Past the prepare phase the batch must commit, never be replayed: what is still
            # prepared is committed by the next run's recovery.
            if self.lost():
                raise  # reported as a lost connection: run it again
            raise ReplError(
                f"the batch ending at {last} is prepared on every stream but not yet committed "
                f"on all of them ({exc}); run the Distribution Agent again to finish it"
            ) from None

    def _prepare(self, gids: list[str]) -> None:
        """PREPARE TRANSACTION on stream i as ``gids[i]``; when one cannot, undo them all."""
        prepared: list[str] = []
        try:
            for conn, gid in zip(self.conns, gids, strict=False):
                conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
                conn.commit()  # closes psycopg's transaction block; the work is now prepared
                prepared.append(gid)
        except psycopg.Error:
            # A stream could not prepare: undo the streams that did, so the batch can be replayed.
            self.rollback_all()
            self.first.autocommit = True
            try:
                for gid in reversed(prepared):  # stream 0 (the watermark) last
                    self.first.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
            finally:
                self.first.autocommit = False
            raise


def _autocommit(conn: psycopg.Connection, statement: sql.Composed) -> None:
    """Run ``statement`` outside a transaction block (COMMIT/ROLLBACK PREPARED must)."""
    conn.autocommit = True
    try:
        conn.execute(statement)
    finally:
        conn.autocommit = False


def recover_prepared(sub: psycopg.Connection, publication: str) -> int:
    """Finish a multi-stream batch whose agent died during two-phase commit; returns how many
    prepared transactions it finished (committed or rolled back as :func:`two_phase.recovery`
    decides)."""
    sub.rollback()
    gids = _prepared_gids(sub, publication)
    committed = subscriber_state.watermark(sub, publication) if gids else None
    sub.rollback()
    for commit, members in two_phase.recovery([two_phase.parse(g) for g in gids], committed):
        _finish_batch(sub, publication, [m.gid for m in members], commit)
    return len(gids)


def _prepared_gids(sub: psycopg.Connection, publication: str) -> list[str]:
    """The gids of the publication's prepared transactions in the subscriber's database."""
    prefix = two_phase.gid_prefix(publication)
    return [
        r[0]
        for r in sub.execute(
            "SELECT gid FROM pg_catalog.pg_prepared_xacts WHERE gid LIKE %s AND database = current_database()",
            (prefix.replace("_", r"\_") + "%",),
        )
    ]


def _finish_batch(sub: psycopg.Connection, publication: str, members: list[str], commit: bool) -> None:
    """COMMIT (or ROLLBACK) PREPARED a batch's transactions, in order (stream 0 last)."""
    for gid in members:
        _autocommit(sub, sql.SQL("COMMIT PREPARED {}" if commit else "ROLLBACK PREPARED {}").format(sql.Literal(gid)))
    log.warning(
        "recovered an interrupted multi-stream batch of %s: %s %d prepared transaction(s)",
        publication,
        "committed" if commit else "rolled back",
        len(members),
    )


def check_capacity(conn: psycopg.Connection, streams: int, publication: str, subscriber: str) -> None:
    """Refuse, before any further connection is opened, more streams than the subscriber can
    serve: one connection each (within max_connections, less the superuser reserve and the
    connections in use, this one included) and one prepared transaction each."""
    row = conn.execute(
        "SELECT current_setting('max_connections')::int, current_setting('superuser_reserved_connections')::int, "
        "(SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE backend_type = 'client backend'), "
        "current_setting('max_prepared_transactions')::int"
    ).fetchone()
    assert row is not None  # a SELECT without FROM returns one row
    max_conn, reserved, in_use, prepared = row
    conn.rollback()
    free = max_conn - reserved - (in_use - 1)  # connections left for this agent, this one included
    allowed = min(free, prepared)
    if streams > allowed:
        raise ReplError(
            f"subscription_streams = {streams} is more than subscriber {subscriber!r} can serve: it allows {allowed} "
            f"(max_prepared_transactions {prepared}; free connections {free} = max_connections {max_conn} - "
            f"superuser_reserved_connections {reserved} - {in_use - 1} in use by others); set subscription_streams "
            f"of publication {publication!r} at subscriber {subscriber!r} to at most {max(allowed, 1)}, or raise "
            f"those settings at the subscriber"
        )
