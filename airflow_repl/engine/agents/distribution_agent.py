"""The Distribution Agent: delivers a publication's pending transactions to one subscriber, in
commit order, exactly once.

Each subscriber commit applies up to ``commit_batch_size`` transactions (or about
``commit_batch_threshold`` commands) *and* moves the subscriber's own watermark
(``airflow_repl.subscription_state``) in the same transaction.  A crash anywhere rolls the
subscriber back to the last watermark; re-running resumes from it, so every transaction is
applied once.  Changes are applied with ``session_replication_role = replica``: ordinary user
triggers and foreign-key triggers do not fire (SQL Server's NOT FOR REPLICATION).

With ``subscription_streams`` > 1 each batch is planned
(:func:`~airflow_repl.engine.agents.stream_planning.plan_streams`): commands that touch a
common key value (primary key or any unique constraint, before or after image) are connected,
and each connected group stays on one stream in commit order, so streams never wait on each
other's locks.  A batch whose groups cannot be spread usefully goes to one stream.  A spread
batch commits on every stream with two-phase commit, so the batch and the watermark still
commit as one.  Any error on any stream rolls the batch back everywhere and replays it on one
stream, transaction by transaction; that replay also implements ``skip_errors`` and names the
failing command.

Positions (``xact_seqno``) are ``pg_lsn`` values: SQL orders and compares the column itself,
never its text, and Python compares them as integers (:func:`lsn.lsn_to_int`).

This module owns the delivery loop, as small steps: read the next batch after the watermark,
plan it into streams, apply it, commit it with the watermark, record the progress (and, when
the fast path failed, replay it).  The parts it drives live elsewhere: the SQL in
:mod:`~airflow_repl.engine.state.dist_transactions` (and the other ``state.dist_*`` modules) and :mod:`~airflow_repl.engine.state.subscriber_state`,
planning in :mod:`~airflow_repl.engine.agents.stream_planning`, applying in
:mod:`~airflow_repl.engine.subscriber.applier` (conflicts in
:mod:`~airflow_repl.engine.subscriber.conflicts`), the streams' connections and two-phase commit
in :mod:`~airflow_repl.engine.subscriber.streams`, and the run's lock and history in
:class:`~airflow_repl.engine.runtime.lifecycle.AgentRun`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from itertools import chain, islice
from typing import Any

import psycopg

from airflow_repl.engine.agents import read_ahead, stream_planning
from airflow_repl.engine.articles.commands import Command
from airflow_repl.engine.articles.resolved import ResolvedArticle, definition_hash
from airflow_repl.engine.errors import AgentBusy, ReplError
from airflow_repl.engine.model import naming
from airflow_repl.engine.model.topology import SKIPPABLE_ERRORS, Topology
from airflow_repl.engine.monitoring import status
from airflow_repl.engine.postgres import catalog, json_values, lsn
from airflow_repl.engine.provisioning import pausing
from airflow_repl.engine.runtime import continuous as continuous_mode
from airflow_repl.engine.runtime import gc_pause, progress_lines, subscriber_writer
from airflow_repl.engine.runtime.lifecycle import AgentRun, ends_when_stopped
from airflow_repl.engine.state import (
    dist_conflicts,
    dist_drops,
    dist_history,
    dist_publications,
    dist_schema,
    dist_subscription_articles,
    dist_subscriptions,
    dist_transactions,
    progress,
    retention,
    subscriber_state,
)
from airflow_repl.engine.state.dist_transactions import CommandRow, PendingTransaction
from airflow_repl.engine.subscriber import bulk_apply, in_doubt, net_change
from airflow_repl.engine.subscriber.applier import (
    Applier,
    Located,
    ReplayOutcome,
    apply_parallel,
    apply_pipelined,
    replay,
)
from airflow_repl.engine.subscriber.convergence import QueueGuard, replay_queued
from airflow_repl.engine.subscriber.schema_changes import SchemaContext
from airflow_repl.engine.subscriber.streams import Streams, recover_prepared
from airflow_repl.engine.subscriber.superseded import Superseding, Taken

log = logging.getLogger(__name__)
AGENT = "distribution"


#: Seconds an ordinary batch's record at the distributor may wait for the next one's (one
#: record for the batches committed at the subscriber meanwhile): :meth:`_Delivery.record`.
RECORD_INTERVAL = 1.0

#: How many times a batch is replayed again because the subscriber's application took (by
#: immediate updating) a key of one of its failed commands while it was applied; then the run
#: ends, to be run again.
SUPERSEDING_RETRIES = 5


def parse_until(value: str) -> datetime:
    """The ``until`` option: an ISO-8601 time; one without an offset is UTC, like Airflow's."""
    try:
        until = datetime.fromisoformat(value.strip())
    except ValueError:
        raise ReplError(
            f"--until {value!r} is not an ISO-8601 time: use e.g. 2026-11-23T13:00:00+00:00 "
            f"(a time without offset is UTC)"
        ) from None
    return until if until.tzinfo is not None else until.replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class _Settings:
    """The options of one run: the subscription's, overridden by the caller's."""

    until: datetime | None
    size: int  # commit_batch_size: transactions per subscriber commit
    threshold: int  # commit_batch_threshold: about this many commands per subscriber commit
    streams: int  # subscription_streams
    skip: set[str]  # SQLSTATEs whose transactions are skipped (skip_errors)
    mode: str = bulk_apply.PER_COMMAND  # apply_mode: auto, per_command or net_change


@dataclass(frozen=True)
class _Batch:
    """The transactions one subscriber commit delivers, after the watermark they follow."""

    watermark: str
    txns: list[PendingTransaction]
    #: its net change, when it was read and prepared ahead (read_ahead) while the batch before was applied
    prepared: read_ahead.Prepared | None = None

    @property
    def first(self) -> str:
        return self.txns[0].xact

    @property
    def last(self) -> str:
        return self.txns[-1].xact

    @property
    def commands(self) -> int:
        return sum(t.command_count for t in self.txns)

    def article_rows(self) -> dict[str, dict[str, int]]:
        return _article_rows(self.txns)

    def count_through(self, xact: str) -> int:
        """How many of the batch's transactions are ``xact`` or before it."""
        return [t.xact for t in self.txns].index(xact) + 1


def _article_rows(txns: list[PendingTransaction]) -> dict[str, dict[str, int]]:
    """Per transaction, the rows it changed per article."""
    return {t.xact: t.article_rows for t in txns}


