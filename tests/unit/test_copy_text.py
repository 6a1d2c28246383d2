"""COPY text made from Arrow batches (the Snapshot Agent's load): every value reads back as
itself under COPY's text rules, at the edges of each type, for slices and empty batches."""

from __future__ import annotations

import math
import random
import re
import struct
import subprocess
import sys

import pyarrow as pa
import pytest

from airflow_repl.engine.postgres.copy_text import copy_text

_UNESCAPE = {"\\\\": "\\", "\\n": "\n", "\\r": "\r", "\\t": "\t"}


def _parse(data: bytes) -> list[list[str | None]]:
    """COPY text format read back (the escapes copy_text writes; \\N is NULL)."""
    text = data.decode()
    assert text == "" or text.endswith("\n")
    rows = []
    for line in text.split("\n")[:-1]:
        fields = line.split("\t")
        rows.append([None if f == "\\N" else re.sub(r"\\[\\nrt]", lambda m: _UNESCAPE[m.group(0)], f) for f in fields])
    return rows


def _float(text: str) -> float:
    return float({"inf": "inf", "-inf": "-inf", "nan": "nan"}.get(text, text))


def test_every_type_reads_back_as_itself():
    rng = random.Random(7)
    strings = ["", "\\", "\\N", "\\.", "a\tb", "line\nbreak", "cr\rlf\r\n", "é€😀", "\b\f\v", " lead", "trail "]
    strings += ["".join(rng.choice("ab\\\t\n\r é€") for _ in range(rng.randint(0, 12))) for _ in range(200)]
    doubles = [0.1, -0.0, 1e300, 5e-324, float("inf"), float("-inf"), float("nan"), 2.0**53 + 2]
    doubles += [struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0] for _ in range(300)]
    n = len(strings)
    doubles = (doubles * (n // len(doubles) + 1))[:n]
    blobs = [bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 6))) for _ in range(n)]
    ints = [rng.choice([-(2**63), 2**63 - 1, 0, -1, rng.getrandbits(40)]) for _ in range(n)]
    bools = [rng.choice([True, False]) for _ in range(n)]
    nulls = [i % 7 == 3 for i in range(n)]

    def with_nulls(values):
        return [None if null else v for v, null in zip(values, nulls, strict=True)]

    batch = pa.record_batch(
        [
            pa.array(with_nulls(strings), pa.string()),
            pa.array(with_nulls(doubles), pa.float64()),
            pa.array(with_nulls(blobs), pa.binary()),
            pa.array(with_nulls(ints), pa.int64()),
            pa.array(with_nulls(bools), pa.bool_()),
        ],
        names=["s", "d", "y", "l", "b"],
    )
    rows = _parse(bytes(copy_text(batch)))
    assert len(rows) == n
    for i, (s, d, y, big, b) in enumerate(rows):
        if nulls[i]:
            assert [s, d, y, big, b] == [None] * 5
            continue
        assert s == strings[i]
        assert d is not None and (math.isnan(_float(d)) if math.isnan(doubles[i]) else _float(d) == doubles[i])
        assert str(_float(d)) != "-0.0" or math.copysign(1, doubles[i]) < 0
        assert y == "\\x" + blobs[i].hex()
        assert big == str(ints[i])
        assert b == ("true" if bools[i] else "false")


def test_float4_is_written_as_the_shortest_text_of_the_single_precision_value():
    rng = random.Random(3)
    values = [struct.unpack("f", struct.pack("I", rng.getrandbits(32)))[0] for _ in range(2000)]
    values = [v for v in values if not math.isnan(v)] + [3.4028234663852886e38, 1.401298464324817e-45]
    rows = _parse(bytes(copy_text(pa.record_batch([pa.array(values, pa.float32())], names=["r"]))))
    for (text,), value in zip(rows, values, strict=True):
        assert text is not None
        assert struct.unpack("f", struct.pack("f", _float(text)))[0] == value
        assert len(text) <= len(repr(value))  # not the double's longer text


def test_slices_and_empty_batches():
    batch = pa.record_batch([pa.array(["a", "b", None, "d"]), pa.array([1, 2, 3, 4], pa.int16())], names=["s", "i"])
    assert bytes(copy_text(batch.slice(1, 2))) == b"b\t2\n\\N\t3\n"
    assert bytes(copy_text(batch.slice(4))) == b""
    assert bytes(copy_text(batch.slice(3, 1))) == b"d\t4\n"
    one = pa.record_batch([pa.array(["x", "y"])], names=["s"])
    assert bytes(copy_text(one.slice(1))) == b"y\n"


def test_a_type_without_a_text_form_is_refused():
    with pytest.raises(TypeError, match="no COPY text form"):
        copy_text(pa.record_batch([pa.array([[1]])], names=["a"]))


@pytest.mark.parametrize("special", ["\\", "\n", "\r", "\t"])
def test_one_special_character_anywhere_is_escaped_and_plain_text_is_left_as_it_is(special):
    """The escaping passes run only for text holding one of COPY's special characters: one such
    character in one row of many (first, middle, last, in a slice) is found; plain text is copied."""
    plain = [f"plain row {i} é" for i in range(1000)]
    for where in (0, 500, 999):
        values = [*plain]
        values[where] = f"x{special}y"
        rows = _parse(bytes(copy_text(pa.record_batch([pa.array(values)], names=["s"]))))
        assert [r[0] for r in rows] == values
    values = [*plain]
    values[10] = special  # outside the slice below, which then has none to escape
    batch = pa.record_batch([pa.array(values), pa.array(range(1000), pa.int32())], names=["s", "i"])
    assert bytes(copy_text(batch.slice(11, 2))) == "plain row 11 é\t11\nplain row 12 é\t12\n".encode()
    assert _parse(bytes(copy_text(batch.slice(9, 3))))[1] == [special, "10"]


@pytest.mark.parametrize("kind", [pa.binary(), pa.large_binary()])
def test_bytea_is_hex_in_slices_with_nulls_empty_values_and_none_at_all(kind):
    values = [b"\x00\xff", None, b"", b"\\\n", None, bytes(range(256))]
    batch = pa.record_batch([pa.array(values, kind), pa.array(range(6), pa.int8())], names=["y", "i"])
    expected = [[None if v is None else "\\x" + v.hex(), str(i)] for i, v in enumerate(values)]
    assert _parse(bytes(copy_text(batch))) == expected
    for start, length in ((1, 3), (2, 1), (3, 3), (5, 1)):
        assert _parse(bytes(copy_text(batch.slice(start, length)))) == expected[start : start + length]
    assert bytes(copy_text(pa.record_batch([pa.array([None, None], kind)], names=["y"]))) == b"\\N\n\\N\n"


def test_making_copy_text_does_not_import_pandas():
    """Converting Python objects makes pyarrow import pandas: about 0.3 s holding the GIL in the
    first read task, and 56 MiB in every Spark worker."""
    script = (
        "import sys, pyarrow as pa, pyarrow.parquet as pq\n"
        "from airflow_repl.engine.postgres.copy_text import copy_text\n"
        "t = pa.Array.from_buffers(pa.large_string(), 1, [None, pa.py_buffer(bytes(8) + bytes([1]) + bytes(7)),"
        " pa.py_buffer(b'x')])\n"
        "batch = pa.RecordBatch.from_arrays([t, t.cast(pa.large_binary()), pa.nulls(1, pa.int32())], names=list('abc'))\n"
        "assert bytes(copy_text(batch)) == b'x\\t\\\\\\\\x78\\t\\\\N\\n', bytes(copy_text(batch))\n"
        "assert 'pandas' not in sys.modules, 'pandas imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
