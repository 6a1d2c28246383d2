"""How the distribution database's JSON is written and read: compact JSON for the commands and
the transaction rows (orjson, ``json`` for what orjson refuses or writes otherwise), and how
that JSON, read as text (the ``json`` columns, and an earlier database's ``jsonb``, cast to
``text`` by the queries), is read back."""

from __future__ import annotations

import json
import re
from typing import Any

import orjson
from psycopg.adapt import Buffer


def dumps(value: Any) -> str:
    """Compact JSON text, as commands and transaction rows store it (:func:`dumps_bytes`)."""
    return dumps_bytes(value).decode()


def dumps_bytes(value: Any) -> bytes:
    """Compact JSON (UTF-8), as commands and transaction rows store it: orjson's, for the values
    commands and transaction rows hold (text, NULL, numbers, lists and objects with text keys);
    ``json``'s, one encoder for every call, for anything orjson refuses (an object with other
    keys, an integer beyond 64 bits) or writes otherwise (a float NaN or infinity, which orjson
    turns into null).  Both parse to the same values: non-ASCII text is written as UTF-8 where
    ``json`` writes ``\\u`` escapes, which the ``jsonb`` column does not keep apart."""
    try:
        return _orjson_dumps(value)
    except (orjson.JSONEncodeError, _NonFinite):
        return _ENCODER.encode(value).encode()


class _NonFinite(Exception):
    """A float orjson would write as null."""


def _default(value: Any) -> Any:
    raise TypeError  # a type orjson does not know: json's encoder decides


def _orjson_dumps(value: Any) -> bytes:
    out = orjson.dumps(value, default=_default)
    if b"null" in out and _has_non_finite(value):
        raise _NonFinite
    return out


def _has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return value != value or value in (float("inf"), float("-inf"))
    if isinstance(value, dict):
        return any(_has_non_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_has_non_finite(v) for v in value)
    return False


_ENCODER = json.JSONEncoder(separators=(",", ":"))


def counts_json(counts: dict[str, int]) -> bytes:
    """Counts by name (a transaction's rows per article) as :func:`dumps_bytes` writes them:
    orjson's, which writes text keys and integers as ``json`` does (nothing to look for)."""
    return orjson.dumps(counts)


def command_data(data: dict[str, Any]) -> bytes:
    """A command's JSON (:meth:`Command.to_json`), as :func:`dumps_bytes` writes it.  A row
    change's holds only text, NULLs and the pair flag, which orjson writes as ``json`` does
    (no float to look for); a schema change's goes through :func:`dumps_bytes`."""
    if "s" not in data:
        try:
            return orjson.dumps(data, default=_default)
        except orjson.JSONEncodeError:
            pass
    return dumps_bytes(data)


def loads(data: Buffer) -> Any:
    """JSON text (UTF-8) as Python values, as ``json.loads`` reads it: orjson's parser, or
    ``json``'s for what orjson refuses (NaN, Infinity) or reads otherwise (an integer beyond 64
    bits, which orjson makes a float: any run of 19 digits, even inside a string, takes ``json``)."""
    if _LONG_NUMBER.search(data) is None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(bytes(data))


_LONG_NUMBER = re.compile(rb"[0-9]{19}")


def load_command(op: str, data: str) -> Any:
    """A stored command's JSON (``airflow_repl.commands.data``, read as text), as :func:`loads`
    reads it.  Only a schema change's (op ``S``) may hold numbers other than the pair flag: a
    row change's goes straight to orjson (no look into its text; psycopg makes the text in C,
    where a loader of the ``json`` column would be a Python call per value)."""
    if op != "S":
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return loads(data.encode())