def _cut_batch(
    txns: list[PendingTransaction], until: datetime | None, threshold: int, own_origin: str | None = None
) -> list[PendingTransaction]:
    """The leading transactions committed up to ``until`` and within about ``threshold``
    commands (always at least one, however large), up to the first that came from
    ``own_origin`` (the subscriber's own queued change, never applied there again).  Commit order is LSN order; commit
    timestamps of concurrent commits need not follow it, so point-in-time delivery stops at the
    first transaction (in LSN order) committed after ``until``, never skipping an earlier-LSN one.
    A transaction with a schema change forms a batch of its own."""
    out: list[PendingTransaction] = []
    total = 0
    for txn in txns:
        if until is not None and txn.commit_time > until:
            break
        if own_origin is not None and txn.origin == own_origin:
            break
        if out and (total + txn.command_count > threshold or txn.schema_change):
            break
        out.append(txn)
        total += txn.command_count
        if txn.schema_change:
            break  # a schema change is delivered in a subscriber commit of its own
    return out


def _own_leading(txns: list[PendingTransaction], own_origin: str, until: datetime | None) -> list[PendingTransaction]:
    """The leading transactions that came from ``own_origin`` (committed up to ``until``)."""
    out: list[PendingTransaction] = []
    for txn in txns:
        if txn.origin != own_origin or (until is not None and txn.commit_time > until):
            break
        out.append(txn)
    return out


class TableChanges:
    """What each subscriber table received during a run, from the delivered transactions'
    per-article row counts: ``{"schema.table": {"transactions", "commands", "last_xact_seqno"}}``
    (``commands``: row changes; an UPDATE delivered as a DELETE + INSERT pair counts once).
    The asset events of the Distribution Agent's operator are made from it."""

    def __init__(self, destinations: dict[str, str]) -> None:
        self.destinations = destinations  # article name -> subscriber table (schema.table)
        self.tables: dict[str, dict[str, Any]] = {}

    def add(self, txns: list[PendingTransaction]) -> None:
        """Count a batch's transactions (in commit order), article by article rather than
        transaction by transaction: a few steps per article of the batch, the loops over its
        transactions in C."""
        per_txn = [t.article_rows for t in txns]
        last: dict[str, int] = {}  # table -> index of the last of txns that changed it
        for article, n in Counter(chain.from_iterable(per_txn)).items():
            table = self.destinations.get(article, article)
            seen = self.tables.setdefault(table, {"transactions": 0, "commands": 0, "last_xact_seqno": None})
            seen["transactions"] += n
            seen["commands"] += sum([rows.get(article, 0) for rows in per_txn])
            at = next(i for i in range(len(txns) - 1, -1, -1) if article in per_txn[i])
            last[table] = max(at, last.get(table, at))
        for table, at in last.items():
            self.tables[table]["last_xact_seqno"] = txns[at].xact

    def summary(self) -> dict[str, dict[str, Any]]:
        return {table: dict(seen) for table, seen in sorted(self.tables.items())}


