"""Validation of a MariaDB subscriber: each article's rows at the publisher and at the
subscriber compared by canonical value (:func:`~airflow_repl.engine.mariadb.types.canonical`:
the publisher's text converted as delivery converts it, the subscriber's values as the driver
reads them), listing the differing keys with :func:`~airflow_repl.engine.subscriber.validation.merge_rows`.

The publisher's side is read in one repeatable-read transaction, the subscriber's in one
consistent InnoDB snapshot (``START TRANSACTION WITH CONSISTENT SNAPSHOT``).  Each side is read
whole on the driver (not split into Spark tasks, as PostgreSQL subscribers' ranges are): the
memory it takes grows with the tables' rows.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from psycopg import sql

from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.errors import NotInitialized
from airflow_repl.engine.mariadb import connections as mariadb_connections
from airflow_repl.engine.mariadb import types
from airflow_repl.engine.mariadb.quoting import ident
from airflow_repl.engine.model.topology import Topology
from airflow_repl.engine.postgres import connections

#: One side's rows: canonical key -> (key text, canonical row).
Side = dict[str, tuple[str, str]]


def _row_hash(row: list[Any]) -> str:
    return hashlib.md5(json.dumps(row, default=str).encode()).hexdigest()


def _side(art: ResolvedArticle, rows: Any, publisher: bool) -> Side:
    """The rows of one side, each by its canonical key."""
    cols = art.columns
    convs = [types.conversion(c.base_type or c.type) for c in cols]
    where = f"article {art.name!r}"
    out: Side = {}
    for row in rows:
        values = [
            types.canonical(
                convs[i],
                cols[i].base_type or cols[i].type,
                types.to_param(convs[i], v, cols[i].name, where) if publisher else v,
            )
            for i, v in enumerate(row)
        ]
        key = json.dumps([values[i] for i in art.pk_positions], default=str)
        out[key] = (", ".join(str(row[i]) for i in art.pk_positions), _row_hash(values))
    return out


def _publisher_rows(pub: Any, art: ResolvedArticle) -> Side:
    cols = sql.SQL(", ").join(
        sql.SQL("CASE WHEN pg_catalog.num_nulls({c}) = 1 THEN NULL ELSE pg_catalog.concat({c}) END").format(
            c=sql.Identifier(c)
        )
        for c in art.column_names
    )
    where = sql.SQL(art.row_filter) if art.row_filter else sql.SQL("true")
    query = sql.SQL("SELECT {} FROM {} WHERE ({})").format(cols, art.source, where)
    return _side(art, pub.execute(query).fetchall(), publisher=True)


def _subscriber_rows(my: Any, art: ResolvedArticle, subscriber: str) -> Side:
    # FLOAT's text in MariaDB's protocol has 6 digits; as a DOUBLE it is the value stored, exactly
    names = ", ".join(
        f"CAST({ident(c.name)} AS DOUBLE)" if types.conversion(c.base_type or c.type) == types.REAL else ident(c.name)
        for c in art.columns
    )
    with my.cursor() as cur:
        try:
            cur.execute(f"SELECT {names} FROM {ident(art.dest_table)}")
        except Exception as exc:
            if getattr(exc, "args", (None,))[0] == 1146:
                raise NotInitialized(
                    f"MariaDB subscriber {subscriber!r} has no table {art.dest_table!r} for article {art.name!r}: "
                    f"run the Snapshot Agent for it before validating"
                ) from None
            raise
        return _side(art, cur.fetchall(), publisher=False)


def _checksum(side: Side) -> str:
    return hashlib.md5("".join(sorted(h for _, h in side.values())).encode()).hexdigest()


def _sorted(side: Side) -> list[tuple[bytes, str, str]]:
    return sorted((key.encode(), text, h) for key, (text, h) in side.items())


def compare(
    topology: Topology, publication: str, subscriber: str, articles: list[ResolvedArticle], max_keys: int
) -> list[dict[str, Any]]:
    """The report lines of a MariaDB subscriber, in the form of
    :func:`~airflow_repl.engine.subscriber.validation.article_row`."""
    from airflow_repl.engine.subscriber.validation import merge_rows

    conninfo = topology.subscriber_conninfo(subscriber)
    lines: list[dict[str, Any]] = []
    with connections.connect(topology.publisher.require("publisher"), "publisher") as pub:
        pub.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        my = mariadb_connections.connect(conninfo, f"MariaDB subscriber {subscriber!r}")
        try:
            with my.cursor() as cur:
                cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
            for art in articles:
                at_pub, at_sub = _publisher_rows(pub, art), _subscriber_rows(my, art, subscriber)
                found = merge_rows(_sorted(at_pub), _sorted(at_sub), max_keys)
                lines.append(
                    {
                        "article": art.name,
                        "publisher_rows": len(at_pub),
                        "subscriber_rows": len(at_sub),
                        "publisher_checksum": _checksum(at_pub),
                        "subscriber_checksum": _checksum(at_sub),
                        "match": not (found["missing"] or found["extra"] or found["different"]),
                        "ranges": 1,
                        "differing_ranges": int(bool(found["missing"] or found["extra"] or found["different"])),
                        **found,
                    }
                )
        finally:
            my.close()
    return lines
