"""Generated scripts hold exactly the statements they should, whatever the names hold.

Random identifiers of every hostile kind PostgreSQL allows (line breaks, quotes, brackets,
``go``, ``--``, ``/*``, ``*/``, dollar quotes, backslashes, ``%``, 63-byte and non-ASCII names)
name schemas, tables, columns, articles and destinations.  Every script the engine writes for
them is read back by a real parser: PostgreSQL's own (``pglast``, libpg_query) for the PL/pgSQL
procedures, their bodies and the statements in them, the types, the updating triggers and the
snapshot's table scripts; ``sqlglot``'s T-SQL grammar for the T-SQL script, plus what it does not
check: the batches a ``go``-splitting client (sqlcmd, SSMS) makes, non-empty SET lists, SQL
Server's type sizes and parameter limit; ``sqlglot``'s MySQL tokenizer and grammar for the
MariaDB procedures and the statements in them, after the statements the ``mariadb`` client makes
of the script (its quotes, comments, ``DELIMITER`` lines and backslash commands; the integration
test ``test_mariadb_procedures`` runs the same kind of script through the real client).  A
script holding anything more, or less, than its statements (an injected one, a split batch, a
misplaced name) fails.
"""

from __future__ import annotations

import re
from typing import Any

import pglast
import pglast.visitors
import pytest
import sqlglot
from article_builder import article
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pglast import ast
from sqlglot import exp
from sqlglot.errors import ErrorLevel

from airflow_repl.engine.agents import snapshot_folder
from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.codegen import (
    call_syntax,
    immediate_triggers,
    key_enforcement,
    mariadb,
    procedures,
    queue_triggers,
    tsql_script,
    updating_scripts,
    user_types,
)
from airflow_repl.engine.errors import TopologyError
from airflow_repl.engine.model.propagation import OPERATIONS, Operation
from airflow_repl.engine.postgres.catalog import Column, TableInfo
from airflow_repl.engine.postgres.quoting import comment, dollar_quote, ident, literal, qualified

# ---------------------------------------------------------------------- hostile names
HOSTILE = [
    *["\n", "\r\n", "\r", "\u2028", "\x85", "\x0b", "\t", "\ngo\n", "\nGO 2\n", "go", "--", "/*", "*/", ";"],
    *["'", '"', "''", "[", "]", "]]", "\\", "\\'", "E'", "U&", "$$", "$airflow_repl$", "$1", "$(x)", "%", "%1$L"],
    *[":x", ":'x'", "\\! echo injected", "SELECT 'injected'; --", "@c1", "pkc1", "bitmap", " ", "é", "名", "😀"],
]
FRAGMENT = st.one_of(
    st.sampled_from(HOSTILE),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=6),
)


def _fit(name: str) -> str:
    """At most 63 bytes (PostgreSQL's limit), cut at a character; never empty."""
    return name.encode()[:63].decode(errors="ignore") or "x"


@st.composite
def identifiers(draw: Any, fragment: st.SearchStrategy[str] = FRAGMENT) -> str:
    name = "".join(draw(st.lists(fragment, min_size=1, max_size=6)))
    if draw(st.integers(0, 4)) == 0:
        name += "x" * 63  # a 63-byte name
    return _fit(name)


def _tsql_safe(name: str) -> str:
    """``name`` without what the T-SQL script refuses (see :func:`tsql_hazard`)."""
    while True:
        cleaned = "".join(c for c in name if c not in "'\"" and (c + "x").splitlines() == [c + "x"])
        cleaned = cleaned.replace("/*", "/").replace("$(", "$")
        if cleaned == name:
            return name or "x"
        name = cleaned


TSQL_SAFE = identifiers().map(_tsql_safe)
TYPES = [
    ("integer", None),
    ("text", None),
    ("character(5000)", None),
    ("character(12)", None),
    ("character varying(4001)", None),
    ("numeric(3,5)", None),
    ("numeric(5,-2)", None),
    ("numeric(40,2)", None),
    ("numeric(12,2)", None),
    ("bytea", None),
    ("timestamp(3) with time zone", None),
    ("integer[]", None),
    ('"odd ""schema"""."my\ntype"', None),  # a user type, as format_type quotes it
    ('"pub"."posint"', "integer"),  # a domain: its base type travels
]


