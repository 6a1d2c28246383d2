"""``airflow-repl drop``: retire an article, a subscription or a publication (SQL Server's
``sp_droparticle``, ``sp_dropsubscription``, ``sp_droppublication``), and nothing else.

Every drop runs in the same order, so that one stopped at any point (killed, a server
restarted) is finished by running it again, and a name that does not exist is refused before
anything changes:

1. checks that change nothing: the object is recorded in the distribution database, every server
   the drop touches is in the topology file;
2. the locks the agents of the publication take (the Log Reader's, the Snapshot and Cleanup
   Agents' at the distributor, the Distribution Agent's and the Queue Reader's at each subscriber
   concerned): an agent running there refuses the drop (:class:`AgentBusy`, retryable); a drop
   never runs beside the agents whose state it changes;
3. the drop's record in ``airflow_repl.drops`` (its first change; ``status`` and a second run see it);
4. the publisher, then the subscribers: each step is idempotent (``IF EXISTS``, a row deleted
   twice is deleted once);
5. the distributor's rows and the drop's record, in one transaction: the drop is finished exactly
   when the object is gone from the distribution database.

Each drop is an ``agent_history`` run (agent ``drop``): a failed one leaves an error row too.

What each drop removes and keeps is listed in docs/operations.md ("Drop").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.codegen import immediate_triggers, queue_triggers, updating_scripts
from airflow_repl.engine.errors import AgentBusy, ReplError
from airflow_repl.engine.mariadb import connections as mariadb_connections
from airflow_repl.engine.model import naming
from airflow_repl.engine.model.propagation import OPERATIONS
from airflow_repl.engine.model.topology import Topology
from airflow_repl.engine.postgres import advisory_locks, connections, slots
from airflow_repl.engine.state import (
    dist_drops,
    dist_history,
    dist_publications,
    dist_schema,
    dist_subscriptions,
    publisher_state,
    subscriber_immediate,
    subscriber_state,
)

log = logging.getLogger(__name__)

#: What ``airflow-repl drop`` drops.
KINDS = ("article", "subscription", "publication")
#: The agents whose lock a drop takes, where they take it, and how a refusal names them.
_DISTRIBUTOR_AGENTS = {"logreader": "Log Reader Agent", "snapshot": "Snapshot Agent", "cleanup": "Cleanup Agent"}
_SUBSCRIBER_AGENTS = {"distribution": "Distribution Agent", "queuereader": "Queue Reader Agent"}


class _Drop:
    """One drop: its connections and locks, its history row, its outcome."""

    def __init__(self, topology: Topology, publication: str, kind: str, name: str) -> None:
        self.topology, self.publication, self.kind, self.name = topology, publication, kind, name
        self.started = time.monotonic()
        self.dist = connections.connect(topology.distributor.require("distributor"), "distributor")
        self.subs: dict[str, psycopg.Connection[Any]] = {}
        self.mariadb: dict[str, Any] = {}  # MariaDB subscribers' connections (mariadb_drop)
        self.run_id: int | None = None

    def __enter__(self) -> _Drop:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        try:
            if exc is not None and self.run_id is not None and not self.dist.broken:
                self._record_failure(exc)
        finally:
            for conn in [*self.subs.values(), *self.mariadb.values(), self.dist]:
                conn.close()

    # ------------------------------------------------------------------ checks and locks
    def check_deployed(self) -> None:
        """The publication is recorded in the distribution database (one line naming it if not);
        the distribution schema is brought to this version (its ``drops`` table)."""
        if not dist_publications.publication_deployed(self.dist, self.publication):
            self.dist.rollback()
            raise ReplError(
                f"publication {self.publication!r} does not exist in the distribution database: nothing to drop "
                f"(check the name and the topology file's distributor)"
            )
        self.dist.rollback()
        dist_schema.ensure_schema(self.dist)

    def subscriber_conninfo(self, subscriber: str) -> str:
        if subscriber not in self.topology.subscribers:
            raise ReplError(
                f"subscriber {subscriber!r} of publication {self.publication!r} is not in the topology file's "
                f"subscribers: keep its connection there until the {self.kind} {self.name!r} is dropped"
            )
        return self.topology.subscriber_conninfo(subscriber)

    def lock_distributor(self) -> None:
        for agent, label in _DISTRIBUTOR_AGENTS.items():
            _try_lock(self.dist, agent, self.publication, label, "")

    def lock_subscriber(self, subscriber: str, conninfo: str) -> psycopg.Connection[Any] | None:
        """Connect to the subscriber and take its agents' locks for the publication (None: a
        MariaDB subscriber, whose connection is in :attr:`mariadb`)."""
        if mariadb_connections.is_mariadb(conninfo):
            if subscriber not in self.mariadb:
                from airflow_repl.engine.provisioning import mariadb_drop  # the MariaDB driver only when needed

                self.mariadb[subscriber] = mariadb_drop.lock(conninfo, subscriber, self.publication)
            return None
        conn = self.subs.get(subscriber)
        if conn is None:
            conn = self.subs[subscriber] = connections.connect(conninfo, f"subscriber {subscriber!r}")
        for agent, label in _SUBSCRIBER_AGENTS.items():
            _try_lock(conn, agent, self.publication, label, f" at subscriber {subscriber!r}")
        return conn

    # ------------------------------------------------------------------ record
    def begin(self, subscriber: str | None = None) -> None:
        """The drop's history row, then its record in ``airflow_repl.drops`` (committed)."""
        self.run_id = dist_history.start_run(self.dist, "drop", self.publication, subscriber)
        # a drop killed before it finished left its run 'running': this one takes over (the
        # distributor's locks keep a second drop of the publication away)
        dist_history.abandon_stale_runs(self.dist, self.run_id, "drop", self.publication, subscriber)
        again = not dist_drops.begin_drop(self.dist, self.publication, self.kind, self.name)
        self.dist.commit()
        if again:
            log.info("finishing the drop of %s %r of publication %r", self.kind, self.name, self.publication)

    def succeed(self, summary: dict[str, Any]) -> dict[str, Any]:
        """Record the run's success and commit it with the distributor's last step (a drop killed
        in between would be finished and still be 'running')."""
        summary = {"dropped": self.kind, "name": self.name, "publication": self.publication, **summary}
        summary["seconds"] = round(time.monotonic() - self.started, 3)
        if self.run_id is not None:
            dist_history.finish_run(
                self.dist, self.run_id, "succeeded", message=f"dropped {self.kind} {self.name!r}", details=summary
            )
        else:
            self.dist.commit()
        log.info("dropped %s %r of publication %r", self.kind, self.name, self.publication)
        return summary

    def _record_failure(self, exc: BaseException) -> None:
        message = f"drop of {self.kind} {self.name!r} stopped ({exc}); run the drop again to finish it"
        try:
            self.dist.rollback()
            assert self.run_id is not None
            dist_history.finish_run(self.dist, self.run_id, "failed", message=message)
            dist_history.record_error(
                self.dist,
                run_id=self.run_id,
                agent="drop",
                publication=self.publication,
                subscriber=None,
                message=message,
            )
        except psycopg.Error as err:  # the distributor went away: the next drop finishes it anyway
            log.debug("could not record the failed drop: %r", err)


