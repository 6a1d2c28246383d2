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
(:func:`~airflow_repl.engine.mariadb.catalog.check_table`).

``apply_mode`` chooses each article's path as at a PostgreSQL subscriber: under ``auto`` (the
default) a batch whose articles nothing at the subscriber can tell apart goes by net change
(:mod:`~airflow_repl.engine.subscriber.mariadb_net_change`; an article with a custom procedure,
``NONE`` or a MariaDB trigger on its table goes command by command, and so does every batch
holding one of its commands); a net change that cannot apply (a row not found, a duplicate key)
is rolled back and the batch applied command by command as below.  The run's summary says which
path each article took and why (``apply``).

With ``subscription_streams`` > 1 a batch applied command by command is planned as at a
PostgreSQL subscriber (:func:`~airflow_repl.engine.agents.stream_planning.plan_batch`: commands
touching a common key value stay on one stream, in commit order), its shares applied at once on
their streams, each an XA transaction, and committed together with the watermark by XA two-phase
commit (:mod:`~airflow_repl.engine.subscriber.mariadb_streams`); any error on any stream (a lock
wait past ``innodb_lock_wait_timeout`` included) rolls the batch back everywhere and replays it on
one stream.  Each run first finishes a batch a dead agent left prepared.  (``auto`` with several
streams applies command by command, as at a PostgreSQL subscriber; ``net_change`` applies each
batch's net change on stream 0.)
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pymysql
from pymysql.constants import CLIENT

from airflow_repl.engine.agents import read_ahead, stream_planning
from airflow_repl.engine.articles.resolved import ResolvedArticle, definition_hash
from airflow_repl.engine.errors import ReplError, ServerLost
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
    mariadb_apply,
    mariadb_calls,
    mariadb_net_change,
    mariadb_schema_changes,
    mariadb_streams,
    net_change,
)
from airflow_repl.engine.subscriber.applier import Located, run_parallel
from airflow_repl.engine.subscriber.mariadb_apply import MariaDBApplier

log = logging.getLogger(__name__)
AGENT = "distribution"

#: The interpreter's thread switch interval (seconds) while the next batch is read ahead.
SWITCH_INTERVAL = 0.0005

