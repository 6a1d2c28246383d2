"""``airflow-repl apply`` for updatable subscriptions: the rules checked before anything changes,
and the row versions added to the publisher's tables.

Rules (SQL Server's, where they apply to PostgreSQL):

- updating, once allowed on a publication, cannot be turned off: drop and recreate the
  publication instead;
- a column filter of a publication that allows immediate updating cannot leave out a NOT NULL
  column without a default (an insert at the subscriber could not be applied at the publisher);
- a publication that allows immediate updating needs ``max_prepared_transactions`` > 0 at the
  publisher (two-phase commit).

Then every published table of a publication that allows updating gets the row-version column and
its trigger (:mod:`airflow_repl.engine.codegen.updating_scripts`).
"""

from __future__ import annotations

import logging

import psycopg

from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.codegen import key_enforcement, updating_scripts
from airflow_repl.engine.errors import TopologyError
from airflow_repl.engine.model.topology import Publication, Topology
from airflow_repl.engine.model.updating import ROW_VERSION_COLUMN
from airflow_repl.engine.postgres import catalog
from airflow_repl.engine.postgres.quoting import qualified
from airflow_repl.engine.state.dist_publications import UpdatingOptions

log = logging.getLogger(__name__)

_OPTION_NAMES = {"allow_sync_tran": "immediate updating", "allow_queued_tran": "queued updating"}


def updating_options(publication: Publication) -> UpdatingOptions:
    """The publication's options as the distribution database records them."""
    return UpdatingOptions(publication.allow_sync_tran, publication.allow_queued_tran, str(publication.conflict_policy))


def refuse_turning_off(topology: Topology, recorded: dict[str, UpdatingOptions]) -> None:
    """A publication that allowed immediate or queued updating when it was applied must still
    allow it (SQL Server: the option cannot be disabled)."""
    for name, before in recorded.items():
        publication = topology.publication(name)
        for option, what in _OPTION_NAMES.items():
            if getattr(before, option) and not getattr(publication, option):
                raise TopologyError(
                    f"publication {name!r} allows {what} ({option}) since it was applied, and updating cannot be "
                    f"turned off: drop and recreate the publication, or keep '{option}: true'"
                )


def check_publication(pub_conn: psycopg.Connection, publication: Publication, articles: list[ResolvedArticle]) -> None:
    """The checks that read the publisher's catalog: column filters of an immediate-updating
    publication, and an existing row-version column's type."""
    if not publication.updatable:
        return
    if publication.allow_sync_tran:
        _check_two_phase(pub_conn, publication)
    for art in articles:
        _check_not_partitioned(publication, art)
        _check_row_version_column(art)
        if publication.allow_sync_tran and art.column_list is not None:
            _check_column_filter(pub_conn, publication, art)


def _check_not_partitioned(publication: Publication, art: ResolvedArticle) -> None:
    """Updating subscribers work on plain tables at the publisher: the row-version trigger, the
    Queue Reader's and immediate updating's statements and their conflict checks read and write
    the article's table itself, not a partitioned table's partitions."""
    if art.table.partitioned:
        what = " and ".join(
            f"{label} ({option})" for option, label in _OPTION_NAMES.items() if getattr(publication, option)
        )
        raise TopologyError(
            f"article {art.name!r} publishes the partitioned table {art.table.qualified}, and publication "
            f"{publication.name!r} allows {what}, which airflow-repl does not support for partitioned tables: "
            f"publish the table in a publication that does not allow updating"
        )


def _check_two_phase(pub_conn: psycopg.Connection, publication: Publication) -> None:
    """Immediate updating prepares transactions at the publisher: max_prepared_transactions > 0."""
    row = pub_conn.execute("SELECT current_setting('max_prepared_transactions')::int").fetchone()
    if not row or row[0] <= 0:
        raise TopologyError(
            f"publication {publication.name!r} allows immediate updating (allow_sync_tran), which commits a "
            f"subscriber's changes at the publisher with two-phase commit, but the publisher has "
            f"max_prepared_transactions = 0: set it (e.g. to max_connections) in postgresql.conf and restart it"
        )


def _check_column_filter(pub_conn: psycopg.Connection, publication: Publication, art: ResolvedArticle) -> None:
    """An insert at an immediate subscriber gives values for the article's columns only: every
    NOT NULL column without a default must be one of them."""
    kept = set(art.column_list or [])
    for column in catalog.required_columns(pub_conn, art.table.oid):
        if column not in kept:
            raise TopologyError(
                f"article {art.name!r} of publication {publication.name!r} (allow_sync_tran) filters out column "
                f"{column!r}, which is NOT NULL without a default, so a row inserted at an immediate subscriber "
                f"could not be inserted at the publisher: add {column!r} to the article's columns, or give it a "
                f"default at the publisher (ALTER TABLE {art.table.qualified} ALTER COLUMN ... SET DEFAULT ...)"
            )


def _check_row_version_column(art: ResolvedArticle) -> None:
    """A table that has a column named msrepl_tran_version already must have it as a NOT NULL uuid."""
    existing = next((c for c in art.table.columns if c.name == ROW_VERSION_COLUMN), None)
    if existing is None:
        return
    if existing.type != updating_scripts.ROW_VERSION_TYPE or not existing.not_null:
        raise TopologyError(
            f"table {art.table.qualified} of article {art.name!r} has a column {ROW_VERSION_COLUMN!r} of type "
            f"{existing.type}{'' if existing.not_null else ' (nullable)'}, but an updatable publication needs it "
            f"as the row version, uuid NOT NULL: rename or drop that column"
        )


def add_row_versions(pub_conn: psycopg.Connection, publication: Publication, articles: list[ResolvedArticle]) -> bool:
    """Row-version column, default and trigger on every published table of an updatable
    publication (and on the inheritance children an article includes), and their DEFERRABLE keys
    checked even under ``session_replication_role = replica`` (the Queue Reader's role at the
    publisher); False when the publication does not allow updating.  Idempotent."""
    if not publication.updatable:
        return False
    with pub_conn.transaction():
        for art in articles:
            pub_conn.execute(updating_scripts.table_row_version_script(art.table.schema, art.table.name).encode())
            tables = [(art.table.schema, art.table.name), *_children(pub_conn, art)]
            for schema, table in tables[1:]:
                pub_conn.execute(updating_scripts.trigger_script(schema, table).encode())
            for schema, table in tables:  # the Queue Reader writes here as replica: keys stay checked
                pub_conn.execute(key_enforcement.enforce_deferrable_keys_script(qualified(schema, table)).encode())
    log.info("publication %s: row versions on %d table(s)", publication.name, len(articles))
    return True


def _children(pub_conn: psycopg.Connection, art: ResolvedArticle) -> list[tuple[str, str]]:
    """The inheritance descendants of an article that includes its children (they inherit the
    column; each needs its own trigger)."""
    if not art.include_children:
        return []
    rows = pub_conn.execute(
        "WITH RECURSIVE d(oid) AS (SELECT inhrelid FROM pg_catalog.pg_inherits WHERE inhparent = %s "
        "UNION SELECT i.inhrelid FROM pg_catalog.pg_inherits i JOIN d ON i.inhparent = d.oid) "
        "SELECT n.nspname, c.relname FROM d JOIN pg_catalog.pg_class c ON c.oid = d.oid "
        "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind = 'r' ORDER BY 1, 2",
        (art.table.oid,),
    ).fetchall()
    return [(str(schema), str(table)) for schema, table in rows]
