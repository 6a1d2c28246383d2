"""The pgoutput decoder (:mod:`airflow_repl.engine.postgres.pgoutput`) without a server.

Most messages here were captured from a real PostgreSQL by ``data/capture_pgoutput.py`` and are
kept in ``data/pgoutput_messages.json``: one step of SQL at a time, each step's messages as the
slot gave them (hex), with the ``lsn`` and ``xid`` PostgreSQL reported beside each message and the
server clock around the step.  Every message type the Log Reader sees (Begin, Commit, Relation,
Insert, Update with and without an old key or old row, Delete, Truncate, and the Type, Origin and
logical Message it skips) and every column kind (null, unchanged TOAST, text, binary) is there.
Hand-made and damaged messages cover the rest.
"""

from __future__ import annotations

import json
import struct
from datetime import datetime, timezone
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from airflow_repl.engine.postgres import pgoutput
from airflow_repl.engine.postgres.lsn import lsn_to_int
from airflow_repl.engine.postgres.pgoutput import (
    Begin,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Origin,
    Other,
    Relation,
    Truncate,
    Update,
)

DATA = json.loads((Path(__file__).parent / "data" / "pgoutput_messages.json").read_text())
STEPS = {step["name"]: step for step in DATA["steps"]}
OIDS = DATA["oids"]
ITEMS, FULL, T1, T2, MOOD = (OIDS[name] for name in ("items", '"s p"."Full Ident"', "t1", "t2", "mood"))
BIG = "0123456789" * 300  # stored out of line: an UPDATE not touching it sends it as unchanged TOAST
ODD = "\u00e9\u4e2d\U0001f600 'q' \\"
U = pgoutput.UNCHANGED_TOAST
N5 = [None] * 5  # the non-key columns of a key-only old image

INT4, TEXT, NUMERIC = 23, 25, 1700
ITEMS_RELATION = Relation(
    ITEMS,
    "public",
    "items",
    "d",
    ["id", "name", "note", "big", "mood", "price"],
    [INT4, TEXT, TEXT, TEXT, MOOD, NUMERIC],
)
FULL_RELATION = Relation(FULL, "s p", "Full Ident", "f", ["k", "v", "n"], [INT4, TEXT, INT4])
T1_RELATION = Relation(T1, "public", "t1", "d", ["id"], [INT4])
T2_RELATION = Relation(T2, "public", "t2", "d", ["id", "t1_id"], [INT4, INT4])

#: step -> what its transaction holds between Begin and Commit, decoded
TRANSACTIONS: dict[str, list[Any]] = {
    "insert": [
        Other("Y"),  # the enum type of items.mood, sent before the relation
        ITEMS_RELATION,
        Insert(ITEMS, ["1", "first", None, BIG, "happy", "9.99"]),
        Insert(ITEMS, ["2", ODD, "", None, None, "-0.50"]),
    ],
    "update_unchanged_toast": [
        Other("Y"),
        ITEMS_RELATION,
        Update(ITEMS, None, ["1", "renamed", None, U, "ok", "9.99"]),
    ],
    "update_key": [Other("Y"), ITEMS_RELATION, Update(ITEMS, ["2", *N5], ["10", ODD, "moved", None, None, "-0.50"])],
    "delete_key": [Other("Y"), ITEMS_RELATION, Delete(ITEMS, ["10", *N5])],
    "insert_full": [FULL_RELATION, Insert(FULL, ["1", "a", None]), Insert(FULL, ["2", "b", "2"])],
    "update_full": [FULL_RELATION, Update(FULL, ["1", "a", None], ["1", "changed", None])],
    "delete_full": [FULL_RELATION, Delete(FULL, ["2", "b", "2"])],
    "insert_t1_t2": [T1_RELATION, Insert(T1, ["1"]), T2_RELATION, Insert(T2, ["1", "1"])],
    "truncate_restart_cascade": [T1_RELATION, T2_RELATION, Truncate([T1, T2], True, True)],
    "truncate_plain": [T2_RELATION, Truncate([T2], False, False)],
    "message_in_transaction": [
        LogicalMessage(
            True,
            lsn_to_int(STEPS["message_in_transaction"]["messages"][1]["lsn"]),
            "airflow_repl.capture",
            b"in a transaction",
        ),
        T1_RELATION,
        Insert(T1, ["1"]),
    ],
    "origin": [
        Origin(lsn_to_int(STEPS["origin"]["origin"]["lsn"]), STEPS["origin"]["origin"]["name"]),
        T1_RELATION,
        Insert(T1, ["2"]),
    ],
}