@st.composite
def articles(draw: Any, names: st.SearchStrategy[str] | None = None) -> ResolvedArticle:
    names = identifiers() if names is None else names
    n = draw(st.integers(1, 6))
    columns = draw(st.lists(names, min_size=n, max_size=n, unique=True))
    types = [draw(st.sampled_from(TYPES)) for _ in columns]
    key = draw(st.permutations(columns))[: draw(st.integers(1, n))]  # in any order
    table = TableInfo(
        draw(names),
        draw(names),
        1,
        [Column(c, t, c in key, 0, base_type=base) for c, (t, base) in zip(columns, types, strict=True)],
        key,
    )
    same = draw(st.booleans())
    return article(
        table,
        name=table.name if same else draw(names),
        dest_schema=table.schema if same else draw(names),
        dest_table=table.name if same else draw(names),
        insert=draw(st.sampled_from(["CALL", "SQL", "NONE"])),
        update=draw(st.sampled_from(["CALL", "SCALL", "MCALL", "XCALL", "SQL", "NONE"])),
        delete=draw(st.sampled_from(["CALL", "XCALL", "SQL", "NONE"])),
    )


PROPERTY = settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------------- PostgreSQL helpers
def _statements(script: str) -> list[Any]:
    return [raw.stmt for raw in pglast.parse_sql(script)]


def _names(strings: Any) -> list[str]:
    return [s.sval for s in strings]


def _literals(line: str) -> list[str]:
    """The values of the string literals in a comment line, read back by PostgreSQL's parser."""
    found = re.findall(r"E?'(?:[^']|'')*'", line)
    (select,) = _statements("SELECT " + ", ".join(found))
    return [target.val.val.sval for target in select.targetList]


def _plpgsql(stmt: ast.CreateFunctionStmt | ast.DoStmt) -> dict[str, Any]:
    """The PL/pgSQL tree of a function's or a DO block's body as the script holds it: its top
    block.  (The body is compiled in a stand-in function whose parameters are text: libpg_query
    resolves no type outside pg_catalog and public, and the bodies refer to parameters by
    position.)"""
    options = stmt.args if isinstance(stmt, ast.DoStmt) else stmt.options
    (body,) = [o.arg.sval if isinstance(o.arg, ast.String) else o.arg[0].sval for o in options if o.defname == "as"]
    params = ", ".join(f"{ident(p.name)} text" for p in getattr(stmt, "parameters", None) or ())
    tree = pglast.parse_plpgsql(f"CREATE PROCEDURE f({params}) LANGUAGE plpgsql AS {dollar_quote(body)}")
    return tree[0]["PLpgSQL_function"]["action"]["PLpgSQL_stmt_block"]


def _query(stmt: dict[str, Any]) -> str:
    (kind,) = stmt
    return stmt[kind]["sqlstmt"]["PLpgSQL_expr"]["query"] if kind == "PLpgSQL_stmt_execsql" else ""


def _columns_of(node: Any) -> set[str]:
    """Every column a statement's expression names (the last field of each column reference)."""
    found: set[str] = set()

    class Visitor(pglast.visitors.Visitor):
        def visit_ColumnRef(self, ancestors: Any, ref: ast.ColumnRef) -> None:
            found.add(ref.fields[-1].sval)

    Visitor()(node)
    return found


def _check_procedure(art: ResolvedArticle, op: Operation, stmt: ast.CreateFunctionStmt) -> None:
    """One generated procedure: its name, parameters and body, down to the statement it runs."""
    syntax = art.propagation[op].call_syntax
    assert stmt.is_procedure and _names(stmt.funcname) == [art.dest_schema, art.default_procs[op]]
    assert [p.name for p in stmt.parameters] == [p for p, _ in call_syntax.parameters(art, op, syntax)]
    body = _plpgsql(stmt)["body"]
    (dml,) = _statements(_query(body[0]))
    assert (dml.relation.schemaname, dml.relation.relname) == (art.dest_schema, art.dest_table)
    names, key = art.column_names, set(art.primary_key)
    if op == Operation.INSERT:
        assert isinstance(dml, ast.InsertStmt) and [c.name for c in dml.cols] == names
        assert len(body) == 2  # and RETURN
        return
    if op == Operation.UPDATE:
        assert isinstance(dml, ast.UpdateStmt) and [t.name for t in dml.targetList] == names
    else:
        assert isinstance(dml, ast.DeleteStmt)
    assert _columns_of(dml.whereClause) == key
    raise_ = body[1]["PLpgSQL_stmt_if"]["then_body"][0]["PLpgSQL_stmt_raise"]
    (message,) = _statements("SELECT " + raise_["options"][1]["PLpgSQL_raise_option"]["expr"]["PLpgSQL_expr"]["query"])
    args = message.targetList[0].val.args
    assert [a.val.sval for a in args[1:3]] == [art.destination, ", ".join(art.primary_key)]


