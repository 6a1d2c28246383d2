"""The Distribution Agent at a MariaDB subscriber: the same delivery, in commit order and
exactly once, through SQL statements (:mod:`~airflow_repl.engine.subscriber.mariadb_apply`).

Each batch (``commit_batch_size`` transactions, about ``commit_batch_threshold`` commands) is
applied and the subscriber's watermark
(:mod:`~airflow_repl.engine.state.mariadb_subscriber_state`) moved in one InnoDB transaction:
a crash anywhere (of the agent, of the MariaDB server) rolls the subscriber back to the last
watermark, and the next run resumes from it.  A batch that fails is rolled back and replayed
command by command with a savepoint per transaction: ``skip_errors`` skips what it allows, any
other error stops delivery naming the command, with what was applied before it committed.
A transaction holding a schema change is a batch of its own, applied with MariaDB's DDL by
:mod:`~airflow_repl.engine.subscriber.mariadb_schema_changes` (exactly once although that DDL
commits on its own).

Before anything is delivered the run checks the subscription (nothing changed when refused):
its articles unchanged since the snapshot (or since the last schema change delivered), the procedures it
calls there (:mod:`~airflow_repl.engine.subscriber.mariadb_calls`), and every subscriber table
transactional (InnoDB), with its primary key and binary key collations
(:func:`~airflow_repl.engine.mariadb.catalog.check_table`).  ``apply_mode: net_change`` is
PostgreSQL's (refused here; ``auto`` applies command by command).

With ``subscription_streams`` > 1 a batch is planned as at a PostgreSQL subscriber
(:func:`~airflow_repl.engine.agents.stream_planning.plan_batch`: commands touching a common key
value stay on one stream, in commit order), its shares applied at once on their streams, each
an XA transaction, and committed together with the watermark by XA two-phase commit
(:mod:`~airflow_repl.engine.subscriber.mariadb_streams`); any error on any stream (a lock wait
past ``innodb_lock_wait_timeout`` included) rolls the batch back everywhere and replays it on
one stream.  Each run first finishes a batch a dead agent left prepared.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg
import pymysql
from pymysql.constants import CLIENT

from airflow_repl.engine.agents import stream_planning
from airflow_repl.engine.articles.resolved import ResolvedArticle, definition_hash
from airflow_repl.engine.errors import ConnectionFailed, ReplError, ServerLost
from airflow_repl.engine.mariadb import catalog
from airflow_repl.engine.mariadb import connections as mariadb_connections
from airflow_repl.engine.model.topology import Topology
from airflow_repl.engine.provisioning import pausing
from airflow_repl.engine.runtime import continuous as continuous_mode
from airflow_repl.engine.runtime import progress_lines
from airflow_repl.engine.runtime.lifecycle import AgentRun
from airflow_repl.engine.state import (
    dist_drops,
    dist_publications,
    dist_subscriptions,
    dist_transactions,
    progress,
    retention,
    subscriber_state,
)
from airflow_repl.engine.state import mariadb_subscriber_state as state
from airflow_repl.engine.state.dist_transactions import PendingTransaction
from airflow_repl.engine.subscriber import (
    bulk_apply,
    mariadb_apply,
    mariadb_calls,
    mariadb_schema_changes,
    mariadb_streams,
)
from airflow_repl.engine.subscriber.applier import Located, run_parallel
from airflow_repl.engine.subscriber.mariadb_apply import MariaDBApplier

log = logging.getLogger(__name__)
AGENT = "distribution"


def expected_table(art: ResolvedArticle) -> catalog.Expected:
    """What :func:`catalog.check_table` checks of the article's table."""
    names = art.column_names
    return catalog.Expected(art.dest_table, art.primary_key, sorted({names[i] for i in art.key_positions}))


