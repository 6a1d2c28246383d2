"""The faster paths of the Log Reader and the Distribution Agent (issue 12, catch-up CPU),
checked against the implementations they replace on random data, without a server: the
pgoutput tuple decoder, the command JSON and its COPY line, the JSON loader of stored commands,
the ``text[]`` literals of bulk_apply and its net change per key."""

from __future__ import annotations

import json
import random
import re
import struct
from datetime import datetime, timezone
from typing import Any

import pytest
from article_builder import text_article

from airflow_repl.engine.agents import change_mapping
from airflow_repl.engine.articles.commands import DELETE, INSERT, UPDATE, Command, OpCode
from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.postgres import copy_escaping, pgoutput
from airflow_repl.engine.state import dist_encoding, dist_transactions
from airflow_repl.engine.subscriber import bulk_apply
from airflow_repl.engine.subscriber.bulk_apply import NotNetApplicable

#: text values with what JSON, COPY and array input escape: quotes, backslashes, control
#: characters, non-ASCII (2, 3 and 4 UTF-8 bytes), braces and commas, the words NULL and null
SPECIAL = [
    "",
    " ",
    '"',
    "\\",
    '\\"',
    "a\tb",
    "line\nbreak\r",
    "\x01\x1f\x7f",
    "é",
    "中文",
    "😀",
    "{a,b}",
    "NULL",
    "null",
    "1.5e300",
    "NaN",
    "-0.00",
    "x" * 300,
    "'q' \\N \\x00",
]


def _value(rng: random.Random) -> str | None:
    pick = rng.random()
    if pick < 0.15:
        return None
    if pick < 0.5:
        return rng.choice(SPECIAL)
    alphabet = "ab 09\\\"\t\n'{},é中😀\x02"
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))


def _values(rng: random.Random, n: int | None = None) -> list[str | None]:
    return [_value(rng) for _ in range(rng.randrange(1, 8) if n is None else n)]


# ---------------------------------------------------------------------- pgoutput tuples
def _old_tuple(buf: bytes, pos: int) -> tuple[list[pgoutput.Datum], int]:
    """The decoder before issue 12 (the reference)."""
    end = len(buf)
    (n,) = struct.unpack_from("!h", buf, pos)
    pos += 2
    out: list[pgoutput.Datum] = []
    for _ in range(n):
        if pos >= end:
            raise pgoutput._ends_early(1, pos, end)
        kind = buf[pos]
        if kind in b"tb":
            (size,) = struct.unpack_from("!i", buf, pos + 1)
            pos += 5
            if size < 0 or pos + size > end:
                raise pgoutput._ends_early(size, pos, end)
            raw = buf[pos : pos + size]
            out.append(raw.decode("utf-8") if kind == b"t"[0] else raw)
            pos += size
        elif kind == b"n"[0]:
            out.append(None)
            pos += 1
        elif kind == b"u"[0]:
            out.append(pgoutput.UNCHANGED_TOAST)
            pos += 1
        else:
            raise ValueError(f"unknown tuple column kind {chr(kind)!r}")
    return out, pos


def _encode_tuple(rng: random.Random, n: int) -> bytes:
    out = struct.pack("!h", n)
    for _ in range(n):
        pick = rng.random()
        if pick < 0.15:
            out += b"n"
        elif pick < 0.25:
            out += b"u"
        elif pick < 0.3:
            raw = bytes(rng.randrange(256) for _ in range(rng.randrange(6)))
            out += b"b" + struct.pack("!i", len(raw)) + raw
        else:
            raw = (rng.choice(SPECIAL) if rng.random() < 0.5 else "v" * rng.randrange(70)).encode()
            out += b"t" + struct.pack("!i", len(raw)) + raw
    return out