def _unless_partitioned(do: ast.DoStmt, dest: list[str]) -> tuple[list[Any], list[Any]]:
    """The statements of a snapshot script's DO block that runs one set of statements on the
    subscriber table ``dest`` when it is a partitioned table the subscriber keeps, and another
    otherwise: the IF's condition names ``dest`` and nothing else, and each branch holds only
    plain statements (parsed again here)."""
    (if_stmt,) = [s["PLpgSQL_stmt_if"] for s in _plpgsql(do)["body"] if "PLpgSQL_stmt_if" in s]
    (select,) = _statements("SELECT " + if_stmt["cond"]["PLpgSQL_expr"]["query"])
    assert {c.val.sval for c in _constants(select) if isinstance(c.val, ast.String)} == {qualified(*dest), "p"}

    def branch(body: list[dict[str, Any]]) -> list[Any]:
        assert all(set(s) == {"PLpgSQL_stmt_execsql"} for s in body), body
        return [
            stmt for s in body for stmt in _statements(s["PLpgSQL_stmt_execsql"]["sqlstmt"]["PLpgSQL_expr"]["query"])
        ]

    return branch(if_stmt.get("then_body", [])), branch(if_stmt.get("else_body", []))


# ---------------------------------------------------------------------- PL/pgSQL scripts
@PROPERTY
@given(articles())
def test_the_postgresql_procedure_script_holds_exactly_its_procedures(art):
    script = procedures.publication_script([art])
    generated = [op for op in OPERATIONS if art.propagation[op].generated]
    stmts = _statements(script)
    assert [type(s) for s in stmts] == [ast.CreateFunctionStmt] * len(generated)
    for op, stmt in zip(generated, stmts, strict=True):
        _check_procedure(art, op, stmt)
    header, _, _ = script.partition("\n")
    assert _literals(header) == [art.name, art.table.qualified, art.destination]


@PROPERTY
@given(articles())
def test_the_snapshot_and_updating_scripts_hold_exactly_their_statements(art):
    dest, source = [art.dest_schema, art.dest_table], [art.table.schema, art.table.name]
    create_schema, do = _statements(snapshot_folder.schema_script(art))
    assert create_schema.schemaname == art.dest_schema
    (truncate,), (drop, create) = _unless_partitioned(do, dest)
    assert [truncate.relations[0].schemaname, truncate.relations[0].relname] == dest
    assert _names(drop.objects[0]) == dest
    assert [c.colname for c in create.tableElts] == art.column_names
    (do,) = _statements(snapshot_folder.keys_script(art))
    kept, (keys, *_) = _unless_partitioned(do, dest)
    assert not kept
    assert [keys.relation.schemaname, keys.relation.relname] == dest
    assert [k.sval for k in keys.cmds[0].def_.keys] == art.primary_key

    column, default, _schema, function, drop_trigger, trigger = _statements(updating_scripts.row_version_script(art))
    for stmt in (column, default, trigger):
        assert [stmt.relation.schemaname, stmt.relation.relname] == dest
    assert isinstance(function, ast.CreateFunctionStmt) and _names(drop_trigger.objects[0])[:2] == dest

    table = qualified(art.dest_schema, art.dest_table)
    (do,) = _statements(key_enforcement.enforce_deferrable_keys_script(table))
    loop = _plpgsql(do)["body"][0]["PLpgSQL_stmt_fors"]["query"]["PLpgSQL_expr"]["query"]
    (select,) = _statements(loop)
    assert {c.val.sval for c in _constants(select.whereClause) if isinstance(c.val, ast.String)} >= {table}

    _drop_row, _drop_commit, row, commit = _statements(immediate_triggers.install(art).as_string(None))
    assert [row.relation.schemaname, row.relation.relname] == dest and commit.isconstraint
    publication, label, insert, update, delete, key_array, article = (a.sval for a in row.args)
    assert (publication, label, article) == (art.publication, qualified(*source), art.name)
    for template, count in ((insert, 1), (update, 2), (delete, 2)):  # run at the publisher
        stmts = _statements(_format(template))
        assert len(stmts) == count
        assert _tables_of(stmts) == {tuple(source)}
    (keys_back,) = _statements(f"SELECT {literal(key_array)}::text[]")
    assert _array(keys_back) == art.primary_key

    _drop_queue, queue = _statements(queue_triggers.install(art).as_string(None))
    assert [queue.relation.schemaname, queue.relation.relname] == dest
    assert [a.sval for a in queue.args] == [art.publication, art.name]


def _constants(node: Any) -> list[ast.A_Const]:
    found: list[ast.A_Const] = []

    class Visitor(pglast.visitors.Visitor):
        def visit_A_Const(self, ancestors: Any, const: ast.A_Const) -> None:
            found.append(const)

    Visitor()(node)
    return found


