"""A logical slot's changes over the streaming replication protocol (``START_REPLICATION``).

The server decodes the slot's WAL once, in its walsender, while the client stores what it sent
before: nothing is decoded twice (a peek, then an advance), and decoding overlaps the client's
work.  The client says how far it has stored with standby status updates; the slot's
``confirmed_flush_lsn`` follows them, and a later stream starts there.

Messages (PostgreSQL's "Streaming Replication Protocol", copy-both mode):

- from the server, ``w`` XLogData: the WAL start and end of the message and the server's clock,
  then one output plugin message (here a pgoutput message); ``k`` primary keepalive: the position
  the walsender has decoded up to (everything committed before it was sent), its clock and
  whether it wants a reply at once (its ``wal_sender_timeout`` ends a silent client);
- from the client, ``r`` standby status update: written, flushed and applied positions, its
  clock, and whether it asks the server for a keepalive at once.

Read through psycopg's libpq wrapper (:mod:`psycopg.pq`): psycopg has no replication API.
"""

from __future__ import annotations

import select
import struct
import time
from typing import Any

import psycopg
from psycopg import pq

from airflow_repl.engine.postgres import pgoutput

#: XLogData (``w``): WAL start, WAL end, server clock; the plugin's message follows.
XLOG_DATA = struct.Struct("!QQq")
#: Primary keepalive (``k``): WAL end, server clock, reply requested.
KEEPALIVE = struct.Struct("!QqB")
#: Standby status update (``r``): written, flushed, applied, client clock, reply requested.
STATUS = struct.Struct("!cQQQqB")
#: The kind byte of XLogData, and where its plugin message starts; the kind byte of a keepalive.
XLOG_DATA_KIND, XLOG_DATA_HEADER = b"w"[0], 1 + XLOG_DATA.size
_KEEPALIVE = b"k"[0]
_DQ, _SQ = '"', "'"
_PG_EPOCH_US = int(pgoutput.PG_EPOCH.timestamp()) * 1_000_000


def _quoted(value: str, quote: str) -> str:
    """``value`` between ``quote`` characters, those inside doubled (the replication grammar's
    identifiers and string literals, and pgoutput's list of names)."""
    return quote + value.replace(quote, quote * 2) + quote


def quoted_names(names: list[str]) -> str:
    """pgoutput's ``publication_names`` option: a comma-separated list of identifiers, each
    double-quoted so that its case and characters are kept."""
    return ",".join(_quoted(name, _DQ) for name in names)


def start_command(slot: str, start: int, options: dict[str, str]) -> bytes:
    """The ``START_REPLICATION`` command of logical slot ``slot`` from ``start`` (0: where the
    slot was confirmed), with the output plugin's ``options``: the slot and the option names as
    quoted identifiers, the values as quoted string literals (the replication grammar takes no
    parameters)."""
    given = ", ".join(f"{_quoted(name, _DQ)} {_quoted(value, _SQ)}" for name, value in options.items())
    at = f"{start >> 32:X}/{start & 0xFFFFFFFF:X}"
    return f"START_REPLICATION SLOT {_quoted(slot, _DQ)} LOGICAL {at} ({given})".encode()


def status_message(position: int, reply: bool = False) -> bytes:
    """A standby status update: everything before ``position`` is stored (written, flushed and
    applied alike); ``reply``: ask for a keepalive at once."""
    return STATUS.pack(b"r", position, position, position, _now(), 1 if reply else 0)


def parse_message(data: memoryview) -> tuple[int, memoryview | None, bool]:
    """One message of the server: ``(wal_start, payload, False)`` for XLogData (the payload a
    view into ``data``), ``(wal_end, None, reply_requested)`` for a keepalive."""
    kind = data[0]
    if kind == XLOG_DATA_KIND and len(data) >= XLOG_DATA_HEADER:
        start, _, _ = XLOG_DATA.unpack_from(data, 1)
        return start, data[XLOG_DATA_HEADER:], False
    if kind == _KEEPALIVE and len(data) >= 1 + KEEPALIVE.size:
        wal_end, _, reply = KEEPALIVE.unpack_from(data, 1)
        return wal_end, None, bool(reply)
    raise psycopg.OperationalError(f"unexpected replication message of {len(data)} bytes starting {bytes(data[:1])!r}")


def _now() -> int:
    """The protocol's clock: microseconds since 2000-01-01 UTC."""
    return int(time.time() * 1_000_000) - _PG_EPOCH_US


