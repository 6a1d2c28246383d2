"""The type map: each published PostgreSQL column type as a MariaDB column type, and each
value's PostgreSQL text (or the Arrow value the snapshot reads) as the parameter MariaDB stores.

docs/subscribers-mariadb.md is the user's copy of :data:`TYPE_MAP_DOC`.  A type the map does
not hold is refused before anything changes, naming the column and its type.  Text is utf8mb4
always; every text column (key or not) compares with ``utf8mb4_nopad_bin``, so keys ``'a'``,
``'A'`` and ``'a '``, distinct at the publisher, stay distinct at the subscriber (a NO PAD
collation: ``utf8mb4_bin`` ignores trailing spaces).
"""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

from airflow_repl.engine.errors import DeliveryError, TopologyError

TEXT = "CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin"
#: InnoDB's limit on a key's bytes (a text key column counts 4 bytes per character: utf8mb4).
KEY_BYTES = 3072

#: How a value travels: as its text, or converted (see :func:`to_param`).
AS_TEXT, BOOL, BYTES, TIMESTAMPTZ, DATETIME, FLOAT = "text", "bool", "bytes", "timestamptz", "datetime", "float"
#: ``real``: a float sent as the exact single-precision value (MariaDB refuses PostgreSQL's
#: shortest text of the largest ones, ``3.4028235e+38``, as out of FLOAT's range).
REAL = "real"


@dataclass(frozen=True)
class Mapped:
    """A column's MariaDB type (its DDL text) and how its values travel."""

    ddl: str
    conversion: str = AS_TEXT


#: The user's copy of the map (docs/subscribers-mariadb.md has it as a table).
TYPE_MAP_DOC = (
    ("smallint, integer, bigint, oid", "SMALLINT, INT, BIGINT, INT UNSIGNED"),
    ("numeric(p,s) (p ≤ 65, s ≤ 38)", "DECIMAL(p,s); numeric without precision is refused"),
    ("real, double precision", "FLOAT, DOUBLE (NaN and ±Infinity stop delivery: MariaDB has none; -0 becomes 0)"),
    ("boolean", "BOOLEAN (TINYINT(1))"),
    (
        "text, character varying",
        "LONGTEXT, or VARCHAR(n) up to 255; keys VARCHAR(n) or what the key leaves of 3,072 bytes (VARCHAR(768) alone)",
    ),
    ("character(n)", "VARCHAR(n), the padded text kept"),
    ("bytea", "LONGBLOB; keys VARBINARY of what the key leaves of 3,072 bytes"),
    ("uuid", "CHAR(36)"),
    ("date", "DATE (years 1-9999; infinity and BC dates stop delivery)"),
    ("timestamp [without time zone]", "DATETIME(6)"),
    ("timestamp with time zone", "DATETIME(6) in UTC"),
    ("time [without time zone]", "TIME(6)"),
    ("json, jsonb", "JSON (MariaDB's LONGTEXT checked by JSON_VALID); not in keys"),
    (
        "interval, arrays, ranges, multiranges, inet, cidr, macaddr, xml",
        "their PostgreSQL text form: VARCHAR or LONGTEXT",
    ),
    ("enum types", "VARCHAR(255), the label"),
    ("domains", "their base type's mapping"),
    ("time with time zone, money, bit, composite, geometric and text-search types, others", "refused"),
)

_SIMPLE: dict[str, Mapped] = {
    "smallint": Mapped("SMALLINT"),
    "integer": Mapped("INT"),
    "bigint": Mapped("BIGINT"),
    "oid": Mapped("INT UNSIGNED"),
    "real": Mapped("FLOAT", REAL),
    "double precision": Mapped("DOUBLE", FLOAT),
    "boolean": Mapped("BOOLEAN", BOOL),
    "uuid": Mapped(f"CHAR(36) {TEXT}"),
    "date": Mapped("DATE", DATETIME),
    "json": Mapped("JSON"),
    "jsonb": Mapped("JSON"),
    "xml": Mapped(f"LONGTEXT {TEXT}"),
    "inet": Mapped(f"VARCHAR(64) {TEXT}"),
    "cidr": Mapped(f"VARCHAR(64) {TEXT}"),
    "macaddr": Mapped(f"VARCHAR(32) {TEXT}"),
    "macaddr8": Mapped(f"VARCHAR(32) {TEXT}"),
    "interval": Mapped(f"VARCHAR(255) {TEXT}"),
}
_NOT_IN_KEYS = {"json", "jsonb", "xml", "real", "double precision"}
_TIMESTAMP = re.compile(r"timestamp(?:\((\d+)\))?( with(?:out)? time zone)?")
_TIME = re.compile(r"time(?:\((\d+)\))?( without time zone)?")
_NUMERIC = re.compile(r"numeric(?:\((\d+)(?:,(-?\d+))?\))?")
_VARCHAR = re.compile(r"character varying(?:\((\d+)\))?")
_CHAR = re.compile(r"(?:character|bpchar)(?:\((\d+)\))?")