def _tables_of(stmts: list[Any]) -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()

    class Visitor(pglast.visitors.Visitor):
        def visit_RangeVar(self, ancestors: Any, rv: ast.RangeVar) -> None:
            if rv.schemaname is not None:
                found.add((rv.schemaname, rv.relname))

    for stmt in stmts:
        Visitor()(stmt)
    return found


def _format(template: str) -> str:
    """What PostgreSQL's ``format(template, '{}', '{}')`` returns; refuses any other directive."""

    def directive(m: re.Match[str]) -> str:
        assert m.group(1) in ("%", "1$L", "2$L"), m.group(0)
        return "%" if m.group(1) == "%" else "'{}'"

    return re.sub(r"%(%|\d\$L|.?)", directive, template)


def _array(select: ast.SelectStmt) -> list[str]:
    """The elements of ``SELECT '<array literal>'::text[]``, as PostgreSQL's array input reads them."""
    text = select.targetList[0].val.arg.val.sval
    out, item, quoted, escaped = [], "", False, False
    for c in text[1:-1]:
        if escaped:
            item, escaped = item + c, False
        elif c == "\\":
            escaped = True
        elif c == '"':
            quoted = not quoted
        elif c == "," and not quoted:
            out, item = [*out, item], ""
        else:
            item += c
    return [*out, item] if text != "{}" else []


@PROPERTY
@given(
    st.lists(st.tuples(st.sampled_from(["enum", "composite"]), identifiers(), identifiers()), min_size=1, max_size=3)
)
def test_the_user_type_script_holds_exactly_its_types(objects):
    objects = list({(s, n): (k, s, n) for k, s, n in objects}.values())
    made = [
        user_types.UserObject(
            kind,
            schema,
            name,
            {},
            f"CREATE TYPE {qualified(schema, name)} AS ENUM ({literal(name)}, {literal(schema)});"
            if kind == "enum"
            else f"CREATE TYPE {qualified(schema, name)} AS ({ident(name)} text);",
        )
        for kind, schema, name in objects
    ]
    script = user_types.script(made)
    stmts = _statements(script)
    schemas = list(dict.fromkeys(s for _, s, _ in objects))
    assert [s.schemaname for s in stmts[: len(schemas)]] == schemas
    comments = [line for line in script.splitlines() if line.startswith("-- ")]
    assert len(comments) == len(objects) == len(stmts) - len(schemas)
    for (kind, schema, name), line, do in zip(objects, comments, stmts[len(schemas) :], strict=True):
        assert line.startswith(f"-- {kind} ") and _literals(line) == [f"{schema}.{name}"]
        (if_,) = _plpgsql(do)["body"][:1]
        (create,) = _statements(_query(if_["PLpgSQL_stmt_if"]["then_body"][0]))
        if kind == "enum":
            assert _names(create.typeName) == [schema, name] and _names(create.vals) == [name, schema]
        else:
            assert [create.typevar.schemaname, create.typevar.relname] == [schema, name]


# ---------------------------------------------------------------------- T-SQL
def tsql_hazard(name: str) -> bool:
    """What the T-SQL script refuses in a name it shows: a line break, a quote, ``/*``, ``$(``."""
    return (name + "x").splitlines() != [name + "x"] or any(s in name for s in ("'", '"', "/*", "$("))


def _shown(art: ResolvedArticle) -> list[str]:
    """The names the T-SQL script shows."""
    procs = [art.default_procs[op] for op in OPERATIONS if art.propagation[op].generated]
    return [art.name, art.dest_schema, art.dest_table, *art.column_names, *procs]


GO = re.compile(r"\s*go\s*(\d+\s*)?", re.IGNORECASE)


def ssms_batches(script: str) -> list[str]:
    """Batches as a client that ends one at every line that is only ``go`` makes them."""
    batches, current = [], []
    for line in script.splitlines():
        if GO.fullmatch(line):
            batches, current = [*batches, "\n".join(current)], []
        else:
            current.append(line)
    return [*batches, "\n".join(current)]


def sqlcmd_batches(script: str) -> list[str]:
    """Batches as go-sqlcmd makes them: ``go`` ends one outside what it reads as a string
    (``'``, ``"``) or a ``/* */`` comment; it knows no brackets."""
    batches, current, quote, block = [], [], "", False
    for line in script.split("\n"):
        if not quote and not block and GO.fullmatch(line):
            batches, current = [*batches, "\n".join(current)], []
            continue
        current.append(line)
        i = 0
        while i < len(line):
            c, two = line[i], line[i : i + 2]
            if quote:
                if c == quote and line[i : i + 2] == quote * 2:
                    i += 1
                elif c == quote:
                    quote = ""
            elif block:
                if two == "*/":
                    block, i = False, i + 1
            elif c in "'\"":
                quote = c
            elif two == "--":
                break
            elif two == "/*":
                block, i = True, i + 1
            i += 1
    return [*batches, "\n".join(current)]


