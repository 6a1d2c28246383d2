"""Validation: row counts and checksums of every article at the publisher and a subscriber.

Validation compares *values*, not bytes or orderings.  Each row is turned into its PostgreSQL
text form (the session settings of :mod:`connections` pin everything that text depends on),
converted to UTF8 whatever the database's encoding, and hashed; a table's checksum is the sum of
its rows' hashes.  A sum does not depend on the order rows are visited in, so neither collation
nor encoding can make identical data look different.  When an article differs, the keys that
differ are found by comparing the sums per bucket of key hashes, then the rows of the differing
buckets only.
"""

from __future__ import annotations

import hashlib
from typing import Any

import psycopg
from psycopg import sql

from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.model.topology import Topology
from airflow_repl.engine.postgres import connections, raw_sql
from airflow_repl.engine.state import distdb

#: Buckets the keys are hashed into when looking for the keys that differ (16^BUCKET_DIGITS).
BUCKET_DIGITS = 3
#: Differing keys reported per article.
MAX_KEYS = 10


def _utf8_md5(expr: sql.Composable) -> sql.Composable:
    return sql.SQL("md5(convert_to({}::text, 'UTF8'))").format(expr)


def _row_hash_sums(columns: list[str]) -> sql.Composable:
    """Two numeric sums of the 128-bit row hashes (as two signed 64-bit halves)."""
    digest = _utf8_md5(sql.SQL("ROW({})").format(sql.SQL(", ").join(sql.Identifier(c) for c in columns)))
    half = "coalesce(sum(('x' || substr({d}, {at}, 16))::bit(64)::bigint::numeric), 0)"
    return sql.SQL(", ").join(sql.SQL(half).format(d=digest, at=sql.Literal(at)) for at in (1, 17))


def _key_text(key: list[str]) -> sql.Composable:
    return sql.SQL("ROW({})::text").format(sql.SQL(", ").join(sql.Identifier(c) for c in key))


def _source(relation: sql.Composable, row_filter: str | None) -> sql.Composable:
    where = sql.SQL(" WHERE ({})").format(sql.SQL(row_filter)) if row_filter else sql.SQL("")
    return sql.SQL("{}{}").format(relation, where)


def _digest(count: int, s1: object, s2: object) -> str:
    return hashlib.md5(f"{count}:{s1}:{s2}".encode()).hexdigest()


def table_checksum(
    conn: psycopg.Connection, relation: sql.Composable, columns: list[str], row_filter: str | None = None
) -> tuple[int, str]:
    """(row count, order- and encoding-independent checksum) of ``columns`` of ``relation``,
    limited to the rows passing ``row_filter`` (an article's filter, in PostgreSQL's deparsed form)."""
    count, s1, s2 = raw_sql.one_row(
        raw_sql.execute(
            conn, sql.SQL("SELECT count(*), {} FROM {}").format(_row_hash_sums(columns), _source(relation, row_filter))
        )
    )
    return int(count), _digest(count, s1, s2)


def _buckets(
    conn: psycopg.Connection, relation: sql.Composable, columns: list[str], key: list[str], row_filter: str | None
) -> dict[str, tuple[Any, ...]]:
    bucket = sql.SQL("left({}, {})").format(_utf8_md5(_key_text(key)), sql.Literal(BUCKET_DIGITS))
    return {
        b: tuple(rest)
        for b, *rest in raw_sql.execute(
            conn,
            sql.SQL("SELECT {b} AS bucket, count(*), {sums} FROM {src} GROUP BY 1").format(
                b=bucket, sums=_row_hash_sums(columns), src=_source(relation, row_filter)
            ),
        )
    }


