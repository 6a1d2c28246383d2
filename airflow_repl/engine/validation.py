"""Validation: row counts and checksums of every article at the publisher and a subscriber."""

from __future__ import annotations

import psycopg
from psycopg import sql

from . import connections, distdb
from .articles import ResolvedArticle
from .topology import Topology


def table_checksum(conn: psycopg.Connection, schema: str, table: str, columns: list[str],
                   key: list[str], row_filter: str | None = None) -> tuple[int, str]:
    """(row count, md5 over the rows in key order) of ``columns`` of a table, limited to the
    rows passing ``row_filter`` (an article's filter, in PostgreSQL's deparsed form)."""
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    order = sql.SQL(", ").join(sql.Identifier(c) for c in key)
    where = sql.SQL(" WHERE ({})").format(sql.SQL(row_filter)) if row_filter else sql.SQL("")
    count, digest = conn.execute(sql.SQL(
        "SELECT count(*), md5(coalesce(string_agg(md5(ROW({cols})::text), '' ORDER BY {order}), '')) "
        "FROM {table}{where}").format(cols=cols, order=order, table=sql.Identifier(schema, table),
                                      where=where)).fetchone()
    return int(count), digest


def compare(topology: Topology, publication: str, subscriber: str,
            articles: list[ResolvedArticle] | None = None) -> list[dict]:
    """Per article: rows and checksum at the publisher and at the subscriber, and whether they match."""
    if articles is None:
        with connections.connect(topology.distributor.require("distributor"), "distributor") as dist:
            articles = distdb.load_articles(dist, publication)
    out = []
    with connections.connect(topology.publisher.require("publisher"), "publisher") as pub, \
            connections.connect(topology.subscriber_conninfo(subscriber), f"subscriber {subscriber!r}") as sub:
        for art in articles:
            p = table_checksum(pub, art.table.schema, art.table.name, art.column_names, art.primary_key,
                               art.row_filter)
            s = table_checksum(sub, art.dest_schema, art.dest_table, art.column_names, art.primary_key)
            out.append({"article": art.name, "publisher_rows": p[0], "subscriber_rows": s[0],
                        "publisher_checksum": p[1], "subscriber_checksum": s[1], "match": p == s})
    return out


def format_report(rows: list[dict]) -> str:
    lines = [f"{'article':<20} {'pub rows':>9} {'sub rows':>9}  {'publisher checksum':<32}  "
             f"{'subscriber checksum':<32}  match"]
    for r in rows:
        lines.append(f"{r['article']:<20} {r['publisher_rows']:>9} {r['subscriber_rows']:>9}  "
                     f"{r['publisher_checksum']:<32}  {r['subscriber_checksum']:<32}  "
                     f"{'yes' if r['match'] else 'NO'}")
    return "\n".join(lines)