#: SQL Server's largest declared sizes.
TSQL_SIZES = {
    exp.DataType.Type.NCHAR: 4000,
    exp.DataType.Type.NVARCHAR: 4000,
    exp.DataType.Type.CHAR: 8000,
    exp.DataType.Type.VARCHAR: 8000,
    exp.DataType.Type.BINARY: 8000,
    exp.DataType.Type.VARBINARY: 8000,
    exp.DataType.Type.DATETIME2: 7,
}


def _check_type(kind: exp.DataType) -> None:
    """A declared type within SQL Server's limits (sqlglot accepts any size)."""
    sizes = [p.this.name for p in kind.expressions]
    if kind.this == exp.DataType.Type.DECIMAL:
        precision, scale = (int(s) for s in sizes)
        assert 1 <= precision <= 38 and 0 <= scale <= precision, kind.sql("tsql")
    elif sizes and sizes != ["MAX"]:
        assert int(sizes[0]) <= TSQL_SIZES[kind.this], kind.sql("tsql")


def _tsql_procedure(batch: str) -> exp.Create:
    """A batch's procedure, parsed by sqlglot's T-SQL grammar.  Its fixed ending (``if
    @@rowcount = 0 ... exec sp_MSreplraiserror 20598``, which the grammar does not read) is
    checked as text and left out; the statement before it gets the ``;`` the grammar wants."""
    tokens = sqlglot.Dialect.get_or_raise("tsql").tokenize(batch)
    ifs = [t for t in tokens if t.token_type == sqlglot.TokenType.VAR and t.text.lower() == "if"]
    end = ifs[0] if ifs else tokens[-1]
    tail = " ".join(batch[end.start :].split())
    assert tail == (" ".join(tsql_script._RAISE.split()) + " end" if ifs else "end"), tail
    create = sqlglot.parse_one(batch[: end.start] + ";\nend", read="tsql", error_level=ErrorLevel.RAISE)
    assert isinstance(create, exp.Create) and create.kind == "PROCEDURE", create  # not a fallback Command
    return create


def _check_tsql_procedure(art: ResolvedArticle, op: Operation, create: exp.Create) -> None:
    syntax = art.propagation[op].call_syntax
    proc = create.this
    assert proc.this.name == art.default_procs[op]
    params = [(p.this.name, p.args["kind"]) for p in proc.expressions]
    expected = [p for p, _ in call_syntax.parameters(art, op, syntax)]
    assert [p for p, _ in params] == expected and len(params) <= call_syntax.MAX_ARGUMENTS[tsql_script.SERVER]
    for _, kind in params:
        _check_type(kind)
    (dml,) = [e for e in create.expression.expressions if not isinstance(e, exp.EndStatement)]
    if isinstance(dml, exp.Insert):
        table = dml.this.this
    elif isinstance(dml, exp.Update):
        table = dml.this
    else:
        table = (dml.args.get("tables") or [dml.this])[0]
    assert (table.db, table.name) == (art.dest_schema, art.dest_table)
    names = art.column_names
    if op == Operation.INSERT:
        assert isinstance(dml, exp.Insert) and [c.name for c in dml.this.expressions] == names
        return
    if op == Operation.UPDATE:
        assert isinstance(dml, exp.Update) and dml.expressions, "an UPDATE without a SET item"
        sets = [e.this.name for e in dml.expressions]
        key = set(art.primary_key)
        by_bitmap = syntax in ("SCALL", "MCALL") and len(key) < len(names)
        assert sets == [c for c in names if not (by_bitmap and c in key)]
    else:
        assert isinstance(dml, exp.Delete)
    assert {c.name for c in dml.args["where"].find_all(exp.Column)} == set(art.primary_key)


