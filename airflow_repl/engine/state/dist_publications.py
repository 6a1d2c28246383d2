"""The distribution database's publications and their articles: the publication with its
updating options and slot, the article definitions (and those a subscriber behind a schema
change still has), the scripts registered to regenerate an article's custom procedures, and the
snapshots written for a publication."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from airflow_repl.engine.articles.resolved import ResolvedArticle, definition_hash
from airflow_repl.engine.errors import NotInitialized
from airflow_repl.engine.state.dist_schema import SCHEMA, deployed, one_row


@dataclass(frozen=True)
class UpdatingOptions:
    """A publication's updatable-subscription options as recorded in ``airflow_repl.publications``."""

    allow_sync_tran: bool = False
    allow_queued_tran: bool = False
    conflict_policy: str = "pub wins"


def save_publication(
    conn: psycopg.Connection,
    publication: str,
    pg_publication: str,
    slot: str,
    articles: list[ResolvedArticle],
    updating: UpdatingOptions | None = None,
) -> None:
    """Upsert the publication and its articles (an article recorded but not among them stays:
    only a drop removes one).  Updating options once allowed stay allowed (``apply`` refuses a
    topology that turns them off before anything changes)."""
    updating = updating or UpdatingOptions()
    conn.execute(
        "INSERT INTO airflow_repl.publications (name, pg_publication, slot_name, allow_sync_tran, "
        "allow_queued_tran, conflict_policy) VALUES (%s, %s, %s, %s, %s, %s) "
        "ON CONFLICT (name) DO UPDATE SET pg_publication = excluded.pg_publication, updated_at = now(), "
        "allow_sync_tran = airflow_repl.publications.allow_sync_tran OR excluded.allow_sync_tran, "
        "allow_queued_tran = airflow_repl.publications.allow_queued_tran OR excluded.allow_queued_tran, "
        "conflict_policy = excluded.conflict_policy",
        (
            publication,
            pg_publication,
            slot,
            updating.allow_sync_tran,
            updating.allow_queued_tran,
            updating.conflict_policy,
        ),
    )  # the slot keeps the name it was first given
    for art in articles:
        conn.execute(
            "INSERT INTO airflow_repl.articles (publication, name, definition) VALUES (%s, %s, %s) "
            "ON CONFLICT (publication, name) DO UPDATE SET definition = excluded.definition, "
            "updated_at = now() WHERE airflow_repl.articles.definition IS DISTINCT FROM excluded.definition",
            (publication, art.name, Jsonb(art.to_dict())),
        )


def load_articles(conn: psycopg.Connection, publication: str) -> list[ResolvedArticle]:
    rows = (
        []
        if not deployed(conn, "articles")
        else conn.execute(
            "SELECT definition FROM airflow_repl.articles WHERE publication = %s ORDER BY name", (publication,)
        ).fetchall()
    )
    if not rows:
        raise NotInitialized(
            f"publication {publication!r} is not deployed in the distribution database: run the "
            f"Snapshot Agent (or 'airflow-repl apply') for it first"
        )
    return [ResolvedArticle.from_dict(r[0]) for r in rows]


def save_article_definition(conn: psycopg.Connection, article: ResolvedArticle) -> None:
    """The article's definition after a schema change the Log Reader stored (same transaction)."""
    conn.execute(
        "UPDATE airflow_repl.articles SET definition = %s, updated_at = now() WHERE publication = %s AND name = %s",
        (Jsonb(article.to_dict()), article.publication, article.name),
    )


def definitions_partly_applied(
    conn: psycopg.Connection, publication: str, xact: str, command_id: int
) -> tuple[dict[str, ResolvedArticle], dict[str, ResolvedArticle]]:
    """What a subscriber that stopped partway through transaction ``xact``, its progress at
    command ``command_id``, may have, where its DDL commits on its own: (article -> definition
    after the last schema change up to that command, the same once the next schema change of
    the transaction ran too, whose DDL may have committed before the progress moved past it)."""
    rows = conn.execute(
        "SELECT article, command_id, data->'s'->'after' FROM airflow_repl.commands "
        "WHERE publication = %s AND op = 'S' AND xact_seqno = %s::pg_lsn ORDER BY command_id",
        (publication, xact),
    ).fetchall()
    done = {str(a): ResolvedArticle.from_dict(d) for a, cid, d in rows if cid <= command_id}
    after = [(str(a), ResolvedArticle.from_dict(d)) for a, cid, d in rows if cid > command_id][:1]
    return done, {**done, **dict(after)}


def definitions_before(conn: psycopg.Connection, publication: str, after: str) -> dict[str, ResolvedArticle]:
    """article -> its definition before the first schema change stored after xact_seqno
    ``after``: what a subscriber at watermark ``after`` still has (articles without a later
    schema change have their stored definition)."""
    rows = conn.execute(
        "SELECT DISTINCT ON (article) article, data->'s'->'before' FROM airflow_repl.commands "
        "WHERE publication = %s AND op = 'S' AND xact_seqno > %s::pg_lsn ORDER BY article, xact_seqno, command_id",
        (publication, after),
    ).fetchall()
    return {str(name): ResolvedArticle.from_dict(before) for name, before in rows}


def definitions_at(
    conn: psycopg.Connection, publication: str, position: str | None, current: list[ResolvedArticle]
) -> list[ResolvedArticle]:
    """The article definitions a subscriber that has everything up to ``position`` has: the
    ``current`` ones, except those with a schema change after it (sorted by name)."""
    out = {a.name: a for a in current}
    if position is not None:  # a dropped article's schema change still stored is not the subscriber's
        out.update({k: v for k, v in definitions_before(conn, publication, position).items() if k in out})
    return [out[name] for name in sorted(out)]


