"""Decoder for PostgreSQL's ``pgoutput`` logical replication protocol (version 1).

The Log Reader Agent reads the slot with ``pg_logical_slot_peek_binary_changes``; each row of
that function is one protocol message, decoded here.  Column values arrive in text format.
See "Logical Replication Message Formats" in the PostgreSQL manual.
"""

from __future__ import annotations

import struct
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

    def marker(self, *allowed: str) -> str:
        """The next byte, one of ``allowed`` (the 'N', 'K' and 'O' before a tuple)."""
        found = self.byte()
        if found not in allowed:
            raise ValueError(f"pgoutput message is malformed: {found!r} where {' or '.join(allowed)} belongs")
        return found

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

    def tuple(self) -> list[Datum]:
        """A row image: per column 'n' (NULL), 'u' (unchanged TOAST), or 't'/'b' and a length-prefixed
        value.  The hot path of the Log Reader, so read inline rather than through :meth:`take`."""
        buf, pos, end = self.buf, self.pos, len(self.buf)
        (n,) = _INT16.unpack_from(buf, pos)
        pos += 2
        out: list[Datum] = []
        append = out.append
        for _ in range(n):
            if pos >= end:
                raise _ends_early(1, pos, end)
            kind = buf[pos]
            pos += 1
            if kind in (_TEXT, _BINARY):
                (size,) = _INT32.unpack_from(buf, pos)
                pos += 4
                if size < 0 or pos + size > end:
                    raise _ends_early(size, pos, end)
                raw = buf[pos : pos + size]
                pos += size
                append(raw.decode("utf-8") if kind == _TEXT else raw)
            elif kind == _NULL:
                append(None)
            elif kind == _UNCHANGED:
                append(UNCHANGED_TOAST)
            else:  # a protocol violation
                raise ValueError(f"unknown tuple column kind {chr(kind)!r}")
        self.pos = pos
        return out


def _ends_early(size: int, pos: int, end: int) -> ValueError:
    return ValueError(f"pgoutput message ends early or is malformed: {size} bytes wanted at offset {pos} of {end}")


_INT16, _INT32 = struct.Struct("!h"), struct.Struct("!i")
_TEXT, _BINARY, _NULL, _UNCHANGED = b"t"[0], b"b"[0], b"n"[0], b"u"[0]


def _time(us: int) -> datetime:
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


def _update(r: _Reader) -> Update:
    relid = r.uint32()
    old = None
    if r.marker("K", "O", "N") != "N":  # the old key ('K') or whole old row ('O') comes first
        old = r.tuple()
        r.marker("N")
    return Update(relid, old, r.tuple())


def decode(message: bytes) -> Message:
    """Decode one pgoutput message."""
    r = _Reader(bytes(message))
    kind = r.byte()
    if kind == "B":
        return Begin(r.int64(), _time(r.int64()), r.uint32())
    if kind == "C":
        r.int8()
        return Commit(r.int64(), r.int64(), _time(r.int64()))
    if kind == "R":
        return _relation(r)
    if kind == "I":
        relid = r.uint32()
        r.marker("N")
        return Insert(relid, r.tuple())
    if kind == "U":
        return _update(r)
    if kind == "D":
        relid = r.uint32()
        r.marker("K", "O")
        return Delete(relid, r.tuple())
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
