"""Applying a topology: check it against the publisher's catalog, prepare the publisher
(replica identity, PostgreSQL publication) and record it in the distribution database.

Applying is idempotent: run it as often as you like; it only changes what differs.
"""

from __future__ import annotations

import logging

import psycopg
from psycopg import sql

from airflow_repl.engine.articles.resolved import ResolvedArticle, resolve_articles
from airflow_repl.engine.codegen import call_syntax
from airflow_repl.engine.errors import TopologyError
from airflow_repl.engine.model import naming
from airflow_repl.engine.model.topology import Publication, Topology
from airflow_repl.engine.postgres import catalog, connections, raw_sql
from airflow_repl.engine.provisioning import updating_setup
from airflow_repl.engine.state import dist_publications, dist_schema, dist_subscriptions, publisher_state

log = logging.getLogger(__name__)


def check_reachable(topology: Topology) -> None:
    """Connect once to every server of the topology; unreachable ones raise ConnectionFailed."""
    for role, endpoint in [
        ("publisher", topology.publisher),
        ("distributor", topology.distributor),
        *[(f"subscriber {k!r}", v) for k, v in topology.subscribers.items()],
    ]:
        connections.connect(endpoint.require(role), role).close()


def resolve_publication(pub_conn: psycopg.Connection, publication: Publication) -> list[ResolvedArticle]:
    tables = {a.name: catalog.load_table(pub_conn, a.source_schema, a.source_table) for a in publication.articles}
    articles = resolve_articles(publication, tables)
    for art in articles:  # before anything changes at the publisher or the distributor
        call_syntax.check_argument_limit(art)
    return articles


def _table_spec(art: ResolvedArticle, row_filter: str | None) -> sql.Composable:
    # ONLY: a parent's inheritance children are published only when the article includes them
    # (then PostgreSQL adds each of them to the publication, with the parent's row filter)
    table = art.source
    if row_filter is None:
        return table
    # The predicate passed check_predicate (balanced parentheses, no ';', no comments), so it
    # cannot leave its parentheses; PostgreSQL parses and validates it here.
    return sql.SQL("{} WHERE ({})").format(table, sql.SQL(row_filter))


def resolve_children(pub_conn: psycopg.Connection, publication: Publication, articles: list[ResolvedArticle]) -> None:
    """The inheritance descendants of every article that includes its children, from pg_inherits
    as it is now (a child created later joins when the topology is applied again).  A table
    cannot be both an article and a child included by another article."""
    sources = {(a.table.schema, a.table.name): a.name for a in articles}
    for art in articles:
        if not art.include_children:
            art.children = None
            continue
        art.children = [
            [s, t]
            for s, t in pub_conn.execute(
                "WITH RECURSIVE d(oid) AS (SELECT inhrelid FROM pg_catalog.pg_inherits WHERE inhparent = %s "
                "UNION SELECT i.inhrelid FROM pg_catalog.pg_inherits i JOIN d ON i.inhparent = d.oid) "
                "SELECT n.nspname, c.relname FROM d JOIN pg_catalog.pg_class c ON c.oid = d.oid "
                "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace ORDER BY 1, 2",
                (art.table.oid,),
            )
        ]
        for schema, table in art.children:
            if (schema, table) in sources:
                raise TopologyError(
                    f"table {schema}.{table} is published by article {sources[(schema, table)]!r} and is also an "
                    f"inheritance child of {art.table.qualified}, whose article {art.name!r} includes its "
                    f"children (include_children: true) in publication {publication.name!r}: remove one of them"
                )


def prepare_publisher(pub_conn: psycopg.Connection, publication: Publication, articles: list[ResolvedArticle]) -> None:
    """REPLICA IDENTITY FULL on every published table (so before images are logged), and a
    PostgreSQL publication listing exactly the article tables with their row filters.  Row
    filters are validated by PostgreSQL here; their deparsed form is stored on the articles."""
    pgpub = naming.pg_publication(publication.name)
    filters = {a.name: a.row_filter for a in publication.articles}
    resolve_children(pub_conn, publication, articles)
    with pub_conn.transaction():
        _replica_identity_full(pub_conn, articles)
        pub_conn.execute("SET LOCAL standard_conforming_strings = on")  # the quoting check_predicate assumes
        for art in articles:  # one at a time, so that an error names its article
            _check_row_filter(pub_conn, art, filters[art.name])
        _publish(pub_conn, publication, pgpub, sql.SQL(", ").join(_table_spec(a, filters[a.name]) for a in articles))
        stored = _stored_row_filters(pub_conn, pgpub)
    for art in articles:
        art.row_filter = stored.get((art.table.schema, art.table.name))


def _replica_identity_full(pub_conn: psycopg.Connection, articles: list[ResolvedArticle]) -> None:
    """REPLICA IDENTITY FULL on each article table (and included child) that lacks it."""
    for art in articles:
        for schema, table in [(art.table.schema, art.table.name), *(art.children or [])]:
            (ident,) = raw_sql.one_row(
                pub_conn.execute(
                    "SELECT c.relreplident FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
                    "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
                    (schema, table),
                )
            )
            if ident != "f":
                pub_conn.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(sql.Identifier(schema, table)))


