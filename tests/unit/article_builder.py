"""Resolved articles for unit tests that need one without a server.

:func:`text_article`: table ``public.t`` with an ``integer`` key ``id`` and text columns, each
operation propagated by ``CALL`` unless a keyword (``insert=``, ``update=``, ``delete=``) names
another method.  :func:`article`: the same for any table, destination and name."""

from __future__ import annotations

from collections.abc import Sequence

from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.model import naming
from airflow_repl.engine.model.propagation import Operation, parse_propagation
from airflow_repl.engine.postgres.catalog import Column, TableInfo


def article(
    table: TableInfo,
    *,
    name: str | None = None,
    dest_schema: str | None = None,
    dest_table: str | None = None,
    **props: str,
) -> ResolvedArticle:
    """Article ``name`` (the table's name by default) of publication ``p`` replicating every
    column of ``table`` to ``dest_schema.dest_table`` (the table's own by default), with SQL
    Server's procedure names as the engine makes them (63 bytes at most)."""
    name = table.name if name is None else name
    dest_schema = table.schema if dest_schema is None else dest_schema
    dest_table = table.name if dest_table is None else dest_table
    return ResolvedArticle(
        "p",
        name,
        table,
        dest_schema,
        dest_table,
        {op: parse_propagation(op, props.get(op.value, "CALL"), article=name) for op in Operation},
        {op: naming.default_procedure(op.prefix, dest_schema, dest_table) for op in Operation},
    )


def text_article(
    columns: Sequence[str] = ("a", "b"),
    *,
    name: str = "t",
    dest_schema: str = "public",
    dest_table: str = "t",
    **props: str,
) -> ResolvedArticle:
    """Article ``name`` of publication ``p``: ``id`` and the text ``columns``, delivered to
    ``dest_schema.dest_table`` with SQL Server's procedure names."""
    cols = [Column("id", "integer", True, 23)] + [Column(c, "text", False, 25) for c in columns]
    table = TableInfo("public", "t", 1, cols, ["id"])
    return article(table, name=name, dest_schema=dest_schema, dest_table=dest_table, **props)
