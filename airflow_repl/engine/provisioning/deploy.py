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
from airflow_repl.engine.mariadb import connections as mariadb_connections
from airflow_repl.engine.model import naming
from airflow_repl.engine.model.topology import Publication, Topology, is_mariadb
from airflow_repl.engine.postgres import catalog, connections, raw_sql
from airflow_repl.engine.provisioning import updating_setup
from airflow_repl.engine.state import dist_publications, dist_schema, dist_subscriptions, publisher_state

log = logging.getLogger(__name__)

#: The options of every PostgreSQL publication airflow-repl makes: every operation, and the
#: changes of a partitioned table's partitions (present and attached later) published as the
#: partitioned table's own (its row filter applies to them, pgoutput names the table).
PUBLICATION_OPTIONS = sql.SQL("publish = 'insert, update, delete, truncate', publish_via_partition_root = true")
#: How long the Log Reader waits for a partition's lock to give it REPLICA IDENTITY FULL.
PARTITION_LOCK_WAIT = "2s"


def check_reachable(topology: Topology, *, subscribers_only: bool = False) -> None:
    """Connect once to every server of the topology (``subscribers_only``: to the subscribers,
    the caller holding connections to the others); unreachable ones raise ConnectionFailed."""
    servers = [] if subscribers_only else [("publisher", topology.publisher), ("distributor", topology.distributor)]
    for role, endpoint in [*servers, *[(f"subscriber {k!r}", v) for k, v in topology.subscribers.items()]]:
        conninfo = endpoint.require(role)
        if is_mariadb(conninfo):
            mariadb_connections.connect(conninfo, f"MariaDB {role}").close()
        else:
            connections.connect(conninfo, role).close()


def resolve_publication(
    pub_conn: psycopg.Connection, publication: Publication, server: str = "PostgreSQL"
) -> list[ResolvedArticle]:
    """The publication's articles, from the publisher's catalog; refused when a procedure call
    would pass more parameters than the subscribers' ``server`` takes (PostgreSQL; SQL Server
    for the T-SQL script)."""
    tables = {a.name: catalog.load_table(pub_conn, a.source_schema, a.source_table) for a in publication.articles}
    articles = resolve_articles(publication, tables)
    for art in articles:  # before anything changes at the publisher or the distributor
        call_syntax.check_argument_limit(art, server)
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


def resolve_children(
    pub_conn: psycopg.Connection, publication: Publication, articles: list[ResolvedArticle]
) -> dict[str, list[tuple[str, str]]]:
    """The tables every article reads besides its own, from pg_inherits as it is now: the
    inheritance descendants of an article that includes its children (stored on the article; a
    child created later joins when the topology is applied again), and the partitions of a
    partitioned table (not stored: a partition attached later is published with its table, as
    PostgreSQL publishes it).  A table cannot be both an article and one of those of another
    article.  Returns article -> those tables."""
    sources = {(a.table.schema, a.table.name): a.name for a in articles}
    out: dict[str, list[tuple[str, str]]] = {}
    for art in articles:
        if art.include_children and art.table.partitioned:
            raise TopologyError(
                f"article {art.name!r} of publication {publication.name!r}: {art.table.qualified} is a partitioned "
                f"table, whose partitions are always published with it: remove include_children"
            )
        tables = catalog.descendants(pub_conn, art.table.oid) if art.include_children or art.table.partitioned else []
        art.children = [[s, t] for s, t in tables] if art.include_children else None
        out[art.name] = tables
        for schema, table in tables:
            if (schema, table) in sources:
                what = (
                    f"an inheritance child of {art.table.qualified}, whose article {art.name!r} includes its "
                    f"children (include_children: true)"
                    if art.include_children
                    else f"a partition of {art.table.qualified}, whose article {art.name!r} publishes the changes of "
                    f"its partitions as its own"
                )
                raise TopologyError(
                    f"table {schema}.{table} is published by article {sources[(schema, table)]!r} and is also {what} "
                    f"in publication {publication.name!r}: remove one of them"
                )
    return out