def _try_lock(conn: psycopg.Connection[Any], agent: str, publication: str, label: str, where: str) -> None:
    """Take ``agent``'s session lock for the publication on ``conn`` (held until the drop's
    connection closes); refused when that agent runs."""
    if not advisory_locks.try_agent_lock(conn, agent, publication):
        raise AgentBusy(
            f"the {label} is running for publication {publication!r}{where}: wait for it to finish (stop it if it "
            f"runs continuously), then run the drop again; nothing was dropped by this run"
        )


# ---------------------------------------------------------------------- article
def drop_article(topology: Topology, publication: str, article: str) -> dict[str, Any]:
    """Drop one article of a publication: it leaves the PostgreSQL publication (its changes are
    no longer decoded from the next transaction on), its commands still stored are discarded,
    its generated procedures and the product's triggers on its table are dropped at every
    subscriber (the table and its rows stay), and its row leaves the distribution database.
    The other articles' subscriptions keep flowing: no reinitialize."""
    with _Drop(topology, publication, "article", article) as drop:
        drop.check_deployed()
        dist = drop.dist
        names = dist_publications.article_names(dist, publication)
        if article not in names:
            raise ReplError(
                f"article {article!r} does not exist in publication {publication!r} (its articles: "
                f"{', '.join(repr(n) for n in names) or 'none'}): nothing to drop"
            )
        if names == [article]:
            raise ReplError(
                f"article {article!r} is the only article of publication {publication!r}: drop the publication "
                f"instead (airflow-repl drop publication -p {publication})"
            )
        before = dist_publications.load_articles(dist, publication)
        after = [a for a in before if a.name != article]
        art = next(a for a in before if a.name == article)
        subs = dist_subscriptions.deployed_subscriptions(dist, publication)
        dist.rollback()
        conninfos = {s.subscriber: drop.subscriber_conninfo(s.subscriber) for s in subs}
        drop.lock_distributor()
        for name, conninfo in conninfos.items():
            drop.lock_subscriber(name, conninfo)
        drop.begin()
        with connections.connect(topology.publisher.require("publisher"), "publisher") as pub:
            unpublished = _unpublish(pub, naming.pg_publication(publication), art)
        positions: dict[str, str | None] = {}
        for name, sub in drop.subs.items():
            positions[name] = _drop_article_at(sub, dist, publication, art, before, after)
        for name, conn in drop.mariadb.items():
            from airflow_repl.engine.provisioning import mariadb_drop  # the MariaDB driver only when needed

            positions[name] = mariadb_drop.drop_article_at(conn, dist, publication, art, before, after)
        discarded = dist_drops.forget_article(dist, publication, article)
        for s in subs:
            new = dist_publications.rehashed(
                dist, publication, s.articles_hash, positions.get(s.subscriber), before, after
            )
            if new is not None:
                dist_subscriptions.set_subscription_articles_hash(dist, publication, s.subscriber, new)
        return drop.succeed(  # the object's last rows and its run's outcome commit together
            {"unpublished_tables": unpublished, "subscribers": sorted(drop.subs), "discarded_commands": discarded}
        )


