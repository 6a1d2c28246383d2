"""A resolved article for unit tests that need one without a server: table ``public.t`` with an
``integer`` key ``id`` and text columns, each operation propagated by ``CALL`` unless a keyword
(``insert=``, ``update=``, ``delete=``) names another method."""

from __future__ import annotations

from collections.abc import Sequence

from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.model.propagation import Operation, parse_propagation
from airflow_repl.engine.postgres.catalog import Column, TableInfo


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
    return ResolvedArticle(
        "p",
        name,
        TableInfo("public", "t", 1, cols, ["id"]),
        dest_schema,
        dest_table,
        {op: parse_propagation(op, props.get(op.value, "CALL"), article=name) for op in Operation},
        {op: f"sp_MS{op.prefix}_{dest_schema}{dest_table}" for op in Operation},
    )