class SlotStream:
    """One ``START_REPLICATION`` of a logical slot, on a replication connection
    (``replication="database"``, autocommit) that it then owns.

    :meth:`fetch` returns the server's messages one at a time, as they came (a view into the
    connection's buffer: copy what must outlive it); :func:`parse_message` reads XLogData, and
    :meth:`keepalive` takes anything else, answering a keepalive that asks for a reply with the
    last confirmed position.  A reader of many messages may take them straight from
    :attr:`pgconn` (``get_copy_data(1)``), after :meth:`take_pending`, and call :meth:`fetch`
    only when none is at hand.
    """

    def __init__(self, conn: psycopg.Connection[Any], slot: str, options: dict[str, str], start: int = 0) -> None:
        self.conn, self.pgconn = conn, conn.pgconn
        self.confirmed = start
        self._pending: memoryview | None = None  # a message wait() took, for the next reader
        self.ended = False  # the server ended the stream (an error, as a rule) or the connection broke
        self.pgconn.send_query(start_command(slot, start, options))
        while True:  # the command's answer: copy-both, or an error (slot busy, missing, invalidated)
            self.pgconn.consume_input()
            if not self.pgconn.is_busy():
                break
            self._wait_readable(None)
        result = self.pgconn.get_result()
        if result is None or result.status != pq.ExecStatus.COPY_BOTH:
            raise self._error(result)

    def fetch(self, timeout: float | None, got: int = 0) -> memoryview | None:
        """The next message as it came (its kind byte first), or None when none came within
        ``timeout`` seconds (None: wait).  ``got``: what the caller's own ``get_copy_data`` just
        returned (-1: the server ended the stream, which is raised with its error)."""
        if got < 0:
            self.end_of_stream()
        if self._pending is not None:
            data, self._pending = self._pending, None
            return data
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            n, data = self.pgconn.get_copy_data(1)
            if n > 0:
                return data
            if n == -1:
                self.end_of_stream()
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            if not self._wait_readable(left):
                return None
            try:
                self.pgconn.consume_input()
            except psycopg.OperationalError:
                self.ended = True
                raise

    def end_of_stream(self) -> None:
        """``get_copy_data`` said the server ended the stream (-1): raise the error it ended it
        with (as a rule), once; asking for copy data again would only say no copy is in progress."""
        self.ended = True
        raise self._error(self.pgconn.get_result())

    def take_pending(self) -> memoryview | None:
        """The message :meth:`wait` took, if any (a raw reader takes it first)."""
        data, self._pending = self._pending, None
        return data

    def keepalive(self, data: memoryview) -> int:
        """A message other than XLogData, which must be a keepalive: its position, after the
        reply it asks for (else an error)."""
        position, payload, reply = parse_message(data)
        if payload is not None:
            raise psycopg.OperationalError("an XLogData message taken for a keepalive")
        if reply:
            self.confirm(self.confirmed)
        return position

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a plugin message, kept for the next read; whether
        one came.  Keepalives meanwhile are answered when they ask, and dropped: they wake no one
        (a walsender decoding only other tables' WAL sends one each time it catches up)."""
        deadline = time.monotonic() + timeout
        while self._pending is None:
            data = self.fetch(max(deadline - time.monotonic(), 0.0))
            if data is None:
                return False
            if data[0] == XLOG_DATA_KIND:
                self._pending = data
            else:
                self.keepalive(data)
        return True

    def confirm(self, position: int, reply: bool = False) -> None:
        """Tell the server that everything before ``position`` is stored (the slot may move
        there); ``reply``: ask for a keepalive at once (it says how far the server has decoded)."""
        self.confirmed = max(self.confirmed, position)
        self.pgconn.put_copy_data(status_message(self.confirmed, reply))
        self._flush()

    def finish(self) -> None:
        """End the stream cleanly: the last status update reaches the server, which releases the
        slot before it answers (so the slot is free when this returns)."""
        self.pgconn.put_copy_end()
        self._flush()
        while True:
            n, _ = self.pgconn.get_copy_data(1)
            if n == -1:
                break
            if n == 0:
                self._wait_readable(None)
                self.pgconn.consume_input()
        while (result := self.pgconn.get_result()) is not None:
            if result.status == pq.ExecStatus.FATAL_ERROR:
                raise self._error(result)

    def close(self) -> None:
        """Close the connection (the server releases the slot when its walsender has ended)."""
        self.conn.close()

    def _error(self, result: pq.abc.PGresult | None) -> psycopg.Error:
        """The error the server answered with (its class from the SQLSTATE, as psycopg raises)."""
        if result is None or result.status != pq.ExecStatus.FATAL_ERROR:
            message = self.pgconn.get_error_message(self.conn.info.encoding).strip()
            return psycopg.OperationalError(message or "the server ended the replication stream")
        return psycopg.errors.error_from_result(result, encoding=self.conn.info.encoding)

    def _flush(self) -> None:
        """Send what libpq holds for the server, waiting while the socket is full."""
        while self.pgconn.flush() == 1:
            select.select([], [self.pgconn.socket], [])

    def _wait_readable(self, timeout: float | None) -> bool:
        ready, _, _ = select.select([self.pgconn.socket], [], [], timeout)
        return bool(ready)