def _rows_in(
    conn: psycopg.Connection,
    relation: sql.Composable,
    columns: list[str],
    key: list[str],
    row_filter: str | None,
    buckets: list[str],
) -> dict[str, str]:
    """key text -> row hash of the rows whose key falls in ``buckets``."""
    cond = sql.SQL("left({}, {}) = ANY({})").format(
        _utf8_md5(_key_text(key)), sql.Literal(BUCKET_DIGITS), sql.Literal(buckets)
    )
    where = sql.SQL(" AND ").join([sql.SQL("({})").format(sql.SQL(row_filter)), cond]) if row_filter else cond
    row = _utf8_md5(sql.SQL("ROW({})").format(sql.SQL(", ").join(sql.Identifier(c) for c in columns)))
    return dict(
        raw_sql.execute(
            conn, sql.SQL("SELECT {}, {} FROM {} WHERE {}").format(_key_text(key), row, relation, where)
        ).fetchall()
    )


def differing_keys(
    pub: psycopg.Connection, sub: psycopg.Connection, art: ResolvedArticle, limit: int = MAX_KEYS
) -> list[dict[str, str]]:
    """Up to ``limit`` keys whose rows differ: missing at the subscriber, extra at the
    subscriber, or with other values.  Reads only the rows of the key buckets that differ."""
    dest = sql.Identifier(art.dest_schema, art.dest_table)
    p = _buckets(pub, art.source, art.column_names, art.primary_key, art.row_filter)
    s = _buckets(sub, dest, art.column_names, art.primary_key, None)
    bad = sorted(b for b in p.keys() | s.keys() if p.get(b) != s.get(b))
    out: list[dict[str, str]] = []
    for i in range(0, len(bad), 16):
        chunk = bad[i : i + 16]
        prow = _rows_in(pub, art.source, art.column_names, art.primary_key, art.row_filter, chunk)
        srow = _rows_in(sub, dest, art.column_names, art.primary_key, None, chunk)
        for k in sorted(prow.keys() | srow.keys()):
            if k not in srow:
                out.append({"key": k, "difference": "missing at the subscriber"})
            elif k not in prow:
                out.append({"key": k, "difference": "extra at the subscriber"})
            elif prow[k] != srow[k]:
                out.append({"key": k, "difference": "values differ"})
            if len(out) >= limit:
                return out
    return out


def compare(
    topology: Topology, publication: str, subscriber: str, articles: list[ResolvedArticle] | None = None
) -> list[dict[str, Any]]:
    """Per article: rows and checksum at the publisher and at the subscriber, whether they
    match, and (when they do not) the first keys that differ."""
    if articles is None:
        with connections.connect(topology.distributor.require("distributor"), "distributor") as dist:
            articles = distdb.load_articles(dist, publication)
    out: list[dict[str, Any]] = []
    with (
        connections.connect(topology.publisher.require("publisher"), "publisher") as pub,
        connections.connect(topology.subscriber_conninfo(subscriber), f"subscriber {subscriber!r}") as sub,
    ):
        for art in articles:
            p = table_checksum(pub, art.source, art.column_names, art.row_filter)
            s = table_checksum(sub, sql.Identifier(art.dest_schema, art.dest_table), art.column_names)
            row: dict[str, Any] = {
                "article": art.name,
                "publisher_rows": p[0],
                "subscriber_rows": s[0],
                "publisher_checksum": p[1],
                "subscriber_checksum": s[1],
                "match": p == s,
            }
            if not row["match"]:
                row["differences"] = differing_keys(pub, sub, art)
            out.append(row)
    return out


def format_report(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'article':<20} {'pub rows':>9} {'sub rows':>9}  {'publisher checksum':<32}  "
        f"{'subscriber checksum':<32}  match"
    ]
    for r in rows:
        lines.append(
            f"{r['article']:<20} {r['publisher_rows']:>9} {r['subscriber_rows']:>9}  "
            f"{r['publisher_checksum']:<32}  {r['subscriber_checksum']:<32}  "
            f"{'yes' if r['match'] else 'NO'}"
        )
        for d in r.get("differences", []):
            lines.append(f"    key {d['key']}: {d['difference']}")
    return "\n".join(lines)
