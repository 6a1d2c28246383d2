"""Schema changes at the publisher, replicated in commit order (``airflow-repl schema-change``).

The statement (one supported ALTER TABLE of a published table, :mod:`~airflow_repl.engine.model.ddl`)
runs at the publisher in one transaction together with a transactional logical-decoding message
(prefix :data:`~airflow_repl.engine.model.naming.DDL_MESSAGE`) per article of the table.  The
message carries what changed and the article's definition after the change, so the Log Reader
stores, at that very point of the transaction stream, a schema-change command: changes committed
before it keep the old columns, changes after it have the new ones, and the Distribution Agent
changes each subscriber table (and regenerates its procedures) in the subscriber transaction
that delivers it.

Everything is checked before the transaction commits; any refusal rolls it back, so a refused
change leaves the publisher as it was.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from airflow_repl.engine.articles.resolved import ResolvedArticle, resolve_articles
from airflow_repl.engine.errors import TopologyError
from airflow_repl.engine.model import ddl, naming
from airflow_repl.engine.model.ddl import ChangeKind, SchemaChangeError, SchemaStatement
from airflow_repl.engine.model.topology import Publication, Topology
from airflow_repl.engine.postgres import catalog, connections, quoting, slots
from airflow_repl.engine.provisioning import deploy
from airflow_repl.engine.state import publisher_state

log = logging.getLogger(__name__)


@dataclass
class _Target:
    """One article of the changed table, in one publication of the topology."""

    publication: Publication
    article: ResolvedArticle  # before the change


def schema_change(
    topology: Topology,
    publication: str,
    statement: str,
    *,
    include_in_filter: bool = False,
    connection: psycopg.Connection | None = None,
) -> dict[str, Any]:
    """Run ``statement`` at the publisher and queue it for every subscriber, in commit order.

    ``include_in_filter``: an added column joins articles with a column filter too (it always
    joins articles without one).  ``connection``: run inside the caller's open publisher
    transaction (which the caller commits, with any data changes around the statement);
    otherwise a transaction of its own is committed here.  Returns a summary."""
    parsed = ddl.parse_statement(statement)
    topology.publication(publication)  # a known publication, or TopologyError
    if connection is not None:
        return _run(connection, topology, publication, parsed, include_in_filter)
    with connections.connect(topology.publisher.require("publisher"), "publisher") as conn, conn.transaction():
        summary = _run(conn, topology, publication, parsed, include_in_filter)
    log.info("schema change %s replicated to articles %s", parsed.sql, summary["articles"])
    return summary


def _run(
    conn: psycopg.Connection, topology: Topology, publication: str, parsed: SchemaStatement, include: bool
) -> dict[str, Any]:
    schema, table = _table(conn, parsed)
    targets = _targets(conn, topology, schema, table)
    if publication not in {t.publication.name for t in targets}:
        raise SchemaChangeError(
            f"table {schema}.{table} is not published by publication {publication!r}: only published tables "
            f"change through airflow-repl schema-change (change other tables directly)"
        )
    for target in targets:
        _check_before(parsed, target)
    before_types = {c.name: c.type for c in targets[0].article.table.columns}
    _execute(conn, parsed)  # PostgreSQL's deparsed form of the checked tree
    change = _describe(conn, parsed, schema, table, before_types)
    for target in targets:
        after = _resolve_after(conn, target, parsed, include)
        change_id = _record(conn, target, parsed)
        message = {
            "change_id": change_id,
            "publication": target.publication.name,
            "article": target.article.name,
            "change": {**change, "in_article": _in_article(parsed, target.article, after)},
            "statement": parsed.sql,
            "definition": after.to_dict(),
        }
        conn.execute(
            "SELECT pg_catalog.pg_logical_emit_message(true, %s, %s)", (naming.DDL_MESSAGE, json.dumps(message))
        )
    return {
        "statement": parsed.sql,
        "kind": str(parsed.kind.value),
        "table": f"{schema}.{table}",
        "articles": sorted(f"{t.publication.name}.{t.article.name}" for t in targets),
    }


def _record(conn: psycopg.Connection, target: _Target, parsed: SchemaStatement) -> int | None:
    """Note the change at the publisher until the Log Reader has stored it (None: the
    publication has no slot yet, so no Log Reader will read it: its snapshot has the change)."""
    if not slots.exists(conn, naming.slot(target.publication.name, conn.info.dbname)):
        return None
    publisher_state.ensure_schema(conn)
    return publisher_state.record_schema_change(conn, target.publication.name, target.article.name, parsed.sql)


def _execute(conn: psycopg.Connection, parsed: SchemaStatement) -> None:
    """Run the statement (PostgreSQL's deparsed form of the checked tree); its refusal is one line."""
    try:
        with conn.transaction():
            conn.execute(sql.SQL(parsed.sql))  # deparsed from the checked tree
    except psycopg.Error as exc:
        detail = exc.diag.message_primary or str(exc).splitlines()[0]
        hint = f" ({exc.diag.message_detail})" if exc.diag.message_detail else ""
        raise SchemaChangeError(f"schema change {parsed.sql!r} failed at the publisher: {detail}{hint}") from None


def _table(conn: psycopg.Connection, parsed: SchemaStatement) -> tuple[str, str]:
    """(schema, table) the statement names, as the publisher resolves it."""
    name = quoting.qualified(parsed.schema, parsed.table) if parsed.schema else quoting.ident(parsed.table)
    row = conn.execute(
        "SELECT n.nspname, c.relname FROM pg_catalog.pg_class c "
        "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = pg_catalog.to_regclass(%s)",
        (name,),
    ).fetchone()
    if row is None:
        raise SchemaChangeError(f"schema change: table {name} does not exist at the publisher")
    return str(row[0]), str(row[1])


def _targets(conn: psycopg.Connection, topology: Topology, schema: str, table: str) -> list[_Target]:
    """Every article of the table in the topology's publications (a table published twice
    changes for both)."""
    out: list[_Target] = []
    for pub in topology.publications.values():
        names = [a.name for a in pub.articles if (a.source_schema, a.source_table) == (schema, table)]
        if not names:
            continue
        resolved = {a.name: a for a in deploy.resolve_publication(conn, pub)}
        for name in names:
            resolved[name].row_filter = _row_filter(conn, resolved[name])
            out.append(_Target(pub, resolved[name]))
    return out


def _check_before(parsed: SchemaStatement, target: _Target) -> None:
    """Refusals that need only the article as it is."""
    art, pub = target.article, target.publication
    where = f"article {art.name!r} of publication {pub.name!r} ({art.table.qualified})"
    if art.include_children:
        raise SchemaChangeError(
            f"schema change: {where} includes inheritance children, whose changes cannot be replicated yet"
        )
    if pub.updatable:
        raise SchemaChangeError(
            f"schema change: {where} belongs to a publication that allows updating subscribers; schema changes "
            f"are not replicated to updatable subscriptions yet (change the tables everywhere, then reinitialize)"
        )
    if parsed.kind == ChangeKind.ADD_COLUMN:
        return
    if parsed.column not in art.table.column_names:
        raise SchemaChangeError(f"schema change: {where} has no column {parsed.column!r}")
    if parsed.kind == ChangeKind.DROP_COLUMN and parsed.column in art.primary_key:
        raise SchemaChangeError(
            f"schema change: column {parsed.column!r} is in the primary key of {where}; it cannot be dropped"
        )
    if (
        parsed.kind == ChangeKind.DROP_COLUMN
        and art.row_filter
        and parsed.column in ddl.referenced_columns(art.row_filter)
    ):
        raise SchemaChangeError(
            f"schema change: column {parsed.column!r} is used by the row filter of {where} ({art.row_filter}); "
            f"change the filter first (topology, then airflow-repl apply)"
        )


def _describe(
    conn: psycopg.Connection, parsed: SchemaStatement, schema: str, table: str, before_types: dict[str, str]
) -> dict[str, Any]:
    """What the statement did, as the subscribers need it (read back from the catalog)."""
    column = parsed.new_name if parsed.kind == ChangeKind.RENAME_COLUMN else parsed.column
    change: dict[str, Any] = {"kind": parsed.kind.value, "column": parsed.column, "new_name": parsed.new_name}
    if parsed.kind in (ChangeKind.DROP_COLUMN, ChangeKind.RENAME_COLUMN):
        return change
    info = catalog.load_table(conn, schema, table).column(str(column))
    change.update(type=info.type, not_null=info.not_null)
    if parsed.kind == ChangeKind.ALTER_TYPE:
        old = before_types[parsed.column]
        if not ddl.is_widening(old, info.type):
            raise SchemaChangeError(
                f"schema change: {schema}.{table}.{parsed.column} from {old} to {info.type} is not a widening "
                f"type change (it could change or lose values at subscribers); supported: {ddl.SUPPORTED}"
            )
        return change
    change["existing"] = _existing_value(conn, schema, table, parsed.column)
    return change


def _existing_value(conn: psycopg.Connection, schema: str, table: str, column: str) -> str | None:
    """The value every existing row got in an added column (its text form), which subscribers
    give their rows too.  A volatile default gives each row its own value: PostgreSQL then
    rewrites the table instead of storing one "missing" value (``atthasmissing``): refused.
    Both checks read one row, whatever the table's size."""
    target = sql.Identifier(schema, table)
    row = conn.execute(
        sql.SQL("SELECT {}::text FROM ONLY {} LIMIT 1").format(sql.Identifier(column), target)
    ).fetchone()
    if row is None or row[0] is None:
        return None  # no rows (nothing to fill), or NULL for all of them (a default that is NULL or none)
    stored = conn.execute(
        "SELECT a.atthasmissing FROM pg_catalog.pg_attribute a WHERE a.attrelid = %s::regclass AND a.attname = %s",
        (quoting.qualified(schema, table), column),
    ).fetchone()
    if stored is None or not stored[0]:
        raise SchemaChangeError(
            f"schema change: the default of {schema}.{table}.{column} gives existing rows different values "
            f"(a volatile default such as random() or nextval()), which cannot be replicated: add the column "
            f"without a default, UPDATE the rows (replicated as row changes), then SET DEFAULT"
        )
    return str(row[0])


def _resolve_after(
    conn: psycopg.Connection, target: _Target, parsed: SchemaStatement, include: bool
) -> ResolvedArticle:
    """The article's definition after the change: the publisher's catalog as it is now, in this
    transaction, with the article's column filter (as the topology states it) following the
    change: a dropped or renamed column leaves or is renamed in it, and an added column joins it
    only when ``include`` asks."""
    pub, art = target.publication, target.article
    spec = next(a for a in pub.articles if a.name == art.name)
    columns = None if spec.columns is None else list(spec.columns)
    if columns is not None and parsed.kind == ChangeKind.ADD_COLUMN and include:
        columns.append(parsed.column)
    elif columns is not None and parsed.kind == ChangeKind.DROP_COLUMN:
        columns = [c for c in columns if c != parsed.column]
    elif columns is not None and parsed.kind == ChangeKind.RENAME_COLUMN and parsed.new_name is not None:
        columns = [parsed.new_name if c == parsed.column else c for c in columns]
    table = catalog.load_table(conn, art.table.schema, art.table.name)
    changed = pub.model_copy(update={"articles": [spec.model_copy(update={"columns": columns})]})
    after = resolve_articles(changed, {art.name: table})[0]
    after.row_filter = _row_filter(conn, art)
    after.default_procs = art.default_procs  # names are the publication's (clashes resolved across articles)
    return after


def _row_filter(conn: psycopg.Connection, art: ResolvedArticle) -> str | None:
    """The article's row filter as PostgreSQL deparses it now (a renamed column is renamed in it)."""
    row = conn.execute(
        "SELECT pg_catalog.pg_get_expr(pr.prqual, pr.prrelid) FROM pg_catalog.pg_publication_rel pr "
        "JOIN pg_catalog.pg_publication p ON p.oid = pr.prpubid "
        "WHERE p.pubname = %s AND pr.prrelid = pg_catalog.to_regclass(%s)",
        (naming.pg_publication(art.publication), art.table.qualified),
    ).fetchone()
    return None if row is None or row[0] is None else str(row[0])


def _in_article(parsed: SchemaStatement, before: ResolvedArticle, after: ResolvedArticle) -> bool:
    """Whether the changed column is (was) replicated by the article."""
    if parsed.kind == ChangeKind.ADD_COLUMN:
        return parsed.column in after.column_names
    return parsed.column in before.column_names


def check_table_published(topology: Topology, schema: str, table: str) -> None:
    """TopologyError unless some publication of ``topology`` publishes ``schema.table``."""
    for pub in topology.publications.values():
        if any((a.source_schema, a.source_table) == (schema, table) for a in pub.articles):
            return
    raise TopologyError(f"table {schema}.{table} is not published by any publication of the topology")