class _Delivery:
    """One Distribution Agent run for one subscription: the delivery loop."""

    def __init__(self, topology: Topology, publication: str, subscriber: str, settings: _Settings) -> None:
        self.topology, self.publication, self.subscriber = topology, publication, subscriber
        self.settings = settings
        self.own_origin = naming.queue_origin(subscriber)  # its queued changes, applied at the publisher
        self.n = settings.streams
        self.streams = Streams(publication, subscriber, settings.streams)
        self.totals: dict[str, Any] = {
            "transactions": 0,
            "commands": 0,
            "commits": 0,
            "retries": 0,
            "skipped": 0,
            "parallel_batches": 0,
            "own_queued": 0,
            "last_xact_seqno": None,
        }
        self.chooser = stream_planning.StreamChooser(adaptive=stream_planning.ADAPTIVE_STREAMS)
        mode = topology.subscription(publication, subscriber).update_mode
        #: a queued updating subscriber (with its queue): batches converge there (see _converge)
        self.guard: QueueGuard | None = None
        #: a subscriber recording the keys its own (immediate) changes took: the batches' commands
        #: those supersede are left out (see _supersede)
        self.superseding: Superseding | None = None
        self.queued = mode.queued or mode.failover
        self.policy = topology.publication(publication).conflict_policy
        #: the turns at a subscriber where a Queue Reader (or a Snapshot Agent initializing it)
        #: writes too (None: no other writer there)
        self.turns: subscriber_writer.Turns | None = None
        #: what each subscriber table received (the run's summary: ``tables``)
        self.tables = TableChanges({a.name: a.destination for a in topology.publication(publication).articles})
        #: each article's apply path (apply_mode) and why, and the articles applied by net change
        self.paths: dict[str, bulk_apply.ArticlePath] = {}
        self.net: set[str] = set()
        #: the articles' definitions as the subscriber has them (the applier's: a schema change updates them)
        self.articles: dict[str, ResolvedArticle] = {}
        #: net change: the next batch read from the distributor while one is applied (None: not here)
        self.ahead: read_ahead.ReadAhead[read_ahead.Prepared] | None = None
        #: the last transaction committed at the subscriber whose delivery the distributor has not
        #: recorded yet (None: all recorded), and when it last recorded (:meth:`record`)
        self.unrecorded: str | None = None
        self.recorded_at = time.monotonic()
        #: the subscription was paused when the last batch was to start (nothing more delivered)
        self.paused = False
        #: ``auto``: a batch by net change watches its tables in its statements' pipeline
        #: (:func:`~airflow_repl.engine.subscriber.bulk_apply.watch_statements`); False once the
        #: subscriber's database has a trigger firing for replicated changes (on any table), when
        #: each batch asks its tables' own first (:meth:`_watched`)
        self.watch_inline = True
        #: the watermark locked in the transaction the last batch's commit began (None: none locked)
        self.locked_watermark: str | None = None
        #: whether the distribution database has ``subscription_articles`` (None: not asked yet)
        self.held_table: bool | None = None

    def connect(self, run: AgentRun) -> None:
        """Open the streams, take the subscription's lock, recover an interrupted batch."""
        conninfo = self.topology.subscriber_conninfo(self.subscriber)
        role = f"subscriber {self.subscriber!r}"
        self.streams.open(lambda: run.connect(conninfo, role))
        # One agent per subscription: a session lock, released if this process dies.  Taken before
        # recovery, so that no live agent's two-phase commit is ever "recovered" under its feet.
        run.lock(self.streams.first)
        run.step = "the recovery of an interrupted two-phase commit"
        recover_prepared(self.streams.first, self.publication)
        has_queue = subscriber_state.has_queue(self.streams.first)
        if self.queued and has_queue:
            subscriber_state.ensure_taken(self.streams.first)
            self.guard = QueueGuard(self.streams.first, self.publication, self.policy)
            self.totals["conflicts"] = 0
        elif subscriber_state.has_taken(self.streams.first):
            self.superseding = Superseding(self.streams.first, self.publication, self.own_origin, self.policy)
            self.totals["superseded"] = 0
        if self.guard is not None or self.superseding is not None:
            json_values.exact_numbers(self.streams.first)  # the rows conflicts record
        self.streams.first.rollback()
        if self.queued or has_queue:  # a Queue Reader may write there too: take turns, batch by batch
            self.turns = subscriber_writer.Turns(self.streams.first, self.publication)

    def choose_paths(self, articles: dict[str, ResolvedArticle], scripts: Iterable[str]) -> None:
        """Each article's apply path under the run's ``apply_mode`` (``auto``: from the
        subscriber's triggers, its update mode, the article's procedures and scripts), in the
        run's summary as ``apply``."""
        mode = self.topology.subscription(self.publication, self.subscriber).update_mode
        triggers: dict[tuple[str, str], list[str]] = {}
        if self.settings.mode == "auto":
            tables = [(a.dest_schema, a.dest_table) for a in articles.values()]
            triggers = catalog.replicated_change_triggers(self.streams.first, tables)
            self.watch_inline = not self.streams.first.execute(bulk_apply.ANY_REPLICATED_TRIGGER).fetchall()
            self.streams.first.rollback()
        paths = bulk_apply.article_paths(
            self.settings.mode,
            articles.values(),
            updatable=str(mode) if mode.updatable else None,
            streams=self.n,
            triggers=triggers,
            scripts=scripts,
        )
        if self.settings.mode == bulk_apply.NET_CHANGE and (mode.queued or mode.failover):
            paths = [
                bulk_apply.ArticlePath(p.article, bulk_apply.PER_COMMAND, f"queued subscriber ({mode})") for p in paths
            ]
        self.paths = {p.article: p for p in paths}
        self.net = {p.article for p in paths if p.apply == bulk_apply.NET_CHANGE}
        self.articles = articles
        self._report_paths()

    def net_articles(self) -> dict[str, ResolvedArticle]:
        """The definitions of the articles applied by net change."""
        return {name: self.articles[name] for name in list(self.net)}

    def _report_paths(self) -> None:
        self.totals["apply"] = [p.to_json() for p in self.paths.values()]

    def _net_batch(self, batch: _Batch) -> list[ResolvedArticle] | None:
        """The articles of a batch that may go by net change (None: one of its articles goes
        command by command, so the batch does)."""
        names = dict.fromkeys(a for t in batch.txns for a in t.article_rows)
        if not self.net or any(a not in self.net for a in names):
            return None
        return [self.articles[a] for a in names]

    def _watch(self, arts: list[ResolvedArticle]) -> list[tuple[str, Sequence[Any] | None]]:
        """``auto``: the statements that watch the batch's tables in its statements' pipeline
        (the common case: no trigger firing for replicated changes in the subscriber's
        database), or none after :meth:`_watched` watched them in round trips of their own."""
        if self.settings.mode != "auto" or not arts:
            return []
        if self.watch_inline:
            return bulk_apply.watch_statements(arts)
        self._watched(arts)
        return []

    def _trigger_met(self, arts: list[ResolvedArticle]) -> None:
        """The batch's pipeline met a trigger firing for replicated changes (all rolled back):
        which articles it watches go command by command from now on (:meth:`_watched`); if none
        of the batch's, the database has one elsewhere and each batch watches in round trips of
        its own from now on.  The batch goes command by command either way (NotNetApplicable)."""
        self.watch_inline = False
        self._watched(arts)
        raise bulk_apply.NotNetApplicable("a trigger fires for replicated changes at the subscriber's database")

    def _watched(self, arts: list[ResolvedArticle]) -> None:
        """``auto``: lock the batch's tables and make sure no trigger there fires for replicated
        changes (one created since the run chose its paths); such an article goes command by
        command from now on (NotNetApplicable: this batch too)."""
        found = bulk_apply.watching_triggers(self.streams.first, arts)
        if not found:
            return
        for name, path in net_change.triggered(arts, found).items():
            self.paths[name] = path
            self.net.discard(name)
            log.info("article %r is applied command by command from now on: %s", name, path.why)
        self._report_paths()
        raise bulk_apply.NotNetApplicable("a trigger fires for replicated changes at the subscriber")

    def open_read_ahead(self, run: AgentRun, applier: Applier) -> None:
        """Net change: read each next batch while one is applied, on a distributor connection
        of its own; not where batches converge with a queue or take turns with a Queue Reader
        (those read the distributor between their own steps)."""
        if not self.net or self.guard is not None or self.turns is not None:
            return
        conn = run.connect(self.topology.distributor.require("distributor"), "distributor", autocommit=True)
        size, until, threshold = self.settings.size, self.settings.until, self.settings.threshold
        self.ahead = read_ahead.ReadAhead(
            conn,
            self.publication,
            size,
            lambda pending: _cut_batch(pending, until, threshold, self.own_origin),
            lambda rows, txns: _prepare(applier, self.net_articles(), rows, txns),
        )
        run.cleanups.append(self.close_read_ahead)

    def close_read_ahead(self) -> None:
        if self.ahead is not None:
            ahead, self.ahead = self.ahead, None
            self.totals["read_ahead_batches"] = ahead.close()

    # ------------------------------------------------------------------ the loop
    def run(
        self,
        dist: psycopg.Connection,
        run_id: int,
        applier: Applier,
        loop: continuous_mode.Loop,
        lines: progress_lines.Lines,
    ) -> None:
        """Deliver batch after batch until none is pending (a continuous run: until ``loop``
        ends it, looking again every poll interval); a batch that fails on the fast path is
        replayed on one stream, which skips what ``skip_errors`` allows or raises.  Progress
        lines (:mod:`~airflow_repl.engine.runtime.progress_lines`) between batches."""
        self._catch_up_record(dist)
        tx, cmds = self._pending(dist)
        self.totals["backlog_at_start"] = {"transactions": tx, "commands": cmds}
        wake = dist_transactions.StoredWake(dist, self.publication) if loop.opts is not None else None
        while True:
            if self.turns is not None and not self.turns.take(loop.must_end):
                break  # the run ends while another agent (Queue Reader, Snapshot Agent) writes there
            try:
                batch = self._next_batch(dist, applier)
                if batch is not None:
                    with gc_pause.paused():
                        self._deliver(dist, run_id, applier, batch)
                    if wake is not None:
                        dist_transactions.forget_stored(dist)  # this batch's notices and older ones
            finally:
                if self.turns is not None:
                    self.turns.give_back()
            if batch is None:
                self.record(dist)  # everything pending is delivered: recorded before idling or ending
                if loop.idle(wake=wake):
                    continue
                break
            if lines.due():
                self.record(dist)
                lines.log(
                    progress_lines.delivery_line(
                        self.totals["transactions"], self.totals["commands"], *self._pending(dist)
                    )
                )
            if not loop.go_on():  # between batches: everything is committed
                break
        self._release()
        self.record(dist)
        self._record_end(dist)

    def _deliver(self, dist: psycopg.Connection, run_id: int, applier: Applier, batch: _Batch) -> None:
        """Apply one batch by the way it needs, and commit it with the watermark."""
        if batch.txns[0].schema_change:
            self._schema_batch(dist, run_id, applier, batch)
        elif self.guard is not None:
            self._converge(dist, run_id, applier, batch, self.guard)
        else:
            self._supersede(dist, applier, batch)
            if not self._fast_path(dist, applier, batch):
                self._replay(dist, run_id, applier, batch)

    def _supersede(self, dist: psycopg.Connection, applier: Applier, batch: _Batch) -> None:
        """At a subscriber that records the keys its own changes took: read them for the batch
        (those the watermark passed are forgotten with it); :meth:`_located` leaves out the
        commands they supersede (:mod:`~airflow_repl.engine.subscriber.superseded`)."""
        if self.superseding is not None:
            self.superseding.left = []
            self.superseding.load(dist, applier.articles, batch.watermark)

    def _located(self, applier: Applier, rows: Iterable[CommandRow], batch: _Batch) -> Iterable[Located]:
        """The batch's commands to apply, in order: without those the subscriber's own later
        changes supersede."""
        located = applier.commands(rows, batch.article_rows())
        if self.superseding is not None and self.superseding.keys:
            return self.superseding.filter(located, applier.articles)
        return located

    def _pending(self, dist: psycopg.Connection) -> tuple[int, int]:
        """The subscription's backlog now (transactions, commands)."""
        tx, cmds, _ = progress.backlog(dist, self.publication, self.subscriber)
        dist.commit()
        return tx, cmds

    def _record_end(self, dist: psycopg.Connection) -> None:
        """The backlog the run leaves behind (``backlog_at_end``: what ``until``, the end of a
        continuous run or a pause left undelivered) and the lag then (``lag_seconds``)."""
        tx, cmds, oldest = progress.backlog(dist, self.publication, self.subscriber)
        dist.commit()
        self.totals["backlog_at_end"] = {"transactions": tx, "commands": cmds}
        self.totals["lag_seconds"] = status.pending_age(oldest, datetime.now(timezone.utc)) if oldest else 0.0

    def definitions_changed(self, dist: psycopg.Connection, applier: Applier) -> str | None:
        """Between batches of a continuous run: why it must end because the subscriber's article
        definitions are no longer those it applies with (the subscription was reinitialized
        meanwhile; the next run starts from the new ones), or None."""
        has = subscriber_state.articles_hash(self.streams.first, self.publication)
        self._release()
        has = has or dist_subscriptions.subscription_articles_hash(dist, self.publication, self.subscriber)
        held = dist_subscription_articles.held_articles(dist, self.publication, self.subscriber)
        dist.commit()
        if dist_subscription_articles.held_names(held, dist_subscription_articles.ACTIVE) - set(applier.articles):
            return "an article was copied to the subscriber"
        if has is None or has in dist_subscription_articles.holding(held, list(applier.articles.values()))[1]:
            return None
        return "article definitions changed"

    def _catch_up_record(self, dist: psycopg.Connection) -> None:
        """A run that stopped between a subscriber commit and its record at the distributor left
        the record behind the watermark: bring it, and the tracer tokens up to it, there."""
        watermark = subscriber_state.watermark(self.streams.first, self.publication)
        self.streams.first.rollback()
        if watermark is not None and dist_subscriptions.catch_up_delivered(
            dist, self.publication, self.subscriber, watermark
        ):
            progress.record_arrivals(dist, self.publication, self.subscriber, watermark)
        dist.commit()

    def _next_batch(self, dist: psycopg.Connection, applier: Applier) -> _Batch | None:
        """Read the transactions after the (locked) watermark; None, all rolled back, when
        there are none.  An article copied on its own (or still to copy) limits the batch
        (:func:`~airflow_repl.engine.state.dist_subscription_articles.delivery_limits`)."""
        watermark = self._lock_watermark()
        ahead = self.ahead.take(watermark) if self.ahead is not None else None
        pending, self.paused, held = self._distributor_batch(dist, watermark, ahead.pending if ahead else None)
        while own := _own_leading(pending, self.own_origin, self.settings.until):
            watermark = self._pass_own(dist, own)  # committed at the distributor too: locked again
            pending, self.paused, held = self._distributor_batch(dist, watermark, None)
        limits = dist_subscription_articles.delivery_limits(held, watermark, set(applier.articles))
        applier.skip = limits.skip
        if limits.stop is not None:  # an article's own copy is under way: up to its hand-off
            pending = [t for t in pending if lsn.lsn_to_int(t.xact) <= limits.stop]
        txns = [] if self.paused else _cut_batch(pending, self.settings.until, self.settings.threshold, self.own_origin)
        if not txns:
            self.streams.rollback_all()
            dist.rollback()
            return None
        prepared = ahead.prepared_for(txns) if ahead is not None and limits.none else None
        if prepared is not None and self.ahead is not None:
            self.ahead.used += 1
        return _Batch(watermark, txns, prepared)

    def _lock_watermark(self) -> str:
        """The watermark, locked: the one the last batch's commit locked in the transaction it
        began, if that transaction is still open (nothing ended it since), else locked now."""
        held, self.locked_watermark = self.locked_watermark, None
        if held is not None and self.streams.first.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
            return held
        return subscriber_state.lock_watermark(self.streams.first, self.publication, self.subscriber)

    def _release(self) -> None:
        """End the subscriber transaction (and so the watermark's lock, if held) on the first stream."""
        self.locked_watermark = None
        self.streams.first.rollback()

    def _distributor_batch(
        self, dist: psycopg.Connection, watermark: str, pending: list[PendingTransaction] | None
    ) -> tuple[list[PendingTransaction], bool, list[dist_subscription_articles.HeldArticle]]:
        """The distributor's part of a batch's start, in one round trip (:func:`batch_start`)."""
        if self.held_table is None:  # a distribution database made before added articles were copied on their own
            self.held_table = dist_schema.deployed(dist, "subscription_articles")
        return batch_start(
            dist, self.publication, self.subscriber, watermark, self.settings.size, pending, held=self.held_table
        )

    def _pass_own(self, dist: psycopg.Connection, own: list[PendingTransaction]) -> str:
        """Move the watermark past the subscriber's own queued changes, which the Queue Reader
        applied at the publisher (they came from here: never apply them again), and lock it
        again; returns it."""
        last = own[-1].xact
        subscriber_state.set_watermark(self.streams.first, self.publication, last, 0)
        if self.guard is not None or self.superseding is not None:  # the keys they took: no older command is left
            Taken.load(self.streams.first, dist, self.publication, self.own_origin, last)
        self.streams.first.commit()
        self.unrecorded = last  # past any batch still unrecorded: one record covers both
        self.record(dist)
        self.totals["own_queued"] += len(own)
        self.totals["last_xact_seqno"] = last
        return subscriber_state.lock_watermark(self.streams.first, self.publication, self.subscriber)

    # ------------------------------------------------------------------ fast path
    def _fast_path(self, dist: psycopg.Connection, applier: Applier, batch: _Batch) -> bool:
        """Plan, apply and commit the batch with the watermark, and record it; False when it
        failed (everything is still to roll back: the caller replays it)."""
        arts = self._net_batch(batch)
        if arts is not None and self._net_change(dist, applier, batch, arts):
            return True
        rows = dist_transactions.batch_commands(dist, self.publication, batch.first, batch.last)
        try:
            may_spread = self.n > 1 and self.chooser.may_spread()
            started = time.monotonic()
            shares = self._plan(applier, rows, batch, may_spread)
            n = self._apply(applier, shares)
            self._commit(batch, len(shares))
            if self.n > 1 and may_spread == (len(shares) > 1):  # a batch planned but kept whole says nothing
                self.chooser.record(may_spread, n, time.monotonic() - started)
            self._delivered(dist, batch.txns, n, defer=self._may_defer(batch))
            return True
        except psycopg.Error as exc:
            rows.close()
            if self.streams.lost() or dist.broken:
                raise  # a server went away: nothing to replay on (the run is recorded as failed)
            log.info(
                "batch %s..%s failed on the fast path (%s); replaying it on one stream",
                batch.first,
                batch.last,
                exc.sqlstate or exc,
            )
            return False

    def _net_change(
        self, dist: psycopg.Connection, applier: Applier, batch: _Batch, arts: list[ResolvedArticle]
    ) -> bool:
        """The batch (of the articles ``arts``) applied by net change (:mod:`~airflow_repl.engine.subscriber.bulk_apply`)
        on the first stream and committed with the watermark; False, rolled back and the
        watermark locked again, when it must be applied command by command.  A batch of more
        than ``CHUNK_COMMANDS`` commands is read through a cursor and applied chunk by chunk in
        the same subscriber transaction."""
        rows: Iterable[CommandRow] = ()
        prepared = batch.prepared
        if self.superseding is not None and self.superseding.keys:
            prepared = None  # made ahead from every command: some are left out
        if prepared is None and batch.commands <= bulk_apply.CHUNK_COMMANDS:
            rows = dist_transactions.batch_commands_list(dist, self.publication, batch.first, batch.last)
        elif prepared is None:
            rows = dist_transactions.batch_commands(dist, self.publication, batch.first, batch.last)
        if self.ahead is not None:
            self.ahead.start(batch.last)  # the next batch, read and prepared while this one is applied
        try:
            n, chunks, moved = self._net_apply(applier, batch, arts, prepared, rows)
        except (bulk_apply.NotNetApplicable, psycopg.Error) as why:
            if isinstance(rows, Generator):
                rows.close()  # the cursor of a chunked batch
            if self.streams.lost() or dist.broken:
                raise
            log.debug("batch %s..%s applied command by command: %s", batch.first, batch.last, why)
            self.streams.first.rollback()
            bulk_apply.forget_tables(self.streams.first)
            self._check_watermark_unmoved(batch)
            return False
        self._commit(batch, 1, moved)
        self._delivered(dist, batch.txns, n, defer=self._may_defer(batch))
        self.totals["net_batches"] = self.totals.get("net_batches", 0) + 1
        if chunks > 1:
            self.totals["net_chunks"] = self.totals.get("net_chunks", 0) + chunks
        return True

    def _net_apply(
        self,
        applier: Applier,
        batch: _Batch,
        arts: list[ResolvedArticle],
        prepared: read_ahead.Prepared | None,
        rows: Iterable[CommandRow],
    ) -> tuple[int, int, bool]:
        """:meth:`_net_change`'s statements, watched (:meth:`_watch`) in the first pipeline:
        how many commands, in how many chunks, and whether the watermark moved with them."""
        try:
            if isinstance(prepared, bulk_apply.NotNetApplicable):
                raise prepared
            n = chunks = 0
            moved = False
            before = self._watch(arts)  # sent with the first statements
            if prepared is not None:
                move = subscriber_state.watermark_move(self.publication, batch.last, len(batch.txns))
                n, chunks, moved = bulk_apply.execute(self.streams.first, prepared, [move], before), 1, True
                before = []
            commands = (cmd for _, _, cmd in self._located(applier, rows, batch))
            while chunk := list(islice(commands, bulk_apply.CHUNK_COMMANDS)):
                n += bulk_apply.execute(
                    self.streams.first, bulk_apply.prepare(chunk, self.net_articles()), before=before
                )
                before = []
                chunks += 1
        except psycopg.Error as exc:
            if not bulk_apply.trigger_fires(exc) or self.streams.lost():
                raise
            self.streams.first.rollback()
            self._trigger_met(arts)
        return n, chunks, moved

    def _plan(
        self, applier: Applier, rows: Iterable[CommandRow], batch: _Batch, may_spread: bool
    ) -> list[Iterable[Command]]:
        """The batch's commands per stream (a single share: apply on one stream).  One stream
        reads the commands as it applies them; several need the whole batch planned first."""
        commands = (cmd for _, _, cmd in self._located(applier, rows, batch))
        if not stream_planning.worth_planning(self.n, may_spread, batch.commands):
            return [commands]
        return list(stream_planning.plan_batch(list(commands), applier.touched, self.n))

    def _apply(self, applier: Applier, shares: list[Iterable[Command]]) -> int:
        """Apply the shares (share i on stream i); how many commands were executed."""
        if len(shares) == 1:
            return apply_pipelined(self.streams.first, applier, shares[0])
        return apply_parallel(self.streams.conns, applier, shares)

    def _commit(self, batch: _Batch, used: int, moved: bool = False) -> None:
        """Commit the batch's changes and the watermark together (``moved``: the watermark was
        moved already, in the batch's transaction): exactly once.  Over several streams that is
        a two-phase commit of the streams the batch used."""
        if not moved:
            subscriber_state.set_watermark(self.streams.first, self.publication, batch.last, len(batch.txns))
        if used == 1 and self.turns is None:  # the next batch's lock in the same round trip
            self.locked_watermark = subscriber_state.commit_and_lock(self.streams.first, self.publication)
        elif used == 1:
            self.streams.first.commit()
        else:
            self.streams.commit_two_phase(used, batch.last)
            self.totals["parallel_batches"] += 1

    # ------------------------------------------------------------------ replay
    def _replay(self, dist: psycopg.Connection, run_id: int, applier: Applier, batch: _Batch) -> None:
        """Roll the failed batch back everywhere and apply it again on one stream, transaction
        by transaction; commit what it applied (and skipped), then raise its failure, if any.
        A command that failed on a key the subscriber's application took meanwhile (immediate
        updating: it is superseded, see :meth:`_supersede`) is not skipped nor a failure: the
        batch is replayed again with the keys read again."""
        self.streams.rollback_all()
        dist.rollback()
        retention.lock_unexpired(dist, self.publication, self.subscriber)
        for attempt in range(SUPERSEDING_RETRIES + 1):
            self.totals["retries"] += 1
            self._check_watermark_unmoved(batch)
            self._supersede(dist, applier, batch)
            rows = dist_transactions.batch_commands(dist, self.publication, batch.first, batch.last)
            outcome = replay(self.streams.first, applier, self._located(applier, rows, batch), self.settings.skip)
            rows.close()
            if not self._superseded_meanwhile(dist, applier, batch, outcome):
                break
            self.streams.first.rollback()
            if attempt == SUPERSEDING_RETRIES:
                raise AgentBusy(
                    f"the application at subscriber {self.subscriber!r} kept changing rows of the batch "
                    f"{batch.first}..{batch.last} while it was applied (immediate updating): run the Distribution "
                    f"Agent again"
                )
        done = batch.last if outcome.failure is None else outcome.last_good
        if done is not None:
            self._commit_replayed(dist, run_id, batch, done, outcome)
        if outcome.failure is not None:
            raise outcome.failure

    def _superseded_meanwhile(
        self, dist: psycopg.Connection, applier: Applier, batch: _Batch, outcome: ReplayOutcome
    ) -> bool:
        """Whether a command the replay skipped or failed on is superseded by a key the
        subscriber's own change took after the keys were read (asked in the replay's
        transaction, rolled back to its savepoints: a committed change is seen)."""
        if self.superseding is None:
            return False
        failed: list[tuple[str | None, dict[str, Any] | None, str]] = [
            (s.article, s.command, s.xact_seqno) for s in outcome.skipped
        ]
        if outcome.failure is not None and outcome.failure.xact_seqno is not None:
            failed.append((outcome.failure.article, outcome.failure.command, outcome.failure.xact_seqno))
        if not failed:
            return False
        left = self.superseding.left
        self.superseding.load(dist, applier.articles, batch.watermark)
        self.superseding.left = left
        return any(self.superseding.covers(applier.articles.get(a or ""), c, x) for a, c, x in failed)

    def _schema_batch(self, dist: psycopg.Connection, run_id: int, applier: Applier, batch: _Batch) -> None:
        """A transaction with a schema change: on one stream, command by command (the row
        changes before the change with the old columns, those after it with the new ones), the
        table changed and its procedures regenerated in the same subscriber transaction, which
        commits with the watermark and the definitions the subscriber now has.  Never skipped:
        a failure stops delivery here, and re-running delivers it once."""
        rows = dist_transactions.batch_commands(dist, self.publication, batch.first, batch.last)
        commands = applier.commands(rows, batch.article_rows())
        outcome = replay(self.streams.first, applier, commands, set())
        if outcome.failure is not None:
            raise outcome.failure
        has = definition_hash(list(applier.articles.values()))
        subscriber_state.set_articles_hash(self.streams.first, self.publication, has)
        dist_subscriptions.set_subscription_articles_hash(
            dist, self.publication, self.subscriber, has
        )  # with its delivery
        self.totals["schema_changes"] = self.totals.get("schema_changes", 0) + applier.schema_changes
        applier.schema_changes = 0
        self._commit_replayed(dist, run_id, batch, batch.last, outcome)

    def _converge(
        self, dist: psycopg.Connection, run_id: int, applier: Applier, batch: _Batch, guard: QueueGuard
    ) -> None:
        """A queued subscriber's batch: one stream, command by command, each converging with the
        subscriber's own changes (:mod:`~airflow_repl.engine.subscriber.convergence`) instead of
        failing on them; commit what it applied, then raise its failure, if any."""
        self._taken(dist, batch, guard)
        rows = dist_transactions.batch_commands(dist, self.publication, batch.first, batch.last)
        commands = applier.commands(rows, batch.article_rows())
        outcome = replay_queued(self.streams.first, applier, commands, self.settings.skip, guard)
        done = batch.last if outcome.failure is None else outcome.last_good
        if done is not None:
            self._commit_replayed(dist, run_id, batch, done, outcome)
        if outcome.failure is not None:
            raise outcome.failure

    def _taken(self, dist: psycopg.Connection, batch: _Batch, guard: QueueGuard) -> None:
        """Where the publisher transactions that took rows of the subscriber's queue are in the
        log (None: not stored yet, so after the batch); forget those the watermark has passed."""
        guard.taken(Taken.load(self.streams.first, dist, self.publication, self.own_origin, batch.watermark))

    def _check_watermark_unmoved(self, batch: _Batch) -> None:
        """Lock the watermark again: it must still be where the batch began (never re-apply)."""
        now = subscriber_state.lock_watermark(self.streams.first, self.publication, self.subscriber)
        if lsn.lsn_to_int(now) != lsn.lsn_to_int(batch.watermark):
            raise ReplError(
                f"the watermark of subscriber {self.subscriber!r} moved while a batch failed; "
                f"run the Distribution Agent again"
            )

    def _commit_replayed(
        self, dist: psycopg.Connection, run_id: int, batch: _Batch, done: str, outcome: ReplayOutcome
    ) -> None:
        """Commit the replay's changes up to ``done`` with the watermark, then record the
        skipped transactions and the progress at the distributor."""
        applied = batch.count_through(done)
        subscriber_state.set_watermark(self.streams.first, self.publication, done, applied)
        self.streams.first.commit()
        record_skipped(dist, run_id, self.publication, self.subscriber, outcome)
        self.totals["skipped"] += len(outcome.skipped)
        if outcome.conflicts:
            through = lsn.lsn_to_int(done)
            met = [c for c in outcome.conflicts if lsn.lsn_to_int(c["xact_seqno"]) <= through]
            dist_conflicts.record_delivery_conflicts(dist, self.publication, self.subscriber, met)
            self.totals["conflicts"] += len(met)
        not_applied = {x.xact_seqno for x in outcome.skipped}  # skipped: no table received them
        self._delivered(dist, batch.txns[:applied], outcome.commands, not_applied)

    # ------------------------------------------------------------------ progress
    def _delivered(
        self,
        dist: psycopg.Connection,
        txns: list[PendingTransaction],
        n_cmd: int,
        skipped: set[str] | None = None,
        *,
        defer: bool = False,
    ) -> None:
        """Record at the distributor that the subscriber has everything up to the last of
        ``txns`` (the transactions just committed there, but for the ``skipped`` ones), with
        what else the caller wrote there (skipped transactions, conflicts).  ``defer``: an
        ordinary batch's record alone may wait up to ``RECORD_INTERVAL`` (:meth:`record`)."""
        self.unrecorded = txns[-1].xact
        if (
            self._record_superseded(dist, txns[-1].xact)
            or not defer
            or time.monotonic() - self.recorded_at >= RECORD_INTERVAL
        ):
            self.record(dist)
        self.totals["transactions"] += len(txns)
        self.totals["commands"] += n_cmd
        self.totals["commits"] += 1
        self.totals["last_xact_seqno"] = txns[-1].xact
        self.tables.add([t for t in txns if not skipped or t.xact not in skipped])

    def _record_superseded(self, dist: psycopg.Connection, through: str) -> int:
        """Record at the distributor the commands left out up to ``through`` (just committed at
        the subscriber), as conflicts; how many (the caller commits)."""
        if self.superseding is None or not self.superseding.left:
            return 0
        found = self.superseding.records(through)
        self._release()  # the rows were read after the commit
        dist_conflicts.record_delivery_conflicts(dist, self.publication, self.subscriber, found)
        self.totals["superseded"] += len(found)
        return len(found)

    def record(self, dist: psycopg.Connection) -> None:
        """Record at the distributor the delivery up to the last transaction committed at the
        subscriber (and the arrival of the tracer tokens up to it), if not recorded yet.  The
        subscriber's watermark, committed with each batch, is what delivery goes by; this record
        is for everyone else (status, sensors, retention) and may lag behind it: a run that stops
        before recording catches up at the next start (:meth:`_catch_up_record`)."""
        if self.unrecorded is None:
            return
        last = self.unrecorded
        dist_subscriptions.mark_delivered(dist, self.publication, self.subscriber, last)
        progress.record_arrivals(dist, self.publication, self.subscriber, last)  # tracer tokens up to it
        dist.commit()
        self.unrecorded, self.recorded_at = None, time.monotonic()

    def _may_defer(self, batch: _Batch) -> bool:
        """Whether the batch's record may wait: an ordinary batch at a subscriber where no other
        agent writes, without a tracer token (a transaction without commands: its arrival is
        recorded at once, at the distributor's clock) or a schema change."""
        return (
            self.turns is None
            and self.guard is None
            and all(t.command_count and not t.schema_change for t in batch.txns)
        )


