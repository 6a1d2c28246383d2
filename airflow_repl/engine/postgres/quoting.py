"""Quoting for SQL text that is written to scripts (snapshot folders, procedure scripts).

Statements sent to a server use psycopg's :mod:`psycopg.sql` composition and bound parameters;
these helpers exist for the scripts the engine *writes*, which must be runnable on their own.
"""

from __future__ import annotations


def ident(name: str) -> str:
    """A PostgreSQL quoted identifier ("my ""odd"" name")."""
    if "\x00" in name:
        raise ValueError("identifiers cannot contain NUL characters")
    return '"' + name.replace('"', '""') + '"'


def qualified(schema: str, name: str) -> str:
    return f"{ident(schema)}.{ident(name)}"


def literal(text: str) -> str:
    """A standard-conforming string literal."""
    if "\x00" in text:
        raise ValueError("string literals cannot contain NUL characters")
    return "'" + text.replace("'", "''") + "'"


def dollar_quote(body: str, tag: str = "airflow_repl") -> str:
    """Wrap ``body`` in a dollar quote whose tag does not occur in it."""
    n = 0
    while True:
        delim = f"${tag}{n or ''}$"
        if delim not in body:
            return f"{delim}\n{body}{delim}"
        n += 1