def rehashed(
    conn: psycopg.Connection,
    publication: str,
    stored: str | None,
    position: str | None,
    before: list[ResolvedArticle],
    after: list[ResolvedArticle],
) -> str | None:
    """The hash of the article definitions a subscription has once its articles go from
    ``before`` to ``after`` (an article dropped, or one copied on its own), when ``stored`` is
    the hash of those it has now (at ``position``); None to leave it (no hash kept, already
    rewritten by an earlier run, or a subscription that must be reinitialized anyway)."""
    if stored is None or stored != definition_hash(definitions_at(conn, publication, position, before)):
        return None
    return definition_hash(definitions_at(conn, publication, position, after))


def save_custom_script(conn: psycopg.Connection, publication: str, article: str, kind: str, body: str) -> None:
    """Register (or replace) the script regenerating the article's custom procedures."""
    conn.execute(
        "INSERT INTO airflow_repl.custom_scripts (publication, article, kind, body) VALUES (%s, %s, %s, %s) "
        "ON CONFLICT (publication, article) DO UPDATE SET kind = excluded.kind, body = excluded.body, "
        "registered_at = now()",
        (publication, article, kind, body),
    )


def drop_custom_script(conn: psycopg.Connection, publication: str, article: str) -> bool:
    """Unregister the article's script; False when none was registered."""
    cur = conn.execute(
        "DELETE FROM airflow_repl.custom_scripts WHERE publication = %s AND article = %s", (publication, article)
    )
    return cur.rowcount > 0


def custom_scripts(conn: psycopg.Connection, publication: str) -> dict[str, tuple[str, str]]:
    """article -> (kind, body) of the publication's registered scripts."""
    if not deployed(conn, "custom_scripts"):
        return {}
    rows = conn.execute(
        "SELECT article, kind, body FROM airflow_repl.custom_scripts WHERE publication = %s", (publication,)
    ).fetchall()
    return {str(a): (str(k), str(b)) for a, k, b in rows}


def slot_name(conn: psycopg.Connection, publication: str) -> str:
    """The publication's logical slot at the publisher, as recorded when it was first deployed."""
    row = conn.execute("SELECT slot_name FROM airflow_repl.publications WHERE name = %s", (publication,)).fetchone()
    if row is None:
        raise NotInitialized(
            f"publication {publication!r} is not deployed in the distribution database: run "
            f"the Snapshot Agent (or 'airflow-repl apply') for it first"
        )
    return str(row[0])


def recorded_updating_options(conn: psycopg.Connection, publications: list[str]) -> dict[str, UpdatingOptions]:
    """The updating options recorded for those of ``publications`` already applied ({} before the
    distribution database has the columns: nothing allowed updating then)."""
    has_columns = one_row(
        conn.execute(
            "SELECT count(*) FROM pg_catalog.pg_attribute WHERE attrelid = to_regclass(%s) "
            "AND attname IN ('allow_sync_tran', 'allow_queued_tran', 'conflict_policy') AND NOT attisdropped",
            (f"{SCHEMA}.publications",),
        )
    )[0]
    if has_columns != 3:
        return {}
    rows = conn.execute(
        "SELECT name, allow_sync_tran, allow_queued_tran, conflict_policy FROM airflow_repl.publications "
        "WHERE name = ANY(%s)",
        (publications,),
    ).fetchall()
    return {str(name): UpdatingOptions(bool(sync), bool(queued), str(policy)) for name, sync, queued, policy in rows}


def publication_was_read(conn: psycopg.Connection[Any], publication: str) -> bool:
    """Has the Log Reader ever stored a transaction of the publication, or does it have an
    active subscription?  (Then a missing slot means lost changes.)"""
    row = conn.execute(
        "SELECT 1 FROM airflow_repl.logreader_state WHERE publication = %s "
        "UNION ALL SELECT 1 FROM airflow_repl.subscriptions WHERE publication = %s "
        "AND status = 'active'",
        (publication, publication),
    ).fetchone()
    return row is not None


def record_snapshot(
    conn: psycopg.Connection[Any],
    publication: str,
    snapshot_id: str,
    folder: str,
    consistent_lsn: str,
    manifest: dict[str, Any],
) -> None:
    """Enter a snapshot folder written for the publication (committed by the caller)."""
    conn.execute(
        "INSERT INTO airflow_repl.snapshots (publication, snapshot_id, folder, consistent_lsn, "
        "manifest) VALUES (%s, %s, %s, %s, %s)",
        (publication, snapshot_id, folder, consistent_lsn, Jsonb(manifest)),
    )


# ---------------------------------------------------------------------- what a drop needs
def publication_deployed(conn: psycopg.Connection[Any], publication: str) -> bool:
    """Is the publication recorded in the distribution database (False before it has a schema)?"""
    if not deployed(conn, "publications"):
        return False
    return (
        conn.execute("SELECT 1 FROM airflow_repl.publications WHERE name = %s", (publication,)).fetchone() is not None
    )


def article_names(conn: psycopg.Connection[Any], publication: str) -> list[str]:
    """The names of the publication's recorded articles, sorted."""
    rows = conn.execute(
        "SELECT name FROM airflow_repl.articles WHERE publication = %s ORDER BY name", (publication,)
    ).fetchall()
    return [str(r[0]) for r in rows]


# ---------------------------------------------------------------------- what airflow-repl plan compares
def deployed_publications(conn: psycopg.Connection[Any]) -> list[str]:
    """The names of the publications the distribution database records, sorted ([] before it
    has a schema)."""
    if not deployed(conn, "publications"):
        return []
    return [str(r[0]) for r in conn.execute("SELECT name FROM airflow_repl.publications ORDER BY name")]