def batch_start(
    dist: psycopg.Connection,
    publication: str,
    subscriber: str,
    watermark: str,
    size: int,
    pending: list[PendingTransaction] | None,
    *,
    held: bool,
) -> tuple[list[PendingTransaction], bool, list[dist_subscription_articles.HeldArticle]]:
    """The distributor's part of a batch's start, in one round trip (a pipeline): up to ``size``
    transactions after ``watermark`` (unless ``pending`` was read ahead), then the
    subscription's row held until the batch commits (an expired one refused: neither the cleanup
    expiring it nor airflow-repl pause can change it while the batch is delivered; whether it is
    paused) and, when ``held`` (the distribution database has the table), the articles it holds
    (an article's own copy limits the batch)."""
    with dist.cursor() as cur:
        with dist.pipeline():
            if pending is None:
                dist_transactions.send_pending(cur, publication, watermark, size)
            lock = dist.execute(retention.UNEXPIRED_QUERY, (publication, subscriber))
            rows = dist.execute(dist_subscription_articles.HELD_QUERY, (subscriber, publication)) if held else None
        if pending is None:
            pending = dist_transactions.pending_rows(cur)
    paused = retention.unexpired(lock.fetchone(), publication, subscriber)
    return pending, paused, dist_subscription_articles.held(rows.fetchall()) if rows is not None else []