def raw(step: str, key: str = "messages") -> list[bytes]:
    return [bytes.fromhex(m["hex"]) for m in STEPS[step][key]]


def decoded(step: str, key: str = "messages") -> list[Any]:
    return [pgoutput.decode(message) for message in raw(step, key)]


def test_the_capture_covers_every_step():
    assert set(STEPS) == {*TRANSACTIONS, "message_alone"}


# ---------------------------------------------------------------------- captured transactions
@pytest.mark.parametrize("name", TRANSACTIONS)
def test_every_message_of_a_transaction_decodes_field_by_field(name):
    begin, *body, commit = decoded(name)
    assert body == TRANSACTIONS[name]
    assert isinstance(begin, Begin) and isinstance(commit, Commit)
    rows = STEPS[name]["messages"]
    xid = int(rows[0]["xid"])
    assert begin.xid == xid and {int(row["xid"]) for row in rows} == {xid}
    # Begin carries the commit record's position; the slot reports the commit at its end
    assert begin.final_lsn == commit.commit_lsn < commit.end_lsn == lsn_to_int(rows[-1]["lsn"])
    assert lsn_to_int(rows[0]["lsn"]) <= begin.final_lsn
    assert begin.commit_time == commit.commit_time and begin.commit_time.tzinfo == timezone.utc
    if name == "origin":  # a replayed transaction keeps the commit time of its origin
        assert begin.commit_time == datetime.fromisoformat(STEPS[name]["origin"]["time"])
    else:
        assert (
            datetime.fromisoformat(STEPS[name]["started"])
            <= begin.commit_time
            <= datetime.fromisoformat(STEPS[name]["finished"])
        )


@pytest.mark.parametrize("name", TRANSACTIONS)
def test_begin_and_commit_fields_read_from_the_bytes_are_the_decoded_ones(name):
    """The Log Reader unpacks every transaction's Begin and Commit at fixed offsets
    (BEGIN_FIELDS, COMMIT_FIELDS) instead of decoding them: the same values."""
    first, *_, last = raw(name)
    begin, *_, commit = decoded(name)
    assert first[0] == ord("B") and len(first) == 1 + pgoutput.BEGIN_FIELDS.size
    assert last[0] == ord("C") and len(last) == 1 + pgoutput.COMMIT_FIELDS.size
    final_lsn, at, xid = pgoutput.BEGIN_FIELDS.unpack_from(first, 1)
    assert (final_lsn, pgoutput.pg_time(at), xid) == (begin.final_lsn, begin.commit_time, begin.xid)
    _, commit_lsn, end_lsn, at = pgoutput.COMMIT_FIELDS.unpack_from(last, 1)
    assert (commit_lsn, end_lsn, pgoutput.pg_time(at)) == (commit.commit_lsn, commit.end_lsn, commit.commit_time)


def test_transactions_follow_each_other_in_xid_and_lsn_order():
    begins = [decoded(name)[0] for name in TRANSACTIONS]
    commits = [decoded(name)[-1] for name in TRANSACTIONS]
    assert [b.xid for b in begins] == sorted(b.xid for b in begins)
    assert all(a.end_lsn <= b.commit_lsn for a, b in pairwise(commits))


def test_a_message_outside_any_transaction_stands_alone():
    (message,) = decoded("message_alone")
    (row,) = STEPS["message_alone"]["messages"]
    assert message == LogicalMessage(False, lsn_to_int(row["lsn"]), "airflow_repl.capture", b"outside any transaction")
    assert row["xid"] == "0"
    assert _message_body(raw("message_alone")[0]) == (
        False,
        lsn_to_int(row["lsn"]),
        "airflow_repl.capture",
        b"outside any transaction",
    )