def _refuse(where: str, column: str, pg_type: str, why: str) -> TopologyError:
    return TopologyError(
        f"column {column!r} of {where} has type {pg_type if pg_type.isprintable() else repr(pg_type)}, which a "
        f"MariaDB subscriber cannot hold: {why}"
    )


def map_type(
    where: str, column: str, pg_type: str, *, key: bool, kind: str = "b", key_bytes: int = KEY_BYTES
) -> Mapped:
    """The MariaDB column type of a PostgreSQL column (``pg_type``: ``format_type`` text, a
    domain's base type already; ``kind``: ``pg_type.typtype`` of a user type: ``e`` enum,
    ``r`` range, ``m`` multirange, ``c`` composite, ``b`` base); ``key``: the column is in the
    primary key or a unique constraint, where a text or bytes column may take ``key_bytes`` of
    InnoDB's key limit (:func:`key_room`).  A type it cannot hold raises, naming the column."""
    t = pg_type.strip().lower()
    if t.endswith("[]") or kind in ("r", "m"):
        if key:
            raise _refuse(where, column, pg_type, "arrays and ranges cannot be keys there; leave the key out")
        return Mapped(f"LONGTEXT {TEXT}")
    if kind == "e":
        return Mapped(f"VARCHAR(255) {TEXT}")
    if kind == "c":
        raise _refuse(where, column, pg_type, "composite types have no MariaDB counterpart; leave the column out")
    if t in _SIMPLE:
        if key and t in _NOT_IN_KEYS:
            raise _refuse(where, column, pg_type, "it cannot be a key there; use another key")
        return _SIMPLE[t]
    found = _numeric(where, column, pg_type, t) or _temporal(t) or _text(where, column, pg_type, t, key, key_bytes)
    if found is not None:
        return found
    if t == "bytea":
        return Mapped(f"VARBINARY({key_bytes})" if key else "LONGBLOB", BYTES)
    why = "it has no MariaDB counterpart in the type map (docs/subscribers-mariadb.md); leave the column out"
    raise _refuse(where, column, pg_type, why)


def is_wide(pg_type: str) -> bool:
    """Whether a key column of this type takes a share of InnoDB's key limit (text and bytes)."""
    t = pg_type.strip().lower()
    return t in ("text", "bytea") or t.startswith(("character", "bpchar"))


#: The most bytes of one utf8mb4 character, as InnoDB counts a text key column's length.
_UTF8MB4 = 4
_FIXED_KEY_BYTES = {
    "SMALLINT": 2,
    "INT": 4,
    "INT UNSIGNED": 4,
    "BIGINT": 8,
    "BOOLEAN": 1,
    "FLOAT": 4,
    "DOUBLE": 8,
    "DATE": 3,
    "DATETIME(6)": 8,
    "TIME(6)": 6,
}
_SIZED = re.compile(r"(VARCHAR|CHAR|VARBINARY)\((\d+)\).*")
_DECIMAL = re.compile(r"DECIMAL\((\d+),(\d+)\)")
#: MariaDB's bytes for the 0-8 leftover digits of a DECIMAL's integer or fraction part.
_DIGIT_BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4)


