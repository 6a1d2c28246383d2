"""The MariaDB dialect (:class:`~airflow_repl.engine.codegen.dialect.Dialect`), for MariaDB and
MySQL subscribers: the generated procedures ``sp_MSins_`` / ``sp_MSupd_`` / ``sp_MSdel_`` of
every call syntax, the ``CALL`` the Distribution Agent runs (generated or custom procedure), the
SQL-statement method's statements, and the DDL of a replicated schema change.

The procedures take the parameters of :mod:`~airflow_repl.engine.codegen.call_syntax`, with SQL
Server's names (``c1``.., ``pkc1``.., ``bitmap``).  A MariaDB statement inside a procedure reads a
bare name that is also a parameter as the parameter, backticks or not, so the bodies name every
column in an expression by its table (```db`.`table`.`column```); only the INSERT's column list,
which holds nothing but columns, names them alone.  Text parameters are ``utf8mb4`` with the
binary collation ``utf8mb4_bin``, so that a key compares as the publisher compares it (``'a'``
and ``'A'`` differ) whatever the database's default collation is.

Update and delete procedures raise SQLSTATE ``RP598`` with error number 20598 (SQL Server's
error) when the key matched no row.  MariaDB's ``ROW_COUNT()`` after an UPDATE counts the rows
changed, not found, unless the client connected with ``CLIENT_FOUND_ROWS``; an update that
matched its row and left it as it was is told apart by looking the key up again.

Names are quoted with backticks (a backtick doubled), which MariaDB reads the same whatever
``sql_mode`` is; string literals are ``'...'`` only when they are printable ASCII without a
backslash, and ``CONVERT(X'hex' USING utf8mb4)`` otherwise (``NO_BACKSLASH_ESCAPES`` and the
connection's character set change nothing).  A name MariaDB cannot hold is refused by
:func:`check_names` before anything is generated: one with a character outside Unicode's Basic
Multilingual Plane (a 4-byte UTF-8 character such as an emoji), one ending in a space or another
ASCII whitespace, and a column named like another one but for case (MariaDB compares column
names ignoring case).  PostgreSQL's 63 bytes are always within MariaDB's 64 characters.

The script (``airflow-repl script-procs --dialect mariadb``) is for the ``mariadb`` (or
``mysql``) command-line client: it starts with ``SET NAMES utf8mb4`` and changes the client's
statement delimiter to one that occurs nowhere in the procedures, so that a name holding
``;``, ``$$`` or ``//`` cannot end a statement; the comment naming each article shows its names
on one line, as :func:`~airflow_repl.engine.postgres.quoting.comment` writes them.
"""

from __future__ import annotations

import itertools
import re
from datetime import datetime, timezone
from typing import Any

from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.codegen import call_syntax, dialect
from airflow_repl.engine.errors import ROW_NOT_FOUND_SQLSTATE, TopologyError
from airflow_repl.engine.model.propagation import OPERATIONS, CallSyntax, Operation
from airflow_repl.engine.postgres.catalog import Column
from airflow_repl.engine.postgres.quoting import comment

#: The ``--dialect`` value.
NAME = "mariadb"
#: The server the procedures are for (its limit on parameters: :data:`call_syntax.MAX_ARGUMENTS`).
SERVER = "MariaDB"
#: The error number the generated procedures raise when a key matched no row (SQL Server's).
ROW_NOT_FOUND_ERRNO = 20598
#: The character set and collation of every text parameter and column this dialect declares.
TEXT = "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
#: MariaDB's limits: DECIMAL's digits and scale, and a VARCHAR's characters in utf8mb4.
MAX_DECIMAL, MAX_SCALE, MAX_VARCHAR = 65, 38, 16383

_FIXED = {
    "smallint": "SMALLINT",
    "integer": "INT",
    "bigint": "BIGINT",
    "boolean": "BOOLEAN",
    "real": "FLOAT",
    "double precision": "DOUBLE",
    "date": "DATE",
    "bytea": "LONGBLOB",
    "uuid": f"CHAR(36) {TEXT}",
    "timestamp without time zone": "DATETIME(6)",
    "timestamp with time zone": "DATETIME(6)",
    "time without time zone": "TIME(6)",
}


def quote(name: str) -> str:
    """A MariaDB quoted identifier (```my ``odd`` name```)."""
    if "\x00" in name:
        raise ValueError("identifiers cannot contain NUL characters")
    return "`" + name.replace("`", "``") + "`"


def qualified(schema: str, name: str) -> str:
    return f"{quote(schema)}.{quote(name)}"


