"""Subscription streams at a MariaDB subscriber: the connections one delivery applies a batch
on, acting as one transaction through XA transactions (InnoDB).  The PostgreSQL subscriber's
counterpart is :mod:`~airflow_repl.engine.subscriber.streams`.

Owns :class:`MariaDBStreams`: the connections (with several streams, a lock wait of
:data:`STREAM_LOCK_WAIT` seconds each, ``innodb_lock_wait_timeout``, and a capacity check before
any further connection is opened, :func:`check_capacity`), a spread batch begun on each stream
it uses with ``XA START``, rolled back together (``XA END``, ``XA ROLLBACK``), and committed
together: ``XA PREPARE`` on every stream, stream 0 (which holds the watermark) last, then ``XA
COMMIT``, stream 0 first; and :func:`recover_prepared`, which finishes what a dead agent (or a
server restart: InnoDB keeps prepared XA transactions) left prepared, as
:func:`~airflow_repl.engine.subscriber.two_phase.recovery` decides.

A transaction's name (:func:`~airflow_repl.engine.subscriber.two_phase.gid`) is an XA
identifier: its global part (gtrid, at most 64 bytes) ``airflow_repl|<tag>|<batch>|<last
xact_seqno>`` and its branch (bqual) ``<stream>|<streams>``.  XA identifiers are seen
server-wide, so the tag is a stable hash of the subscriber database and the publication
(:func:`tag`): any publication name fits, and two databases of one server never meet.  The
identifiers travel as hexadecimal literals: no text of a name reaches the SQL.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Callable
from typing import Any

import pymysql

from airflow_repl.engine.errors import ReplError
from airflow_repl.engine.state import mariadb_subscriber_state as state
from airflow_repl.engine.subscriber import two_phase

log = logging.getLogger(__name__)

#: With several streams, a stream waiting this many seconds for a row lock gives up and the
#: batch is replayed on one stream (the counterpart of PostgreSQL's lock_timeout).
STREAM_LOCK_WAIT = 10
#: The formatID of the XA identifiers (MariaDB's default).
FORMAT_ID = 1
#: MariaDB's error numbers: the XA identifier is unknown (finished meanwhile); access denied
#: (MySQL 8's XA RECOVER wants XA_RECOVER_ADMIN; MariaDB 10.11 lets any login list them).
_XAER_NOTA = 1397
_ACCESS_DENIED = (1227, 1044, 1045, 1142)


def tag(database: str, publication: str) -> str:
    """The publication's part of its XA identifiers at this subscriber database: stable, 16
    hexadecimal characters, so that the global part stays within MariaDB's 64 bytes."""
    return hashlib.sha256(f"{database}\0{publication}".encode()).hexdigest()[:16]


def xid(gid: str) -> str:
    """The XA identifier of ``gid`` as SQL: ``X'gtrid', X'bqual', formatID``."""
    gtrid, bqual = _split(gid)
    return f"X'{gtrid.encode().hex()}', X'{bqual.encode().hex()}', {FORMAT_ID}"


def _split(gid: str) -> tuple[str, str]:
    """(gtrid, bqual) of a gid: the batch, and the stream of it."""
    gtrid, stream, streams = gid.rsplit("|", 2)
    return gtrid, f"{stream}|{streams}"


def _run(conn: Any, statement: str) -> None:
    with conn.cursor() as cur:
        cur.execute(statement)


class MariaDBStreams:
    """The connections of one delivery to a MariaDB subscriber; ``conns[0]`` holds the watermark."""

    def __init__(self, publication: str, subscriber: str, database: str, count: int) -> None:
        self.publication, self.subscriber, self.count = publication, subscriber, count
        self.tag = tag(database, publication)
        self.conns: list[Any] = []
        #: the XA transaction open on each stream of the batch being applied (None: none)
        self.active: list[str | None] = []
        self.state: list[str] = []  # per stream: "active", "prepared"

    def open(self, first: Any, connect: Callable[[], Any]) -> None:
        """Stream 0 is ``first`` (connected already); the others are opened with ``connect``
        once the subscriber is known to serve them all."""
        self.conns = [first]
        if self.count > 1:
            check_capacity(first, self.count, self.publication, self.subscriber)
            for _ in range(self.count - 1):
                self.conns.append(connect())
            for conn in self.conns:
                _run(conn, f"SET SESSION innodb_lock_wait_timeout = {int(STREAM_LOCK_WAIT)}")

    def close(self) -> None:
        """Close streams 1.. (stream 0 is its opener's to close)."""
        for conn in self.conns[1:]:
            try:
                conn.close()
            except pymysql.MySQLError:
                pass
        self.conns = self.conns[:1]

    def begin(self, used: int, last: str) -> None:
        """Begin the batch ending at ``last`` as an XA transaction on streams 0..used-1 (stream
        0's open transaction, which only read the watermark, is rolled back first)."""
        self.conns[0].rollback()
        batch = uuid.uuid4().hex[:12]
        gids = [two_phase.gid(self.tag, batch, last, i, used) for i in range(used)]
        self.active, self.state = list(gids), ["" for _ in range(used)]
        for i, gid in enumerate(gids):
            _run(self.conns[i], f"XA START {xid(gid)}")
            self.state[i] = "active"

    def abort(self, i: int) -> None:
        """Roll back stream ``i``'s part of the batch (its locks released at once); never
        raises (it runs on error paths)."""
        gid = self.active[i] if i < len(self.active) else None
        if gid is None:
            return
        conn = self.conns[i]
        if self.state[i] == "active":
            try:
                _run(conn, f"XA END {xid(gid)}")
            except pymysql.MySQLError as exc:
                log.debug("XA END on stream %d of subscriber %r: %r", i, self.subscriber, exc)
        try:
            _run(conn, f"XA ROLLBACK {xid(gid)}")
        except pymysql.MySQLError as exc:
            log.debug("XA ROLLBACK on stream %d of subscriber %r: %r", i, self.subscriber, exc)
            return  # left prepared or open: recovery (or the server, for a lost session) rolls it back
        self.active[i] = None

    def decided(self) -> bool:
        """Whether the batch must commit: stream 0, the last to prepare, is prepared (then every
        stream is; a batch past that point is committed here or by recovery, never rolled back)."""
        return bool(self.state) and self.state[0] == "prepared"

    def rollback_all(self) -> None:
        """Roll the batch back on every stream it used, stream 0 (the watermark) last; a batch
        past its decision (:meth:`decided`) is left to the next run's recovery."""
        if not self.decided():
            for i in reversed(range(len(self.active))):
                self.abort(i)
        self.active, self.state = [], []

    def commit(self) -> None:
        """Commit the batch on every stream it used, as one: ``XA END`` and ``XA PREPARE`` on
        each, stream 0 last, then ``XA COMMIT``, stream 0 first.  A failed prepare rolls the
        batch back everywhere (it can be replayed); past stream 0's prepare the batch commits,
        here or by the next run's recovery."""
        order = list(reversed(range(len(self.active))))  # stream 0 prepares last
        try:
            for i in order:
                gid = self.active[i]
                assert gid is not None
                _run(self.conns[i], f"XA END {xid(gid)}")
                self.state[i] = "ended"
                _run(self.conns[i], f"XA PREPARE {xid(gid)}")
                self.state[i] = "prepared"
        except pymysql.MySQLError:
            self.rollback_all()
            raise
        before_commit()
        for i in reversed(order):  # stream 0 first: then the batch is committed, whatever follows
            gid = self.active[i]
            assert gid is not None
            _run(self.conns[i], f"XA COMMIT {xid(gid)}")
            self.active[i] = None
        self.active, self.state = [], []


