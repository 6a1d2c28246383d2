"""Applying a topology: check it against the publisher's catalog, prepare the publisher
(replica identity, PostgreSQL publication) and record it in the distribution database.

Applying is idempotent: run it as often as you like; it only changes what differs.
"""

from __future__ import annotations

import logging
from dataclasses import asdict

import psycopg
from psycopg import sql

from . import catalog, connections, distdb, naming
from .articles import ResolvedArticle, resolve_articles
from .topology import Publication, Topology

log = logging.getLogger(__name__)


def check_reachable(topology: Topology) -> None:
    """Connect once to every server of the topology; unreachable ones raise ConnectionFailed."""
    for role, endpoint in [("publisher", topology.publisher), ("distributor", topology.distributor),
                           *[(f"subscriber {k!r}", v) for k, v in topology.subscribers.items()]]:
        connections.connect(endpoint.require(role), role).close()


def resolve_publication(pub_conn: psycopg.Connection, publication: Publication) -> list[ResolvedArticle]:
    tables = {a.name: catalog.load_table(pub_conn, a.source_schema, a.source_table)
              for a in publication.articles}
    return resolve_articles(publication, tables)


def prepare_publisher(pub_conn: psycopg.Connection, publication: str, articles: list[ResolvedArticle]) -> None:
    """REPLICA IDENTITY FULL on every published table (so before images are logged), and a
    PostgreSQL publication listing exactly the article tables."""
    pgpub = naming.pg_publication(publication)
    with pub_conn.transaction():
        for art in articles:
            ident = pub_conn.execute("SELECT relreplident FROM pg_catalog.pg_class WHERE oid = %s",
                                     (art.table.oid,)).fetchone()[0]
            if ident != "f":
                pub_conn.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(
                    sql.Identifier(art.table.schema, art.table.name)))
        tables = sql.SQL(", ").join(sql.Identifier(a.table.schema, a.table.name) for a in articles)
        exists = pub_conn.execute("SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = %s",
                                  (pgpub,)).fetchone()
        if exists:
            current = {(s, t) for s, t in pub_conn.execute(
                "SELECT schemaname, tablename FROM pg_catalog.pg_publication_tables WHERE pubname = %s",
                (pgpub,))}
            if current != {(a.table.schema, a.table.name) for a in articles}:
                pub_conn.execute(sql.SQL("ALTER PUBLICATION {} SET TABLE {}").format(
                    sql.Identifier(pgpub), tables))
        else:
            pub_conn.execute(sql.SQL(
                "CREATE PUBLICATION {} FOR TABLE {} WITH (publish = 'insert, update, delete, truncate')"
            ).format(sql.Identifier(pgpub), tables))


def apply_topology(topology: Topology, publications: list[str] | None = None) -> dict[str, list[ResolvedArticle]]:
    """Validate and deploy the topology (or some of its publications).  Returns the resolved
    articles per publication."""
    check_reachable(topology)
    names = publications or list(topology.publications)
    resolved: dict[str, list[ResolvedArticle]] = {}
    with connections.connect(topology.publisher.require("publisher"), "publisher") as pub_conn:
        dbname = pub_conn.info.dbname
        for name in names:
            resolved[name] = resolve_publication(pub_conn, topology.publication(name))
        for name in names:
            prepare_publisher(pub_conn, name, resolved[name])
    with connections.connect(topology.distributor.require("distributor"), "distributor") as dist:
        distdb.ensure_schema(dist)
        with dist.transaction():
            for name in names:
                distdb.save_publication(dist, name, naming.pg_publication(name), naming.slot(name, dbname),
                                        resolved[name])
                for sub in topology.subscriptions_of(name):
                    opts = {k: v for k, v in asdict(sub).items() if k not in ("publication", "subscriber")}
                    distdb.save_subscription(dist, name, sub.subscriber, opts)
    log.info("applied topology: %s", ", ".join(f"{n} ({len(a)} articles)" for n, a in resolved.items()))
    return resolved
