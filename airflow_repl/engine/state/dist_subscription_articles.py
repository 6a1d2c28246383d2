"""The distribution database's record of the articles each subscription holds
(``airflow_repl.subscription_articles``): an article added to a live publication is copied to
each subscription on its own, from a snapshot of its own, and delivered from that copy's
hand-off on.

An article of the publication has, for one subscription, one of three states:

- no row: not copied yet (added since the subscription was initialized).  The Distribution
  Agent applies none of its commands: a copy taken later holds every change stored now;
- ``copying``: a copy of its own is under way.  Delivery stops where it is while the copy's
  snapshot is exported (no hand-off yet), then at the hand-off until the copy is done
  (commands after it need the copied rows);
- ``active``: copied.  Its commands at or before the hand-off (NULL: copied with the
  subscription's own snapshot) are in the copy and skipped; every later one is applied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from airflow_repl.engine.articles.resolved import ResolvedArticle, definition_hash
from airflow_repl.engine.postgres import lsn
from airflow_repl.engine.state.dist_schema import deployed

COPYING, ACTIVE = "copying", "active"


@dataclass(frozen=True)
class HeldArticle:
    """One article of the publication as one subscription holds it."""

    article: str
    status: str | None  # None: not copied yet
    handoff: str | None  # handoff_xact_seqno as text


def held_articles(conn: psycopg.Connection[Any], publication: str, subscriber: str) -> list[HeldArticle]:
    """Every article of the publication, with the subscription's state of it (sorted by name);
    [] before the distribution database has the table."""
    if not deployed(conn, "subscription_articles"):
        return []
    return held(conn.execute(HELD_QUERY, (subscriber, publication)).fetchall())


#: SQL (subscriber, publication): every article of the publication with the subscription's state
#: of it, by name (:func:`held_articles`; a caller sending it in a pipeline gives its rows to
#: :func:`held`).
HELD_QUERY = (
    "SELECT a.name, sa.status, sa.handoff_xact_seqno::text FROM airflow_repl.articles a "
    "LEFT JOIN airflow_repl.subscription_articles sa ON sa.publication = a.publication "
    "AND sa.subscriber = %s AND sa.article = a.name WHERE a.publication = %s ORDER BY a.name"
)


def held(rows: list[tuple[Any, ...]]) -> list[HeldArticle]:
    """:data:`HELD_QUERY`'s rows."""
    return [HeldArticle(str(a), s, h) for a, s, h in rows]


def record_all_active(
    conn: psycopg.Connection[Any], publication: str, subscriber: str, articles: list[str], snapshot_id: str
) -> None:
    """The subscription was (re)initialized from one snapshot holding every one of ``articles``
    (committed by the caller with its activation)."""
    conn.execute(
        "DELETE FROM airflow_repl.subscription_articles WHERE publication = %s AND subscriber = %s",
        (publication, subscriber),
    )
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO airflow_repl.subscription_articles (publication, subscriber, article, status, snapshot_id) "
            "VALUES (%s, %s, %s, 'active', %s)",
            [(publication, subscriber, a, snapshot_id) for a in articles],
        )


def lock_subscriptions(conn: psycopg.Connection[Any], publication: str, subscribers: list[str]) -> None:
    """Hold the subscriptions' rows until the transaction ends: a Distribution Agent delivering
    a batch to one of them holds its row too (``retention.lock_unexpired``), so this waits for
    that batch to commit, and no batch starts meanwhile."""
    conn.execute(
        "SELECT 1 FROM airflow_repl.subscriptions WHERE publication = %s AND subscriber = ANY(%s) "
        "ORDER BY subscriber FOR UPDATE",
        (publication, subscribers),
    )


def start_copies(conn: psycopg.Connection[Any], publication: str, copies: dict[str, list[str]]) -> None:
    """The copies of their own (subscriber -> articles) are about to be taken: 'copying' without
    a hand-off yet, which stops their subscriptions' delivery where it is until
    :func:`set_handoff` (committed by the caller, under :func:`lock_subscriptions`: no batch
    that read the articles as not copied is still being delivered)."""
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO airflow_repl.subscription_articles (publication, subscriber, article, status) "
            "VALUES (%s, %s, %s, 'copying') ON CONFLICT (publication, subscriber, article) DO UPDATE SET "
            "status = 'copying', handoff_xact_seqno = NULL, snapshot_id = NULL, rows_copied = NULL, "
            "updated_at = now()",
            [(publication, s, a) for s, arts in copies.items() for a in arts],
        )