def record_skipped(
    dist: psycopg.Connection, run_id: int, publication: str, subscriber: str, outcome: ReplayOutcome
) -> None:
    """Record at the distributor (in its open transaction) the transactions a replay skipped."""
    for skipped in outcome.skipped:
        dist_history.record_error(
            dist,
            run_id=run_id,
            agent=AGENT,
            publication=publication,
            subscriber=subscriber,
            skipped=True,
            commit=False,
            **dataclasses.asdict(skipped),
        )


def _prepare(
    applier: Applier, net: dict[str, ResolvedArticle], rows: list[CommandRow], txns: list[PendingTransaction]
) -> read_ahead.Prepared:
    """A batch's net change from its stored commands (DELETE + INSERT pairs merged back into one
    UPDATE as the applier does) for the articles applied by net change ``net``, or why it has
    none; made by the read-ahead's thread."""
    commands = [cmd for _, _, cmd in applier.commands(rows, _article_rows(txns))]
    try:
        return bulk_apply.prepare(commands, net)
    except bulk_apply.NotNetApplicable as why:
        return why


# ---------------------------------------------------------------------- the run
@ends_when_stopped
def run_distribution(
    topology: Topology,
    publication: str,
    subscriber: str,
    *,
    until: datetime | str | None = None,
    commit_batch_size: int | None = None,
    commit_batch_threshold: int | None = None,
    subscription_streams: int | None = None,
    skip_errors: list[str] | None = None,
    continuous: bool = False,
    poll_interval: float | None = None,
    max_run_seconds: float | None = None,
) -> dict[str, Any]:
    """Deliver every pending transaction (committed up to ``until``, when given).
    ``continuous``: keep delivering what the Log Reader stores later, looking every
    ``poll_interval`` seconds when idle, until ``max_run_seconds`` or SIGTERM
    (:mod:`~airflow_repl.engine.runtime.continuous`); not with ``until``."""
    opts = continuous_mode.options(continuous, poll_interval, max_run_seconds)
    continuous_mode.refuse_until(until, opts)
    if topology.is_mariadb_subscriber(subscriber):  # through SQL statements (mariadb_distribution)
        from airflow_repl.engine.agents.mariadb_distribution import run_mariadb_distribution

        overrides = _Overrides(until, commit_batch_size, commit_batch_threshold, subscription_streams, skip_errors)
        return run_mariadb_distribution(
            topology, publication, subscriber, _settings(topology, publication, subscriber, overrides), opts
        )
    in_doubt.resolve_quietly(topology, publication, [subscriber])  # its immediate updates, prepared at the publisher
    overrides = _Overrides(until, commit_batch_size, commit_batch_threshold, subscription_streams, skip_errors)
    delivery = _Delivery(topology, publication, subscriber, _settings(topology, publication, subscriber, overrides))
    with AgentRun(AGENT, publication, subscriber) as run:
        lines = progress_lines.Lines(run)  # its interval checked before anything changes
        run.step = "connecting"
        dist = run.connect(topology.distributor.require("distributor"), "distributor")
        dist_publications.load_articles(dist, publication)  # deployed at all? (before the subscriber is asked)
        paused = retention.lock_unexpired(dist, publication, subscriber)  # expired: refused
        dist.rollback()
        if paused and opts is None:  # skipped without asking the subscriber; a continuous run idles
            return _skip_paused(run, dist)
        _start(run, delivery)
        applier = _check_subscription(run, dist, delivery)
        run_id = run.begin(dist)
        dist_history.record_run_details(dist, run_id, {"apply": delivery.totals["apply"]})
        run.counts = run.details = delivery.totals
        run.step = "delivery"
        delivery.open_read_ahead(run, applier)
        with continuous_mode.Loop(opts, run, delivery.totals) as loop:
            loop.check = lambda: delivery.definitions_changed(dist, applier)
            delivery.run(dist, run_id, applier, loop, lines)
        delivery.close_read_ahead()
        totals = _succeed(run, delivery, loop)
    return totals