def _message_body(message: bytes) -> tuple[bool, int, str, bytes]:
    """Message: 'M', flags (1 = transactional), LSN, prefix, content length and content."""
    flags, lsn = struct.unpack_from("!bq", message, 1)
    end = message.index(b"\0", 10)
    (size,) = struct.unpack_from("!i", message, end + 1)
    return bool(flags & 1), lsn, message[10:end].decode(), message[end + 5 : end + 5 + size]


def test_the_skipped_messages_hold_what_the_capture_says():
    """The decoder reads only the kind of Type, Origin and Message: their bodies, read here, show
    the captured file holds real ones."""
    type_message = raw("insert")[1]
    assert (struct.unpack_from("!I", type_message, 1)[0], type_message[5:]) == (MOOD, b"public\0mood\0")
    origin = raw("origin")[1]
    assert struct.unpack_from("!q", origin, 1)[0] == lsn_to_int(STEPS["origin"]["origin"]["lsn"])
    assert origin[9:] == STEPS["origin"]["origin"]["name"].encode() + b"\0"
    transactional, _, prefix, content = _message_body(raw("message_in_transaction")[1])
    assert (transactional, prefix, content) == (True, "airflow_repl.capture", b"in a transaction")


def test_binary_columns_arrive_as_bytes():
    """The same insert read from a second slot with ``binary`` true: column kind 'b'."""
    text, binary = decoded("insert"), decoded("insert", "binary_messages")
    assert binary[:3] == text[:3] and binary[-1] == text[-1]  # Begin, Type, Relation, Commit
    numeric = struct.pack("!hhHhhh", 2, 0, 0, 2, 9, 9900)  # 9.99: ndigits, weight, sign, dscale, digits
    assert binary[3] == Insert(ITEMS, [struct.pack("!i", 1), b"first", None, BIG.encode(), b"happy", numeric])
    minus_half = struct.pack("!hhHhh", 1, -1, 0x4000, 2, 5000)  # -0.50
    assert binary[4] == Insert(ITEMS, [struct.pack("!i", 2), ODD.encode(), b"", None, None, minus_half])


# ---------------------------------------------------------------------- damaged messages
READ = {"B", "C", "O", "R", "I", "U", "D", "T", "M"}  # the kinds the decoder reads past their first byte
CAPTURED = {
    f"{step['name']}-{key.split('_')[0]}-{i}": bytes.fromhex(m["hex"])
    for step in DATA["steps"]
    for key in ("messages", "binary_messages")
    for i, m in enumerate(step.get(key, []))
}


@pytest.mark.parametrize("name", CAPTURED)
def test_a_message_cut_short_is_refused_never_decoded(name):
    message = CAPTURED[name]
    kind = chr(message[0])
    for size in range(1 if kind in READ else 2, len(message)):
        if kind in READ:
            with pytest.raises((ValueError, struct.error, IndexError)):
                pgoutput.decode(message[:size])
        else:  # skipped messages: only their kind is read
            assert pgoutput.decode(message[:size]) == Other(kind)
    with pytest.raises(ValueError, match="ends early"):
        pgoutput.decode(b"")


def _insert(tuple_data: bytes, marker: bytes = b"N") -> bytes:
    return b"I" + struct.pack("!I", 7) + marker + tuple_data


def test_damaged_tuples_are_refused():
    with pytest.raises(ValueError, match=r"ends early or is malformed: 5 bytes wanted at offset 13 of 15"):
        pgoutput.decode(_insert(struct.pack("!h", 1) + b"t" + struct.pack("!i", 5) + b"ab"))
    with pytest.raises(ValueError, match=r"ends early or is malformed: -1 bytes wanted"):
        pgoutput.decode(_insert(struct.pack("!h", 1) + b"t" + struct.pack("!i", -1) + b"ab"))
    with pytest.raises(ValueError, match="unknown tuple column kind 'x'"):
        pgoutput.decode(_insert(struct.pack("!h", 1) + b"x"))
    with pytest.raises(UnicodeDecodeError):
        pgoutput.decode(_insert(struct.pack("!h", 1) + b"t" + struct.pack("!i", 1) + b"\xff"))