@PROPERTY
@given(st.one_of(articles(TSQL_SAFE), articles()))
def test_the_tsql_script_holds_exactly_its_procedures_or_is_refused_in_one_line(art):
    generated = [op for op in OPERATIONS if art.propagation[op].generated]
    procs = [art.default_procs[op] for op in generated]
    hazards = [n for n in _shown(art) if tsql_hazard(n)] + [n for n in (art.dest_table, *procs) if n.startswith("#")]
    if hazards:
        with pytest.raises(TopologyError) as err:
            tsql_script.publication_script([art])
        message = str(err.value)
        assert message.splitlines() == [message] and message.startswith(f"article {comment(art.name)} cannot ")
        assert any(f" {comment(n)} holds " in message for n in hazards), message
        return
    script = tsql_script.publication_script([art])
    assert "$(" not in script
    header, _, _ = script.partition("\n")
    assert header == f"-- article {comment(art.name)} -> {tsql_script._table(art)}"
    batches = [b.strip() for b in sqlcmd_batches(script)]
    assert [b.strip() for b in ssms_batches(script)] == batches
    code = [b for b in batches if any(t for t in sqlglot.Dialect.get_or_raise("tsql").tokenize(b))]
    assert len(code) == len(generated)
    for op, batch in zip(generated, code, strict=True):
        _check_tsql_procedure(art, op, _tsql_procedure(batch))


def test_the_checks_see_what_they_look_for():
    """The checkers above fail on the defects they are for."""
    split = "create procedure [a\ngo\nb] @c1 int as begin delete [s].[t] where [x] = @c1 end\ngo\n"
    assert len(ssms_batches(split)) == 3 and len(sqlcmd_batches(split)) == 3
    hidden = "create procedure [it's] @c1 int as begin delete [s].[t] where [x] = @c1 end\ngo\n"
    assert len(ssms_batches(hidden)) == 2 and len(sqlcmd_batches(hidden)) == 1
    empty = "create procedure [sp_MSupd_st] @c1 int = null,@pkc1 int,@bitmap binary(1) as begin update [s].[t] set \nwhere [x] = @pkc1\nend\n"
    with pytest.raises(AssertionError, match="an UPDATE without a SET item"):
        art = article(TableInfo("s", "t", 1, [Column("x", "integer", True, 23)], ["x"]), update="SCALL")
        _check_tsql_procedure(art, Operation.UPDATE, _tsql_procedure(empty))
    with pytest.raises(AssertionError, match=r"NCHAR\(5000\)"):
        _check_type(
            sqlglot.parse_one("create procedure [p] @c1 nchar(5000) as begin select 1; end", read="tsql")
            .this.expressions[0]
            .args["kind"]
        )
    injected = procedures.article_header(article(TableInfo("s", "nl\nSELECT 'injected'; --", 1, [], [])))
    assert len(_statements(injected)) == 0  # the header is a comment, nothing else
    assert len(_statements("-- article nl\nSELECT 'injected'; --\n")) == 1  # as it was written before


# ---------------------------------------------------------------------- MariaDB
#: What the MariaDB script and the ``mariadb`` client read specially, besides :data:`HOSTILE`.
MARIADB_HOSTILE = [
    *["`", "``", "#", "-- ", "--\t", "/*!", "/*M!", "*/", "DELIMITER ;", "\ndelimiter //\n", "\\g", "\\G", "\\!"],
    *["\\c", "\\N", "//", "$$", ";;", "$$1$$", "%s", "%%", "@@", "a ", "A", "\t", "\U0001f600", "\u00e9", "ß"],
]
MARIADB_NAMES = identifiers(st.one_of(FRAGMENT, st.sampled_from(MARIADB_HOSTILE)))


def _mariadb_safe(name: str) -> str:
    """``name`` without what the MariaDB dialect refuses (see :func:`mariadb_hazard`)."""
    return "".join(c for c in name if ord(c) <= 0xFFFF).rstrip(" ") or "x"


MARIADB_SAFE = MARIADB_NAMES.map(_mariadb_safe)


def mariadb_hazard(name: str) -> bool:
    """What the MariaDB dialect refuses in a name: a character outside the BMP, trailing
    whitespace (space, tab, line break, vertical tab, form feed, carriage return)."""
    return any(ord(c) > 0xFFFF for c in name) or name.endswith((" ", "\t", "\n", "\v", "\f", "\r"))