def prepare_publisher(pub_conn: psycopg.Connection, publication: Publication, articles: list[ResolvedArticle]) -> None:
    """REPLICA IDENTITY FULL on every published table and partition (so before images are
    logged), and a PostgreSQL publication listing exactly the article tables with their row
    filters, publishing a partitioned table's changes as its own.  Row filters are validated
    by PostgreSQL here; their deparsed form is stored on the articles."""
    pgpub = naming.pg_publication(publication.name)
    filters = {a.name: a.row_filter for a in publication.articles}
    descendants = resolve_children(pub_conn, publication, articles)
    with pub_conn.transaction():
        full_replica_identity(
            pub_conn, [t for a in articles for t in [(a.table.schema, a.table.name), *descendants[a.name]]]
        )
        pub_conn.execute("SET LOCAL standard_conforming_strings = on")  # the quoting check_predicate assumes
        for art in articles:  # one at a time, so that an error names its article
            _check_row_filter(pub_conn, art, filters[art.name])
        _publish(pub_conn, publication, pgpub, sql.SQL(", ").join(_table_spec(a, filters[a.name]) for a in articles))
        stored = _stored_row_filters(pub_conn, pgpub)
    for art in articles:
        art.row_filter = stored.get((art.table.schema, art.table.name))


def full_replica_identity(pub_conn: psycopg.Connection, tables: list[tuple[str, str]]) -> list[str]:
    """REPLICA IDENTITY FULL on each of ``tables`` (schema, table) that lacks it; returns those
    changed (``schema.table``).  Each ALTER TABLE takes its table's ACCESS EXCLUSIVE lock."""
    changed = []
    for schema, table in tables:
        (ident,) = raw_sql.one_row(
            pub_conn.execute(
                "SELECT c.relreplident FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
                "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
                (schema, table),
            )
        )
        if ident != "f":
            pub_conn.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(sql.Identifier(schema, table)))
            changed.append(f"{schema}.{table}")
    return changed


def full_replica_identity_of_partitions(pub_conn: psycopg.Connection, articles: list[ResolvedArticle]) -> list[str]:
    """REPLICA IDENTITY FULL on the partitions of the partitioned articles that lack it (created
    or attached since the topology was applied), each in a savepoint of its own that waits at
    most :data:`PARTITION_LOCK_WAIT` for the partition's lock: one busy longer (or gone
    meanwhile) is left for the next call, with a warning.  Committed here (the locks go at once);
    returns the partitions changed."""
    changed = []
    for art in articles:
        if not art.table.partitioned:
            continue
        for schema, table in catalog.descendants(pub_conn, art.table.oid):
            try:
                with pub_conn.transaction():
                    pub_conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(PARTITION_LOCK_WAIT)))
                    changed += full_replica_identity(pub_conn, [(schema, table)])
            except (psycopg.errors.LockNotAvailable, LookupError) as exc:
                log.warning(
                    "partition %s.%s of %s (article %r) keeps its replica identity for now: %s",
                    schema,
                    table,
                    art.table.qualified,
                    art.name,
                    exc,
                )
    pub_conn.commit()
    if changed:
        log.info("REPLICA IDENTITY FULL on partition(s) %s", ", ".join(changed))
    return changed


def _check_row_filter(pub_conn: psycopg.Connection, art: ResolvedArticle, row_filter: str | None) -> None:
    """Let PostgreSQL check the article's row filter on its table, naming the article and the
    filter when it refuses it: first as a query's condition (unknown columns, syntax and type
    errors), then as a publication's row filter (PostgreSQL's rules for those: no user-defined
    or mutable functions, no system columns, ...), on a publication of this table alone made in
    a savepoint that is always rolled back."""
    if row_filter is None:
        return
    table = sql.Identifier(art.table.schema, art.table.name)
    try:
        with pub_conn.transaction():
            pub_conn.execute(
                sql.SQL("SELECT 1 FROM {} WHERE ({}) LIMIT 0").format(table, sql.SQL(row_filter)), prepare=True
            )  # one statement, never a script
            pub_conn.execute(
                sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WHERE ({}) WITH ({})").format(
                    sql.Identifier(naming.ROW_FILTER_PROBE), table, sql.SQL(row_filter), PUBLICATION_OPTIONS
                ),
                prepare=True,
            )
            raise psycopg.Rollback()  # the probe publication is never kept
    except psycopg.Error as exc:
        reason = " ".join(filter(None, [exc.diag.message_primary or str(exc), exc.diag.message_detail]))
        raise TopologyError(
            f"row_filter of article {art.name!r} ({art.table.qualified}) is rejected by the publisher: "
            f"{' '.join(reason.split())}; the filter: {row_filter!r}"
        ) from None