def before_commit() -> None:
    """Between the prepare and the commit phases (a test holds a batch prepared here)."""


def recover_prepared(conn: Any, database: str, publication: str, subscriber: str, streams: int) -> int:
    """Finish the batches of the publication that a dead agent (or a server restart) left
    prepared at this subscriber database; returns how many XA transactions it finished.  A
    login that may not list them (MySQL 8's ``XA RECOVER`` wants XA_RECOVER_ADMIN) is refused
    with several streams (they may leave some), passed with one."""
    conn.rollback()
    try:
        with conn.cursor() as cur:
            cur.execute("XA RECOVER")
            rows = list(cur.fetchall())
    except pymysql.MySQLError as exc:
        if not exc.args or exc.args[0] not in _ACCESS_DENIED:
            raise
        if streams <= 1:
            log.debug("XA RECOVER refused at subscriber %r (one stream: nothing to recover): %r", subscriber, exc)
            return 0
        raise ReplError(
            f"the login of MariaDB subscriber {subscriber!r} may not list prepared XA transactions (XA RECOVER), "
            f"which subscription_streams > 1 needs to finish a batch a stopped agent left: grant it "
            f"XA_RECOVER_ADMIN (MySQL 8) or SUPER, or set subscription_streams of publication {publication!r} at subscriber {subscriber!r} to 1"
        ) from None
    prefix = two_phase.gid_prefix(tag(database, publication)).encode()
    gids = []
    for format_id, gtrid_length, _, data in rows:
        data = data if isinstance(data, bytes) else str(data).encode()
        gtrid, bqual = data[:gtrid_length], data[gtrid_length:]
        if format_id == FORMAT_ID and gtrid.startswith(prefix):
            gids.append(f"{gtrid.decode()}|{bqual.decode()}")
    if not gids:
        return 0
    committed = state.watermark(conn, publication)  # a consistent read: the prepared locks do not block it
    conn.rollback()
    for commit, members in two_phase.recovery([two_phase.parse(g) for g in gids], committed):
        _finish(conn, [m.gid for m in members], commit)
        log.warning(
            "recovered an interrupted multi-stream batch of %s at %s: %s %d prepared XA transaction(s)",
            publication,
            subscriber,
            "committed" if commit else "rolled back",
            len(members),
        )
    return len(gids)


def _finish(conn: Any, gids: list[str], commit: bool) -> None:
    """XA COMMIT (or XA ROLLBACK) another session's prepared transactions, in order; MariaDB
    wants autocommit for that (XAER_OUTSIDE otherwise)."""
    conn.autocommit(True)
    try:
        for gid in gids:
            try:
                _run(conn, f"XA {'COMMIT' if commit else 'ROLLBACK'} {xid(gid)}")
            except pymysql.MySQLError as exc:
                if not exc.args or exc.args[0] != _XAER_NOTA:  # finished meanwhile
                    raise
    finally:
        conn.autocommit(False)


def check_capacity(conn: Any, streams: int, publication: str, subscriber: str) -> None:
    """Refuse, before any further connection is opened, more streams than the subscriber can
    serve: one connection each, within max_connections less the connections in use (this one
    included)."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT @@max_connections, (SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS "
            "WHERE VARIABLE_NAME = 'THREADS_CONNECTED')"
        )
        row = cur.fetchone()
    conn.rollback()
    max_conn, in_use = int(row[0]), int(row[1])
    free = max_conn - (in_use - 1)  # connections left for this agent, this one included
    if streams > free:
        raise ReplError(
            f"subscription_streams = {streams} is more than MariaDB subscriber {subscriber!r} can serve: it allows "
            f"{free} (free connections {free} = max_connections {max_conn} - {in_use - 1} in use by others); set "
            f"subscription_streams of publication {publication!r} at subscriber {subscriber!r} to at most "
            f"{max(free, 1)}, or raise max_connections at the subscriber"
        )
