"""JSON values whose numbers stay exact on their way through Python.

``to_jsonb`` writes a ``numeric`` as the number it is (``12.50``); Python's ``json`` would read
it as a float and cannot write a Decimal at all.  Connections that read row images (the Queue
Reader's, the Distribution Agent's at an updatable subscriber) read numbers with a fraction as
Decimal (:func:`exact_numbers`), and every JSON parameter the engine writes from such values goes
through :func:`jsonb`, which writes a Decimal as a JSON number again: a value keeps its JSON type
(numbers as numbers) whoever recorded it, and a column's type reads it back exactly.
"""

from __future__ import annotations

import json
from decimal import Decimal
from functools import partial
from typing import Any

import psycopg
from psycopg.types.json import Jsonb, set_json_loads

_loads = partial(json.loads, parse_float=Decimal)


def exact_numbers(conn: psycopg.Connection[Any]) -> None:
    """Read JSON numbers with a fraction as Decimal on ``conn`` (never as float)."""
    set_json_loads(_loads, conn)


def loads(text: str) -> Any:
    """JSON text read as :func:`exact_numbers` reads it."""
    return _loads(text)


def dumps(value: Any) -> str:
    """The JSON text of ``value``, a Decimal written as the number it is (``json`` has no way
    to); other values as ``json`` writes them (anything else as its ``str``)."""
    if isinstance(value, Decimal):
        return str(value) if value.is_finite() else json.dumps(str(value))
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(str(k)) + ":" + dumps(v) for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    return json.dumps(value, default=str)


def jsonb(value: Any) -> Jsonb:
    """A JSON parameter written by :func:`dumps`."""
    return Jsonb(value, dumps=dumps)