def _check_row_filter(pub_conn: psycopg.Connection, art: ResolvedArticle, row_filter: str | None) -> None:
    """Let PostgreSQL parse the article's row filter on its table, naming the article when it
    refuses it."""
    try:
        with pub_conn.transaction():
            pub_conn.execute(
                sql.SQL("SELECT 1 FROM {} WHERE ({}) LIMIT 0").format(
                    sql.Identifier(art.table.schema, art.table.name), sql.SQL(row_filter or "true")
                ),
                prepare=True,
            )  # one statement, never a script
    except psycopg.Error as exc:
        raise TopologyError(
            f"row_filter of article {art.name!r} ({art.table.qualified}) is rejected by the "
            f"publisher: {exc.diag.message_primary or exc}"
        ) from None


def _publish(pub_conn: psycopg.Connection, publication: Publication, pgpub: str, tables: sql.Composed) -> None:
    """CREATE the PostgreSQL publication, or set its tables when it exists."""
    exists = pub_conn.execute("SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = %s", (pgpub,)).fetchone()
    statement = (
        sql.SQL("ALTER PUBLICATION {} SET TABLE {}")
        if exists
        else sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WITH (publish = 'insert, update, delete, truncate')")
    )
    try:
        pub_conn.execute(statement.format(sql.Identifier(pgpub), tables), prepare=True)
    except psycopg.Error as exc:
        raise TopologyError(
            f"publication {publication.name!r}: the publisher rejected its row filters: "
            f"{exc.diag.message_primary or exc}"
        ) from None


def _stored_row_filters(pub_conn: psycopg.Connection, pgpub: str) -> dict[tuple[str, str], str | None]:
    """(schema, table) -> the row filter as PostgreSQL stored it (deparsed), None for none."""
    return {
        (schema, table): row_filter
        for schema, table, row_filter in pub_conn.execute(
            "SELECT n.nspname, c.relname, pg_catalog.pg_get_expr(pr.prqual, pr.prrelid) "
            "FROM pg_catalog.pg_publication_rel pr JOIN pg_catalog.pg_publication p ON p.oid = pr.prpubid "
            "JOIN pg_catalog.pg_class c ON c.oid = pr.prrelid "
            "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE p.pubname = %s",
            (pgpub,),
        )
    }


def apply_topology(topology: Topology, publications: list[str] | None = None) -> dict[str, list[ResolvedArticle]]:
    """Validate and deploy the topology (or some of its publications).  Returns the resolved
    articles per publication."""
    check_reachable(topology)
    names = publications or list(topology.publications)
    with connections.connect(topology.distributor.require("distributor"), "distributor") as dist:
        dist_schema.check_encoding(dist)  # before the publisher is changed
        updating_setup.refuse_turning_off(topology, dist_publications.recorded_updating_options(dist, names))
        dist.rollback()
    with connections.connect(topology.publisher.require("publisher"), "publisher") as pub_conn:
        dbname = pub_conn.info.dbname
        for name in names:
            refuse_unread(pub_conn, name, f"applying publication {name!r}")
        pub_conn.rollback()
        resolved = _prepare_publications(pub_conn, topology, names)
    with connections.connect(topology.distributor.require("distributor"), "distributor") as dist:
        dist_schema.ensure_schema(dist)
        with dist.transaction():
            for name in names:
                _save_publication(dist, topology, name, dbname, resolved[name])
    log.info("applied topology: %s", ", ".join(f"{n} ({len(a)} articles)" for n, a in resolved.items()))
    return resolved


def refuse_unread(conn: psycopg.Connection, publication: str, doing: str) -> None:
    """TopologyError when a schema change of ``publication`` is not stored by its Log Reader yet:
    the article definitions cannot be recorded anew while older changes still have the old columns."""
    unread = publisher_state.unread_schema_changes(conn, publication)
    if unread:
        article, statement = unread[0]
        raise TopologyError(
            f"{doing}: schema change {statement!r} of article {article!r} (publication {publication!r}) "
            f"{'and ' + str(len(unread) - 1) + ' more ' if len(unread) > 1 else ''}has not been read by the Log "
            f"Reader yet: run the Log Reader Agent first"
        )


def _prepare_publications(
    pub_conn: psycopg.Connection, topology: Topology, names: list[str]
) -> dict[str, list[ResolvedArticle]]:
    """Resolve and check every publication first, then add row versions (re-resolving the
    articles, which now have the column) and prepare the publisher."""
    resolved = {name: resolve_publication(pub_conn, topology.publication(name)) for name in names}
    for name in names:
        updating_setup.check_publication(pub_conn, topology.publication(name), resolved[name])
    for name in names:
        if updating_setup.add_row_versions(pub_conn, topology.publication(name), resolved[name]):
            resolved[name] = resolve_publication(pub_conn, topology.publication(name))
    for name in names:
        prepare_publisher(pub_conn, topology.publication(name), resolved[name])
    return resolved


def _save_publication(
    dist: psycopg.Connection, topology: Topology, name: str, dbname: str, articles: list[ResolvedArticle]
) -> None:
    """The publication, its options, articles and subscriptions in the distribution database."""
    publication = topology.publication(name)
    dist_publications.save_publication(
        dist,
        name,
        naming.pg_publication(name),
        naming.slot(name, dbname),
        articles,
        updating_setup.updating_options(publication),
    )
    for sub in topology.subscriptions_of(name):
        dist_subscriptions.save_subscription(dist, name, sub.subscriber, sub.options(), str(sub.update_mode))
