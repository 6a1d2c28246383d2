"""The Log Reader's compiled command lines (``_command_lines.c``) against the Python path they
replace, on generated pgoutput row messages: whenever the compiled function writes a line, it
is byte for byte the Python path's; it declines only what the Python path must handle (pairs,
unchanged TOASTed values it cannot fill in, binary values, bytes that are not UTF-8, damaged
messages); and a transaction's commands come out the same whichever path each message took."""

from __future__ import annotations

import dataclasses
import os
import struct
import subprocess
import sys
from typing import Any

import pytest
from article_builder import text_article
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_repl.engine.agents import change_mapping, command_lines, log_reader_agent
from airflow_repl.engine.postgres import copy_escaping, lsn, pgoutput
from airflow_repl.engine.state import dist_encoding, dist_transactions

row_line = command_lines.row_line()
PREFIX = copy_escaping.copy_field("pub\tlication") + b"\t" + copy_escaping.copy_field("0/A0000D8") + b"\t"
FIELD = copy_escaping.copy_field("t")
RELID = 16385
UNCHANGED = pgoutput.UNCHANGED_TOAST


def test_the_compiled_module_is_built_here():
    """The suite's machine has a C compiler: the compiled path is what the agents run (and what
    the tests below compare), not silently the Python path."""
    assert command_lines.compiled() and row_line is not None