def _unpublish(pub: psycopg.Connection[Any], pg_publication: str, art: ResolvedArticle) -> int:
    """The article's table (and the children it includes) out of the PostgreSQL publication;
    returns how many were still in it.  Committed."""
    with pub.transaction():
        members = pub.execute(
            "SELECT schemaname, tablename FROM pg_catalog.pg_publication_tables WHERE pubname = %s",
            (pg_publication,),
        ).fetchall()
        tables = {(art.table.schema, art.table.name), *((s, t) for s, t in art.children or [])}
        found = [(str(s), str(t)) for s, t in members if (s, t) in tables]
        for schema, table in found:
            pub.execute(
                sql.SQL("ALTER PUBLICATION {} DROP TABLE {}").format(
                    sql.Identifier(pg_publication), sql.Identifier(schema, table)
                )
            )
    return len(found)


def _drop_article_at(
    sub: psycopg.Connection[Any],
    dist: psycopg.Connection[Any],
    publication: str,
    art: ResolvedArticle,
    before: list[ResolvedArticle],
    after: list[ResolvedArticle],
) -> str | None:
    """At one subscriber, in one transaction: the article's generated procedures and the
    product's triggers on its table, its queued changes, and the subscriber's record of its
    article definitions without it.  Returns the subscriber's watermark (None: not initialized)."""
    with sub.transaction():
        _drop_article_objects(sub, art)
        subscriber_state.forget_queued_article(sub, publication, art.name)
        if not subscriber_state.has_state(sub):
            return None
        position = subscriber_state.watermark(sub, publication)
        new = dist_publications.rehashed(
            dist, publication, subscriber_state.articles_hash(sub, publication), position, before, after
        )
        if new is not None:
            subscriber_state.set_articles_hash(sub, publication, new)
    dist.rollback()
    return position


