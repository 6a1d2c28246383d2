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
    """A string literal that means ``text`` whatever ``standard_conforming_strings`` is: a
    standard one ('it''s'), or, when ``text`` holds a backslash, an escape string with the
    backslashes doubled (E'a\\b'), as PostgreSQL's ``quote_literal`` writes it.  (A standard
    literal ending in a backslash would end elsewhere in a session where the setting is off.)"""
    if "\x00" in text:
        raise ValueError("string literals cannot contain NUL characters")
    quoted = text.replace("'", "''")
    if "\\" in text:
        return "E'" + quoted.replace("\\", "\\\\") + "'"
    return "'" + quoted + "'"


#: Escapes of an escape string (E'...') for the characters that have a short one.
_SHORT_ESCAPES = {"\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def comment(text: str) -> str:
    """``text`` (a name) as a script's comment shows it: a string literal on one line.  A
    standard literal ('it''s') when every character of ``text`` is printable; otherwise an escape
    string in which backslashes, line breaks and every other character that is not printable
    are escaped (E'nl\\nSELECT 1; --', E'\\u2028'), so that nothing of ``text`` can end the
    comment.  Either form reads back as ``text`` in PostgreSQL (``SELECT E'...'``)."""
    if text.isprintable() and "\\" not in text:
        return literal(text)
    out = []
    for c in text:
        if c in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[c])
        elif c.isprintable():
            out.append("''" if c == "'" else c)
        else:
            out.append(f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}")
    return "E'" + "".join(out) + "'"


def dollar_quote(body: str, tag: str = "airflow_repl") -> str:
    """Wrap ``body`` in a dollar quote whose tag does not occur in it."""
    n = 0
    while True:
        delim = f"${tag}{n or ''}$"
        if delim not in body:
            return f"{delim}\n{body}{delim}"
        n += 1