@dataclass(frozen=True)
class _Overrides:
    """The caller's options; None: the subscription's."""

    until: datetime | str | None
    size: int | None
    threshold: int | None
    streams: int | None
    skip_errors: list[str] | None


def _settings(topology: Topology, publication: str, subscriber: str, given: _Overrides) -> _Settings:
    """The run's settings: the caller's options over the subscription's, checked."""
    until = parse_until(given.until) if isinstance(given.until, str) else given.until
    if until is not None and until.tzinfo is None:
        until = until.replace(tzinfo=timezone.utc)  # a time without offset is UTC, like Airflow's
    opts = topology.subscription(publication, subscriber)
    skip = given.skip_errors if given.skip_errors is not None else opts.skip_errors
    unknown = [e for e in skip if str(e) not in SKIPPABLE_ERRORS]
    if unknown:
        raise ReplError(f"skip_errors {unknown} not understood; use row_not_found (20598) and/or duplicate_key (2627)")
    return _Settings(
        until=until,
        size=given.size or opts.commit_batch_size,
        threshold=given.threshold or opts.commit_batch_threshold,
        streams=given.streams or opts.subscription_streams,
        skip={SKIPPABLE_ERRORS[str(e)] for e in skip},
        mode=topology.apply_mode(publication, subscriber),
    )