def _outcome(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:  # the same error, type and text
        return (type(exc), str(exc))


def test_tuple_decoder_matches_the_old_one_on_random_and_damaged_images():
    rng = random.Random(12)
    for _ in range(3000):
        buf = b"xx" + _encode_tuple(rng, rng.randrange(0, 1601 if rng.random() < 0.01 else 9))
        assert pgoutput._tuple(buf, 2) == _old_tuple(buf, 2)
        cut = buf[: rng.randrange(2, len(buf) + 1)]  # cut anywhere: refused the same way
        assert _outcome(pgoutput._tuple, cut, 2) == _outcome(_old_tuple, cut, 2)
    for damaged in (
        b"xx\x00\x01t\xff\xff\xff\xff",
        b"xx\x00\x01q",
        b"xx\xff\xff",
        b"xx\x00\x01t\x00\x00\x00\x02\xc3\xa9"[:-1],
    ):
        assert _outcome(pgoutput._tuple, damaged, 2) == _outcome(_old_tuple, damaged, 2)


def test_insert_update_delete_images_decode_as_before():
    rng = random.Random(7)
    for _ in range(500):
        new, old = _encode_tuple(rng, 4), _encode_tuple(rng, 4)
        relid = struct.pack("!I", 16400)
        assert pgoutput.decode(b"I" + relid + b"N" + new) == pgoutput.Insert(16400, _old_tuple(new, 0)[0])
        assert pgoutput.decode(b"D" + relid + b"O" + old) == pgoutput.Delete(16400, _old_tuple(old, 0)[0])
        update = pgoutput.decode(b"U" + relid + b"O" + old + b"N" + new)
        assert update == pgoutput.Update(16400, _old_tuple(old, 0)[0], _old_tuple(new, 0)[0])


# ---------------------------------------------------------------------- row commands
def test_row_commands_of_an_article_with_every_column_equal_the_projection():
    art = text_article(("c1", "c2"))
    whole = change_mapping.RelationMap(art, [0, 1, 2])
    projected = change_mapping.RelationMap(art, [0, 2, 1])
    prefix = change_mapping.RelationMap(art, [0, 1, 2])  # a child with a column of its own after them
    assert whole.identity and not projected.identity
    u = pgoutput.UNCHANGED_TOAST
    changes: list[change_mapping.RowChange] = [
        pgoutput.Insert(1, ["1", "é", None]),
        pgoutput.Delete(1, ["1", "", "\\"]),
        pgoutput.Update(1, ["1", "a", "big"], ["1", "b", u]),
        pgoutput.Update(1, ["1", "a", "b"], ["2", "a", "b"]),
    ]
    copying = change_mapping.RelationMap(art, [0, 1, 2])
    copying.identity = False  # the projection, as every article took it before
    for change in changes:
        reference = change_mapping.row_commands(change, copying)
        assert change_mapping.row_commands(change, whole) == reference
        swapped = change_mapping.row_commands(change, projected)
        assert [[c.old, c.new] for c in swapped] == [
            [
                None if c.old is None else [c.old[0], c.old[2], c.old[1]],
                None if c.new is None else [c.new[0], c.new[2], c.new[1]],
            ]
            for c in reference
        ]
    longer = pgoutput.Insert(1, ["1", "a", "b", "own"])
    assert change_mapping.row_commands(longer, prefix)[0].new == ["1", "a", "b"]


# ---------------------------------------------------------------------- command JSON and COPY lines
OLD_ENCODER = json.JSONEncoder(separators=(",", ":"))


def _copy_fields(line: bytes) -> list[str | None]:
    """What the server reads from one line of COPY's text format."""
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    escapes = {"\\": "\\", "n": "\n", "r": "\r", "t": "\t", "N": None}
    out: list[str | None] = []
    for field in line[:-1].split(b"\t"):
        if field == b"\\N":
            out.append(None)
        else:
            out.append(re.sub(r"\\(.)", lambda m: escapes[m[1]] or "", field.decode()))
    return out


def test_command_json_parses_as_the_old_encoders_and_its_copy_line_reads_back():
    rng = random.Random(1)
    for n in range(3000):
        old = _values(rng) if rng.random() < 0.6 else None
        new = _values(rng) if rng.random() < 0.6 or old is None else None
        cmd = Command(
            rng.choice([INSERT, UPDATE, DELETE]), rng.choice(["a", "é t\\x", "tab\there"]), old, new, rng.random() < 0.3
        )
        data = dist_encoding.command_data(cmd.to_json())
        assert json.loads(data) == json.loads(OLD_ENCODER.encode(cmd.to_json())) == cmd.to_json()
        prefix = copy_escaping.copy_field("pub\\lication") + b"\t" + copy_escaping.copy_field("0/1A") + b"\t"
        line = dist_transactions.command_line(
            prefix, n + 1, copy_escaping.copy_field(cmd.article), cmd.op.value.encode(), data
        )
        fields = _copy_fields(line)
        assert fields[:5] == ["pub\\lication", "0/1A", str(n + 1), cmd.article, cmd.op.value]
        assert fields[5] is not None and json.loads(fields[5]) == cmd.to_json()
    assert (
        copy_escaping.copy_field(None) == b"\\N" and copy_escaping.copy_field("a\\b\nc\rd\te") == b"a\\\\b\\nc\\rd\\te"
    )


@pytest.mark.parametrize(
    ("at", "origin", "schema_change"),
    [
        (datetime(2026, 11, 27, 6, 30, 1, 123456, tzinfo=timezone.utc), None, False),
        (datetime(2000, 1, 1, tzinfo=timezone.utc), "pg_16384\ttab\\back\nline", True),  # no fraction: none written
    ],
)
def test_transaction_rows_copy_lines_read_back(at: datetime, origin: str | None, schema_change: bool) -> None:
    rows = {"a": 1, "é t\\x": 2, "tab\there\nnl": 3, "null": 0}
    line = dist_transactions.transaction_line(
        copy_escaping.copy_field("pub\\lication"), "1F/A0", 4294967297, at, "20/0", 6, rows, origin, schema_change
    )
    fields = _copy_fields(line)
    assert fields[:3] == ["pub\\lication", "1F/A0", "4294967297"]
    assert fields[3] is not None and datetime.fromisoformat(fields[3]) == at
    assert fields[4:6] == ["20/0", "6"]
    assert fields[6] is not None and json.loads(fields[6]) == rows
    assert fields[7:] == [origin, "t" if schema_change else "f"]


def test_transaction_rows_commit_time_from_a_message_reads_back_as_its_datetime() -> None:
    """The Log Reader writes a commit time straight from the message's microseconds since 2000:
    the same instant as the datetime the decoder makes of them, in every second (cached per
    second), before 2000 and with no fraction too."""
    rng = random.Random(33)
    second = 849_000_000 * 1_000_000
    times = [0, -1, -1_000_000, 1, 999_999, second, second + 1, second + 999_999, second + 1_000_000, second]
    times += [rng.randrange(-(10**15), 10**16) for _ in range(2000)]
    for us in times:
        line = dist_transactions.transaction_line(b"p", "0/1", 1, us, "0/2", 1, {"a": 1}, None, False)
        text = _copy_fields(line)[3]
        assert text is not None and datetime.fromisoformat(text) == pgoutput.pg_time(us), us


def test_dumps_keeps_what_orjson_would_write_otherwise_to_json():
    schema = {"change": "add column", "before": {"n": 1.5, "big": 2**70, "none": None}, 3: "int key"}
    data = dist_encoding.command_data(Command(OpCode.SCHEMA, "t", schema=schema).to_json())
    assert data == OLD_ENCODER.encode({"s": schema}).encode()  # json's, whole: orjson refuses int keys and 2**70
    for value in ({"x": float("nan")}, [float("inf"), None], {"a": [1, {"b": -float("inf")}]}):
        assert dist_encoding.dumps(value) == OLD_ENCODER.encode(value)  # NaN/Infinity as json writes them, not null
    plain = {"a": 1, "é": [None, "😀", 2.5, True]}
    assert json.loads(dist_encoding.dumps(plain)) == plain and "😀" in dist_encoding.dumps(plain)


def test_loads_reads_what_every_version_wrote():
    rng = random.Random(3)
    for _ in range(2000):
        value = {"o": _values(rng), "n": _values(rng), "p": 1}
        for text in (OLD_ENCODER.encode(value), json.dumps(value, ensure_ascii=False), dist_encoding.dumps(value)):
            assert dist_encoding.loads(text.encode()) == json.loads(text) == value
            assert dist_encoding.loads(memoryview(text.encode())) == value
    for text in ('{"big": 123456789012345678901234567890}', '{"x": NaN}', "[1.0, -0.0, 1e400]"):
        assert repr(dist_encoding.loads(text.encode())) == repr(json.loads(text))


def test_stored_commands_load_as_json_loads_reads_them():
    """The Distribution Agent's loader of ``airflow_repl.commands.data`` (jsonb's text output)."""
    rng = random.Random(4)
    for _ in range(2000):
        cmd = Command(UPDATE, "t", _values(rng), _values(rng), rng.random() < 0.5)
        text = json.dumps(cmd.to_json(), ensure_ascii=rng.random() < 0.5, separators=(", ", ": "))
        assert dist_encoding.load_command("U", text) == json.loads(text) == cmd.to_json()
    schema = {"s": {"change": "x", "before": {"limit": 2**70, "oid": 23, "ratio": 0.1}, "after": {}}}
    text = json.dumps(schema)  # only a schema change's JSON holds numbers: read by json, exactly
    assert repr(dist_encoding.load_command("S", text)) == repr(schema)
    tricky = {"o": ['"s": 1'], "n": ["s", 'a"s":']}  # "s": inside values: json's, the same
    assert dist_encoding.load_command("U", json.dumps(tricky)) == tricky


# ---------------------------------------------------------------------- text[] literals
def _parse_array(literal: str) -> list[str | None]:
    """PostgreSQL's array input for a one-dimensional text[] (quoted elements or NULL)."""
    assert literal[0] == "{" and literal[-1] == "}"
    out: list[str | None] = []
    i, body = 0, literal[1:-1]
    while i < len(body):
        if body[i] == '"':
            i += 1
            value = []
            while body[i] != '"':
                if body[i] == "\\":
                    i += 1
                value.append(body[i])
                i += 1
            out.append("".join(value))
            i += 1
        else:
            j = body.find(",", i)
            j = len(body) if j < 0 else j
            word = body[i:j]
            assert word.upper() == "NULL", word
            out.append(None)
            i = j
        if i < len(body):
            assert body[i] == ","
            i += 1
    return out


def test_array_literals_read_back_as_their_values():
    rng = random.Random(5)
    for _ in range(3000):
        values = tuple(_values(rng))
        literal = bulk_apply.array_literal(values)
        assert _parse_array(literal) == list(values)
    assert bulk_apply.array_literal(("a", None, "")) == '{"a",null,""}'
    assert bulk_apply.array_literal(('a"b', "c\\d", None, "\n")) == '{"a\\"b","c\\\\d",NULL,"\n"}'


# ---------------------------------------------------------------------- net change
def _old_net_changes(commands: list[Command], articles: dict[str, ResolvedArticle]) -> Any:
    """net_changes before issue 12 (the reference); the columns an UPDATE changed are counted
    for the articles whose UPDATEs set only those (SCALL, MCALL), the only ones that use them."""
    out: dict[str, dict[Any, Any]] = {}
    checked: dict[str, ResolvedArticle] = {}
    for cmd in commands:
        art = checked.get(cmd.article) or articles.get(cmd.article)
        if (
            cmd.op not in (INSERT, UPDATE, DELETE)
            or art is None
            or not (cmd.article in checked or bulk_apply.eligible(art))
        ):
            raise NotNetApplicable(f"{cmd.op} command of article {cmd.article!r}")
        checked[cmd.article] = art
        keys = out.setdefault(cmd.article, {})
        image = cmd.new if cmd.op == INSERT else cmd.old
        assert image is not None
        key = tuple([image[i] for i in art.pk_positions])
        if cmd.op == UPDATE and cmd.new is not None and (moved := tuple([cmd.new[i] for i in art.pk_positions])) != key:
            _old_step(keys, key, Command(DELETE, cmd.article, old=cmd.old), False)
            _old_step(keys, moved, Command(INSERT, cmd.article, new=cmd.new), False)
            continue
        _old_step(keys, key, cmd, bulk_apply.masked(art))
    return out


def _old_step(keys: dict[Any, Any], key: Any, cmd: Command, by_mask: bool) -> None:
    state = keys.get(key)
    if cmd.op == INSERT:
        if state is None:
            keys[key] = bulk_apply._Key(existed=False, final=cmd.new)
        elif state.final is None:
            state.final = cmd.new
        else:
            raise NotNetApplicable("an INSERT of a row the batch already has")
        return
    if state is not None and state.final is None:
        raise NotNetApplicable(f"an {cmd.op} of a row the batch deleted")
    if cmd.op == UPDATE:
        if state is None:
            state = keys[key] = bulk_apply._Key(existed=True, final=cmd.new)
        state.final = cmd.new
        if by_mask:
            state.changed.update(i for i, c in enumerate(cmd.changed()) if c)
        return
    if state is None:
        keys[key] = bulk_apply._Key(existed=True, final=None, deleted=True)
    elif not state.existed and not state.deleted:
        del keys[key]
    else:
        state.final, state.deleted = None, True


@pytest.mark.parametrize("update", ["CALL", "SCALL"])
@pytest.mark.parametrize("seed", range(40))
def test_net_changes_match_the_old_implementation_on_random_batches(seed, update):
    rng = random.Random(seed)
    articles = {"t": text_article(("c1", "c2"), update=update), "n": text_article(("c1", "c2"), delete="NONE")}
    commands: list[Command] = []
    for _ in range(rng.randrange(1, 60)):
        k, k2 = str(rng.randrange(5)), str(rng.randrange(5))
        a, b = _values(rng, 2), _values(rng, 2)
        op = rng.choice([INSERT, UPDATE, UPDATE, DELETE])
        article = "n" if rng.random() < 0.02 else "t"
        if op == INSERT:
            commands.append(Command(INSERT, article, new=[k, *a]))
        elif op == DELETE:
            commands.append(Command(DELETE, article, old=[k, *a]))
        else:
            commands.append(Command(UPDATE, article, old=[k, *a], new=[k2 if rng.random() < 0.2 else k, *b]))
    assert _outcome(bulk_apply.net_changes, commands, articles) == _outcome(_old_net_changes, commands, articles)
