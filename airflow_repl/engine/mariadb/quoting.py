"""Quoting for MariaDB: identifiers in backticks, literals that mean the same under any
``sql_mode`` (``NO_BACKSLASH_ESCAPES`` included) and connection character set."""

from __future__ import annotations

from airflow_repl.engine.errors import TopologyError

#: MariaDB's limit on a table or column name, in characters.
MAX_NAME = 64


def ident(name: str) -> str:
    """``name`` as a MariaDB identifier: in backticks, a backtick doubled."""
    return "`" + name.replace("`", "``") + "`"


def ident_in_format(name: str) -> str:
    """:func:`ident` for a statement the driver fills with parameters (``%s``): PyMySQL formats
    it with Python's ``%``, so a ``%`` in the name is doubled."""
    return ident(name).replace("%", "%%")


def qualified(database: str, table: str) -> str:
    return f"{ident(database)}.{ident(table)}"


def literal(text: str) -> str:
    """A string literal meaning ``text`` whatever ``sql_mode`` (``NO_BACKSLASH_ESCAPES``) and the
    connection's character set are: ``'it''s'`` when ``text`` is printable ASCII without a
    backslash (a quote doubled, which every mode reads alike), otherwise its UTF-8 bytes in
    hexadecimal, converted (``CONVERT(X'C3A9' USING utf8mb4)``)."""
    if text.isascii() and text.isprintable() and "\\" not in text:
        return "'" + text.replace("'", "''") + "'"
    return f"CONVERT(X'{text.encode().hex().upper()}' USING utf8mb4)"


#: Trailing characters MariaDB refuses in a database, table or column name.
TRAILING = " \t\n\v\f\r"


def check_name(kind: str, name: str, where: str) -> str:
    """A name MariaDB can hold as it is, or a refusal (one line) naming it: at most 64
    characters, no NUL, no trailing space, tab, line break, vertical tab, form feed or carriage
    return (MariaDB refuses or strips them), no character outside the Basic Multilingual Plane
    (MariaDB's names are 3-byte utf8)."""
    if (
        "\0" in name
        or not name
        or name != name.rstrip(TRAILING)
        or len(name) > MAX_NAME
        or any(ord(ch) > 0xFFFF for ch in name)
    ):
        raise TopologyError(
            f"{kind} {name!r} of {where} cannot be a MariaDB name (at most {MAX_NAME} characters, no NUL, "
            f"no trailing space, tab, line break, vertical tab, form feed or carriage return, no 4-byte UTF-8 "
            f"character): rename it at the publisher or leave it out of the article"
        )
    return name