def test_the_environment_turns_the_compiled_path_off():
    code = "from airflow_repl.engine.agents import command_lines as c; print(c.compiled(), c.row_line() is None)"
    env = {**os.environ, command_lines.PURE_PYTHON_ENV: "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "True"]


# ---------------------------------------------------------------------- messages
def _tuple(values: list[Any]) -> bytes:
    """A pgoutput tuple: str (text), bytes (raw text bytes, maybe not UTF-8), None, UNCHANGED,
    or ('b', bytes) for a binary value."""
    out = struct.pack("!h", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif v is UNCHANGED:
            out += b"u"
        elif isinstance(v, tuple):
            out += b"b" + struct.pack("!i", len(v[1])) + v[1]
        else:
            raw = v.encode() if isinstance(v, str) else v
            out += b"t" + struct.pack("!i", len(raw)) + raw
    return out


def insert(new: list[Any]) -> bytes:
    return b"I" + struct.pack("!I", RELID) + b"N" + _tuple(new)


def delete(old: list[Any], marker: bytes = b"O") -> bytes:
    return b"D" + struct.pack("!I", RELID) + marker + _tuple(old)


def update(old: list[Any] | None, new: list[Any], marker: bytes = b"O") -> bytes:
    head = b"U" + struct.pack("!I", RELID)
    if old is None:
        return head + b"N" + _tuple(new)
    return head + marker + _tuple(old) + b"N" + _tuple(new)


def python_line(message: bytes, relmap: change_mapping.RelationMap, command_id: int) -> bytes | str:
    """What the Python path stores for the message: its line, "pair" (two commands), or "refused"."""
    try:
        cmds = change_mapping.row_commands(pgoutput.decode(message), relmap)  # type: ignore[arg-type]
        if len(cmds) != 1:
            return "pair"
        (cmd,) = cmds
        data = dist_encoding.command_data(cmd.to_json())
    except Exception:
        return "refused"
    return dist_transactions.command_line(PREFIX, command_id, FIELD, cmd.op.value.encode(), data)


def compiled_line(message: bytes, relmap: change_mapping.RelationMap, command_id: int) -> bytes | None:
    assert row_line is not None
    pairs = relmap.article.update_mode == "all"
    return row_line(message, relmap.positions_u16, relmap.keys_u16, pairs, PREFIX, command_id, FIELD)


def relmap(article_columns: int, relation_columns: int, order: list[int], pairs: bool = False):
    """The map of an article of ``id`` and ``article_columns - 1`` text columns onto a relation
    of ``relation_columns`` columns: its columns at ``order``."""
    art = text_article([f"c{i}" for i in range(1, article_columns)])
    if pairs:
        art = dataclasses.replace(art, update_mode="all")
    assert len(order) == article_columns and max(order) < relation_columns
    return change_mapping.RelationMap(art, order)


# ---------------------------------------------------------------------- examples
ODD = 'tab\there\nnew line\r\n back\\slash "double" \\N \\. \b\f\x00\x01\x1f\x7f \u2028\u200b é \U0010ffff'


@pytest.mark.parametrize(
    "message",
    [
        insert(["1", ODD, None]),
        insert(["1", "", ""]),
        delete(["1", ODD, None]),
        delete(["1", "a", "b"], marker=b"K"),
        update(["1", "a", None], ["1", ODD, "x"]),
        update(["1", "big", "a"], ["1", UNCHANGED, None]),  # an unchanged TOASTed value: the before image's
        update(["1", "a", "b"], ["1", "a", "b"]),  # an UPDATE that changes nothing is an UPDATE still
    ],
    ids=["insert", "insert-empty", "delete", "delete-key", "update", "update-toast", "update-same"],
)
def test_common_messages_are_written_as_the_python_path_writes_them(message):
    m = relmap(3, 3, [0, 1, 2])
    line = compiled_line(message, m, 7)
    assert line is not None and line == python_line(message, m, 7)


@pytest.mark.parametrize(
    "message",
    [
        update(["1", "a", "b"], ["2", "a", "b"]),  # a key changed: a DELETE + INSERT pair
        update(None, ["1", "a", "b"]),  # no before image: the Python path refuses it
        insert(["1", UNCHANGED, "b"]),
        update(["1", UNCHANGED, "b"], ["1", "a", "b"]),
        insert(["1", ("b", b"\x00\x01"), "b"]),  # a binary value
        insert(["1", b"\xff\xfe", "b"]),  # not UTF-8
        insert(["1", b"\xed\xa0\x80", "b"]),  # an encoded surrogate: not UTF-8 to Python either
        insert(["1", b"\xc0\xaf", "b"]),  # an overlong form
        insert(["1", "a"]),  # fewer columns than the article takes
        insert(["1", "a", "b"])[:-1],  # cut short
        insert(["1", "a", "b"]).replace(b"N", b"X", 1),  # a wrong marker
        b"I" + struct.pack("!I", RELID) + b"N" + struct.pack("!h", -1),
        b"I\x00\x00",
    ],
    ids=[
        "key-change",
        "no-before-image",
        "insert-toast",
        "old-toast",
        "binary",
        "not-utf8",
        "surrogate",
        "overlong",
        "too-few-columns",
        "cut-short",
        "wrong-marker",
        "negative-count",
        "tiny",
    ],
)
def test_the_rest_is_left_to_the_python_path(message):
    assert compiled_line(message, relmap(3, 3, [0, 1, 2]), 1) is None


def test_every_update_of_an_article_that_pairs_them_is_left_to_the_python_path():
    m = relmap(3, 3, [0, 1, 2], pairs=True)
    message = update(["1", "a", "b"], ["1", "a", "c"])
    assert compiled_line(message, m, 1) is None and python_line(message, m, 1) == "pair"


def test_a_column_filter_and_another_column_order_select_by_position():
    m = relmap(3, 5, [4, 0, 2])
    for message in (insert(["a", "x", "b", "y", "1"]), update(["a", "x", "b", "y", "1"], ["z", "x", "c", "y", "1"])):
        line = compiled_line(message, m, 3)
        assert line is not None and line == python_line(message, m, 3)


def test_a_wide_relation_takes_the_heap_path():
    width = 1600
    m = relmap(70, width, list(range(width - 70, width)))
    values = [f"v{i}\t" for i in range(width)]
    line = compiled_line(insert(values), m, 2**40)
    assert line is not None and line == python_line(insert(values), m, 2**40)


# ---------------------------------------------------------------------- generated
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
VALUE = st.one_of(
    TEXT,
    st.none(),
    st.sampled_from(["", "\\", '"', "\t\n\r", "\x00\x1f\x7f", "\u00e9\U0001f600"]),
    st.just(UNCHANGED),
    st.binary(max_size=6),  # raw text bytes: UTF-8 or not
    st.tuples(st.just("b"), st.binary(max_size=4)),
)


@st.composite
def cases(draw):
    relation_columns = draw(st.integers(1, 6))
    article_columns = draw(st.integers(1, relation_columns))
    order = draw(st.permutations(range(relation_columns)))[:article_columns]
    m = relmap(article_columns, relation_columns, list(order), pairs=draw(st.booleans()))
    image = st.lists(VALUE, min_size=relation_columns, max_size=relation_columns)
    kind = draw(st.sampled_from("IUD"))
    old, new = draw(image), draw(image)
    if kind == "U" and draw(st.booleans()):
        new = [draw(VALUE) if draw(st.booleans()) else o for o in old]  # few columns changed
    message = {"I": lambda: insert(new), "D": lambda: delete(old), "U": lambda: update(old, new)}[kind]()
    if draw(st.integers(0, 9)) == 0:
        message = message[: draw(st.integers(0, len(message)))]
    return message, m


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.integers(1, 2**62))
def test_generated_messages_agree_with_the_python_path(case, command_id):
    message, m = case
    line, expected = compiled_line(message, m, command_id), python_line(message, m, command_id)
    if line is not None:
        assert line == expected
    elif isinstance(expected, bytes):
        # declined although the Python path stores one command: only for what it leaves alone
        decoded = pgoutput.decode(message)
        images = [getattr(decoded, side, None) or [] for side in ("old", "new")]
        assert any(v is UNCHANGED or isinstance(v, bytes) for image in images for v in image), message


# ---------------------------------------------------------------------- in the writer
def _writer(line: command_lines.RowLine | None) -> log_reader_agent._TxnWriter:
    writer = log_reader_agent._TxnWriter(None, "p", 10**9, line)  # type: ignore[arg-type]  # never flushes
    writer.begin("0/10")
    return writer


def test_a_transaction_stores_the_same_commands_whichever_path_each_message_takes():
    """Pairs form runs (their DELETEs first): a message after a run closes it on the Python path
    before anything is written, and a pair after a compiled line starts a new run."""
    m = relmap(3, 3, [0, 1, 2])
    messages = [
        insert(["1", "a", None]),
        update(["1", "a", None], ["2", "a", None]),  # pairs: a run
        update(["3", "c", None], ["4", "c", None]),
        update(["2", "a", None], ["2", "b", None]),  # after the run
        delete(["4", "c", None]),
        update(["2", "b", None], ["5", "b", None]),  # a run again
        insert(["6", UNCHANGED, "x"]),  # declined by the compiled function
        insert(["7", "g", "h"]),
    ]
    results = []
    for line in (row_line, None):
        writer = _writer(line)
        compiled = 0
        for message in messages:
            if writer.row_message(m, message):
                compiled += 1
            else:
                writer.row_change("t", change_mapping.row_commands(pgoutput.decode(message), m))  # type: ignore[arg-type]
        writer.close_run()
        results.append((writer.buffer, writer.count, writer.article_rows, compiled))
    (with_c, count_c, rows_c, compiled_c), (python, count_py, rows_py, compiled_py) = results
    assert (with_c, count_c, rows_c) == (python, count_py, rows_py)
    assert count_c == 11 and rows_c == {"t": 8}
    # compiled: the first insert, the delete and the last insert (each after a run is closed); the
    # update after the first run meets it open, and the insert with an unchanged value is declined
    assert compiled_py == 0 and compiled_c == 3


# ---------------------------------------------------------------------- transactions
transaction_line = command_lines.transaction_line()
lsn_text = command_lines.lsn_text()

#: WAL positions at the edges: 0, either side of the 32-bit boundary, the maximum.
EDGE_LSNS = [0, 1, 2**32 - 1, 2**32, 2**32 + 1, 0xA0000D8, 2**63, 2**64 - 1]
#: Commit times (microseconds since 2000-01-01 UTC) at the edges: the epoch and either side of
#: it, before 2000, the years 1000 and 9999 (the compiled line's range) and past them.
_YEAR_1000, _YEAR_10000 = -31_556_908_800_000_000, 252_455_616_000_000_000
EDGE_TIMES = [
    0,
    1,
    -1,
    -999_999,
    -1_000_000,
    -1_000_001,
    86_399_999_999,
    -86_400_000_000,
    888_710_400_000_000,  # 2028-02-29 (a leap day)
    -946_684_800_000_000,  # 1970-01-01
    -3_155_673_600_000_000,  # 1900-01-01 (no leap day)
    4_107_542_399_999_999,  # 2130-02-28 23:59:59.999999
    _YEAR_1000,  # 1000-01-01 00:00:00
    _YEAR_1000 - 1,  # 999-12-31 23:59:59.999999: the Python path's
    _YEAR_10000 - 1,  # 9999-12-31 23:59:59.999999
    _YEAR_10000,  # 10000-01-01: the Python path's (which refuses it)
    2**63 - 1,
    -(2**63),
]


def test_lsn_text_is_int_to_lsn_at_the_edges():
    assert lsn_text is not lsn.int_to_lsn  # the compiled one, here
    for value in EDGE_LSNS:
        assert lsn_text(value) == lsn.int_to_lsn(value)
    for bad in (-1, 2**64, 2**70):
        with pytest.raises(ValueError, match=f"not a WAL position \\(pg_lsn\\): {bad}"):
            lsn_text(bad)
        with pytest.raises(ValueError, match=f"not a WAL position \\(pg_lsn\\): {bad}"):
            lsn.int_to_lsn(bad)


@given(st.integers(0, 2**64 - 1))
def test_lsn_text_agrees_with_int_to_lsn(value):
    assert lsn_text(value) == lsn.int_to_lsn(value)


def _python_line(*args: Any) -> bytes | type[Exception]:
    try:
        return dist_transactions.transaction_line(*args)
    except (OverflowError, ValueError) as exc:
        return type(exc)


def _transaction_case(publication, xact, xid, us, end_lsn, count, rows, origin, schema_change):
    """The compiled line is the Python path's, or it declines (None) what the Python path writes
    otherwise or refuses: a commit time outside years 1000 to 9999."""
    field = copy_escaping.copy_field(publication)
    args = (field, lsn.int_to_lsn(xact), xid, us, end_lsn, count, rows, origin, schema_change)
    expected = _python_line(
        field, lsn.int_to_lsn(xact), xid, us, lsn.int_to_lsn(end_lsn), count, rows, origin, schema_change
    )
    line = transaction_line(*args)
    if line is None:
        assert not _YEAR_1000 <= us < _YEAR_10000, us
    else:
        assert line == expected
    return line


def test_transaction_lines_at_the_edges_are_the_python_paths():
    rows = {"t": 3, 'we"ird\\ \n\t\r\x01\x1f/* go -- é 名': 1, "x" * 63: 2**62}
    written = 0
    for us in EDGE_TIMES:
        for end_lsn in EDGE_LSNS:
            for origin in (None, "", "pg_16390", "tab\there\\ and\nnewline\r é"):
                written += (
                    _transaction_case("pub\tli\\cation\n", end_lsn, 2**32 - 1, us, end_lsn, 0, rows, origin, True)
                    is not None
                )
    assert written == (len(EDGE_TIMES) - 4) * len(EDGE_LSNS) * 4  # every time in years 1000 to 9999
    assert (
        _transaction_case("p", 0, 0, 0, 0, 0, {}, None, False)
        == b"p\t0/0\t0\t2000-01-01 00:00:00.000000+00\t0/0\t0\t{}\t\\N\tf\n"
    )


_names = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)


@settings(max_examples=800, deadline=None)
@given(
    _names,
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**32 - 1),
    st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from(EDGE_TIMES)),
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**62),
    st.dictionaries(_names, st.integers(0, 2**62), max_size=5),
    st.one_of(st.none(), _names),
    st.booleans(),
)
def test_generated_transactions_agree_with_the_python_path(
    publication, xact, xid, us, end_lsn, count, rows, origin, sc
):
    _transaction_case(publication, xact, xid, us, end_lsn, count, rows, origin, sc)


def test_what_the_compiled_transaction_line_declines():
    """A name that is not UTF-8 (a lone surrogate) or a count beyond 64 bits: the Python path's."""
    base = (b"p", "0/1", 1, 0, 2)
    assert transaction_line(*base, 1, {"\ud800": 1}, None, False) is None
    assert transaction_line(*base, 1, {"t": 2**64}, None, False) is None
    assert transaction_line(*base, 2**64, {"t": 1}, None, False) is None
    assert transaction_line(*base, 1, {"t": 1}, "\ud800", False) is None
