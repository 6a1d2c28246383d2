"""Schema changes that can be replicated: parsing and checking the DDL statement a user asks
``airflow-repl schema-change`` to run at the publisher.

A statement is parsed with PostgreSQL's own parser (:mod:`pglast`, libpg_query) and accepted
only when it is exactly one of the supported changes of one table:

* ``ALTER TABLE t ADD [COLUMN] c type [DEFAULT expr] [NOT NULL | NULL]``
* ``ALTER TABLE t DROP [COLUMN] c [RESTRICT]``
* ``ALTER TABLE t RENAME [COLUMN] c TO d``
* ``ALTER TABLE t ALTER [COLUMN] c [SET DATA] TYPE wider_type`` (no ``USING``)

Anything else (several statements, several changes in one ALTER TABLE, IF [NOT] EXISTS,
constraints, identity or generated columns, COLLATE, CASCADE, USING) is refused before anything
runs, with the list of what is supported.  What the statement is allowed to do to a type is
checked by :func:`is_widening` once PostgreSQL has resolved the new type.

The statement that runs is PostgreSQL's own deparsed form of the parsed tree
(:attr:`SchemaStatement.sql`), never the user's text itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Any

from pglast import ast, parse_sql
from pglast.enums import AlterTableType, ConstrType, DropBehavior, ObjectType
from pglast.parser import ParseError
from pglast.stream import RawStream

from airflow_repl.engine.errors import TopologyError

SUPPORTED = (
    "ALTER TABLE t ADD [COLUMN] c type [DEFAULT expr] [NOT NULL]; "
    "ALTER TABLE t DROP [COLUMN] c; "
    "ALTER TABLE t RENAME [COLUMN] c TO d; "
    "ALTER TABLE t ALTER [COLUMN] c TYPE wider_type (int -> bigint, varchar(n) -> varchar(m >= n) or text, ...)"
)


#: The placeholders a registered SQL script (``airflow-repl register-script``) may use, each
#: replaced by quoted SQL text of the article at the subscriber: ``{{table}}`` and so on.
SCRIPT_PLACEHOLDERS = ("schema", "table", "columns", "proc_ins", "proc_upd", "proc_del")


class SchemaChangeError(TopologyError):
    """A schema change that cannot be replicated; nothing was changed."""


class ChangeKind(str, Enum):
    ADD_COLUMN = "add_column"
    DROP_COLUMN = "drop_column"
    RENAME_COLUMN = "rename_column"
    ALTER_TYPE = "alter_type"


@dataclass(frozen=True)
class SchemaStatement:
    """One supported schema change, as parsed."""

    kind: ChangeKind
    schema: str | None  # None: the table was named without a schema
    table: str
    column: str
    new_name: str | None = None  # RENAME: the column's new name
    has_default: bool = False  # ADD: with a DEFAULT
    not_null: bool = False  # ADD: NOT NULL
    sql: str = ""  # the statement to run: PostgreSQL's deparsed form of what was parsed


def _refuse(statement: str, why: str) -> SchemaChangeError:
    shown = " ".join(statement.split())
    shown = shown if len(shown) <= 120 else shown[:117] + "..."
    return SchemaChangeError(f"schema change {shown!r} cannot be replicated: {why}; supported: {SUPPORTED}")


def parse_statement(statement: str) -> SchemaStatement:
    """The one supported change ``statement`` makes (SchemaChangeError otherwise)."""
    try:
        stmts = parse_sql(statement)
    except ParseError as exc:
        raise _refuse(statement, f"it does not parse ({exc})") from None
    if len(stmts) != 1:
        raise _refuse(statement, f"it holds {len(stmts)} statements, not one")
    node = stmts[0].stmt
    if isinstance(node, ast.RenameStmt):
        return _rename(statement, node)
    if not isinstance(node, ast.AlterTableStmt) or node.objtype != ObjectType.OBJECT_TABLE:
        raise _refuse(statement, f"it is a {type(node).__name__}, not an ALTER TABLE")
    if node.missing_ok:
        raise _refuse(statement, "ALTER TABLE IF EXISTS is not supported (name a published table)")
    cmds = node.cmds or ()
    if len(cmds) != 1:
        raise _refuse(statement, f"it makes {len(cmds)} changes; make one change per statement")
    cmd = cmds[0]
    schema, table = _relation(node.relation)
    handlers = {
        AlterTableType.AT_AddColumn: _add,
        AlterTableType.AT_DropColumn: _drop,
        AlterTableType.AT_AlterColumnType: _alter_type,
    }
    handler = handlers.get(cmd.subtype)
    if handler is None:
        raise _refuse(statement, f"{cmd.subtype.name.removeprefix('AT_')} is not a supported change")
    kind, column, extra = handler(statement, cmd)
    return SchemaStatement(kind, schema, table, column, sql=RawStream()(node), **extra)


def _relation(rel: Any) -> tuple[str | None, str]:
    return (rel.schemaname or None, rel.relname)


def _rename(statement: str, node: Any) -> SchemaStatement:
    if node.renameType != ObjectType.OBJECT_COLUMN or node.relationType != ObjectType.OBJECT_TABLE:
        raise _refuse(statement, "only a column of a table can be renamed")
    if node.missing_ok:
        raise _refuse(statement, "ALTER TABLE IF EXISTS is not supported (name a published table)")
    schema, table = _relation(node.relation)
    return SchemaStatement(
        ChangeKind.RENAME_COLUMN, schema, table, node.subname, new_name=node.newname, sql=RawStream()(node)
    )


def _add(statement: str, cmd: Any) -> tuple[ChangeKind, str, dict[str, Any]]:
    col = cmd.def_
    if cmd.missing_ok:
        raise _refuse(statement, "ADD COLUMN IF NOT EXISTS is not supported")
    if col.collClause is not None:
        raise _refuse(statement, "COLLATE is not supported on an added column")
    if col.identity not in (None, "", "\x00") or col.generated not in (None, "", "\x00") or col.typeName.setof:
        raise _refuse(statement, "identity and generated columns are not supported")
    has_default, not_null = False, False
    for con in col.constraints or ():
        if con.contype == ConstrType.CONSTR_DEFAULT:
            has_default = True
        elif con.contype == ConstrType.CONSTR_NOTNULL:
            not_null = True
        elif con.contype != ConstrType.CONSTR_NULL:
            name = con.contype.name.removeprefix("CONSTR_")
            raise _refuse(statement, f"a {name} constraint on the added column is not supported (add it separately)")
    return ChangeKind.ADD_COLUMN, col.colname, {"has_default": has_default, "not_null": not_null}


def _drop(statement: str, cmd: Any) -> tuple[ChangeKind, str, dict[str, Any]]:
    if cmd.missing_ok:
        raise _refuse(statement, "DROP COLUMN IF EXISTS is not supported")
    if cmd.behavior == DropBehavior.DROP_CASCADE:
        raise _refuse(statement, "DROP COLUMN ... CASCADE is not supported")
    return ChangeKind.DROP_COLUMN, cmd.name, {}


def _alter_type(statement: str, cmd: Any) -> tuple[ChangeKind, str, dict[str, Any]]:
    col = cmd.def_
    if col.raw_default is not None:
        raise _refuse(statement, "a type change with USING is not supported (only widening changes)")
    if col.collClause is not None:
        raise _refuse(statement, "a type change with COLLATE is not supported")
    return ChangeKind.ALTER_TYPE, cmd.name, {}


# ---------------------------------------------------------------------- widening type changes
_INT_RANK = {"smallint": 1, "integer": 2, "bigint": 3}
_FLOAT_RANK = {"real": 1, "double precision": 2}
_VARCHAR = re.compile(r"^character varying(?:\((\d+)\))?$")
_NUMERIC = re.compile(r"^numeric(?:\((\d+),(\d+)\))?$")


def is_widening(old: str, new: str) -> bool:
    """Whether changing a column from type ``old`` to ``new`` (``format_type`` texts) keeps
    every value and its text form: integers to wider integers or to numeric, ``real`` to
    ``double precision``, ``varchar(n)`` to a longer varchar or text, ``numeric(p,s)`` to more
    digits of the same scale or to unconstrained numeric.  The same type is not a change."""
    if old == new:
        return False
    if old in _INT_RANK:
        return (new in _INT_RANK and _INT_RANK[new] > _INT_RANK[old]) or new == "numeric"
    if old in _FLOAT_RANK:
        return new in _FLOAT_RANK and _FLOAT_RANK[new] > _FLOAT_RANK[old]
    if (m := _VARCHAR.match(old)) is not None:
        if new == "text":
            return True
        n = _VARCHAR.match(new)
        return n is not None and (n.group(1) is None or (m.group(1) is not None and int(n.group(1)) >= int(m.group(1))))
    if (m := _NUMERIC.match(old)) is not None and m.group(1) is not None:
        n = _NUMERIC.match(new)
        if n is None:
            return False
        if n.group(1) is None:
            return True
        same_scale = int(n.group(2)) == int(m.group(2))
        return same_scale and int(n.group(1)) >= int(m.group(1))
    return False


def referenced_columns(expression: str) -> set[str]:
    """The column names a row-filter expression (PostgreSQL's deparsed text) reads."""
    tree = parse_sql(f"SELECT 1 WHERE {expression}")
    found: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, ast.ColumnRef):
            names = [str(f.sval) for f in node.fields or () if isinstance(f, ast.String)]
            if names:
                found.add(names[-1])
        if isinstance(node, ast.Node):
            for attr in node:
                visit(getattr(node, attr))
        elif isinstance(node, tuple):
            for item in node:
                visit(item)

    visit(tree[0].stmt)
    return found