def literal(text: str) -> str:
    """A string literal meaning ``text`` whatever ``sql_mode`` and the connection's character
    set are: ``'it''s'`` when ``text`` is printable ASCII without a backslash, otherwise its UTF-8
    bytes in hexadecimal, converted (``CONVERT(X'C3A9' USING utf8mb4)``)."""
    if "\x00" not in text and text.isascii() and text.isprintable() and "\\" not in text:
        return "'" + text.replace("'", "''") + "'"
    return f"CONVERT(X'{text.encode().hex().upper()}' USING utf8mb4)"


def type_of(pg_type: str) -> str:
    """The MariaDB type of a parameter or column carrying values of PostgreSQL type ``pg_type``
    (``format_type`` text); text, JSON, arrays, ranges and every type without a MariaDB
    counterpart travel as ``LONGTEXT`` in their PostgreSQL text form."""
    if pg_type in _FIXED:
        return _FIXED[pg_type]
    if m := re.fullmatch(r"numeric\((\d+),(-?\d+)\)", pg_type):
        return _decimal(int(m.group(1)), int(m.group(2)))
    if m := re.fullmatch(r"(timestamp|time)\((\d)\) with(out)? time zone", pg_type):
        return f"{'DATETIME' if m.group(1) == 'timestamp' else 'TIME'}({m.group(2)})"
    if m := re.fullmatch(r"character\((\d+)\)", pg_type):
        n = int(m.group(1))
        return f"{'CHAR' if n <= 255 else 'VARCHAR'}({n}) {TEXT}" if n <= MAX_VARCHAR else f"LONGTEXT {TEXT}"
    if (m := re.fullmatch(r"character varying\((\d+)\)", pg_type)) and int(m.group(1)) <= MAX_VARCHAR:
        return f"VARCHAR({m.group(1)}) {TEXT}"
    if pg_type == "numeric":
        return f"DECIMAL({MAX_DECIMAL},30)"
    return f"LONGTEXT {TEXT}"


def _decimal(precision: int, scale: int) -> str:
    """MariaDB's DECIMAL holding the digits of PostgreSQL's numeric(precision, scale), whose
    scale may be negative or above the precision: the same digits on each side of the point;
    DECIMAL(65,30) beyond MariaDB's 65 digits or 38 decimals."""
    whole, fraction = max(precision - scale, 0), max(scale, 0)
    if whole + fraction > MAX_DECIMAL or fraction > MAX_SCALE:
        return f"DECIMAL({MAX_DECIMAL},30)"
    return f"DECIMAL({whole + fraction},{fraction})"


def column_type(column: Column) -> str:
    """The MariaDB type of ``column``'s parameter (a domain's base type, as values travel)."""
    return type_of(column.param_type)


# ---------------------------------------------------------------------- names
def _hazard(name: str) -> str | None:
    """Why MariaDB cannot hold ``name`` as a database, table, column or procedure name, or None."""
    if any(ord(c) > 0xFFFF for c in name):
        return "a character outside Unicode's Basic Multilingual Plane (MariaDB names hold none, such as emoji)"
    if name[-1:] in (" ", "\t", "\n", "\x0b", "\x0c", "\r"):
        return "a space or line break at its end (MariaDB refuses such a name)"
    return None


def check_names(article: ResolvedArticle) -> None:
    """Refuse an article with a name MariaDB cannot hold (see the module's docstring): one line
    naming the article, the name and the fix."""
    key = set(article.primary_key)
    fix_destination = "give the article another destination"
    names = [
        ("its destination schema", article.dest_schema, fix_destination),
        ("its destination table", article.dest_table, fix_destination),
        *[
            ("its key column" if c in key else "its column", c, "rename the column" if c in key else _LEAVE_OUT)
            for c in article.column_names
        ],
        *[
            (f"its {op} procedure", article.default_procs[op], fix_destination)
            for op in OPERATIONS
            if article.propagation[op].generated
        ],
    ]
    for what, name, fix in names:
        if hazard := _hazard(name):
            raise _refusal(article, f"{what} {comment(name)} holds {hazard}; {fix}")
    seen: dict[str, str] = {}
    for c in article.column_names:
        if (other := seen.setdefault(c.lower(), c)) != c:
            raise _refusal(
                article,
                f"its columns {comment(other)} and {comment(c)} differ only in case, and MariaDB compares column "
                f"names ignoring case; {_LEAVE_OUT}",
            )


_LEAVE_OUT = "leave the column out (columns:) or rename it"


def _refusal(article: ResolvedArticle, why: str) -> TopologyError:
    return TopologyError(f"article {comment(article.name)} cannot be replicated to MariaDB: {why}")


# ---------------------------------------------------------------------- procedures
def _column(article: ResolvedArticle) -> Any:
    """A column in an expression: by its table, never read as a parameter of the same name."""
    table = qualified(article.dest_schema, article.dest_table)
    return lambda name: f"{table}.{quote(name)}"