def _drop_article_objects(sub: psycopg.Connection[Any], art: ResolvedArticle) -> None:
    """The article's generated procedures, and the queue, immediate-updating and row-version
    triggers on its table at the subscriber (custom procedures and the table stay)."""
    for op in OPERATIONS:
        if art.propagation[op].generated:
            schema, name = art.called_procedure(op)
            sub.execute(sql.SQL("DROP PROCEDURE IF EXISTS {}").format(sql.Identifier(schema, name)))
    table = sql.Identifier(art.dest_schema, art.dest_table)
    if subscriber_state.table_exists(sub, art.dest_schema, art.dest_table):
        sub.execute(queue_triggers.drop(art))
        sub.execute(immediate_triggers.drop(art))
        sub.execute(
            sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(
                sql.Identifier(updating_scripts.ROW_VERSION_TRIGGER), table
            )
        )


# ---------------------------------------------------------------------- subscription
def drop_subscription(topology: Topology, publication: str, subscriber: str) -> dict[str, Any]:
    """Drop one subscription: at the subscriber, every object the product installed for it
    (generated procedures, the queue, immediate-updating and row-version triggers, its queued
    changes, watermark and snapshot ledger rows, and the queue, the immediate-updating functions
    and dblink once no other subscription there uses them); at the publisher, the queued
    transactions it had taken and its replication origin when no other subscription of that
    subscriber remains; at the distributor, its row, errors, conflicts and tracer arrivals.
    The subscriber's tables and rows stay.  At a MariaDB subscriber: its rows in the product's
    state tables, and those tables once no other subscription uses them (:mod:`mariadb_drop`)."""
    with _Drop(topology, publication, "subscription", subscriber) as drop:
        drop.check_deployed()
        summary = _drop_subscription(drop, topology, publication, subscriber)
        return drop.succeed(summary)


def _drop_subscription(drop: _Drop, topology: Topology, publication: str, subscriber: str) -> dict[str, Any]:
    dist = drop.dist
    known = {s.subscriber for s in dist_subscriptions.deployed_subscriptions(dist, publication)}
    if subscriber not in known:
        raise ReplError(
            f"subscriber {subscriber!r} has no subscription to publication {publication!r} (its subscribers: "
            f"{', '.join(repr(n) for n in sorted(known)) or 'none'}): nothing to drop"
        )
    articles = dist_publications.load_articles(dist, publication)
    others = [p for p in dist_subscriptions.subscriber_publications(dist, subscriber) if p != publication]
    dist.rollback()
    conninfo = drop.subscriber_conninfo(subscriber)
    pub_conninfo = topology.publisher.require("publisher")
    with connections.connect(pub_conninfo, "publisher") as pub:
        prepared = publisher_state.prepared_with_prefix(pub, naming.immediate_gid_prefix(publication, subscriber))
    if prepared:
        raise ReplError(
            f"{prepared} transaction(s) of immediate subscriber {subscriber!r} are prepared at the publisher for "
            f"publication {publication!r}: run 'airflow-repl resolve-in-doubt -p {publication} --subscriber "
            f"{subscriber}' first, then the drop again; nothing was dropped"
        )
    drop.lock_distributor()
    sub = drop.lock_subscriber(subscriber, conninfo)
    drop.begin(subscriber)
    if sub is None:
        from airflow_repl.engine.provisioning import mariadb_drop  # the MariaDB driver only when needed

        shared = mariadb_drop.drop_subscription_at(drop.mariadb[subscriber], publication, articles)
    else:
        shared = _drop_subscription_at(sub, publication, articles)
    with connections.connect(pub_conninfo, "publisher") as pub:
        with pub.transaction():
            taken = publisher_state.forget_subscriber(pub, publication, subscriber)
        origin = not others and publisher_state.drop_origin(pub, naming.queue_origin(subscriber))
    dist_drops.forget_subscription(dist, publication, subscriber)  # committed with the run's outcome
    return {
        "subscriber": subscriber,
        "shared_objects_dropped": shared,
        "queue_applied_rows": taken,
        "origin_dropped": origin,
    }


