"""Decoder for PostgreSQL's ``pgoutput`` logical replication protocol (version 1).

The Log Reader Agent streams the slot (:mod:`~airflow_repl.engine.postgres.replication_stream`);
each XLogData message of the stream carries one protocol message, decoded here.  Column values
arrive in text format.
See "Logical Replication Message Formats" in the PostgreSQL manual.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from enum import Enum
from typing import Final

PG_EPOCH = datetime(2000, 1, 1, tzinfo=timezone.utc)


class _Unchanged(Enum):
    TOAST = "unchanged TOASTed value"


#: A value that was not sent because it is an unchanged TOASTed value (compare with ``is``).
UNCHANGED_TOAST: Final = _Unchanged.TOAST

#: One column of a tuple: text format (str), binary format (bytes), NULL, or not sent.
Datum = str | bytes | None | _Unchanged


#: SQL for the current transaction's id as a Begin message carries it (32 bits, without the
#: epoch of ``pg_current_xact_id()``): what the Log Reader records as ``transactions.xid``.
CURRENT_XID_SQL = "pg_catalog.mod(pg_catalog.pg_current_xact_id()::text::bigint, 4294967296)"


@dataclass
class Begin:
    final_lsn: int
    commit_time: datetime
    xid: int


@dataclass
class Commit:
    commit_lsn: int
    end_lsn: int
    commit_time: datetime


@dataclass
class Relation:
    relid: int
    namespace: str
    name: str
    replica_identity: str
    columns: list[str]
    type_oids: list[int]


@dataclass
class Insert:
    relid: int
    new: list[Datum]


@dataclass
class Update:
    relid: int
    old: list[Datum] | None  # present with REPLICA IDENTITY FULL (or when the key changed)
    new: list[Datum]


@dataclass
class Delete:
    relid: int
    old: list[Datum]


@dataclass
class Truncate:
    relids: list[int]
    cascade: bool
    restart_identity: bool


@dataclass
class Origin:
    """The transaction was replayed from a replication origin (sent after its Begin): the
    commit LSN at the origin and the origin's name."""

    commit_lsn: int
    name: str


@dataclass
class LogicalMessage:
    """A message written with ``pg_logical_emit_message`` (sent with the ``messages`` option);
    a transactional one comes between its transaction's Begin and Commit."""

    transactional: bool
    lsn: int
    prefix: str
    content: bytes


@dataclass
class Other:
    kind: str


Message = Begin | Commit | Origin | Relation | Insert | Update | Delete | Truncate | LogicalMessage | Other


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, size: int) -> bytes:
        """The next ``size`` bytes: a message that ends before them is refused, never cut short."""
        if size < 0 or self.pos + size > len(self.buf):
            raise _ends_early(size, self.pos, len(self.buf))
        raw = self.buf[self.pos : self.pos + size]
        self.pos += size
        return raw

    def byte(self) -> str:
        return self.take(1).decode("ascii")

    def int8(self) -> int:
        v = self.buf[self.pos]
        self.pos += 1
        return v

    def int16(self) -> int:
        v: int = struct.unpack_from("!h", self.buf, self.pos)[0]
        self.pos += 2
        return v

    def int32(self) -> int:
        v: int = struct.unpack_from("!i", self.buf, self.pos)[0]
        self.pos += 4
        return v

    def uint32(self) -> int:
        v: int = struct.unpack_from("!I", self.buf, self.pos)[0]
        self.pos += 4
        return v

    def int64(self) -> int:
        v: int = struct.unpack_from("!q", self.buf, self.pos)[0]
        self.pos += 8
        return v

    def string(self) -> str:
        end = self.buf.index(b"\x00", self.pos)
        s = self.buf[self.pos : end].decode("utf-8")
        self.pos = end + 1
        return s


def _tuple(buf: bytes, pos: int) -> tuple[list[Datum], int]:
    """A row image at ``pos`` and the offset after it: per column 'n' (NULL), 'u' (unchanged
    TOAST), or 't'/'b' and a length-prefixed value.  The hot path of the Log Reader, so read
    inline rather than through :class:`_Reader`: text first, one bound method for the lengths."""
    end = len(buf)
    (n,) = _INT16.unpack_from(buf, pos)
    pos += 2
    out: list[Datum] = []
    append = out.append
    size_at = _INT32_AT
    for _ in range(n):
        if pos >= end:
            raise _ends_early(1, pos, end)
        kind = buf[pos]
        if kind == _TEXT:
            (size,) = size_at(buf, pos + 1)
            pos += 5
            nxt = pos + size
            if size < 0 or nxt > end:
                raise _ends_early(size, pos, end)
            append(buf[pos:nxt].decode())
            pos = nxt
        elif kind == _NULL:
            append(None)
            pos += 1
        elif kind == _BINARY:
            (size,) = size_at(buf, pos + 1)
            pos += 5
            if size < 0 or pos + size > end:
                raise _ends_early(size, pos, end)
            append(buf[pos : pos + size])
            pos += size
        elif kind == _UNCHANGED:
            append(UNCHANGED_TOAST)
            pos += 1
        else:  # a protocol violation
            raise ValueError(f"unknown tuple column kind {chr(kind)!r}")
    return out, pos


