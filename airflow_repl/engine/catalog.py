"""What the publisher's catalog says about a published table: columns, types, keys."""

from __future__ import annotations

from dataclasses import dataclass, field

import psycopg

from .errors import TopologyError


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # format_type() text, e.g. "numeric(10,2)"
    not_null: bool
    type_oid: int


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
    generated: list[GeneratedColumn] = field(default_factory=list)

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
        raise TopologyError(f"table {self.qualified} has no column {name!r}; its columns are: "
                            f"{', '.join(self.column_names)}")

    def to_dict(self) -> dict:
        data = {"schema": self.schema, "name": self.name, "oid": self.oid,
                "columns": [c.__dict__ for c in self.columns],
                "primary_key": self.primary_key, "unique_keys": self.unique_keys}
        if self.generated:  # absent otherwise, so that existing definition hashes stay valid
            data["generated"] = [{**g.__dict__, "depends_on": list(g.depends_on)} for g in self.generated]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "TableInfo":
        return cls(data["schema"], data["name"], data["oid"], [Column(**c) for c in data["columns"]],
                   list(data["primary_key"]), [list(u) for u in data.get("unique_keys", [])],
                   [GeneratedColumn(**{**g, "depends_on": tuple(g["depends_on"])})
                    for g in data.get("generated", [])])


def load_table(conn: psycopg.Connection, schema: str, table: str) -> TableInfo:
    """Read a table's definition; unknown tables and tables without a primary key are errors."""
    row = conn.execute(
        "SELECT c.oid, c.relkind FROM pg_catalog.pg_class c "
        "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s", (schema, table)).fetchone()
    if row is None:
        raise TopologyError(f"unknown table {schema}.{table} at the publisher: create it or fix the "
                            f"article's 'table' entry")
    oid, relkind = row
    if relkind == "p":
        raise TopologyError(f"{schema}.{table} is a partitioned table, which airflow-repl cannot publish yet: "
                            f"publish its partitions as separate articles")
    if relkind != "r":
        raise TopologyError(f"{schema}.{table} is not an ordinary table (relkind {relkind!r}); only "
                            f"tables can be published")
    columns = [Column(name, typ, notnull, typoid) for name, typ, notnull, typoid in conn.execute(
        "SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod), a.attnotnull, a.atttypid "
        "FROM pg_catalog.pg_attribute a WHERE a.attrelid = %s AND a.attnum > 0 "
        "AND NOT a.attisdropped AND a.attgenerated = '' ORDER BY a.attnum", (oid,))]
    primary_key: list[str] = []
    unique_keys: list[list[str]] = []
    for is_primary, cols in conn.execute(
            "SELECT i.indisprimary, ARRAY(SELECT a.attname FROM unnest(i.indkey) WITH ORDINALITY "
            "AS k(attnum, ord) JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = k.attnum ORDER BY k.ord) "
            "FROM pg_catalog.pg_index i WHERE i.indrelid = %s AND i.indisunique "
            "AND i.indpred IS NULL AND i.indexprs IS NULL ORDER BY i.indisprimary DESC, i.indexrelid",
            (oid,)):
        if is_primary:
            primary_key = list(cols)
        else:
            unique_keys.append(list(cols))
    if not primary_key:
        raise TopologyError(
            f"table {schema}.{table} has no primary key; transactional replication needs one to find "
            f"rows at subscribers. Add one (ALTER TABLE {schema}.{table} ADD PRIMARY KEY (...)) or "
            f"remove the article")
    return TableInfo(schema, table, oid, columns, primary_key, unique_keys, generated_columns(conn, oid))


def generated_columns(conn: psycopg.Connection, oid: int) -> list[GeneratedColumn]:
    """The table's stored generated columns, with their expressions and the columns they read."""
    return [GeneratedColumn(name, typ, expr, position, tuple(deps)) for name, typ, expr, position, deps in conn.execute(
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
        "AND a.attgenerated = 's' ORDER BY a.attnum", (oid,))]
