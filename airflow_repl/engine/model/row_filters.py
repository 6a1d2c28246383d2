"""Checking a row-filter predicate before it reaches any SQL text.

The predicate is PostgreSQL SQL written by the topology's author.  It is embedded as
``WHERE (<predicate>)`` in ``CREATE PUBLICATION``, where PostgreSQL parses and validates it
(unknown columns, types, non-immutable functions).  This module makes sure the text cannot
leave its parentheses: balanced parentheses outside literals and quoted identifiers, no
statement separators and no comments.  As a second line of defence, every statement that
embeds the text is sent through the extended protocol (one statement, never a script) in a
session with ``standard_conforming_strings = on`` (the quoting rules this lexer assumes).
After validation the engine only uses PostgreSQL's own deparsed form (``pg_get_expr``) of the
stored filter.
"""

from __future__ import annotations

import re

from airflow_repl.engine.errors import TopologyError

_DOLLAR = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$")


class _Invalid(Exception):
    """Why the predicate could leave its parentheses (completed into a TopologyError)."""


def check_predicate(text: object, *, article: str) -> str:
    """Return the stripped predicate, or raise TopologyError explaining what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise TopologyError(f"row_filter of article {article!r} must be a non-empty SQL predicate")
    text = text.strip()
    try:
        _scan(text)
    except _Invalid as exc:
        raise TopologyError(f"row_filter of article {article!r} is not a valid predicate: {exc}: {text!r}") from None
    return text


def _scan(text: str) -> None:
    """Walk the predicate outside literals and quoted identifiers, checking what may appear
    there and that parentheses balance."""
    depth, i = 0, 0
    while i < len(text):
        ch = text[i]
        if ch == "\x00":
            raise _Invalid("it contains a NUL character")
        if ch in "'\"":
            i = _after_quoted(text, i)
            continue
        if ch == "$" and (end := _after_dollar_quoted(text, i)) is not None:
            i = end
            continue
        if text.startswith("--", i) or text.startswith("/*", i):
            raise _Invalid("comments are not allowed")
        if ch == ";":
            raise _Invalid("';' is not allowed")
        depth += 1 if ch == "(" else -1 if ch == ")" else 0
        if depth < 0:
            raise _Invalid("unbalanced parentheses")
        i += 1
    if depth:
        raise _Invalid("unbalanced parentheses")


def _after_quoted(text: str, i: int) -> int:
    """The position after the string literal or quoted identifier opening at ``i``: a doubled
    quote stays inside, and so does a backslash escape in an ``E'...'`` string."""
    quote = text[i]
    escape = quote == "'" and i > 0 and text[i - 1] in "eE" and (i < 2 or not text[i - 2].isalnum())
    j = i + 1
    while True:
        if j >= len(text):
            raise _Invalid("an unterminated quoted string or identifier")
        if escape and text[j] == "\\":
            j += 2
        elif text[j] != quote:
            j += 1
        elif j + 1 < len(text) and text[j + 1] == quote:
            j += 2
        else:
            return j + 1


def _after_dollar_quoted(text: str, i: int) -> int | None:
    """The position after the dollar-quoted string opening at ``i``; None when the ``$`` there
    opens none.  A ``$`` after an identifier character (or another ``$``) belongs to the
    identifier (a$b, a$$t$): only a ``$`` standing alone opens a dollar quote."""
    m = _DOLLAR.match(text, i)
    if not m or (i > 0 and (text[i - 1].isalnum() or text[i - 1] in "_$")):
        return None
    end = text.find(m.group(0), m.end())
    if end < 0:
        raise _Invalid("an unterminated dollar-quoted string")
    return end + len(m.group(0))
