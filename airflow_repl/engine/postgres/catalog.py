"""What the publisher's catalog says about a published table: columns, types, keys."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg

from airflow_repl.engine.errors import TopologyError
from airflow_repl.engine.postgres import raw_sql


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # format_type() text, e.g. "numeric(10,2)"
    not_null: bool
    type_oid: int
    base_type: str | None = None  # a domain's underlying base type (format_type text); None otherwise

    @property
    def param_type(self) -> str:
        """The type values travel in as parameters: a domain's base type, so that a NULL for an
        unchanged column (SCALL) does not meet a NOT NULL domain; the column checks the domain."""
        return self.base_type or self.type

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if not (k == "base_type" and v is None)}


@dataclass(frozen=True)
class GeneratedColumn:
    """A stored generated column: not replicated (pgoutput does not send it), but created at
    the subscriber with the same expression, which computes it there as native logical
    replication's subscribers do."""

    name: str
    type: str
    expression: str  # pg_get_expr() text
    position: int  # how many replicated (non-generated) columns precede it in the table
    depends_on: tuple[str, ...]  # the columns the expression reads


@dataclass
class TableInfo:
    schema: str
    name: str
    oid: int
    columns: list[Column]
    primary_key: list[str]
    unique_keys: list[list[str]] = field(default_factory=list)
    #: primary-key and unique constraints declared DEFERRABLE: (key columns, INITIALLY DEFERRED)
    deferrable_keys: list[tuple[list[str], bool]] = field(default_factory=list)
    generated: list[GeneratedColumn] = field(default_factory=list)
    #: a partitioned table (relkind ``p``): its rows are its partitions', published as its own
    partitioned: bool = False

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    def column(self, name: str) -> Column:
        for col in self.columns:
            if col.name == name:
                return col
        raise TopologyError(
            f"table {self.qualified} has no column {name!r}; its columns are: {', '.join(self.column_names)}"
        )

    def deferral(self, key: list[str]) -> str:
        """The constraint clause that makes ``key`` as deferrable as at the publisher ("" when
        it is not deferrable)."""
        for columns, initially_deferred in self.deferrable_keys:
            if columns == key:
                return "DEFERRABLE INITIALLY DEFERRED" if initially_deferred else "DEFERRABLE"
        return ""

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "schema": self.schema,
            "name": self.name,
            "oid": self.oid,
            "columns": [c.to_dict() for c in self.columns],
            "primary_key": self.primary_key,
            "unique_keys": self.unique_keys,
        }
        if self.deferrable_keys:  # absent otherwise: definitions stored before it keep their hash
            data["deferrable_keys"] = [[list(cols), deferred] for cols, deferred in self.deferrable_keys]
        if self.generated:  # likewise
            data["generated"] = [{**g.__dict__, "depends_on": list(g.depends_on)} for g in self.generated]
        if self.partitioned:  # likewise
            data["partitioned"] = True
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TableInfo:
        return cls(
            data["schema"],
            data["name"],
            data["oid"],
            [Column(**c) for c in data["columns"]],
            list(data["primary_key"]),
            [list(u) for u in data.get("unique_keys", [])],
            [(list(cols), bool(deferred)) for cols, deferred in data.get("deferrable_keys", [])],
            [GeneratedColumn(**{**g, "depends_on": tuple(g["depends_on"])}) for g in data.get("generated", [])],
            bool(data.get("partitioned", False)),
        )


@contextmanager
def catalog_search_path(conn: psycopg.Connection) -> Iterator[None]:
    """Run catalog reads with ``search_path = pg_catalog``: format_type() (and pg_get_expr())
    qualify every name that is not visible on the search_path, so under this setting every type
    outside pg_catalog comes out schema-qualified (``public.mood``, ``other.color``) and means
    the same at every server.  The session's setting is restored afterwards."""
    (previous,) = raw_sql.one_row(conn.execute("SELECT pg_catalog.current_setting('search_path')"))
    conn.execute("SELECT pg_catalog.set_config('search_path', 'pg_catalog', false)")
    try:
        yield
    finally:
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.INERROR:  # else rollback restores it
            conn.execute("SELECT pg_catalog.set_config('search_path', %s, false)", (previous,))


def load_table(conn: psycopg.Connection, schema: str, table: str) -> TableInfo:
    """Read a table's definition; unknown tables and tables without a primary key are errors."""
    oid, partitioned = _table_oid(conn, schema, table)
    with catalog_search_path(conn):
        columns = _columns(conn, oid)
    primary_key, unique_keys = _unique_keys(conn, oid)
    if not primary_key:
        raise TopologyError(
            f"table {schema}.{table} has no primary key; transactional replication needs one to find "
            f"rows at subscribers. Add one (ALTER TABLE {schema}.{table} ADD PRIMARY KEY (...)) or "
            f"remove the article"
        )
    with catalog_search_path(conn):
        generated = generated_columns(conn, oid)
    return TableInfo(
        schema,
        table,
        oid,
        columns,
        primary_key,
        unique_keys,
        deferrable_keys=_deferrable_keys(conn, oid),
        generated=generated,
        partitioned=partitioned,
    )