def _flagged(bitmap: str, i: int) -> str:
    """Column ``i`` (0-based) is flagged in ``bitmap``: bit 2^(i % 8) of byte i // 8 + 1."""
    return f"ASCII(SUBSTRING({bitmap}, {i // 8 + 1}, 1)) & {1 << (i % 8)} <> 0"


def _body_statement(article: ResolvedArticle, operation: Operation, syntax: CallSyntax) -> str:
    """The statement a procedure runs, naming its parameters (``c1``, ``pkc1``, ``bitmap``)."""
    params = call_syntax.parameters(article, operation, syntax)
    return call_syntax.statement(
        article,
        operation,
        syntax,
        lambda i: params[i - 1][0],
        table=qualified(article.dest_schema, article.dest_table),
        quote=quote,
        column=_column(article),
        flagged=_flagged,
    )


def procedure_sql(article: ResolvedArticle, operation: Operation) -> str | None:
    """``CREATE OR REPLACE PROCEDURE`` of the generated procedure for ``operation`` (one
    statement, as a driver sends it), or None when the operation uses no generated procedure
    (SQL, NONE or a custom procedure).  Refused (:func:`check_names`) for a name MariaDB cannot
    hold."""
    prop = article.propagation[operation]
    if not prop.generated:
        return None
    check_names(article)
    syntax = prop.call_syntax
    params = call_syntax.parameters(article, operation, syntax)
    decl = ", ".join(f"IN {p} {type_of(t)}" for p, t in params)
    lines = [f"-- {syntax} syntax: {', '.join(p for p, _ in params)}", "BEGIN"]
    if operation != Operation.INSERT:
        lines.append("    DECLARE msg TEXT;")
    lines.append(f"    {_body_statement(article, operation, syntax)};")
    if operation != Operation.INSERT:
        lines += _row_not_found_check(article, operation, syntax)
    lines.append("END")
    name = qualified(article.dest_schema, article.default_procs[operation])
    return f"CREATE OR REPLACE PROCEDURE {name}({decl})\nMODIFIES SQL DATA\n" + "\n".join(lines)


def _row_not_found_check(article: ResolvedArticle, operation: Operation, syntax: CallSyntax) -> list[str]:
    """Body lines raising RP598 / 20598 when the statement found no row: a DELETE deleted none;
    an UPDATE changed none and the key is not there (one that found its row but left it as it
    was counts 0 rows)."""
    params = call_syntax.parameters(article, operation, syntax)
    keys = call_syntax.key_placeholders(article, operation, syntax, lambda i: params[i - 1][0])
    col = _column(article)
    where = " AND ".join(f"{col(c)} = {k}" for c, k in zip(article.primary_key, keys, strict=True))
    table = qualified(article.dest_schema, article.dest_table)
    message = (
        f"CONCAT('row not found at the subscriber: {operation} of ', {literal(article.destination)}, "
        f"' with key (', {literal(', '.join(article.primary_key))}, ')=(', CONCAT_WS(', ', {', '.join(keys)}), "
        f"') matched no row [20598]')"
    )
    signal = [
        f"SET msg = LEFT({message}, 128);",
        f"SIGNAL SQLSTATE {literal(ROW_NOT_FOUND_SQLSTATE)} SET MYSQL_ERRNO = {ROW_NOT_FOUND_ERRNO}, MESSAGE_TEXT = msg;",
    ]
    if operation == Operation.DELETE:  # a DELETE counts the rows it found
        return ["    IF ROW_COUNT() = 0 THEN", *(f"        {s}" for s in signal), "    END IF;"]
    return [
        "    IF ROW_COUNT() = 0 THEN",
        f"        IF NOT EXISTS (SELECT 1 FROM {table} WHERE {where}) THEN",
        *(f"            {s}" for s in signal),
        "        END IF;",
        "    END IF;",
    ]


def _pyformat(text: str) -> str:
    """``text`` (generated SQL without placeholders) with each ``%`` doubled, as a driver with
    the ``format`` parameter style (PyMySQL) reads it when given parameters."""
    return text.replace("%", "%%")


def call_sql(article: ResolvedArticle, operation: Operation) -> str:
    """``CALL `db`.`procedure`(%s, ...)``: the call of the procedure ``operation`` uses
    (generated or custom), one ``%s`` per parameter of its call syntax, in PyMySQL's ``format``
    parameter style (every ``%`` of a name doubled); bind :func:`call_syntax.values`."""
    schema, name = article.called_procedure(operation)
    count = len(call_syntax.parameters(article, operation, article.propagation[operation].call_syntax))
    return f"CALL {_pyformat(qualified(schema, name))}({', '.join(['%s'] * count)})"