def mariadb_client_statements(script: str) -> list[str]:
    """The statements the ``mariadb`` command-line client sends for ``script``: it ends one at
    its delimiter outside strings (``'``, ``"``, backticks) and comments (``-- ``, ``#``,
    ``/* */``), changes the delimiter at a line ``DELIMITER x`` outside them, and runs a
    backslash command (``\\g``, ``\\!``) at a backslash outside strings and comments, which the
    script must never hold.  Comments are dropped, as the client drops them."""
    statements, current, quote, block, delimiter = [], "", "", False, ";"
    for line in script.split("\n"):
        if not quote and not block and not current.strip() and line.lower().startswith("delimiter "):
            delimiter = line.split()[1]
            continue
        i = 0
        while i < len(line):
            if quote or block:
                j, quote, block = _inside(line, i, quote)
                current, i = current + line[i:j], j
            elif line.startswith(delimiter, i):
                statements, current, i = [*statements, current.strip()], "", i + len(delimiter)
            elif line[i] == "#" or (line[i : i + 2] == "--" and (line[i + 2 : i + 3] in ("", " ", "\t"))):
                break
            else:
                assert line[i] != "\\", f"the client runs a backslash command: {line[i : i + 2]!r}"
                quote = line[i] if line[i] in "'\"`" else ""
                block = line[i : i + 2] == "/*"
                current, i = current + line[i : i + 1 + block], i + 1 + block
        current += "\n"
    assert not current.strip() and not quote and not block, current
    return statements


def _inside(line: str, i: int, quote: str) -> tuple[int, str, bool]:
    """Past the character at ``i`` of a string (``quote``) or, without one, a ``/* */``
    comment: (the next position, the string still open or "", the comment still open)."""
    if not quote:
        return (i + 2, "", False) if line[i : i + 2] == "*/" else (i + 1, "", True)
    if (line[i] == "\\" and quote != "`") or line[i : i + 2] == quote * 2:  # an escape, a doubled quote
        return i + 2, quote, False
    return i + 1, "" if line[i] == quote else quote, False


def _mariadb_tokens(text: str) -> list[Any]:
    return sqlglot.Dialect.get_or_raise("mysql").tokenize(text)


def _mariadb_strings(tokens: list[Any]) -> list[str]:
    """The values of the string literals, ``'...'`` or ``CONVERT(X'..' USING utf8mb4)``."""
    out = []
    for t in tokens:
        if t.token_type == sqlglot.TokenType.STRING:
            out.append(t.text)
        elif t.token_type == sqlglot.TokenType.HEX_STRING:
            out.append(bytes.fromhex(t.text).decode())
    return out


def _check_mariadb_procedure(art: ResolvedArticle, op: Operation, text: str) -> None:
    """One generated procedure, read by sqlglot's MySQL tokenizer and grammar: its name, its
    parameters, its one comment, its string literals and the statement it runs."""
    syntax = art.propagation[op].call_syntax
    tokens = _mariadb_tokens(text)
    kinds = [t.token_type for t in tokens]
    T = sqlglot.TokenType
    assert kinds[:6] == [T.CREATE, T.OR, T.REPLACE, T.PROCEDURE, T.IDENTIFIER, T.L_PAREN]
    assert tokens[4].text == art.default_procs[op]  # in the subscriber's database, as its tables
    close = kinds.index(T.R_PAREN, 6)
    while tokens[close + 1].text.upper() != "MODIFIES":  # a type's own parentheses
        close = kinds.index(T.R_PAREN, close + 1)
    params = [tokens[i + 1].text for i in range(6, close) if tokens[i].token_type == T.IN]
    expected = [p for p, _ in call_syntax.parameters(art, op, syntax)]
    assert params == expected and len(params) <= call_syntax.MAX_ARGUMENTS[mariadb.SERVER]
    assert [c for t in tokens for c in t.comments] == [f" {syntax} syntax: {', '.join(expected)}"]
    begin = kinds.index(T.BEGIN)
    first = begin + 1 if op == Operation.INSERT else kinds.index(T.SEMICOLON, begin) + 1
    if op != Operation.INSERT:
        assert [t.text for t in tokens[begin + 1 : first]] == ["DECLARE", "msg", "TEXT", ";"]
    end = kinds.index(T.SEMICOLON, first)
    dml = sqlglot.parse_one(text[tokens[first].start : tokens[end - 1].end + 1], read="mysql")
    dest = ("", art.dest_table)
    names = art.column_names
    if op == Operation.INSERT:
        assert isinstance(dml, exp.Insert) and (dml.this.this.db, dml.this.this.name) == dest
        assert [c.name for c in dml.this.expressions] == names
        assert [v.name for v in dml.expression.expressions[0].expressions] == expected
        assert "IF" not in [t.text.upper() for t in tokens] and _mariadb_strings(tokens) == []
        return
    table = dml.this if isinstance(dml, exp.Update) else (dml.args.get("tables") or [dml.this])[0]
    assert (table.db, table.name) == dest
    if isinstance(dml, exp.Update):
        assert op == Operation.UPDATE and [e.this.name for e in dml.expressions] == names
    else:
        assert op == Operation.DELETE and isinstance(dml, exp.Delete)
    columns = list(dml.find_all(exp.Column))
    qualified = [(c.db, c.table) for c in columns if c.table]
    assert set(qualified) <= {dest}  # every column by its table, never a bare name a parameter hides
    assert {c.name for c in columns if c.table} >= set(art.primary_key)
    assert {c.name for c in columns if not c.table} <= set(expected)  # the rest are parameters
    assert {c.name for c in dml.args["where"].find_all(exp.Column) if c.table} == set(art.primary_key)
    strings = _mariadb_strings(tokens)
    assert strings == [
        f"row not found at the subscriber: {op} of ",
        art.destination,
        " with key (",
        ", ".join(art.primary_key),
        ")=(",
        ", ",
        ") matched no row [20598]",
        "RP598",
    ], strings


