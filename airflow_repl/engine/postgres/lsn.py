"""WAL positions (``pg_lsn``): parse them to the numbers they stand for and back.

Positions are compared and sorted as numbers, never as text (``'10/0' < 'F/0'`` as text).
"""

from __future__ import annotations

import re

_LSN = re.compile(r"([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})")


def lsn_to_int(lsn: str) -> int:
    """A WAL position (pg_lsn text, ``'16/B374D848'``) as the number it stands for.  Compare
    and sort positions by this, never by their text: ``'10/0' < 'F/0'`` as text."""
    match = _LSN.fullmatch(lsn)
    if match is None:
        raise ValueError(f"not a WAL position (pg_lsn): {lsn!r}")
    return (int(match[1], 16) << 32) | int(match[2], 16)


def int_to_lsn(value: int) -> str:
    """The pg_lsn text of a WAL position (PostgreSQL's own form: upper case, no leading zeros)."""
    if not 0 <= value < 1 << 64:
        raise ValueError(f"not a WAL position (pg_lsn): {value}")
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"