def _check_subscription(run: AgentRun, dist: psycopg.Connection, delivery: _Delivery) -> Applier:
    """The subscription's articles, unchanged since the subscriber was initialized, and what
    the last run learnt about spreading here; nothing is changed."""
    run.step = "the subscription check"
    publication, subscriber = delivery.publication, delivery.subscriber
    unfinished = dist_drops.unfinished_drop(dist, publication, subscriber)
    if unfinished is not None:
        raise ReplError(unfinished)
    retention.lock_unexpired(dist, publication, subscriber)  # an expired subscription is refused
    articles = _definitions_at_watermark(dist, delivery)
    held = dist_subscription_articles.held_articles(dist, publication, subscriber)
    articles, accepted = dist_subscription_articles.holding(held, articles)  # an added one: once copied
    has = subscriber_state.articles_hash(delivery.streams.first, publication)
    delivery.streams.first.rollback()
    has = has or dist_subscriptions.subscription_articles_hash(dist, publication, subscriber)
    if has is not None and has not in accepted:
        raise ReplError(
            f"the articles of publication {publication!r} changed since subscriber {subscriber!r} "
            f"was initialized: run the Snapshot Agent with reinitialize for it "
            f"({retention.reinitialize_command(publication, subscriber)})"
        )
    if delivery.n > 1:  # start from what the last run learnt about spreading here
        delivery.chooser.resume(dist_history.last_stream_rates(dist, publication, subscriber, delivery.n))
    scripts = dist_publications.custom_scripts(dist, publication)
    dist.commit()
    applier = Applier({a.name: a for a in articles}, SchemaContext(subscriber, scripts))
    delivery.choose_paths(applier.articles, scripts)
    return applier