def key_length(ddl: str) -> int:
    """The bytes a key column of MariaDB type ``ddl`` (a :class:`Mapped` ddl) takes of InnoDB's
    3,072-byte key limit: a text column 4 bytes per character (utf8mb4), a DECIMAL its packed
    digits, the others their fixed size."""
    if ddl in _FIXED_KEY_BYTES:
        return _FIXED_KEY_BYTES[ddl]
    if m := _SIZED.fullmatch(ddl):
        return int(m.group(2)) * (1 if m.group(1) == "VARBINARY" else _UTF8MB4)
    if m := _DECIMAL.fullmatch(ddl):
        p, s = int(m.group(1)), int(m.group(2))
        return sum(n // 9 * 4 + _DIGIT_BYTES[n % 9] for n in (p - s, s))
    return KEY_BYTES


def key_part(where: str, column: str, pg_type: str, kind: str | None) -> tuple[str, int | None]:
    """A key column as :func:`key_room` takes it: its name and the bytes it takes of InnoDB's
    key limit (:func:`key_length` of its mapped type), None for a text or bytes column
    (:func:`is_wide`), which shares what the others leave.  ``kind`` None: a user type's kind
    is not known, so a type the map holds only by its kind is an enum (the one such type a key
    can hold)."""
    if is_wide(pg_type):
        return (column, None)
    try:
        mapped = map_type(where, column, pg_type, key=True, kind=kind or "b")
    except TopologyError:
        if kind is not None:
            raise
        mapped = map_type(where, column, pg_type, key=True, kind="e")
    return (column, key_length(mapped.ddl))


def key_room(where: str, keys: list[list[tuple[str, int | None]]]) -> dict[str, int]:
    """The bytes each text or bytes key column may take (``VARCHAR(bytes / 4)``,
    ``VARBINARY(bytes)``): InnoDB's 3,072-byte limit on a key, less its other columns' bytes,
    shared equally by its text and bytes columns; the least over the keys a column is in.
    ``keys``: each key (primary, unique) as its columns' :func:`key_part`.  A key whose fixed columns
    leave a text column no character is refused, naming its columns."""
    room: dict[str, int] = {}
    for key in keys:
        wide = [name for name, size in key if size is None]
        fixed = sum(size for _, size in key if size is not None)
        share = (KEY_BYTES - fixed) // len(wide) if wide else KEY_BYTES
        if fixed > KEY_BYTES or share < _UTF8MB4:
            names = ", ".join(repr(name) for name, _ in key)
            raise TopologyError(
                f"the key ({names}) of {where} would take more than InnoDB's {KEY_BYTES:,} bytes at a MariaDB "
                f"subscriber ({fixed:,} bytes without its text and bytes columns): use a shorter key"
            )
        for name in wide:
            room[name] = min(room.get(name, share), share)
    return room


def _numeric(where: str, column: str, pg_type: str, t: str) -> Mapped | None:
    m = _NUMERIC.fullmatch(t)
    if m is None:
        return None
    p, s = m.group(1), m.group(2) or "0"
    if p is None:
        raise _refuse(
            where,
            column,
            pg_type,
            "numeric without precision holds up to 1000 digits, MariaDB's DECIMAL 65: declare numeric(p,s) "
            "with p ≤ 65 and s ≤ 38",
        )
    if int(p) > 65 or not 0 <= int(s) <= 38:
        raise _refuse(where, column, pg_type, "MariaDB's DECIMAL holds at most 65 digits, 38 after the point")
    return Mapped(f"DECIMAL({p},{s})")


def _temporal(t: str) -> Mapped | None:
    if m := _TIMESTAMP.fullmatch(t):
        with_zone = (m.group(2) or "").strip() == "with time zone"
        return Mapped("DATETIME(6)", TIMESTAMPTZ if with_zone else DATETIME)
    if _TIME.fullmatch(t):
        return Mapped("TIME(6)")
    return None


def _text(where: str, column: str, pg_type: str, t: str, key: bool, key_bytes: int) -> Mapped | None:
    if t == "text":
        n = None
    elif m := (_VARCHAR.fullmatch(t) or _CHAR.fullmatch(t)):
        n = int(m.group(1)) if m.group(1) else None
    else:
        return None
    if key:
        room = key_bytes // _UTF8MB4
        if n is not None and n > room:
            raise _refuse(where, column, pg_type, f"a MariaDB key holds at most {room} characters there")
        return Mapped(f"VARCHAR({n or room}) {TEXT}")
    return Mapped(f"VARCHAR({n}) {TEXT}" if n is not None and n <= 255 else f"LONGTEXT {TEXT}")


def conversion(pg_type: str) -> str:
    """How values of ``pg_type`` travel (a type outside the map, e.g. an enum: as text)."""
    try:
        return map_type("", "", pg_type, key=False).conversion
    except TopologyError:
        return AS_TEXT


def to_param(conversion: str, value: Any, column: str, where: str) -> Any:
    """A value (PostgreSQL text, or the Arrow value of a typed snapshot column) as the parameter
    MariaDB stores; a value MariaDB cannot hold stops delivery, naming the column."""
    if value is None or conversion == AS_TEXT:
        return value
    if conversion == BOOL:
        return value in ("t", "true", True) if isinstance(value, str) else bool(value)
    if conversion == BYTES:
        if isinstance(value, str):
            return bytes.fromhex(value[2:]) if value.startswith("\\x") else value.encode()
        return bytes(value)
    if conversion in (FLOAT, REAL):
        number = float(value)
        if math.isnan(number) or math.isinf(number):
            raise _cannot(value, column, where, "MariaDB has no NaN or infinity")
        return _single(number) if conversion == REAL else value
    text = str(value)
    if "infinity" in text or text.endswith(" BC"):
        raise _cannot(value, column, where, "MariaDB has no infinite or BC dates")
    if conversion == TIMESTAMPTZ:
        return _utc(text, column, where)
    return text


def canonical(conversion: str, pg_type: str, value: Any) -> Any:
    """A value in one form whichever side it was read from: the publisher's text once converted
    (:func:`to_param`), or what the driver read at the MariaDB subscriber.  What validation
    compares: numbers as numbers (``real`` at single precision), times as times, bytes as hex,
    text (arrays and ranges of any of these too: their text) as it is."""
    if value is None:
        return None
    t = pg_type.strip().lower()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if conversion == BOOL:
        return int(value in ("t", "true", True, 1)) if isinstance(value, str) else int(bool(value))
    if conversion in (FLOAT, REAL):
        number = float(value) + 0.0  # -0 is 0: MariaDB has no negative zero
        return _single(number) if conversion == REAL else number
    if _NUMERIC.fullmatch(t) or isinstance(value, Decimal):
        return str(Decimal(str(value)).normalize())
    if t in ("smallint", "integer", "bigint", "oid"):
        return int(value)
    if conversion in (DATETIME, TIMESTAMPTZ) or isinstance(value, (datetime, date)):
        if isinstance(value, (datetime, date)):
            return value.isoformat()
        text = str(value)
        return (date.fromisoformat(text) if t == "date" else datetime.fromisoformat(text)).isoformat()
    if isinstance(value, timedelta) or _TIME.fullmatch(t):
        return _time_of(value)
    return str(value)


def _single(number: float) -> float:
    """``number`` at single precision (``real``), as the float that holds it exactly."""
    return float(struct.unpack("f", struct.pack("f", number))[0])


def _time_of(value: Any) -> str:
    """A ``time`` value (PostgreSQL's text, or the driver's timedelta) as microseconds since midnight."""
    if isinstance(value, timedelta):
        return str(value // timedelta(microseconds=1))
    hh, mm, rest = str(value).split(":")
    return str(round((int(hh) * 3600 + int(mm) * 60 + float(rest)) * 1_000_000))


def _utc(text: str, column: str, where: str) -> str:
    """A ``timestamptz`` text (``2026-01-02 03:04:05.5+00``, the session is in UTC) as UTC without offset."""
    m = re.fullmatch(r"(.+?)([+-]\d\d(?::?\d\d(?::?\d\d)?)?)", text)
    if m is None:
        raise _cannot(text, column, where, "not a timestamp with time zone")
    stamp, offset = m.groups()
    if offset in ("+00", "-00", "+00:00"):
        return stamp
    sign = 1 if offset[0] == "+" else -1
    digits = offset[1:].replace(":", "")
    hh, mm, ss = int(digits[0:2]), int(digits[2:4] or 0), int(digits[4:6] or 0)
    fmt = "%Y-%m-%d %H:%M:%S.%f" if "." in stamp else "%Y-%m-%d %H:%M:%S"
    try:
        moment = datetime.strptime(stamp, fmt) - sign * timedelta(hours=hh, minutes=mm, seconds=ss)
    except OverflowError:
        raise _cannot(text, column, where, "in UTC it falls outside the years 1-9999 MariaDB holds") from None
    return moment.replace(tzinfo=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")


def _cannot(value: Any, column: str, where: str, why: str) -> DeliveryError:
    return DeliveryError(
        f"the value {str(value)[:40]!r} of column {column!r} of {where} cannot be stored at a MariaDB subscriber: "
        f"{why}; change the value at the publisher or leave the column out of the article"
    )