class MariaDBDelivery:
    """One Distribution Agent run for a MariaDB subscriber."""

    def __init__(self, topology: Topology, publication: str, subscriber: str, settings: Any) -> None:
        self.topology, self.publication, self.subscriber, self.settings = topology, publication, subscriber, settings
        self.conninfo = topology.subscriber_conninfo(subscriber)
        self.role = f"MariaDB subscriber {subscriber!r}"
        self.conn: Any = None
        self.database = mariadb_connections.database(self.conninfo)
        self.streams = mariadb_streams.MariaDBStreams(publication, subscriber, self.database, settings.streams)
        self.chooser = stream_planning.StreamChooser(adaptive=stream_planning.ADAPTIVE_STREAMS)
        self.totals: dict[str, Any] = {
            "transactions": 0,
            "commands": 0,
            "commits": 0,
            "retries": 0,
            "skipped": 0,
            "last_xact_seqno": None,
        }
        if settings.streams > 1:
            self.totals["parallel_batches"] = 0
        self.paused = False

    # ------------------------------------------------------------------ checks
    def refuse_options(self) -> None:
        if self.settings.mode == bulk_apply.NET_CHANGE:  # auto: statement by statement here
            raise ReplError(
                f"subscription of MariaDB subscriber {self.subscriber!r} to publication {self.publication!r} sets "
                f"apply_mode: net_change (or bulk_apply: true), which only PostgreSQL subscribers have: remove it"
            )

    def _connect(self) -> Any:
        return mariadb_connections.connect(
            self.conninfo, self.role, client_flag=CLIENT.FOUND_ROWS | CLIENT.MULTI_STATEMENTS
        )

    def connect(self, run: AgentRun) -> None:
        """Open the streams (stream 0 first: it takes the subscription's lock and finishes a
        batch a dead agent left prepared, whose locks would hold the watermark)."""
        run.step = "connecting"
        self.conn = self._connect()
        run.cleanups.append(self.close)
        # one agent per subscription: a session lock, released if this process dies
        if not state.try_agent_lock(self.conn, self.publication):
            raise subscriber_state.watermark_busy(self.publication, self.subscriber)
        mariadb_streams.recover_prepared(
            self.conn, self.database, self.publication, self.subscriber, self.settings.streams
        )
        state.lock_watermark(self.conn, self.publication, self.subscriber)  # initialized?
        self.conn.rollback()
        self.streams.open(self.conn, self._connect)

    def close(self) -> None:
        self.streams.close()
        if self.conn is not None:
            try:
                self.conn.close()
            except pymysql.MySQLError:
                pass
            self.conn = None

    def check(self, run: AgentRun, dist: psycopg.Connection[Any]) -> MariaDBApplier:
        """The subscription's articles and tables, checked; nothing is changed."""
        run.step = "the subscription check"
        unfinished = dist_drops.unfinished_drop(dist, self.publication, self.subscriber)
        if unfinished is not None:
            raise ReplError(unfinished)
        retention.lock_unexpired(dist, self.publication, self.subscriber)
        watermark = state.watermark(self.conn, self.publication)
        articles = dist_publications.definitions_at(
            dist, self.publication, watermark, dist_publications.load_articles(dist, self.publication)
        )
        has = state.articles_hash(self.conn, self.publication)  # a schema change's, committed with it
        has = has or dist_subscriptions.subscription_articles_hash(dist, self.publication, self.subscriber)
        dist.commit()
        if has is not None and has != definition_hash(articles):
            raise ReplError(
                f"the articles of publication {self.publication!r} changed since subscriber {self.subscriber!r} "
                f"was initialized: run the Snapshot Agent with reinitialize for it "
                f"({retention.reinitialize_command(self.publication, self.subscriber)})"
            )
        database = mariadb_connections.database(self.conninfo)
        certain, possible = {a.name: a for a in articles}, {a.name: a for a in articles}
        partly = state.partly_applied(self.conn, self.publication)  # a schema change's DDL commits alone
        if partly is not None:
            done, maybe = dist_publications.definitions_partly_applied(dist, self.publication, *partly)
            certain.update({k: v for k, v in done.items() if k in certain})
            possible.update({k: v for k, v in maybe.items() if k in possible})
        dist.commit()
        for name, art in certain.items():
            try:
                catalog.check_table(self.conn, database, expected_table(art), self.subscriber)
            except ReplError:
                if possible[name] == art:
                    raise
                catalog.check_table(self.conn, database, expected_table(possible[name]), self.subscriber)
        applier = mariadb_calls.applier(self.conn, database, articles, self.subscriber)  # statements or CALLs
        self.conn.rollback()
        return applier

    # ------------------------------------------------------------------ the loop
    def run(
        self,
        dist: psycopg.Connection[Any],
        run_id: int,
        applier: MariaDBApplier,
        loop: continuous_mode.Loop,
        lines: progress_lines.Lines,
    ) -> None:
        self._catch_up_record(dist)
        wake = dist_transactions.StoredWake(dist, self.publication) if loop.opts is not None else None
        while True:
            batch = self._next_batch(dist)
            if batch is None:
                if loop.idle(wake=wake):
                    continue
                break
            watermark, txns = batch
            self._deliver(dist, run_id, applier, watermark, txns)
            if wake is not None:
                dist_transactions.forget_stored(dist)  # this batch's notices and older ones
            if lines.due():
                tx, cmds, _ = progress.backlog(dist, self.publication, self.subscriber)
                dist.commit()
                lines.log(progress_lines.delivery_line(self.totals["transactions"], self.totals["commands"], tx, cmds))
            if not loop.go_on():
                break

    def _catch_up_record(self, dist: psycopg.Connection[Any]) -> None:
        """A run that stopped between a subscriber commit and its record at the distributor."""
        watermark = state.watermark(self.conn, self.publication)
        self.conn.rollback()
        if watermark is not None and dist_subscriptions.catch_up_delivered(
            dist, self.publication, self.subscriber, watermark
        ):
            progress.record_arrivals(dist, self.publication, self.subscriber, watermark)
        dist.commit()

    def _next_batch(self, dist: psycopg.Connection[Any]) -> tuple[str, list[PendingTransaction]] | None:
        from airflow_repl.engine.agents.distribution_agent import _cut_batch

        watermark = self._guard(lambda: state.lock_watermark(self.conn, self.publication, self.subscriber))
        pending = dist_transactions.pending_transactions(dist, self.publication, watermark, self.settings.size)
        self.paused = retention.lock_unexpired(dist, self.publication, self.subscriber)
        txns = [] if self.paused else _cut_batch(pending, self.settings.until, self.settings.threshold)
        if not txns:
            self.conn.rollback()
            dist.rollback()
            return None
        return watermark, txns

    def _deliver(
        self,
        dist: psycopg.Connection[Any],
        run_id: int,
        applier: MariaDBApplier,
        watermark: str,
        txns: list[PendingTransaction],
    ) -> None:
        first, last = txns[0].xact, txns[-1].xact
        article_rows = {t.xact: t.article_rows for t in txns}
        rows = dist_transactions.batch_commands_list(dist, self.publication, first, last)
        if txns[0].schema_change:  # a batch of its own
            self._schema_batch(dist, applier, txns, list(applier.commands(rows, article_rows)))
            return
        located = applier.commands(rows, article_rows)
        may_spread = self.settings.streams > 1 and self.chooser.may_spread()
        if stream_planning.worth_planning(self.settings.streams, may_spread, len(rows)):
            shares = stream_planning.plan_batch(
                list(located), lambda loc: applier.touched(loc[2]), self.settings.streams
            )
            if len(shares) > 1:
                spread = self._spread(applier, watermark, txns[-1].xact, len(txns), shares)
                if spread is None:
                    self._replay(dist, run_id, applier, watermark, txns, rows)
                else:
                    self._delivered(dist, txns, spread)
                return
            located = iter(shares[0])
        try:
            started = time.monotonic()
            n = self._guard(lambda: mariadb_apply.apply_fast(self.conn, applier, located))
            self._guard(lambda: state.set_watermark(self.conn, self.publication, last, len(txns)))
            self._guard(self.conn.commit)
        except ServerLost:
            raise
        except (pymysql.MySQLError, mariadb_apply.RowNotFound, ReplError) as exc:
            log.info("batch %s..%s failed on the fast path (%s); replaying it", first, last, exc)
            self._guard(self.conn.rollback)
            self._replay(dist, run_id, applier, watermark, txns, rows)
            return
        if may_spread is False and self.settings.streams > 1:
            self.chooser.record(False, n, time.monotonic() - started)
        self._delivered(dist, txns, n)

    def _spread(
        self, applier: MariaDBApplier, watermark: str, last: str, transactions: int, shares: list[list[Located]]
    ) -> int | None:
        """A planned batch of ``transactions`` ending at ``last``: share i applied on stream i
        (an XA transaction each) at once, the watermark moved on stream 0, all committed by
        two-phase commit; how many commands ran, or None when it failed before the prepare
        phase ended (rolled back on every stream: the caller replays it)."""
        streams = self.streams
        started = time.monotonic()
        try:
            self._guard(lambda: streams.begin(len(shares), last))
            self._check_unmoved(watermark, "was planned")
            n = self._guard(
                lambda: run_parallel([self._share_job(applier, i, share) for i, share in enumerate(shares)])
            )
            self._guard(lambda: state.set_watermark(self.conn, self.publication, last, transactions))
            self._guard(streams.commit)
        except ServerLost:
            streams.rollback_all()
            raise
        except (pymysql.MySQLError, mariadb_apply.RowNotFound, ReplError) as exc:
            if streams.decided():  # past the prepare phase: committed by the next run, never replayed
                streams.rollback_all()  # forgets the batch, rolls nothing back
                raise ReplError(
                    f"the batch ending at {last} is prepared on every stream of MariaDB subscriber "
                    f"{self.subscriber!r} but not yet committed on all of them ({exc}); run the Distribution Agent "
                    f"again to finish it"
                ) from None
            log.info("batch ending at %s failed on %d streams (%s); replaying it on one stream", last, len(shares), exc)
            streams.rollback_all()
            return None
        self.chooser.record(True, n, time.monotonic() - started)
        self.totals["parallel_batches"] += 1
        return int(n)

    def _check_unmoved(self, watermark: str, when: str) -> None:
        """Lock the watermark again (stream 0): it must not have moved since the batch was read."""
        now = self._guard(lambda: state.lock_watermark(self.conn, self.publication, self.subscriber))
        if now != watermark:
            raise ReplError(
                f"the watermark of subscriber {self.subscriber!r} moved while a batch {when}; "
                f"run the Distribution Agent again"
            )

    def _share_job(self, applier: MariaDBApplier, i: int, share: list[Located]) -> Any:
        """Stream ``i`` applies ``share``; on an error it rolls its part back at once (its
        locks released for the other streams) and stops them."""
        conn = self.streams.conns[i]

        def apply(stop: Any) -> int:
            try:
                return mariadb_apply.apply_fast(conn, applier, share, stop)
            except BaseException:
                self.streams.abort(i)
                raise

        return apply

    def _schema_batch(
        self, dist: psycopg.Connection[Any], applier: MariaDBApplier, txns: list[PendingTransaction], located: list[Any]
    ) -> None:
        """A transaction with a schema change (:mod:`~airflow_repl.engine.subscriber.mariadb_schema_changes`),
        its definitions recorded with its delivery."""
        database = mariadb_connections.database(self.conninfo)
        n, changes = self._guard(
            lambda: mariadb_schema_changes.deliver(
                self.conn, applier, located, txns[0].xact, self.publication, self.subscriber, database
            )
        )
        self._guard(self.conn.commit)
        has = mariadb_schema_changes.articles_hash(applier)
        dist_subscriptions.set_subscription_articles_hash(dist, self.publication, self.subscriber, has)
        self.totals["schema_changes"] = self.totals.get("schema_changes", 0) + changes
        self._delivered(dist, txns, n)

    def _replay(
        self,
        dist: psycopg.Connection[Any],
        run_id: int,
        applier: MariaDBApplier,
        watermark: str,
        txns: list[PendingTransaction],
        rows: list[Any],
    ) -> None:
        self.totals["retries"] += 1
        self._check_unmoved(watermark, "failed")
        article_rows = {t.xact: t.article_rows for t in txns}
        outcome = self._guard(
            lambda: mariadb_apply.replay(self.conn, applier, applier.commands(rows, article_rows), self.settings.skip)
        )
        from airflow_repl.engine.agents.distribution_agent import record_skipped

        done = txns[-1].xact if outcome.failure is None else outcome.last_good
        if done is not None:
            applied = [t.xact for t in txns].index(done) + 1
            self._guard(lambda: state.set_watermark(self.conn, self.publication, done, applied))
            self._guard(self.conn.commit)
            record_skipped(dist, run_id, self.publication, self.subscriber, outcome)
            self.totals["skipped"] += len(outcome.skipped)
            self._delivered(dist, txns[:applied], outcome.commands)
        else:
            self._guard(self.conn.rollback)
        if outcome.failure is not None:
            raise outcome.failure

    def _delivered(self, dist: psycopg.Connection[Any], txns: list[PendingTransaction], n: int) -> None:
        last = txns[-1].xact
        dist_subscriptions.mark_delivered(dist, self.publication, self.subscriber, last)
        progress.record_arrivals(dist, self.publication, self.subscriber, last)
        dist.commit()
        self.totals["transactions"] += len(txns)
        self.totals["commands"] += n
        self.totals["commits"] += 1
        self.totals["last_xact_seqno"] = last

    def _guard(self, step: Any) -> Any:
        """Run a step at the subscriber; a lost server is one line naming it (ServerLost)."""
        try:
            return step()
        except (pymysql.err.OperationalError, pymysql.err.InterfaceError) as exc:
            if isinstance(exc, pymysql.err.OperationalError) and not mariadb_connections.is_lost(exc):
                raise
            raise ServerLost(
                f"lost connection to the {self.role} ({mariadb_connections.describe(self.conninfo)}): "
                f"{mariadb_connections.error_text(exc, self.conninfo)}"
            ) from None