def _definitions_at_watermark(dist: psycopg.Connection, delivery: _Delivery) -> list[ResolvedArticle]:
    """The article definitions the subscriber has: the stored ones, except that an article
    with a schema change still to deliver there has its definition from before that change."""
    watermark = subscriber_state.watermark(delivery.streams.first, delivery.publication)
    return dist_publications.definitions_at(
        dist, delivery.publication, watermark, dist_publications.load_articles(dist, delivery.publication)
    )


def _start(run: AgentRun, delivery: _Delivery) -> None:
    """Connect to the subscriber and check that its subscription is initialized and that no
    other agent is alive there (both raise)."""
    run.cleanups.append(delivery.streams.rollback_all)
    delivery.connect(run)
    subscriber_state.lock_watermark(delivery.streams.first, delivery.publication, delivery.subscriber)
    delivery.streams.first.rollback()


def _skip_paused(run: AgentRun, dist: psycopg.Connection) -> dict[str, Any]:
    """A paused subscription: a history row with the outcome ``paused``, naming the command that
    resumes it; nothing delivered, the subscriber not asked."""
    run.begin(dist, take_over=False)  # no lock taken: the rows of other runs are left alone
    message = pausing.paused_message(run.publication, str(run.subscriber))
    summary = {"paused": True, "transactions": 0, "commands": 0, "message": message}
    return run.succeed(summary, message=message, outcome="paused")


def _left_by_until(run: AgentRun, delivery: _Delivery) -> None:
    """A run bounded by ``until`` that left pending transactions says so: ``left_by_until`` in its
    summary (how many, when the first of them and the newest below the bound committed) and a
    warning line."""
    assert delivery.settings.until is not None
    dist = run.connect(delivery.topology.distributor.require("distributor"), "distributor", autocommit=True)
    try:
        left = progress.left_by_until(dist, delivery.publication, delivery.subscriber, delivery.settings.until)
    finally:
        dist.close()
    if left["transactions"]:
        delivery.totals["left_by_until"] = left
        log.warning("%s", progress.until_message(delivery.publication, delivery.subscriber, left))


def _succeed(run: AgentRun, delivery: _Delivery, loop: continuous_mode.Loop) -> dict[str, Any]:
    """Finish the run: its totals (with the streams' measured rates and, for a continuous run,
    how it ended) in the history row, the log and the result; ``paused`` when the subscription
    was paused at its end (a continuous run idled on it, or it was paused during the run)."""
    totals = delivery.totals
    totals["tables"] = delivery.tables.summary()
    if delivery.settings.until is not None and not delivery.paused:
        _left_by_until(run, delivery)
    if delivery.n > 1:
        totals["stream_rates"] = {"streams": delivery.n, **delivery.chooser.rates()}
    if not delivery.paused:
        return run.succeed(loop.summary(totals))
    message = pausing.paused_message(delivery.publication, delivery.subscriber, totals["transactions"])
    totals.update(paused=True, message=message)
    return run.succeed(loop.summary(totals), message=message, outcome="paused")