def statement_sql(article: ResolvedArticle, operation: Operation) -> str:
    """The SQL-statement method's INSERT, UPDATE or DELETE, with the ``CALL`` syntax's
    parameters as ``%s`` in PyMySQL's ``format`` style (bind :func:`call_syntax.values` with
    ``CallSyntax.CALL``).  The caller tells a row not found by the rows the UPDATE or DELETE
    found."""
    return call_syntax.statement(
        article,
        operation,
        CallSyntax.CALL,
        lambda i: "%s",
        table=_pyformat(qualified(article.dest_schema, article.dest_table)),
        quote=lambda c: _pyformat(quote(c)),
    )


# ---------------------------------------------------------------------- schema changes
def schema_change_sql(before: ResolvedArticle, change: dict[str, Any]) -> list[str]:
    """The statements of a replicated schema change at a MariaDB subscriber (none when the
    changed column is not in the article): ADD, DROP and RENAME COLUMN, and a widening as
    ``MODIFY COLUMN`` with the column's NOT NULL restated.  The new column's type is
    :func:`type_of` the publisher's; the value the publisher gave existing rows becomes a default
    that is dropped again.  MariaDB commits before and after each ALTER TABLE (its DDL is not
    transactional)."""
    kind = dialect.schema_change_kind(before, change)
    if kind is None:
        return []
    new = change["new_name"] if kind == "rename_column" else change["column"]
    if hazard := _hazard(new):
        raise _refusal(before, f"its new column {comment(new)} holds {hazard}; name the column otherwise")
    table, col = qualified(before.dest_schema, before.dest_table), quote(change["column"])
    if kind == "drop_column":
        return [f"ALTER TABLE {table} DROP COLUMN {col}"]
    if kind == "rename_column":
        return [f"ALTER TABLE {table} RENAME COLUMN {col} TO {quote(new)}"]
    typ = type_of(change["type"])
    if kind == "alter_type":
        (old,) = [c for c in before.columns if c.name == change["column"]]
        return [f"ALTER TABLE {table} MODIFY COLUMN {col} {typ}{' NOT NULL' if old.not_null else ' NULL'}"]
    null = " NOT NULL" if change.get("not_null") else " NULL"
    if change.get("existing") is None:
        return [f"ALTER TABLE {table} ADD COLUMN {col} {typ}{null}"]
    default = value_literal(change["type"], change["existing"])
    return [
        f"ALTER TABLE {table} ADD COLUMN {col} {typ}{null} DEFAULT {default}",
        f"ALTER TABLE {table} ALTER COLUMN {col} DROP DEFAULT",
    ]


def value_literal(pg_type: str, text: str) -> str:
    """A MariaDB literal of the value PostgreSQL writes as ``text`` for type ``pg_type``:
    ``TRUE``/``FALSE`` for a boolean, ``X'..'`` for bytea, a timestamp with time zone in UTC,
    and otherwise the text itself, which MariaDB converts to the column's type."""
    if pg_type == "boolean":
        return "TRUE" if text == "t" else "FALSE"
    if pg_type == "bytea" and text.startswith("\\x"):
        return f"X'{text[2:].upper()}'"
    if pg_type.startswith("timestamp") and pg_type.endswith("with time zone"):
        try:
            moment = datetime.fromisoformat(text).astimezone(timezone.utc).replace(tzinfo=None)
        except ValueError:  # infinity, a BC date: MariaDB refuses it as it is
            return literal(text)
        return literal(moment.isoformat(sep=" "))
    return literal(text)


# ---------------------------------------------------------------------- the script
def article_header(article: ResolvedArticle) -> str:
    """The comment line that opens an article's procedures in a script: its name, its table and
    its destination, each as :func:`~airflow_repl.engine.postgres.quoting.comment` writes it."""
    return f"-- article {comment(article.name)}: {comment(article.table.qualified)} -> {comment(article.destination)}\n"


def _delimiter(texts: list[str]) -> str:
    """A statement delimiter for the client that occurs in none of ``texts``."""
    joined = "\n".join(texts)
    candidates = itertools.chain(["//", "$$", ";;"], (f"$${n}$$" for n in itertools.count(1)))
    return next(c for c in candidates if c not in joined)


def publication_script(articles: list[ResolvedArticle]) -> str:
    """The generated procedures of every article for the ``mariadb`` client, each article's
    under its header (``airflow-repl script-procs --dialect mariadb``); every article's names are
    checked before any is scripted."""
    for article in articles:
        check_names(article)
    blocks = [(a, [sql for op in OPERATIONS if (sql := procedure_sql(a, op))]) for a in articles]
    delimiter = _delimiter([sql for _, procs in blocks for sql in procs])
    out = ["SET NAMES utf8mb4;\n"]
    for article, procs in blocks:
        out.append(article_header(article))
        if procs:
            out.append(f"DELIMITER {delimiter}\n" + "".join(f"{sql}\n{delimiter}\n" for sql in procs) + "DELIMITER ;\n")
        out.append("\n")
    return "".join(out)
