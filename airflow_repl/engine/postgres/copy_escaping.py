"""COPY's text format: the one statement of what a field escapes (:data:`ESCAPES`) and the
function that writes one field (:func:`copy_field`).  The Arrow path (:mod:`.copy_text`) applies
the same escapes column by column; the Log Reader's compiled command lines
(``engine/agents/_command_lines.c``) are tested byte for byte against :func:`copy_field`'s
lines (tests/unit/test_command_lines.py)."""

from __future__ import annotations

#: COPY text's escapes, backslash first (the others add backslashes).
ESCAPES = (("\\", "\\\\"), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"))
_BYTE_ESCAPES = tuple((raw.encode(), escaped.encode()) for raw, escaped in ESCAPES)


def copy_field(value: str | None) -> bytes:
    """One field of a line of COPY's text format: UTF-8, backslash, newline, carriage return
    and tab escaped; NULL as ``\\N``."""
    if value is None:
        return b"\\N"
    field = value.encode()
    for raw, escaped in _BYTE_ESCAPES:
        field = field.replace(raw, escaped)
    return field