def _drop_subscription_at(sub: psycopg.Connection[Any], publication: str, articles: list[ResolvedArticle]) -> list[str]:
    """Everything the product installed at the subscriber for the subscription, in one
    transaction; returns the shared objects dropped with it (no other subscription used them)."""
    shared: list[str] = []
    with sub.transaction():
        for art in articles:
            _drop_article_objects(sub, art)
        subscriber_state.forget_publication(sub, publication)
        subscriber_immediate.forget_publication(sub, publication)
        steps: list[tuple[str, Callable[[psycopg.Connection[Any]], bool]]] = [
            ("queue", subscriber_state.drop_unused_queue),
            ("immediate updating functions and dblink", subscriber_immediate.drop_unused),
            ("row-version function", subscriber_state.drop_unused_row_version_function),
        ]
        for what, step in steps:
            if step(sub):
                shared.append(what)
    return shared


# ---------------------------------------------------------------------- publication
def drop_publication(topology: Topology, publication: str, *, with_subscriptions: bool = False) -> dict[str, Any]:
    """Drop a publication: refused while it has subscriptions, unless ``with_subscriptions``
    (each is dropped first, as :func:`drop_subscription` does); then its PostgreSQL publication,
    its replication slot (the WAL it kept is released), its rows at the publisher and every row
    of it in the distribution database.  The row-version columns and triggers of an updatable
    publication stay on the publisher's tables (the application may rely on them)."""
    subscriptions: list[str] = []
    with _Drop(topology, publication, "publication", publication) as drop:
        drop.check_deployed()
        dist = drop.dist
        subscriptions = [s.subscriber for s in dist_subscriptions.deployed_subscriptions(dist, publication)]
        dist.rollback()
        if subscriptions and not with_subscriptions:
            raise ReplError(
                f"publication {publication!r} has subscriptions ({', '.join(repr(s) for s in subscriptions)}): drop "
                f"them first (airflow-repl drop subscription), or drop them with it (--with-subscriptions); "
                f"nothing was dropped"
            )
        for name in subscriptions:
            drop.subscriber_conninfo(name)  # every one reachable by name before anything changes
    for name in subscriptions:
        drop_subscription(topology, publication, name)
    with _Drop(topology, publication, "publication", publication) as drop:
        drop.check_deployed()
        dist = drop.dist
        slot = dist_publications.slot_name(dist, publication)
        dist.rollback()
        drop.lock_distributor()
        drop.begin()
        with connections.connect(topology.publisher.require("publisher"), "publisher") as pub:
            with pub.transaction():
                pub.execute(
                    sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(naming.pg_publication(publication)))
                )
                publisher_state.forget_publication(pub, publication)
            try:
                with pub.transaction():
                    slot_dropped = slots.drop(pub, slot)
            except psycopg.errors.ObjectInUse:
                raise AgentBusy(
                    f"the replication slot {slot!r} of publication {publication!r} is in use by another session (a Log "
                    f"Reader Agent outside this distributor's locks?): stop it, then run the drop again"
                ) from None
        deleted = dist_drops.forget_publication(dist, publication)
        return drop.succeed(  # the publication's last rows and its run's outcome commit together
            {
                "subscriptions_dropped": subscriptions,
                "slot": slot,
                "slot_dropped": slot_dropped,
                "rows_deleted": deleted,
            }
        )
