"""Arrow record batches as PostgreSQL ``COPY ... FROM STDIN`` text, column by column in Arrow's
C++ kernels: no Python object per value (except for ``bytea``, written as ``\\x`` hex).

What each column becomes is what PostgreSQL's input functions read back as the same value:

* ``bool``: ``true`` / ``false``; integers: their decimal digits;
* ``float4`` / ``float8``: the shortest text that reads back as the same binary value (Arrow's
  formatting; ``inf``, ``-inf``, ``nan`` and ``-0`` are accepted by ``float4in``/``float8in``);
* text: the characters, with ``\\``, newline, carriage return and tab escaped as COPY's text
  format requires;
* ``bytea``: ``\\x`` and the hex digits (the backslash escaped);
* NULL: ``\\N``.

Owns: :func:`copy_text` (a batch's rows, tab-separated, one line each).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_repl.engine.postgres.copy_escaping import ESCAPES


def copy_text(batch: Any) -> memoryview:
    """The batch's rows in COPY's text format (``pa.RecordBatch`` with columns of the types the
    Snapshot Agent's data files use), ready for ``copy.write``; empty for no rows."""
    if batch.num_rows == 0:
        return memoryview(b"")
    columns = [_column_text(col) for col in batch.columns]
    columns[-1] = pc.binary_join_element_wise(columns[-1], _EMPTY, _NEWLINE)  # each line ends with a newline
    lines = pc.binary_join_element_wise(*columns, _TAB) if len(columns) > 1 else columns[0]
    return _data(lines)


def _column_text(col: Any) -> Any:
    """One column as COPY text values (a large string array without nulls: 64-bit offsets, so
    a batch of big values never overflows them)."""
    kind = col.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        text = col.cast(pa.large_string())
        if _has_any(text, _SPECIAL):  # most text has none: four passes over it saved
            for raw, escaped in ESCAPES:
                text = pc.replace_substring(text, raw, escaped)
    elif pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        text = _hex(col.cast(pa.large_binary()))
    elif pa.types.is_boolean(kind) or pa.types.is_integer(kind) or pa.types.is_floating(kind):
        text = pc.cast(col, pa.large_string())
    else:
        raise TypeError(f"no COPY text form for Arrow type {kind}")
    return text if text.null_count == 0 else pc.fill_null(text, _NULL)


def _hex(col: Any) -> Any:
    """A large binary array as COPY text for ``bytea``: ``\\\\x`` and the hex digits of each
    value (null stays null), made from the data buffer's hex in one call."""
    offsets = np.frombuffer(col.buffers()[1], dtype=np.int64)[col.offset : col.offset + len(col) + 1]
    first, last = int(offsets[0]), int(offsets[-1])
    data = col.buffers()[2]
    digits = (memoryview(data)[first:last].hex() if data is not None else "").encode()
    hex_offsets = (offsets - first) * 2
    values = pa.Array.from_buffers(
        pa.large_string(), len(col), [None, pa.py_buffer(hex_offsets.tobytes()), pa.py_buffer(digits)]
    )
    return pc.if_else(col.is_null(), _NULL_VALUE, pc.binary_join_element_wise(_BYTEA_PREFIX, values, _EMPTY))


def _has_any(text: Any, needles: tuple[bytes, ...]) -> bool:
    """Whether a large string array's values hold any of the bytes ``needles`` (a search of its
    data buffer between the first and the last offset; a null's bytes, if any, may only make it
    say yes, which costs the escaping passes and changes nothing)."""
    if len(text) == 0 or text.buffers()[2] is None:
        return False
    data = _data(text).tobytes()
    return any(needle in data for needle in needles)


#: The bytes :data:`ESCAPES` replace (each is one byte in UTF-8).
_SPECIAL = tuple(raw.encode() for raw, _ in ESCAPES)


def _constant(text: str) -> Any:
    """A large string scalar built from its bytes: converting a Python object (``pa.scalar``,
    ``pa.array``) makes pyarrow import pandas, about 0.3 s holding the GIL in the first read
    task and 56 MiB in every process."""
    data = text.encode()
    offsets = np.array([0, len(data)], dtype=np.int64).tobytes()
    return pa.Array.from_buffers(pa.large_string(), 1, [None, pa.py_buffer(offsets), pa.py_buffer(data)])[0]


_TAB, _NEWLINE, _EMPTY, _NULL, _BYTEA_PREFIX = (_constant(s) for s in ("\t", "\n", "", "\\N", "\\\\x"))
#: A null large string (what ``if_else`` leaves where a value is null).
_NULL_VALUE = pa.nulls(1, pa.large_string())[0]


def _data(lines: Any) -> memoryview:
    """The concatenated values of a large string array without nulls: its data buffer between
    the first and the last offset (a slice of the array may start inside the buffer)."""
    offsets = memoryview(lines.buffers()[1]).cast("q")
    first, last = offsets[lines.offset], offsets[lines.offset + len(lines)]
    return memoryview(lines.buffers()[2])[first:last]
