"""The MariaDB dialect (:class:`~airflow_repl.engine.codegen.dialect.Dialect`), for MariaDB and
MySQL subscribers: the generated procedures ``sp_MSins_`` / ``sp_MSupd_`` / ``sp_MSdel_`` of
every call syntax, the ``CALL`` the Distribution Agent runs (generated or custom procedure), the
SQL-statement method's statements, and the DDL of a replicated schema change.

A MariaDB subscriber keeps every table in the database its address names, whatever the
table's schema at the publisher; the procedures are created there too, so a table or a
generated procedure is named alone (a custom procedure written ``schema.name`` is called in the
database ``schema``).  The procedures take the parameters of
:mod:`~airflow_repl.engine.codegen.call_syntax`, with SQL Server's names (``c1``.., ``pkc1``..,
``bitmap``), typed by the type map (:mod:`airflow_repl.engine.mariadb.types`: text is
``utf8mb4`` with the no-pad binary collation of the columns, so keys ``'a'``, ``'A'`` and
``'a '`` stay apart).  A MariaDB statement inside a procedure reads a bare name that is also a
parameter as the parameter, backticks or not, so the bodies name every column in an expression
by its table (```table`.`column```); only the INSERT's column list, which holds nothing but
columns, names them alone.

Update and delete procedures raise SQLSTATE ``RP598`` with error number 20598 (SQL Server's
error) when the key matched no row.  MariaDB's ``ROW_COUNT()`` after an UPDATE counts the rows
changed, not found, unless the client connected with ``CLIENT_FOUND_ROWS``; an update that
matched its row and left it as it was is told apart by looking the key up again.

Names are quoted with backticks (a backtick doubled), which MariaDB reads the same whatever
``sql_mode`` is; string literals are ``'...'`` only when they are printable ASCII without a
backslash, and ``CONVERT(X'hex' USING utf8mb4)`` otherwise (``NO_BACKSLASH_ESCAPES`` and the
connection's character set change nothing).  A name MariaDB cannot hold
(:func:`airflow_repl.engine.mariadb.quoting.check_name`: a 4-byte UTF-8 character such as an
emoji, a trailing space) and columns named alike but for case are refused by
:func:`check_names` before anything is generated.

The script (``airflow-repl script-procs --dialect mariadb``) is for the ``mariadb`` (or
``mysql``) command-line client: it starts with ``SET NAMES utf8mb4`` and changes the client's
statement delimiter to one that occurs nowhere in the procedures, so that a name holding
``;``, ``$$`` or ``//`` cannot end a statement; the comment naming each article shows its names
on one line, as :func:`~airflow_repl.engine.postgres.quoting.comment` writes them.
"""

from __future__ import annotations

import itertools
from typing import Any

from airflow_repl.engine.articles.commands import Command
from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.codegen import call_syntax, dialect
from airflow_repl.engine.errors import ROW_NOT_FOUND_SQLSTATE, TopologyError
from airflow_repl.engine.mariadb import quoting, types
from airflow_repl.engine.model.propagation import OPERATIONS, CallSyntax, Operation
from airflow_repl.engine.postgres.catalog import Column
from airflow_repl.engine.postgres.quoting import comment

#: The ``--dialect`` value.
NAME = "mariadb"
#: The server the procedures are for (its limit on parameters: :data:`call_syntax.MAX_ARGUMENTS`).
SERVER = "MariaDB"
#: The error number the generated procedures raise when a key matched no row (SQL Server's).
ROW_NOT_FOUND_ERRNO = 20598

quote = quoting.ident
qualified = quoting.qualified


literal = quoting.literal


def type_of(pg_type: str) -> str:
    """The MariaDB type of a parameter carrying values of PostgreSQL type ``pg_type``
    (``format_type`` text): the type map's (:func:`airflow_repl.engine.mariadb.types.map_type`,
    as for a column outside the keys), and for a type the map holds only by its kind (an enum, a
    range) or refuses, ``LONGTEXT`` (values travel as their text; the subscription refuses a
    column the map refuses)."""
    try:
        return types.map_type("a procedure parameter", "", pg_type, key=False).ddl
    except TopologyError:
        return f"LONGTEXT {types.TEXT}"


