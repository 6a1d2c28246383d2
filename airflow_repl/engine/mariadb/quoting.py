"""Quoting for MariaDB: identifiers in backticks, literals as ``'...'`` with every backslash and
quote escaped (safe under any ``sql_mode``)."""

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
    """``text`` as a MariaDB string literal (backslashes and quotes escaped, NUL as ``\\0``)."""
    escaped = text.replace("\\", "\\\\").replace("'", "\\'").replace("\0", "\\0")
    return f"'{escaped}'"


def check_name(kind: str, name: str, where: str) -> str:
    """A name MariaDB can hold as it is, or a refusal naming it: at most 64 characters, no NUL,
    no trailing space (MariaDB refuses or strips them), no character outside the Basic
    Multilingual Plane (MariaDB's names are 3-byte utf8)."""
    if (
        "\0" in name
        or not name
        or name != name.rstrip(" ")
        or len(name) > MAX_NAME
        or any(ord(ch) > 0xFFFF for ch in name)
    ):
        raise TopologyError(
            f"{kind} {name!r} of {where} cannot be a MariaDB name (at most {MAX_NAME} characters, no NUL, "
            f"no trailing space, no 4-byte UTF-8 character): rename it at the publisher or leave it out of the article"
        )
    return name