def run_mariadb_distribution(
    topology: Topology, publication: str, subscriber: str, settings: Any, opts: Any
) -> dict[str, Any]:
    """The Distribution Agent's run for a MariaDB subscriber (called by
    :func:`~airflow_repl.engine.agents.distribution_agent.run_distribution`)."""
    delivery = MariaDBDelivery(topology, publication, subscriber, settings)
    with AgentRun(AGENT, publication, subscriber) as run:
        lines = progress_lines.Lines(run)
        run.step = "connecting"
        dist = run.connect(topology.distributor.require("distributor"), "distributor")
        dist_publications.load_articles(dist, publication)
        paused = retention.lock_unexpired(dist, publication, subscriber)
        dist.rollback()
        if paused and opts is None:
            run.begin(dist, take_over=False)
            message = pausing.paused_message(publication, subscriber)
            return run.succeed(
                {"paused": True, "transactions": 0, "commands": 0, "message": message},
                message=message,
                outcome="paused",
            )
        delivery.refuse_options()
        try:
            delivery.connect(run)
        except ConnectionFailed:
            raise
        applier = delivery.check(run, dist)
        run_id = run.begin(dist)
        run.counts = run.details = delivery.totals
        run.step = "delivery"
        with continuous_mode.Loop(opts, run, delivery.totals) as loop:
            delivery.run(dist, run_id, applier, loop, lines)
        totals = delivery.totals
        if delivery.paused:
            message = pausing.paused_message(publication, subscriber, totals["transactions"])
            totals.update(paused=True, message=message)
            return run.succeed(loop.summary(totals), message=message, outcome="paused")
        return run.succeed(loop.summary(totals))