def deparse_row_filters(
    pub_conn: psycopg.Connection, publication: Publication, articles: list[ResolvedArticle]
) -> None:
    """Set each article's row filter to the form PostgreSQL would store for the topology's
    (what :func:`prepare_publisher` records), changing nothing: each filter is checked as
    apply checks it, then put on a probe publication in a transaction that is always rolled back."""
    filters = {a.name: a.row_filter for a in publication.articles}
    with pub_conn.transaction():
        pub_conn.execute("SET LOCAL standard_conforming_strings = on")  # the quoting check_predicate assumes
        for art in articles:
            row_filter = filters[art.name]
            _check_row_filter(pub_conn, art, row_filter)
            if row_filter is None:
                art.row_filter = None
                continue
            probe = sql.Identifier(naming.ROW_FILTER_PROBE)
            pub_conn.execute(
                sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WHERE ({}) WITH ({})").format(
                    probe, sql.Identifier(art.table.schema, art.table.name), sql.SQL(row_filter), PUBLICATION_OPTIONS
                )
            )
            art.row_filter = _stored_row_filters(pub_conn, naming.ROW_FILTER_PROBE).get(
                (art.table.schema, art.table.name)
            )
            pub_conn.execute(sql.SQL("DROP PUBLICATION {}").format(probe))
        raise psycopg.Rollback()  # nothing of the probe is kept


def _publish(pub_conn: psycopg.Connection, publication: Publication, pgpub: str, tables: sql.Composed) -> None:
    """CREATE the PostgreSQL publication, or set its options and tables when it exists."""
    exists = pub_conn.execute("SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = %s", (pgpub,)).fetchone()
    name = sql.Identifier(pgpub)
    statements = (
        [
            sql.SQL("ALTER PUBLICATION {} SET ({})").format(name, PUBLICATION_OPTIONS),
            sql.SQL("ALTER PUBLICATION {} SET TABLE {}").format(name, tables),
        ]
        if exists
        else [sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WITH ({})").format(name, tables, PUBLICATION_OPTIONS)]
    )
    try:
        for statement in statements:
            pub_conn.execute(statement, prepare=True)
    except psycopg.Error as exc:
        raise TopologyError(
            f"publication {publication.name!r}: the publisher rejected its PostgreSQL publication {pgpub}: "
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
    names = publications or list(topology.publications)
    # one connection to the publisher and one to the distributor for the checks and the changes
    # (each connection is a password exchange: a run that applies the topology makes two, not five)
    with (
        connections.connect(topology.publisher.require("publisher"), "publisher") as pub_conn,
        connections.connect(topology.distributor.require("distributor"), "distributor") as dist,
    ):
        check_reachable(topology, subscribers_only=True)
        dist_schema.check_encoding(dist)  # before the publisher is changed
        updating_setup.refuse_turning_off(topology, dist_publications.recorded_updating_options(dist, names))
        refuse_removed_articles(dist, topology, names)
        dist.rollback()
        dbname = pub_conn.info.dbname
        for name in names:
            refuse_unread(pub_conn, name, f"applying publication {name!r}")
        pub_conn.rollback()
        resolved = _prepare_publications(pub_conn, topology, names)
        pub_conn.commit()  # the publisher prepared before the distributor records it
        dist_schema.ensure_schema(dist)
        with dist.transaction():
            for name in names:
                _save_publication(dist, topology, name, dbname, resolved[name])
    log.info("applied topology: %s", ", ".join(f"{n} ({len(a)} articles)" for n, a in resolved.items()))
    return resolved


def refuse_removed_articles(dist: psycopg.Connection, topology: Topology, names: list[str]) -> None:
    """TopologyError, before anything changes, when a recorded article of one of the
    publications is not in the topology file: removing one is a drop, which ``plan`` lists and
    only ``apply --allow-drop`` (or ``airflow-repl drop article``) carries out."""
    for name in names:
        if not dist_publications.publication_deployed(dist, name):
            continue
        wanted = {a.name for a in topology.publication(name).articles}
        removed = [a for a in dist_publications.article_names(dist, name) if a not in wanted]
        if removed:
            raise TopologyError(
                f"article(s) {', '.join(map(repr, removed))} of publication {name!r} are deployed but not in the "
                f"topology file: drop them first (airflow-repl plan lists the drop; airflow-repl apply --allow-drop "
                f"or airflow-repl drop article carries it out), or put them back in the file; nothing was changed"
            )


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
        resolve_children(pub_conn, topology.publication(name), resolved[name])  # its refusals, before any change
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
        if sub.paused is not None and dist_subscriptions.set_paused(dist, name, sub.subscriber, sub.paused):
            log.info("subscription %r/%r %s (topology key paused)", name, sub.subscriber, _PAUSED[sub.paused])


_PAUSED = {True: "paused", False: "resumed"}
