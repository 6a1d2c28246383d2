"""An article resolved against the publisher's catalog: everything the agents need to read,
transform and apply its changes, without going back to the publisher."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from psycopg import sql

from airflow_repl.engine.model import naming
from airflow_repl.engine.model.propagation import OPERATIONS, Method, Operation, Propagation, parse_propagation
from airflow_repl.engine.model.topology import Article, Publication
from airflow_repl.engine.model.updating import ROW_VERSION_COLUMN
from airflow_repl.engine.postgres.catalog import Column, TableInfo


@dataclass
class ResolvedArticle:
    publication: str
    name: str
    table: TableInfo  # the source table at the publisher
    dest_schema: str
    dest_table: str
    propagation: dict[Operation, Propagation]  # how each operation propagates
    default_procs: dict[Operation, str]  # operation -> generated procedure name (in dest_schema)
    column_list: list[str] | None = None  # column filter (primary key included), None = all
    row_filter: str | None = None  # PostgreSQL's deparsed form of the article's row filter
    update_mode: str = "key_changes"  # see topology.UPDATE_MODES
    include_children: bool = False  # replicate the inheritance children's rows too
    children: list[list[str]] | None = None  # [schema, table] of those children, resolved when applied

    @property
    def columns(self) -> list[Column]:
        """The replicated columns, in table order (the column filter applied)."""
        if self.column_list is None:
            return self.table.columns
        return [c for c in self.table.columns if c.name in self.column_list]

    # The three below are computed once per article (the agents ask for them per row change);
    # an article's definition is never changed in place: a schema change makes a new one.
    @cached_property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def primary_key(self) -> list[str]:
        return self.table.primary_key

    @cached_property
    def pk_positions(self) -> list[int]:
        names = self.column_names
        return [names.index(c) for c in self.primary_key]

    @cached_property
    def unique_positions(self) -> list[list[int]]:
        names = self.column_names
        return [[names.index(c) for c in key] for key in self.table.unique_keys if set(key) <= set(names)]

    @cached_property
    def key_positions(self) -> list[int]:
        """The positions of every column of the primary key or of a unique constraint."""
        positions = set(self.pk_positions)
        for key in self.unique_positions:
            positions.update(key)
        return sorted(positions)

    @cached_property
    def digest(self) -> str:
        """A fingerprint of this article's definition (sha1 of its stored form)."""
        return hashlib.sha1(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()

    @property
    def source(self) -> sql.Composable:
        """The publisher table as the snapshot and validation read it: ``ONLY`` the table, or the
        table with its inheritance children (projected onto its columns) when they are included,
        or a partitioned table with its partitions (where its rows are)."""
        table = sql.Identifier(self.table.schema, self.table.name)
        return table if self.include_children or self.table.partitioned else sql.SQL("ONLY {}").format(table)

    @property
    def destination(self) -> str:
        return f"{self.dest_schema}.{self.dest_table}"

    def procedure(self, operation: Operation) -> tuple[str, str] | None:
        """(schema, name) of the procedure called for ``operation``, or None for SQL/NONE."""
        if self.propagation[operation].method != Method.PROC:
            return None
        return self.called_procedure(operation)

    def called_procedure(self, operation: Operation) -> tuple[str, str]:
        """(schema, name) of the procedure called for ``operation``, which must propagate by a
        procedure call (ValueError otherwise)."""
        prop = self.propagation[operation]
        if prop.method != Method.PROC:
            raise ValueError(f"{operation}s of article {self.name!r} propagate by {prop.text}, not by a procedure")
        if prop.procedure:
            schema, _, name = prop.procedure.rpartition(".")
            return (schema or self.dest_schema, name)
        return (self.dest_schema, self.default_procs[operation])

    # -- serialisation: stored in the distribution database with the article
    def to_dict(self) -> dict[str, Any]:
        return {
            "publication": self.publication,
            "name": self.name,
            "table": self.table.to_dict(),
            "dest_schema": self.dest_schema,
            "dest_table": self.dest_table,
            "propagation": {op: p.text for op, p in self.propagation.items()},
            "default_procs": self.default_procs,
            "column_list": self.column_list,
            "row_filter": self.row_filter,
            "update_mode": self.update_mode,
            **({"include_children": True, "children": self.children or []} if self.include_children else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ResolvedArticle:
        return cls(
            data["publication"],
            data["name"],
            TableInfo.from_dict(data["table"]),
            data["dest_schema"],
            data["dest_table"],
            {
                Operation(op): parse_propagation(op, text, article=data["name"])
                for op, text in data["propagation"].items()
            },
            {Operation(op): name for op, name in data["default_procs"].items()},
            data.get("column_list"),
            data.get("row_filter"),
            data.get("update_mode", "key_changes"),
            bool(data.get("include_children", False)),
            data.get("children"),
        )


def definition_hash(articles: list[ResolvedArticle]) -> str:
    """A fingerprint of a publication's article definitions: a subscription initialized under
    one set of definitions cannot take commands recorded under another."""
    payload = json.dumps(sorted((a.to_dict() for a in articles), key=lambda d: d["name"]), sort_keys=True)
    return hashlib.sha1(payload.encode()).hexdigest()


def resolve_articles(publication: Publication, tables: dict[str, TableInfo]) -> list[ResolvedArticle]:
    """Resolve a publication's articles; ``tables`` maps article name to its source table."""
    base = {a.name: naming.default_procedure("ins", a.dest_schema, a.dest_table) for a in publication.articles}
    clashes = {n for n, k in Counter(base.values()).items() if k > 1}
    out: list[ResolvedArticle] = []
    for art in publication.articles:
        clash = base[art.name] in clashes
        procs = {
            op: naming.default_procedure(op.prefix, art.dest_schema, art.dest_table, disambiguate=clash)
            for op in OPERATIONS
        }
        out.append(
            ResolvedArticle(
                publication.name,
                art.name,
                tables[art.name],
                art.dest_schema,
                art.dest_table,
                _propagation(art),
                procs,
                _column_list(art, tables[art.name], publication.updatable),
                None,
                art.updates_as_delete_insert,
                art.include_children,
            )
        )
    return out


def _column_list(art: Article, table: TableInfo, updatable: bool = False) -> list[str] | None:
    """Validate a column filter against the table; the primary key is always replicated, and so
    is the row-version column of an updatable publication's table."""
    if art.columns is None:
        return None
    for name in art.columns:
        try:
            table.column(name)
        except Exception as exc:
            raise type(exc)(f"column filter of article {art.name!r}: {exc}") from None
    wanted = set(art.columns) | set(table.primary_key) | ({ROW_VERSION_COLUMN} if updatable else set())
    return [c for c in table.column_names if c in wanted]


def _propagation(art: Article) -> dict[Operation, Propagation]:
    return {Operation.INSERT: art.ins_cmd, Operation.UPDATE: art.upd_cmd, Operation.DELETE: art.del_cmd}