def set_handoff(
    conn: psycopg.Connection[Any],
    publication: str,
    copies: dict[str, list[str]],
    snapshot_id: str,
    consistent_lsn: str,
) -> None:
    """The copies are taken at ``consistent_lsn``: their hand-off is just before it (committed
    by the caller); delivery goes on up to it."""
    with conn.cursor() as cur:
        cur.executemany(
            "UPDATE airflow_repl.subscription_articles SET handoff_xact_seqno = %s::pg_lsn - 1, snapshot_id = %s, "
            "updated_at = now() WHERE publication = %s AND subscriber = %s AND article = %s AND status = 'copying'",
            [(consistent_lsn, snapshot_id, publication, s, a) for s, arts in copies.items() for a in arts],
        )


def finish_copy(
    conn: psycopg.Connection[Any], publication: str, subscriber: str, rows: dict[str, int], snapshot_id: str
) -> None:
    """The subscriber holds the copies of ``rows``' articles (article -> rows) taken by
    ``snapshot_id``: they are active (committed by the caller)."""
    with conn.cursor() as cur:
        cur.executemany(
            "UPDATE airflow_repl.subscription_articles SET status = 'active', rows_copied = %s, updated_at = now() "
            "WHERE publication = %s AND subscriber = %s AND article = %s AND snapshot_id = %s",
            [(n, publication, subscriber, a, snapshot_id) for a, n in rows.items()],
        )


# ---------------------------------------------------------------------- what the Distribution Agent goes by
@dataclass(frozen=True)
class DeliveryLimits:
    """What one batch of a subscription's delivery leaves out and where it stops."""

    #: article -> its commands at or before this position (int LSN) are not applied (None: none is)
    skip: dict[str, int | None]
    #: the batch ends at this position (int LSN): a copy of its own is under way (None: no stop)
    stop: int | None

    @property
    def none(self) -> bool:
        return not self.skip and self.stop is None


def delivery_limits(held: list[HeldArticle], watermark: str, applied: set[str]) -> DeliveryLimits:
    """The limits of the next batch after ``watermark``, for a run applying the ``applied``
    articles: an article not copied yet is skipped altogether; one being copied is skipped up
    to its hand-off, where delivery stops until the copy is done; one copied on its own is
    skipped up to its hand-off; one copied since the run started (not ``applied``) also stops
    delivery at its hand-off (the next run applies it)."""
    at = lsn.lsn_to_int(watermark)
    skip: dict[str, int | None] = {}
    stops: list[int] = []
    for h in held:
        handoff = lsn.lsn_to_int(h.handoff) if h.handoff is not None else None
        if h.status is None:
            skip[h.article] = None
            continue
        if handoff is not None and handoff > at:
            skip[h.article] = handoff
        if handoff is not None and (h.status == COPYING or h.article not in applied):
            stops.append(handoff)
        elif handoff is None and h.status == COPYING:  # its snapshot is being exported: nothing yet
            skip[h.article] = None
            stops.append(at)
    return DeliveryLimits(skip, min(stops) if stops else None)


def held_names(held: list[HeldArticle], *statuses: str) -> set[str]:
    """The articles held in one of ``statuses``."""
    return {h.article for h in held if h.status in statuses}


def holding(held: list[HeldArticle], articles: list[ResolvedArticle]) -> tuple[list[ResolvedArticle], set[str]]:
    """Of ``articles``, those the subscription holds (copied, or being copied on their own),
    and the hashes of its definitions its agents accept: with those being copied or without
    them (their copy is not done).  Without any record (``held`` empty): every article."""
    if not held:
        return articles, {definition_hash(articles)}
    copied = held_names(held, ACTIVE)
    mine = [a for a in articles if a.name in copied | held_names(held, COPYING)]
    return mine, {definition_hash(mine), definition_hash([a for a in mine if a.name in copied])}