@PROPERTY
@given(st.one_of(articles(MARIADB_SAFE), articles(MARIADB_NAMES), articles()))
def test_the_mariadb_script_holds_exactly_its_procedures_or_is_refused_in_one_line(art):
    generated = [op for op in OPERATIONS if art.propagation[op].generated]
    procs = [art.default_procs[op] for op in generated]
    shown = [art.dest_table, *art.column_names, *procs]
    hazards = [n for n in shown if mariadb_hazard(n)]
    folded = [c.lower() for c in art.column_names]
    if hazards or len(set(folded)) < len(folded):
        with pytest.raises(TopologyError) as err:
            mariadb.publication_script([art])
        message = str(err.value)
        assert message.splitlines() == [message], message
        assert any(f"{n!r} of article {art.name!r}" in message for n in hazards) or "differ only in case" in message
        return
    script = mariadb.publication_script([art])
    header = script.splitlines()[1]
    assert header == f"-- article {comment(art.name)}: {comment(art.table.qualified)} -> {comment(art.destination)}"
    statements = mariadb_client_statements(script)
    texts = [mariadb.procedure_sql(art, op) for op in generated]
    # nothing split, nothing added; the client drops the procedure's comment line
    assert statements == ["SET NAMES utf8mb4", *(re.sub(r"\n-- [^\n]*\n", "\n\n", t or "", count=1) for t in texts)]
    for op, text in zip(generated, texts, strict=True):
        assert text is not None
        _check_mariadb_procedure(art, op, text)
        # as PyMySQL binds the parameters: a % of a name is doubled, or this fails
        call = mariadb.call_sql(art, op) % tuple(
            ["?"] * len(call_syntax.parameters(art, op, art.propagation[op].call_syntax))
        )
        tokens = _mariadb_tokens(call.removeprefix("CALL "))  # sqlglot reads CALL as a command
        kinds = [t.token_type for t in tokens]
        T = sqlglot.TokenType
        assert kinds[:2] == [T.IDENTIFIER, T.L_PAREN] and set(kinds[2:]) <= {T.PLACEHOLDER, T.COMMA, T.R_PAREN}
        assert tokens[0].text == art.default_procs[op]
    for op in OPERATIONS:
        params = len(call_syntax.parameters(art, op, call_syntax.CallSyntax.CALL))
        dml = sqlglot.parse_one(mariadb.statement_sql(art, op) % tuple(["?"] * params), read="mysql")
        assert (
            isinstance(dml, (exp.Insert, exp.Update, exp.Delete)) and len(list(dml.find_all(exp.Placeholder))) == params
        )
        table = dml.this.this if isinstance(dml, exp.Insert) else dml.this
        assert (table.db, table.name) == ("", art.dest_table)
        assert {c.name for c in dml.find_all(exp.Column)} <= set(art.column_names)


def test_the_mariadb_checks_see_what_they_look_for():
    """The client model splits where the client would, and refuses a backslash command."""
    assert mariadb_client_statements("SELECT `a;b`; SELECT 'c;d' -- e;f\n;") == ["SELECT `a;b`", "SELECT 'c;d'"]
    assert mariadb_client_statements("DELIMITER //\nCREATE x; y //\nDELIMITER ;\nSELECT 1;") == [
        "CREATE x; y",
        "SELECT 1",
    ]
    assert mariadb_client_statements("SELECT `a\\`; SELECT 1 /* ; */;") == ["SELECT `a\\`", "SELECT 1 /* ; */"]
    with pytest.raises(AssertionError, match="backslash command"):
        mariadb_client_statements("SELECT 1 \\! echo injected\n;")
    art = article(TableInfo("s", "t", 1, [Column("x", "integer", True, 23), Column("y", "text", False, 25)], ["x"]))
    bare = mariadb.procedure_sql(art, Operation.DELETE).replace("`t`.`x` = pkc1;", "x = pkc1;")
    with pytest.raises(AssertionError):
        _check_mariadb_procedure(art, Operation.DELETE, bare)