def column_type(column: Column) -> str:
    """The MariaDB type of ``column``'s parameter (a domain's base type, as values travel)."""
    return type_of(column.param_type)


# ---------------------------------------------------------------------- names
def check_names(article: ResolvedArticle) -> None:
    """Refuse an article with a name MariaDB cannot hold (:func:`quoting.check_name`: 64
    characters, no trailing whitespace, no 4-byte UTF-8 character) or with columns named alike but for
    case (MariaDB compares column names ignoring case): one line naming the name and the fix."""
    where = f"article {article.name!r} ({article.destination!r}) at a MariaDB subscriber"
    quoting.check_name("table", article.dest_table, where)
    for op in OPERATIONS:
        if article.propagation[op].generated:
            quoting.check_name(f"{op} procedure", article.default_procs[op], where)
    seen: dict[str, str] = {}
    for c in article.column_names:
        quoting.check_name("column", c, where)
        if (other := seen.setdefault(c.lower(), c)) != c:
            raise TopologyError(
                f"columns {other!r} and {c!r} of {where} differ only in case, which MariaDB's column names "
                f"ignore: {_LEAVE_OUT}"
            )


_LEAVE_OUT = "rename one at the publisher or leave it out of the article (columns:)"


# ---------------------------------------------------------------------- procedures
def _column(article: ResolvedArticle) -> Any:
    """A column in an expression: by its table, never read as a parameter of the same name."""
    table = quote(article.dest_table)
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
        table=quote(article.dest_table),
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
    name = quote(article.default_procs[operation])
    return f"CREATE OR REPLACE PROCEDURE {name}({decl})\nMODIFIES SQL DATA\n" + "\n".join(lines)