def _table_oid(conn: psycopg.Connection, schema: str, table: str) -> tuple[int, bool]:
    """(oid, partitioned) of an ordinary or partitioned table; other relations (or none) are
    errors naming the fix."""
    row = conn.execute(
        "SELECT c.oid, c.relkind FROM pg_catalog.pg_class c "
        "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s",
        (schema, table),
    ).fetchone()
    if row is None:
        raise TopologyError(
            f"unknown table {schema}.{table} at the publisher: create it or fix the article's 'table' entry"
        )
    oid, relkind = row
    if relkind not in ("r", "p"):
        raise TopologyError(
            f"{schema}.{table} is not a table (relkind {relkind!r}); only ordinary and partitioned tables can be "
            f"published"
        )
    return int(oid), relkind == "p"


def descendants(conn: psycopg.Connection, oid: int) -> list[tuple[str, str]]:
    """(schema, table) of every partition or inheritance child of the table, at every level,
    as ``pg_inherits`` says now."""
    return [
        (str(schema), str(table))
        for schema, table in conn.execute(
            "WITH RECURSIVE d(oid) AS (SELECT inhrelid FROM pg_catalog.pg_inherits WHERE inhparent = %s "
            "UNION SELECT i.inhrelid FROM pg_catalog.pg_inherits i JOIN d ON i.inhparent = d.oid) "
            "SELECT n.nspname, c.relname FROM d JOIN pg_catalog.pg_class c ON c.oid = d.oid "
            "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace ORDER BY 1, 2",
            (oid,),
        )
    ]


def table_blocks(conn: psycopg.Connection, name: str, with_descendants: bool) -> int | None:
    """Heap blocks of table ``name`` (quoted, as ``to_regclass`` takes it; None when there is no
    such table), or of the largest of it and its descendants when ``with_descendants`` or when it
    is partitioned (its rows are its partitions'): block ranges read from the table are read
    from each of them."""
    row = conn.execute(
        "SELECT c.oid, c.relkind FROM pg_catalog.pg_class c WHERE c.oid = pg_catalog.to_regclass(%s)", (name,)
    ).fetchone()
    if row is None:
        return None
    oid, relkind = row
    tree = (
        "WITH RECURSIVE t(oid) AS (SELECT %s::oid UNION ALL "
        "SELECT i.inhrelid FROM pg_catalog.pg_inherits i JOIN t ON i.inhparent = t.oid) "
        if with_descendants or relkind == "p"
        else "WITH t(oid) AS (SELECT %s::oid) "
    )
    (blocks,) = raw_sql.one_row(
        conn.execute(
            tree + "SELECT coalesce(max(pg_catalog.pg_relation_size(oid)), 0) / "
            "pg_catalog.current_setting('block_size')::bigint FROM t",
            (oid,),
        )
    )
    return int(blocks)


def _columns(conn: psycopg.Connection, oid: int) -> list[Column]:
    """The table's columns in order, generated columns left out (they are not replicated)."""
    return [
        Column(name, typ, notnull, typoid, _domain_base(conn, typoid) if is_domain else None)
        for name, typ, notnull, typoid, is_domain in conn.execute(
            "SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod), a.attnotnull, a.atttypid, "
            "t.typtype = 'd' FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type t ON t.oid = a.atttypid "
            "WHERE a.attrelid = %s AND a.attnum > 0 "
            "AND NOT a.attisdropped AND a.attgenerated = '' ORDER BY a.attnum",
            (oid,),
        ).fetchall()
    ]


def required_columns(conn: psycopg.Connection, oid: int) -> list[str]:
    """The columns an INSERT must give a value for: NOT NULL, without a default, not an
    identity and not generated."""
    return [
        str(name)
        for (name,) in conn.execute(
            "SELECT a.attname FROM pg_catalog.pg_attribute a WHERE a.attrelid = %s AND a.attnum > 0 "
            "AND NOT a.attisdropped AND a.attnotnull AND NOT a.atthasdef AND a.attidentity = '' "
            "AND a.attgenerated = '' ORDER BY a.attnum",
            (oid,),
        )
    ]


def _unique_keys(conn: psycopg.Connection, oid: int) -> tuple[list[str], list[list[str]]]:
    """(primary key, other unique keys) of the table: the key columns of its unique indexes
    without predicate or expressions; the primary key is empty when there is none."""
    primary_key: list[str] = []
    unique_keys: list[list[str]] = []
    for is_primary, cols in conn.execute(
        # the key columns only: INCLUDE columns follow the first indnkeyatts entries of indkey
        "SELECT i.indisprimary, ARRAY(SELECT a.attname FROM unnest(i.indkey) WITH ORDINALITY "
        "AS k(attnum, ord) JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid "
        "AND a.attnum = k.attnum WHERE k.ord <= i.indnkeyatts ORDER BY k.ord) "
        "FROM pg_catalog.pg_index i WHERE i.indrelid = %s AND i.indisunique "
        "AND i.indpred IS NULL AND i.indexprs IS NULL ORDER BY i.indisprimary DESC, i.indexrelid",
        (oid,),
    ):
        if is_primary:
            primary_key = list(cols)
        else:
            unique_keys.append(list(cols))
    return primary_key, unique_keys