#: A batch's net change at the subscriber, why it has none, or None (it is not for net change).
Prepared = mariadb_net_change.Prepared | net_change.NotNetApplicable | None


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
        #: each article's apply path (apply_mode) and why; the articles applied by net change
        self.paths: dict[str, net_change.ArticlePath] = {}
        self.net: dict[str, ResolvedArticle] = {}
        self.net_change: mariadb_net_change.NetChange | None = None
        #: net change: the next batch read and prepared while one is applied (None: not here)
        self.ahead: read_ahead.ReadAhead[Prepared] | None = None
        self.switch_interval = sys.getswitchinterval()  # the interpreter's, restored when the read-ahead closes
        self.prepared: Prepared = None  # the batch's, when it was prepared ahead

    # ------------------------------------------------------------------ checks
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
        self.choose_paths(applier, dist_publications.custom_scripts(dist, self.publication))
        dist.commit()
        return applier

    def choose_paths(self, applier: MariaDBApplier, scripts: Any) -> None:
        """Each article's apply path under the run's ``apply_mode`` (``auto``: from the triggers
        on the subscriber tables and the article's procedures), in the run's summary as ``apply``."""
        found: dict[tuple[str, str], list[str]] = {}
        if self.settings.mode == "auto":
            database = mariadb_connections.database(self.conninfo)
            found = mariadb_net_change.triggers(self.conn, database, applier.articles.values())
            self.conn.rollback()
        paths = mariadb_net_change.article_paths(
            self.settings.mode, applier.articles.values(), found, scripts, self.settings.streams
        )
        self.paths = {p.article: p for p in paths}
        self.net = {p.article: applier.articles[p.article] for p in paths if p.apply == net_change.NET_CHANGE}
        if self.net:
            self.net_change = mariadb_net_change.NetChange(self.conn)
        self.totals["apply"] = [p.to_json() for p in self.paths.values()]

    def _net_articles(
        self, applier: MariaDBApplier, txns: list[PendingTransaction]
    ) -> dict[str, ResolvedArticle] | None:
        """The batch's articles as net change applies them (None: one goes command by command)."""
        names = {a for t in txns for a in t.article_rows}
        net = set(self.net)
        if self.net_change is None or not names <= net:
            return None
        return {name: mariadb_net_change.as_applied(applier.articles[name]) for name in names}

    def _prepare(self, applier: MariaDBApplier, rows: list[Any], txns: list[PendingTransaction]) -> Prepared:
        """A batch's net change from its stored commands, or why it has none (None: one of its
        articles goes command by command); made by the read-ahead's thread too."""
        articles = self._net_articles(applier, txns)
        if articles is None or self.net_change is None:
            return None
        commands = [cmd for _, _, cmd in applier.commands(rows, {t.xact: t.article_rows for t in txns})]
        try:
            return self.net_change.prepare(commands, articles)
        except (net_change.NotNetApplicable, ReplError) as why:
            return net_change.NotNetApplicable(str(why))

    def open_read_ahead(self, run: AgentRun, applier: MariaDBApplier) -> None:
        """Net change: read and prepare each next batch while one is applied, on a distributor
        connection of its own (:mod:`~airflow_repl.engine.agents.read_ahead`)."""
        from airflow_repl.engine.agents.distribution_agent import _cut_batch

        if not self.net:
            return
        conn = run.connect(self.topology.distributor.require("distributor"), "distributor", autocommit=True)
        until, threshold = self.settings.until, self.settings.threshold
        # The driver reads each statement's result on its own, and each read needs the GIL back
        # from the read-ahead's thread, which would keep it for the interpreter's switch interval
        # (5 ms): the run switches threads ten times as often while it reads ahead.
        self.switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(self.switch_interval, SWITCH_INTERVAL))
        self.ahead = read_ahead.ReadAhead(
            conn,
            self.publication,
            self.settings.size,
            lambda pending: _cut_batch(pending, until, threshold),
            lambda rows, txns: self._prepare(applier, rows, txns),
        )
        run.cleanups.append(self.close_read_ahead)

    def close_read_ahead(self) -> None:
        if self.ahead is not None:
            ahead, self.ahead = self.ahead, None
            self.totals["read_ahead_batches"] = ahead.close()
            sys.setswitchinterval(self.switch_interval)

    def _net_batch(
        self, applier: MariaDBApplier, txns: list[PendingTransaction], rows: Callable[[], list[Any]], prepared: Prepared
    ) -> int | None:
        """The batch applied by net change (``prepared`` ahead, or made now), not committed
        (None: one of its articles goes command by command, or the net change could not apply:
        rolled back)."""
        articles = self._net_articles(applier, txns)
        if articles is None or self.net_change is None:
            return None
        net = self.net_change
        if self.ahead is not None:
            self.ahead.start(txns[-1].xact)  # the next batch, read and prepared while this one is applied
        try:
            if isinstance(prepared, net_change.NotNetApplicable):
                raise prepared
            n: int
            if prepared is not None:
                n = self._guard(lambda: net.execute(prepared))
            else:
                commands = [cmd for _, _, cmd in applier.commands(rows(), {t.xact: t.article_rows for t in txns})]
                n = 0
                for start in range(0, len(commands), net_change.CHUNK_COMMANDS):
                    chunk = commands[start : start + net_change.CHUNK_COMMANDS]
                    n += self._guard(lambda chunk=chunk: net.apply(chunk, articles))
            if self.settings.mode == "auto":
                self._watched([applier.articles[a] for a in articles])
        except ServerLost:
            raise
        except (net_change.NotNetApplicable, pymysql.MySQLError, ReplError) as why:
            log.debug("batch %s..%s applied command by command: %s", txns[0].xact, txns[-1].xact, why)
            self._guard(self.conn.rollback)
            return None
        self.totals["net_batches"] = self.totals.get("net_batches", 0) + 1
        return n

    def _watched(self, arts: list[ResolvedArticle]) -> None:
        """``auto``, after the batch's statements (whose metadata locks keep a trigger from
        being created on their tables before the commit): no trigger there saw them, or the
        articles with one go command by command from now on (NotNetApplicable: this batch too)."""
        database = mariadb_connections.database(self.conninfo)
        found = self._guard(lambda: mariadb_net_change.triggers(self.conn, database, arts))
        if not found:
            return
        for name, path in net_change.triggered(arts, found).items():
            self.paths[name] = path
            self.net.pop(name, None)
            log.info("article %r is applied command by command from now on: %s", name, path.why)
        self.totals["apply"] = [p.to_json() for p in self.paths.values()]
        raise net_change.NotNetApplicable("a trigger at the subscriber")

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
        from airflow_repl.engine.agents.distribution_agent import _cut_batch, batch_start

        watermark = self._guard(lambda: state.lock_watermark(self.conn, self.publication, self.subscriber))
        ahead = self.ahead.take(watermark) if self.ahead is not None else None
        pending, self.paused, _ = batch_start(
            dist,
            self.publication,
            self.subscriber,
            watermark,
            self.settings.size,
            ahead.pending if ahead is not None else None,
            held=False,
        )
        txns = [] if self.paused else _cut_batch(pending, self.settings.until, self.settings.threshold)
        if not txns:
            self.conn.rollback()
            dist.rollback()
            return None
        self.prepared = ahead.prepared_for(txns) if ahead is not None else None
        if self.prepared is not None and self.ahead is not None:
            self.ahead.used += 1
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
        prepared, self.prepared = self.prepared, None
        read: list[list[Any]] = []

        def commands() -> list[Any]:  # read when needed (not for a batch prepared ahead by net change)
            if not read:
                read.append(dist_transactions.batch_commands_list(dist, self.publication, first, last))
            return read[0]

        if txns[0].schema_change:  # a batch of its own
            self._schema_batch(dist, applier, txns, list(applier.commands(commands(), article_rows)))
            return
        may_spread: bool | None = None
        located: Any = None  # the batch's commands as streams plan them (None: read when needed)
        if self.settings.streams > 1 and self._net_articles(applier, txns) is None:
            may_spread = self.chooser.may_spread()
            located = self._over_streams(dist, run_id, applier, watermark, txns, commands(), may_spread)
            if located is None:  # spread over the streams, delivered or replayed
                return
        try:
            started = time.monotonic()
            n = self._net_batch(applier, txns, commands, prepared)
            if n is None:
                if located is None:
                    located = applier.commands(commands(), article_rows)
                n = self._guard(lambda: mariadb_apply.apply_fast(self.conn, applier, located))
            self._guard(lambda: state.set_watermark(self.conn, self.publication, last, len(txns)))
            self._guard(self.conn.commit)
        except ServerLost:
            raise
        except (pymysql.MySQLError, mariadb_apply.RowNotFound, ReplError) as exc:
            log.info("batch %s..%s failed on the fast path (%s); replaying it", first, last, exc)
            self._guard(self.conn.rollback)
            self._replay(dist, run_id, applier, watermark, txns, commands())
            return
        if may_spread is False and self.settings.streams > 1:
            self.chooser.record(False, n, time.monotonic() - started)
        self._delivered(dist, txns, n)

    def _over_streams(
        self,
        dist: psycopg.Connection[Any],
        run_id: int,
        applier: MariaDBApplier,
        watermark: str,
        txns: list[PendingTransaction],
        rows: list[Any],
        may_spread: bool,
    ) -> Any:
        """A batch applied command by command with several streams: planned, and when it spreads
        over more than one, applied on them (or replayed on one) and delivered: None; else its
        commands, for one stream."""
        located = applier.commands(rows, {t.xact: t.article_rows for t in txns})
        if not stream_planning.worth_planning(self.settings.streams, may_spread, len(rows)):
            return located
        shares = stream_planning.plan_batch(list(located), lambda loc: applier.touched(loc[2]), self.settings.streams)
        if len(shares) == 1:
            return iter(shares[0])
        spread = self._spread(applier, watermark, txns[-1].xact, len(txns), shares)
        if spread is None:
            self._replay(dist, run_id, applier, watermark, txns, rows)
        else:
            self._delivered(dist, txns, spread)
        return None

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
        if self.net_change is not None:  # the tables changed: their temporary copies are made again
            self._guard(self.net_change.forget)
            self.net.update((name, applier.articles[name]) for name in self.net)
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
    try:  # its connections closed whatever the outcome: the subscription's lock is their session's
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
            delivery.connect(run)
            applier = delivery.check(run, dist)
            run_id = run.begin(dist)
            run.counts = run.details = delivery.totals
            run.step = "delivery"
            delivery.open_read_ahead(run, applier)
            with continuous_mode.Loop(opts, run, delivery.totals) as loop:
                delivery.run(dist, run_id, applier, loop, lines)
            delivery.close_read_ahead()
            totals = delivery.totals
            if delivery.paused:
                message = pausing.paused_message(publication, subscriber, totals["transactions"])
                totals.update(paused=True, message=message)
                return run.succeed(loop.summary(totals), message=message, outcome="paused")
            return run.succeed(loop.summary(totals))
    finally:
        delivery.close_read_ahead()
        delivery.close()