def _ends_early(size: int, pos: int, end: int) -> ValueError:
    return ValueError(f"pgoutput message ends early or is malformed: {size} bytes wanted at offset {pos} of {end}")


_INT16, _INT32 = struct.Struct("!h"), struct.Struct("!i")
_INT32_AT = _INT32.unpack_from
_TEXT, _BINARY, _NULL, _UNCHANGED, _NEW = b"t"[0], b"b"[0], b"n"[0], b"u"[0], b"N"[0]


def pg_time(us: int) -> datetime:
    """A message's timestamp (microseconds since 2000-01-01 UTC) as a datetime."""
    return PG_EPOCH + timedelta(microseconds=us)


def _relation(r: _Reader) -> Relation:
    relid, ns, name, ident = r.uint32(), r.string(), r.string(), chr(r.int8())
    cols: list[str] = []
    oids: list[int] = []
    for _ in range(r.int16()):
        r.int8()  # flags (part of the key)
        cols.append(r.string())
        oids.append(r.uint32())
        r.int32()  # type modifier
    return Relation(relid, ns, name, ident, cols, oids)


def _marker(buf: bytes, pos: int, allowed: str) -> str:
    """The byte at ``pos``, one of ``allowed`` (the 'N', 'K' and 'O' before a tuple)."""
    if pos >= len(buf):
        raise _ends_early(1, pos, len(buf))
    found = chr(buf[pos])
    if found not in allowed:
        raise ValueError(f"pgoutput message is malformed: {found!r} where {' or '.join(allowed)} belongs")
    return found


def _insert(buf: bytes) -> Insert:
    (relid,) = _UINT32.unpack_from(buf, 1)
    _marker(buf, 5, "N")
    return Insert(relid, _tuple(buf, 6)[0])


def _update(buf: bytes) -> Update:
    (relid,) = _UINT32.unpack_from(buf, 1)
    old = None
    pos = 6
    if _marker(buf, 5, "KON") != "N":  # the old key ('K') or whole old row ('O') comes first
        old, pos = _tuple(buf, 6)
        if pos >= len(buf) or buf[pos] != _NEW:
            _marker(buf, pos, "N")  # refuses it
        pos += 1
    return Update(relid, old, _tuple(buf, pos)[0])


def _delete(buf: bytes) -> Delete:
    (relid,) = _UINT32.unpack_from(buf, 1)
    _marker(buf, 5, "KO")
    return Delete(relid, _tuple(buf, 6)[0])


def _begin(buf: bytes) -> Begin:
    final_lsn, at, xid = BEGIN_FIELDS.unpack_from(buf, 1)
    return Begin(final_lsn, pg_time(at), xid)


def _commit(buf: bytes) -> Commit:
    _, commit_lsn, end_lsn, at = COMMIT_FIELDS.unpack_from(buf, 1)
    return Commit(commit_lsn, end_lsn, pg_time(at))


_UINT32 = struct.Struct("!I")
#: The fields of a Begin message after its kind byte (final LSN, commit time, xid) and of a
#: Commit message (flags, commit LSN, end LSN, commit time): a reader of every transaction's two
#: messages may take them straight from the bytes (``unpack_from(message, 1)``) when the message
#: is at least ``size`` + 1 bytes, instead of decoding it to an object.
BEGIN_FIELDS, COMMIT_FIELDS = struct.Struct("!qqI"), struct.Struct("!Bqqq")
#: The decoders of the messages every transaction carries, by kind byte: read with struct, no reader object.
_FAST: dict[int, Callable[[bytes], Message]] = {
    ord("I"): _insert,
    ord("U"): _update,
    ord("D"): _delete,
    ord("B"): _begin,
    ord("C"): _commit,
}


def decode(message: bytes) -> Message:
    """Decode one pgoutput message."""
    buf = bytes(message)
    fast = _FAST.get(buf[0]) if buf else None
    if fast is not None:
        return fast(buf)
    r = _Reader(buf)
    kind = r.byte()
    if kind == "R":
        return _relation(r)
    if kind == "O":
        return Origin(r.int64(), r.string())
    if kind == "M":
        transactional, at, prefix = bool(r.int8() & 1), r.int64(), r.string()
        return LogicalMessage(transactional, at, prefix, r.take(r.int32()))
    if kind == "T":
        n = r.int32()
        opts = r.int8()
        return Truncate([r.uint32() for _ in range(n)], bool(opts & 1), bool(opts & 2))
    return Other(kind)