def test_a_wrong_marker_before_a_tuple_is_refused():
    one = struct.pack("!h", 1) + b"t" + struct.pack("!i", 1) + b"1"
    with pytest.raises(ValueError, match="'K' where N belongs"):
        pgoutput.decode(_insert(one, b"K"))
    with pytest.raises(ValueError, match="'X' where K or O or N belongs"):
        pgoutput.decode(b"U" + struct.pack("!I", 7) + b"X" + one)
    with pytest.raises(ValueError, match="'O' where N belongs"):
        pgoutput.decode(b"U" + struct.pack("!I", 7) + b"K" + one + b"O" + one)
    with pytest.raises(ValueError, match="'N' where K or O belongs"):
        pgoutput.decode(b"D" + struct.pack("!I", 7) + b"N" + one)


def test_what_the_decoder_does_not_check():
    """Today's behaviour, stated: bytes after a complete message are ignored, and an unknown
    message kind is passed on as Other (the Log Reader skips it)."""
    insert = raw("insert_t1_t2")[2]
    assert pgoutput.decode(insert + b"more") == pgoutput.decode(insert) == Insert(T1, ["1"])
    assert pgoutput.decode(b"Z") == Other("Z")
    with pytest.raises(UnicodeDecodeError):
        pgoutput.decode(b"\xff")


# ---------------------------------------------------------------------- hand-made edge values
#: one character of every Unicode plane (0-16), plus BMP specials (as in tests/integration/test_data_edges.py)
UNICODE_TEXT = (
    "".join(chr(p * 0x10000 + 0x141) for p in range(17))
    + "\u00e9\u4e2d\ufffd\ufeff\uffff\ud7ff\U0001f600\U0010ffff\U000e0001"
)
ODD_TEXT = (
    "tab\there\nnew line\r\n back\\slash 'single' \"double\" %s %(x)s $1 $$ \\. \\N \u200b\u200f\u202e\x7f\x01 end "
)


def _tuple_data(*values) -> bytes:
    out = struct.pack("!h", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif v is pgoutput.UNCHANGED_TOAST:
            out += b"u"
        else:
            raw = v.encode()
            out += b"t" + struct.pack("!i", len(raw)) + raw
    return out


def test_pgoutput_decodes_edge_text_null_and_unchanged_toast():
    long_name = "\u00e9" * 31 + "x"  # 63 bytes
    rel = (
        b"R"
        + struct.pack("!I", 16384)
        + b"s p"
        + b"\0"
        + long_name.encode()
        + b"\0"
        + b"f"
        + struct.pack("!h", 3)
        + b"".join(
            b"\1" * (i == 0) + b"\0" * (i != 0) + c.encode() + b"\0" + struct.pack("!Ii", 25, -1)
            for i, c in enumerate(["id", "a.b", long_name])
        )
    )
    assert pgoutput.decode(rel) == pgoutput.Relation(
        16384, "s p", long_name, "f", ["id", "a.b", long_name], [25, 25, 25]
    )
    update = (
        b"U"
        + struct.pack("!I", 16384)
        + b"O"
        + _tuple_data("1", "", None)
        + b"N"
        + _tuple_data("1", UNICODE_TEXT + ODD_TEXT, pgoutput.UNCHANGED_TOAST)
    )
    assert pgoutput.decode(update) == pgoutput.Update(
        16384, ["1", "", None], ["1", UNICODE_TEXT + ODD_TEXT, pgoutput.UNCHANGED_TOAST]
    )
    delete = b"D" + struct.pack("!I", 7) + b"O" + _tuple_data("\\x00ff", "")
    assert pgoutput.decode(delete) == pgoutput.Delete(7, ["\\x00ff", ""])
    truncate = b"T" + struct.pack("!ibII", 2, 3, 7, 8)
    assert pgoutput.decode(truncate) == pgoutput.Truncate([7, 8], True, True)


def test_an_origin_message_names_the_origin_and_its_commit_lsn():
    """Origin ('O'): the commit LSN at the origin (uint64) and the origin's name (cstring), as
    a Queue Reader's transaction at the publisher carries it."""
    message = b"O" + struct.pack("!q", 0x1_0000_00AB) + b"airflow_repl_q_0123456789abcdef" + b"\0"
    assert pgoutput.decode(message) == Origin(0x1_0000_00AB, "airflow_repl_q_0123456789abcdef")
    with pytest.raises((ValueError, struct.error)):
        pgoutput.decode(b"O" + struct.pack("!q", 1) + b"no terminator")
