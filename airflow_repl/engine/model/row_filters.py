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


def check_predicate(text: str, *, article: str) -> str:
    """Return the stripped predicate, or raise TopologyError explaining what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise TopologyError(f"row_filter of article {article!r} must be a non-empty SQL predicate")
    text = text.strip()
    depth, i, n = 0, 0, len(text)

    def bad(why: str) -> TopologyError:
        return TopologyError(f"row_filter of article {article!r} is not a valid predicate: {why}: {text!r}")

    while i < n:
        ch = text[i]
        if ch == "\x00":
            raise bad("it contains a NUL character")
        if ch in "'\"":
            escape = ch == "'" and i > 0 and text[i - 1] in "eE" and (i < 2 or not text[i - 2].isalnum())
            j = i + 1
            while True:
                if j >= n:
                    raise bad("an unterminated quoted string or identifier")
                if escape and text[j] == "\\":
                    j += 2
                    continue
                if text[j] == ch:
                    if j + 1 < n and text[j + 1] == ch:
                        j += 2
                        continue
                    break
                j += 1
            i = j + 1
            continue
        if ch == "$":
            m = _DOLLAR.match(text, i)
            # '$' after an identifier character (or another '$') belongs to the identifier
            # (a$b, a$$t$): only a '$' standing alone opens a dollar quote.
            if m and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] in "_$")):
                end = text.find(m.group(0), m.end())
                if end < 0:
                    raise bad("an unterminated dollar-quoted string")
                i = end + len(m.group(0))
                continue
        if text.startswith("--", i) or text.startswith("/*", i):
            raise bad("comments are not allowed")
        if ch == ";":
            raise bad("';' is not allowed")
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise bad("unbalanced parentheses")
        i += 1
    if depth:
        raise bad("unbalanced parentheses")
    return text