def _domain_base(conn: psycopg.Connection, type_oid: int) -> str:
    """The base type under a domain (through domains over domains), as format_type() text."""
    cur = conn.execute(
        "WITH RECURSIVE d(depth, base, typmod) AS (SELECT 0, typbasetype, typtypmod FROM pg_catalog.pg_type "
        "WHERE oid = %s UNION ALL SELECT d.depth + 1, t.typbasetype, t.typtypmod FROM d "
        "JOIN pg_catalog.pg_type t ON t.oid = d.base WHERE t.typtype = 'd') "
        "SELECT pg_catalog.format_type(base, typmod) FROM d ORDER BY depth DESC LIMIT 1",
        (type_oid,),
    )
    return str(raw_sql.one_row(cur)[0])


def _deferrable_keys(conn: psycopg.Connection, oid: int) -> list[tuple[list[str], bool]]:
    """The table's DEFERRABLE primary-key and unique constraints: (key columns, INITIALLY DEFERRED)."""
    return [
        (list(cols), deferred)
        for cols, deferred in conn.execute(
            "SELECT ARRAY(SELECT a.attname FROM unnest(c.conkey) WITH ORDINALITY AS k(attnum, ord) "
            "JOIN pg_catalog.pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum ORDER BY k.ord), "
            "c.condeferred FROM pg_catalog.pg_constraint c "
            "WHERE c.conrelid = %s AND c.contype IN ('p', 'u') AND c.condeferrable ORDER BY c.oid",
            (oid,),
        )
    ]


def generated_columns(conn: psycopg.Connection, oid: int) -> list[GeneratedColumn]:
    """The table's stored generated columns, with their expressions and the columns they read."""
    return [
        GeneratedColumn(name, typ, expr, position, tuple(deps))
        for name, typ, expr, position, deps in conn.execute(
            "SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod), "
            "pg_catalog.pg_get_expr(d.adbin, d.adrelid), "
            "(SELECT count(*) FROM pg_catalog.pg_attribute b WHERE b.attrelid = a.attrelid AND b.attnum > 0 "
            " AND b.attnum < a.attnum AND NOT b.attisdropped AND b.attgenerated = '')::int, "
            "ARRAY(SELECT r.attname FROM pg_catalog.pg_depend dep JOIN pg_catalog.pg_attribute r "
            " ON r.attrelid = dep.refobjid AND r.attnum = dep.refobjsubid "
            " WHERE dep.classid = 'pg_catalog.pg_class'::regclass AND dep.objid = a.attrelid "
            " AND dep.objsubid = a.attnum AND dep.refclassid = 'pg_catalog.pg_class'::regclass "
            " AND dep.refobjid = a.attrelid AND dep.refobjsubid > 0 ORDER BY r.attnum) "
            "FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_attrdef d ON d.adrelid = a.attrelid "
            "AND d.adnum = a.attnum WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped "
            "AND a.attgenerated = 's' ORDER BY a.attnum",
            (oid,),
        )
    ]


def replicated_change_triggers(
    conn: psycopg.Connection, tables: list[tuple[str, str]]
) -> dict[tuple[str, str], list[str]]:
    """(schema, table) -> its user triggers (row or statement, its partitions' too) that fire for
    replicated changes (in a session with ``session_replication_role = replica``): those set
    ``ENABLE ALWAYS`` or ``ENABLE REPLICA``, each as ``name (ENABLE ALWAYS|REPLICA)``; tables
    without any are left out, as are tables that do not exist."""
    rows = conn.execute(
        "SELECT s.sch, s.tab, t.tgname, t.tgenabled "
        "FROM unnest(%s::text[], %s::text[]) AS s(sch, tab) "
        "JOIN pg_catalog.pg_namespace n ON n.nspname = s.sch "
        "JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = s.tab "
        "CROSS JOIN LATERAL (SELECT c.oid::regclass AS relid UNION SELECT relid FROM pg_catalog.pg_partition_tree(c.oid)) AS p "
        "JOIN pg_catalog.pg_trigger t ON t.tgrelid = p.relid "
        "WHERE NOT t.tgisinternal AND t.tgenabled IN ('A', 'R') ORDER BY 1, 2, 3",
        ([s for s, _ in tables], [t for _, t in tables]),
    ).fetchall()
    out: dict[tuple[str, str], list[str]] = {}
    for schema, table, name, enabled in rows:
        how = "ENABLE ALWAYS" if enabled == "A" else "ENABLE REPLICA"
        out.setdefault((str(schema), str(table)), []).append(f"{str(name)!r} ({how})")
    return out