def _row_not_found_check(article: ResolvedArticle, operation: Operation, syntax: CallSyntax) -> list[str]:
    """Body lines raising RP598 / 20598 when the statement found no row: a DELETE deleted none;
    an UPDATE changed none and the key is not there (one that found its row but left it as it
    was counts 0 rows)."""
    params = call_syntax.parameters(article, operation, syntax)
    keys = call_syntax.key_placeholders(article, operation, syntax, lambda i: params[i - 1][0])
    col = _column(article)
    where = " AND ".join(f"{col(c)} = {k}" for c, k in zip(article.primary_key, keys, strict=True))
    table = quote(article.dest_table)
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
    parameter style (every ``%`` of a name doubled); bind :func:`call_values`."""
    count = len(call_syntax.parameters(article, operation, article.propagation[operation].call_syntax))
    return f"CALL {_pyformat(procedure_name(article, operation))}({', '.join(['%s'] * count)})"


def call_values(article: ResolvedArticle, operation: Operation, cmd: Command) -> list[Any]:
    """The arguments of :func:`call_sql` for one command: its call syntax's values
    (:func:`call_syntax.values`, PostgreSQL's text) as the type map converts each column's values
    (:func:`airflow_repl.engine.mariadb.types.to_param`: booleans, bytes, timestamps with time
    zone in UTC; a value MariaDB cannot hold stops delivery naming the column), the bitmap as
    its bytes."""
    syntax = article.propagation[operation].call_syntax
    where = f"article {article.name!r} ({article.destination!r}) at a MariaDB subscriber"
    out: list[Any] = []
    for value, (name, _) in zip(
        call_syntax.values(article, cmd, syntax), call_syntax.parameters(article, operation, syntax), strict=True
    ):
        if name == "bitmap":
            out.append(value)
            continue
        # c<k> is column (k - 1) mod n (XCALL's after image follows its before image); pkc<j> key column j
        position = article.pk_positions[int(name[3:]) - 1] if name.startswith("pkc") else int(name[1:]) - 1
        column = article.columns[position % len(article.columns)]
        out.append(types.to_param(types.conversion(column.param_type), value, column.name, where))
    return out


def procedure_name(article: ResolvedArticle, operation: Operation) -> str:
    """The quoted name of the procedure ``operation`` calls at a MariaDB subscriber: in the
    subscriber's database (where its tables are, whatever their schema at the publisher), or, for
    a custom procedure named ``schema.name``, in the database ``schema``."""
    prop = article.propagation[operation]
    schema, name = article.called_procedure(operation)
    return qualified(schema, name) if prop.procedure and "." in prop.procedure else quote(name)


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
        table=_pyformat(quote(article.dest_table)),
        quote=lambda c: _pyformat(quote(c)),
    )


# ---------------------------------------------------------------------- schema changes
def schema_change_sql(before: ResolvedArticle, change: dict[str, Any]) -> list[str]:
    """The statements of a replicated schema change at a MariaDB subscriber (none when the
    changed column is not in the article): ADD, DROP and RENAME COLUMN, and a widening as
    ``MODIFY COLUMN`` with the column's NOT NULL restated.  The column's type is the type map's
    (:func:`airflow_repl.engine.mariadb.types.map_type`: a type it refuses, or a name MariaDB
    cannot hold, is refused naming the column); the value the publisher gave existing rows
    becomes a default that is dropped again.  MariaDB commits before and after each ALTER TABLE
    (its DDL is not transactional)."""
    kind = dialect.schema_change_kind(before, change)
    if kind is None:
        return []
    where = f"article {before.name!r} ({before.destination!r}) at a MariaDB subscriber"
    new = quoting.check_name("column", change["new_name"] if kind == "rename_column" else change["column"], where)
    table, col = quote(before.dest_table), quote(change["column"])
    if kind == "drop_column":
        return [f"ALTER TABLE {table} DROP COLUMN {col}"]
    if kind == "rename_column":
        return [f"ALTER TABLE {table} RENAME COLUMN {col} TO {quote(new)}"]
    keys = {before.column_names[i] for i in before.key_positions}
    typ = types.map_type(
        where,
        change["column"],
        change["type"],
        key=change["column"] in keys,
        key_bytes=_key_room(before, change, where),
    ).ddl
    if kind == "alter_type":
        (old,) = [c for c in before.columns if c.name == change["column"]]
        return [f"ALTER TABLE {table} MODIFY COLUMN {col} {typ}{' NOT NULL' if old.not_null else ' NULL'}"]
    null = " NOT NULL" if change.get("not_null") else " NULL"
    if change.get("existing") is None:
        return [f"ALTER TABLE {table} ADD COLUMN {col} {typ}{null}"]
    default = value_literal(change["type"], change["existing"], change["column"], where)
    return [
        f"ALTER TABLE {table} ADD COLUMN {col} {typ}{null} DEFAULT {default}",
        f"ALTER TABLE {table} ALTER COLUMN {col} DROP DEFAULT",
    ]


def _key_room(before: ResolvedArticle, change: dict[str, Any], where: str) -> int:
    """The bytes of InnoDB's key limit the keys of ``before`` leave the changed column, with its
    new type (:func:`airflow_repl.engine.mariadb.types.key_room`)."""
    names = before.column_names
    keys = [
        [
            types.key_part(
                where,
                names[i],
                change["type"] if names[i] == change["column"] else before.columns[i].param_type,
                None,
            )
            for i in key
        ]
        for key in [before.pk_positions, *before.unique_positions]
        if change["column"] in [names[i] for i in key]
    ]
    return types.key_room(where, keys).get(change["column"], types.KEY_BYTES)


def value_literal(pg_type: str, text: str, column: str, where: str) -> str:
    """A MariaDB literal of the value PostgreSQL writes as ``text`` for type ``pg_type``, as the
    type map converts it (:func:`airflow_repl.engine.mariadb.types.to_param`): ``TRUE`` /
    ``FALSE``, ``X'..'`` for bytes, otherwise a string literal MariaDB converts to the column's
    type (a timestamp with time zone in UTC)."""
    value = types.to_param(types.conversion(pg_type), text, column, where)
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, bytes):
        return f"X'{value.hex().upper()}'"
    return literal(str(value))


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
