"""The Queue Reader Agent: applies a queued updating subscriber's own transactions at the
publisher, in the subscriber's commit order, exactly once, resolving conflicts by the
publication's policy.

Per queued transaction (``airflow_repl.queue_commits`` order at the subscriber):

1. at the publisher, in ONE transaction of a session marked with the subscriber's replication
   origin (:func:`~airflow_repl.engine.model.naming.queue_origin`): unless
   ``airflow_repl.queue_applied`` has the transaction already, lock and read the publisher's row
   at each command's key, classify the conflict from the row versions
   (:mod:`~airflow_repl.engine.subscriber.conflicts`), apply the commands (in a savepoint,
   rolled back when the policy rejects the transaction), and insert its ``queue_applied`` row
   with the outcome; commit.  The writes run under ``session_replication_role = replica``, like
   every replication write: the publisher's triggers (the row-version trigger among them) do
   not fire, so the publisher keeps the subscriber's new row versions;
2. record its conflicts in the distribution database (each once);
3. at the subscriber, in one transaction under ``session_replication_role = replica`` (no queue
   trigger fires): when the publisher won, compensate every key the transaction touched with
   the publisher's current row (unless a later queued transaction changes that row again: it
   is decided in its turn); when the publisher took it as it is, remember its keys with the
   publisher's transaction id in ``airflow_repl.queue_taken`` (the Distribution Agent keeps
   those rows until it passes that transaction); delete the transaction from the queue; commit.

One writer at a time at the subscriber: each queued transaction (steps 1 to 3) is one turn of
:mod:`~airflow_repl.engine.runtime.subscriber_writer`, taken in turns with the Distribution
Agent's batches there, so that its compensation and the Distribution Agent's delivery never
interleave, also while either runs continuously.  The Distribution Agent in turn keeps a row with
a queued change as it is (see :mod:`~airflow_repl.engine.subscriber.convergence`): this agent
decides it.

A continuous run (``continuous``, :mod:`~airflow_repl.engine.runtime.continuous`) drains the
queue, then looks again every ``poll_interval`` seconds, until ``max_run_seconds``, SIGTERM, or
the publication's article definitions change (``ended_by: "article definitions changed"``: the
next run checks them again); a subscription marked for reinitialization is left alone, and taken
up again once the Snapshot Agent has initialized it.

A run killed anywhere re-runs from the queue: a transaction the publisher has taken is found in
``queue_applied`` and only steps 2 and 3 are done again.  The Log Reader records the origin of
the applied transactions, and the Distribution Agent does not send them back to the subscriber
they came from, with one exception: a transaction that won a conflict under "sub wins" commits
without the origin, so that it reaches its subscriber after the publisher's older change to the
same row (still on its way there) and the subscriber ends with the winning row.  Under "sub
reinit" the first conflict stops the subscriber's queue: the subscription is marked
'reinitialize' and the next Snapshot Agent run initializes it again (and empties its queue);
until then this agent leaves that queue alone.

Owns the per-transaction steps; the queue's SQL is
:mod:`~airflow_repl.engine.state.subscriber_state`'s, the publisher's
:mod:`~airflow_repl.engine.state.publisher_state`'s, the conflict rules
:mod:`~airflow_repl.engine.subscriber.conflicts`', the row statements
:mod:`~airflow_repl.engine.subscriber.row_images`'.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import psycopg

from airflow_repl.engine.articles.resolved import ResolvedArticle, definition_hash
from airflow_repl.engine.errors import ReplError
from airflow_repl.engine.model import naming
from airflow_repl.engine.model.topology import Topology
from airflow_repl.engine.model.updating import ConflictPolicy
from airflow_repl.engine.postgres import json_values
from airflow_repl.engine.runtime import continuous as continuous_mode
from airflow_repl.engine.runtime import subscriber_writer
from airflow_repl.engine.runtime.lifecycle import AgentRun, ends_when_stopped
from airflow_repl.engine.state import (
    dist_conflicts,
    dist_publications,
    dist_schema,
    dist_subscription_articles,
    dist_subscriptions,
    publisher_state,
    subscriber_state,
)
from airflow_repl.engine.state.subscriber_state import QueuedCommand, QueuedTransaction
from airflow_repl.engine.subscriber import conflicts, in_doubt, row_images
from airflow_repl.engine.subscriber.conflicts import Action, ConflictKind, Met, PublisherRow, Resolution
from airflow_repl.engine.subscriber.row_images import Image, Table

AGENT = "queuereader"
VERSION = "msrepl_tran_version"
_BATCH = 100  # queued transactions read per look at the queue


@dataclass
class _Outcome:
    """What the publisher made of one queued transaction (stored in ``queue_applied``)."""

    resolution: Resolution
    conflicts: list[dict[str, Any]] = field(default_factory=list)
    compensate: list[tuple[str, Image]] = field(default_factory=list)  # (article, key)
    publisher_xid: int | None = None  # the publisher transaction that applied it

    def to_json(self) -> dict[str, Any]:
        return {
            "resolution": self.resolution.value,
            "conflicts": self.conflicts,
            "compensate": [[a, k] for a, k in self.compensate],
            "publisher_xid": self.publisher_xid,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> _Outcome:
        compensate = [(a, k) for a, k in data["compensate"]]
        return cls(Resolution(data["resolution"]), data["conflicts"], compensate, data.get("publisher_xid"))


class _Tables:
    """An article's table at the publisher and at the subscriber, written by image."""

    def __init__(self, art: ResolvedArticle) -> None:
        cols, key = art.column_names, art.primary_key
        self.publisher = Table(art.table.schema, art.table.name, cols, key, only=not art.include_children)
        self.subscriber = Table(art.dest_schema, art.dest_table, cols, key)


class _QueueReader:
    """One run of the Queue Reader for one subscription."""

    def __init__(self, run: AgentRun, topology: Topology, publication: str, subscriber: str) -> None:
        self.run, self.topology, self.publication, self.subscriber = run, topology, publication, subscriber
        self.policy: ConflictPolicy = topology.publication(publication).conflict_policy
        self.totals: dict[str, Any] = {"transactions": 0, "commands": 0, "conflicts": 0, "rejected": 0}
        run.step = "connecting"
        self.dist = run.connect(topology.distributor.require("distributor"), "distributor")
        self.sub = run.connect(topology.subscriber_conninfo(subscriber), f"subscriber {subscriber!r}")
        json_values.exact_numbers(self.sub)
        self.turns = subscriber_writer.Turns(self.sub, publication)
        self.must_end: Callable[[], bool] = lambda: False  # a continuous run's (continuous.Loop.must_end)
        self.applying = False  # the publisher session opened and the subscriber's taken rows table made

    def check(self) -> str | None:
        """The articles, and the subscription's status in the distribution database."""
        self.run.step = "the subscription check"
        dist_schema.ensure_schema(self.dist)
        articles, accepted = self._held()
        initialized_with = dist_subscriptions.subscription_articles_hash(self.dist, self.publication, self.subscriber)
        if initialized_with is not None and initialized_with not in accepted:
            raise ReplError(
                f"the articles of publication {self.publication!r} changed since subscriber {self.subscriber!r} "
                f"was initialized, so its queued changes may not fit the publisher's tables: run the Snapshot "
                f"Agent with reinitialize for it (its queue is given up)"
            )
        self.tables = {a.name: _Tables(a) for a in articles}
        self.articles_hash = definition_hash(articles)
        status = dist_subscriptions.subscription_status(self.dist, self.publication, self.subscriber)
        self.dist.commit()
        return status

    def status(self) -> str | None:
        """The subscription's status in the distribution database now."""
        status = dist_subscriptions.subscription_status(self.dist, self.publication, self.subscriber)
        self.dist.commit()
        return status

    def definitions_changed(self) -> str | None:
        """Between rounds of a continuous run: why it must end because the publication's article
        definitions (or those the subscriber was initialized with) are no longer the ones it
        applies with, or None.  The next run checks them as :meth:`check` does."""
        articles, accepted = self._held()
        initialized_with = dist_subscriptions.subscription_articles_hash(self.dist, self.publication, self.subscriber)
        self.dist.commit()
        if definition_hash(articles) == self.articles_hash and (
            initialized_with is None or initialized_with in accepted
        ):
            return None
        return "article definitions changed"

    def _held(self) -> tuple[list[ResolvedArticle], set[str]]:
        """The articles the subscription holds (an article added is not, until its copy of its
        own) and the definitions' hashes it may have been initialized with."""
        articles = dist_publications.load_articles(self.dist, self.publication)
        held = dist_subscription_articles.held_articles(self.dist, self.publication, self.subscriber)
        return dist_subscription_articles.holding(held, articles)

    def start_applying(self) -> None:
        """Before the first queued transaction: the subscriber's record of taken rows and the
        publisher session (once per run)."""
        if self.applying:
            return
        subscriber_state.ensure_taken(self.sub)
        self.sub.commit()
        self.open_publisher()
        self.applying = True

    def forget_taken(self) -> None:
        """Prune the publisher's record of taken transactions no longer queued."""
        if not self.applying:
            return
        oldest = subscriber_state.oldest_queued_xid(self.sub, self.publication)
        self.sub.commit()
        self.totals["forgotten"] = self.totals.get("forgotten", 0) + publisher_state.forget_applied(
            self.pub, self.publication, self.subscriber, oldest
        )

    def open_publisher(self) -> None:
        """The publisher session: the subscriber's replication origin, the replica role."""
        self.run.step = "the publisher session"
        self.pub = self.run.connect(self.topology.publisher.require("publisher"), "publisher")
        json_values.exact_numbers(self.pub)
        publisher_state.ensure_schema(self.pub)
        self.origin = naming.queue_origin(self.subscriber)
        publisher_state.use_origin(self.pub, self.origin)
        self.pub.execute("SET session_replication_role = replica")
        self.pub.commit()

    # ------------------------------------------------------------------ the loop
    def drain(self, max_transactions: int | None, go_on: Callable[[], bool] = lambda: True) -> None:
        """Take queued transactions in commit order until the queue is empty (or
        ``max_transactions``), a conflict under "sub reinit" stops it, or ``go_on`` (asked
        between transactions: a continuous run's) says the run ends."""
        self.start_applying()
        while max_transactions is None or self.totals["transactions"] < max_transactions:
            queued = subscriber_state.queued_transactions(self.sub, self.publication, _BATCH)
            self.sub.commit()
            if not queued:
                return
            for txn in queued:
                if not self._take_turn(txn) or not go_on():
                    return
                if max_transactions is not None and self.totals["transactions"] >= max_transactions:
                    return

    def _take_turn(self, txn: QueuedTransaction) -> bool:
        """One transaction in this agent's turn at the subscriber (waiting for a Distribution
        Agent's batch to commit); False when the queue must stop, or the run end meanwhile."""
        self.run.step = f"waiting for the subscriber (queued transaction {txn.xid})"
        if not self.turns.take(self.must_end):
            return False
        try:
            return self._take(txn)
        finally:
            self.turns.give_back()

    def _take(self, txn: QueuedTransaction) -> bool:
        """Steps 1-3 for one transaction; False when the subscriber's queue must stop."""
        self.run.step = f"queued transaction {txn.xid}"
        commands = subscriber_state.queued_commands(self.sub, self.publication, txn.xid)
        self.sub.commit()
        if not commands:  # no longer queued: a Snapshot Agent initialized the subscriber meanwhile
            subscriber_state.dequeue(self.sub, self.publication, txn.xid)  # (whatever is left of it)
            self.sub.commit()
            return True
        outcome = self._at_publisher(txn, commands)
        dist_conflicts.record_conflicts(
            self.dist, self.publication, self.subscriber, txn.xid, self.policy.value, outcome.conflicts
        )
        if outcome.resolution is Resolution.REINITIALIZE:
            dist_subscriptions.mark_reinitialize(self.dist, self.publication, self.subscriber)
        self.dist.commit()
        self._count(outcome, len(commands))
        if outcome.resolution is Resolution.REINITIALIZE:
            return False
        self._at_subscriber(txn, outcome, commands)
        return True

    def _count(self, outcome: _Outcome, commands: int) -> None:
        self.totals["transactions"] += 1
        self.totals["commands"] += commands
        self.totals["conflicts"] += len(outcome.conflicts)
        self.totals["rejected"] += 0 if outcome.resolution.applied else 1

    # ------------------------------------------------------------------ step 1: the publisher
    def _at_publisher(self, txn: QueuedTransaction, commands: list[QueuedCommand]) -> _Outcome:
        """Apply (or reject) the transaction and record it as taken, in one publisher transaction."""
        self.pub.rollback()  # idle: the block below is the transaction itself (never a savepoint of another)
        with self.pub.transaction():
            stored = publisher_state.applied(self.pub, self.publication, self.subscriber, txn.xid)
            if stored is not None:
                return _Outcome.from_json(stored)
            outcome = self._apply(commands)
            outcome.publisher_xid = publisher_state.current_xid(self.pub)
            publisher_state.record_applied(self.pub, self.publication, self.subscriber, txn.xid, outcome.to_json())
            if outcome.resolution.returns_to_origin:
                publisher_state.without_origin(self.pub)
            else:
                publisher_state.stamp_commit_time(self.pub)
        if outcome.resolution.returns_to_origin:
            publisher_state.use_origin(self.pub, self.origin)
        return outcome

    def _apply(self, commands: list[QueuedCommand]) -> _Outcome:
        """The commands in a savepoint, kept only when the policy keeps the transaction; a
        constraint the publisher enforces (a unique key: ``SET k = k + 1`` applied row by row)
        rejects the whole transaction."""
        met: list[Met] = []
        found: list[dict[str, Any]] = []
        resolution = Resolution.APPLIED
        cmd: QueuedCommand | None = None
        try:
            with self.pub.transaction():
                for cmd in commands:
                    kind, row = self._apply_one(cmd)
                    if kind is not None:
                        met.append(Met(kind, self._key_changed(cmd)))
                        found.append(self._conflict(cmd, kind, row))
                        if conflicts.stops_at_first(self.policy):
                            break
                # a DEFERRABLE key is checked at commit: check it now, inside the savepoint, so a
                # violation rejects this transaction instead of failing the whole run at COMMIT
                self.pub.execute("SET CONSTRAINTS ALL IMMEDIATE")
                resolution = conflicts.decide(self.policy, met)
                if not resolution.applied:
                    raise _Rejected  # rolls the savepoint back
        except _Rejected:
            pass
        except psycopg.errors.IntegrityError as exc:
            assert cmd is not None  # the error came from a command
            resolution, found = Resolution.REFUSED, [self._refused(cmd, exc)]
        for c in found:
            c["outcome"] = resolution.value if "outcome" not in c else f"{resolution.value}: {c['outcome']}"
        return _Outcome(resolution, found, self._to_compensate(commands, resolution))

    def _refused(self, cmd: QueuedCommand, exc: psycopg.Error) -> dict[str, Any]:
        """The record of a command the publisher refused, with the server's reason."""
        record = self._conflict(cmd, ConflictKind.CONSTRAINT, None)
        table = self._tables(cmd.article).publisher
        record["outcome"] = (
            f"{exc.diag.message_primary or exc} ({table.schema}.{table.name}, key {json.dumps(record['key'], default=str)})"
        )
        return record

    def _apply_one(self, cmd: QueuedCommand) -> tuple[ConflictKind | None, Image | None]:
        """Classify one command against the publisher's (locked) rows and apply it: as it is
        without a conflict, by "subscriber wins" with one (rolled back if the policy rejects).
        Returns the conflict and the publisher's row it met."""
        table = self._tables(cmd.article).publisher
        old_key = table.key_of(cmd.old) if cmd.old is not None else None
        new_key = table.key_of(cmd.new) if cmd.new is not None else None
        at_old = row_images.fetch(self.pub, table, old_key, lock=True) if old_key is not None else None
        at_new = None
        if new_key is not None and new_key != old_key:
            at_new = row_images.fetch(self.pub, table, new_key, lock=True)
        found = PublisherRow(at_old is not None, at_old.get(VERSION) if at_old is not None else None)
        kind = conflicts.classify(cmd.op, cmd.old_version, found, at_new is not None)
        self._write(table, conflicts.action(cmd.op, kind), cmd, old_key, new_key)
        return kind, at_new if kind is ConflictKind.INSERT_INSERT else at_old

    def _write(
        self, table: Table, what: Action, cmd: QueuedCommand, old_key: Image | None, new_key: Image | None
    ) -> None:
        if what is Action.INSERT:
            row_images.insert(self.pub, table, table.project(cmd.new or {}))
        elif what is Action.UPDATE and old_key is not None:
            row_images.update(self.pub, table, old_key, table.project(cmd.new or {}))
        elif what is Action.OVERWRITE and new_key is not None:
            row_images.update(self.pub, table, new_key, table.project(cmd.new or {}))
        elif what is Action.DELETE and old_key is not None:
            row_images.delete(self.pub, table, old_key)

    def _key_changed(self, cmd: QueuedCommand) -> bool:
        table = self._tables(cmd.article).publisher
        return cmd.old is not None and cmd.new is not None and table.key_of(cmd.old) != table.key_of(cmd.new)

    def _conflict(self, cmd: QueuedCommand, kind: ConflictKind, publisher_row: Image | None) -> dict[str, Any]:
        """The conflict's record: the publisher's row it met and the subscriber's change."""
        table = self._tables(cmd.article).publisher
        image = cmd.new if conflicts.names_new_row(kind, cmd.op) else cmd.old
        return {
            "queue_id": cmd.id,
            "article": cmd.article,
            "key": table.key_of(image or {}),
            "kind": kind.value,
            "publisher_row": publisher_row,
            "subscriber_row": table.project(cmd.new) if cmd.new is not None else None,
            "detected_at": datetime.now(timezone.utc).isoformat(),
        }

    def _to_compensate(self, commands: list[QueuedCommand], resolution: Resolution) -> list[tuple[str, Image]]:
        """The keys to bring back to the publisher's rows: every key a rejected transaction touched."""
        return self._keys(commands) if resolution.compensates else []

    def _keys(self, commands: list[QueuedCommand]) -> list[tuple[str, Image]]:
        """Every (article, key) the transaction's commands touched, old and new images."""
        keys: list[tuple[str, Image]] = []
        for cmd in commands:
            table = self._tables(cmd.article).publisher
            for image in (cmd.old, cmd.new):
                if image is not None and (cmd.article, table.key_of(image)) not in keys:
                    keys.append((cmd.article, table.key_of(image)))
        return keys

    # ------------------------------------------------------------------ step 3: the subscriber
    def _at_subscriber(self, txn: QueuedTransaction, outcome: _Outcome, commands: list[QueuedCommand]) -> None:
        """Compensate the outcome's keys with the publisher's current rows (or, when the
        publisher took the transaction as it is, remember its rows as taken) and dequeue the
        transaction, in one subscriber transaction (no queue trigger fires)."""
        with self.sub.transaction():
            self.sub.execute("SET LOCAL session_replication_role = replica")
            for article, key in outcome.compensate:
                if not subscriber_state.queued_later(self.sub, self.publication, txn.xid, article, key):
                    self._compensate(article, key)
            if outcome.resolution is Resolution.APPLIED and outcome.publisher_xid is not None:
                for cmd in commands:
                    key_names = self._tables(cmd.article).publisher.key
                    subscriber_state.record_taken(self.sub, self.publication, cmd.id, key_names, outcome.publisher_xid)
            subscriber_state.dequeue(self.sub, self.publication, txn.xid)
        self.pub.rollback()

    def _compensate(self, article: str, key: Image) -> None:
        """The subscriber's row at ``key`` becomes the publisher's (or goes, when the publisher has none)."""
        tables = self._tables(article)
        row = row_images.fetch(self.pub, tables.publisher, key)
        row_images.delete(self.sub, tables.subscriber, key)
        if row is not None:
            row_images.insert(self.sub, tables.subscriber, row)
        self.totals["compensated"] = self.totals.get("compensated", 0) + 1

    def _tables(self, article: str) -> _Tables:
        try:
            return self.tables[article]
        except KeyError:
            raise ReplError(
                f"the queue of subscriber {self.subscriber!r} holds a change of {article!r}, which is not an article "
                f"of publication {self.publication!r} (any more): run the Snapshot Agent with reinitialize for it"
            ) from None


class _Rejected(Exception):
    """Rolls back the savepoint of a transaction the policy rejects."""


# ---------------------------------------------------------------------- the run
@ends_when_stopped
def run_queue_reader(
    topology: Topology,
    publication: str,
    subscriber: str,
    *,
    max_transactions: int | None = None,
    continuous: bool = False,
    poll_interval: float | None = None,
    max_run_seconds: float | None = None,
) -> dict[str, Any]:
    """Apply the subscriber's queued transactions at the publisher (all of them, or the first
    ``max_transactions``).  Returns a summary (transactions, commands, conflicts, rejected,
    compensated, queued: what is left).  ``continuous``: keep applying what the subscriber
    queues later, looking every ``poll_interval`` seconds when the queue is empty, until
    ``max_run_seconds`` or SIGTERM (:mod:`~airflow_repl.engine.runtime.continuous`); not with
    ``max_transactions``."""
    opts = continuous_mode.options(continuous, poll_interval, max_run_seconds)
    if opts is not None and max_transactions is not None:
        raise ReplError(
            "max_transactions and continuous cannot be combined: a continuous Queue Reader drains the queue "
            "as the subscriber fills it; use max_transactions for single runs only"
        )
    topology.subscription(publication, subscriber)  # an unknown subscription -> error
    in_doubt.resolve_quietly(topology, publication, [subscriber])  # before this run takes the origin
    with AgentRun(AGENT, publication, subscriber) as run:
        reader = _QueueReader(run, topology, publication, subscriber)
        run.lock(reader.sub)
        status = reader.check()
        run.begin(reader.dist)
        run.counts = totals = reader.totals
        if opts is not None:
            return _run_continuously(run, reader, status, opts)
        if status == "reinitialize":
            message = (
                f"subscription of {subscriber!r} to {publication!r} is marked for reinitialization (a conflict under "
                f"'sub reinit'): its queue is left alone; run the Snapshot Agent to initialize it again"
            )
            return run.succeed({**totals, "queued": _depth(reader), "message": message}, message=message)
        if not _depth(reader):
            message = "the queue is empty; nothing to apply"
            return run.succeed({**totals, "queued": 0, "message": message}, message=message)
        run.step = "applying the queue"
        reader.drain(max_transactions)
        return run.succeed(_finish(reader))


def _run_continuously(
    run: AgentRun, reader: _QueueReader, status: str | None, opts: continuous_mode.Continuous
) -> dict[str, Any]:
    """Drain the queue, look again every poll interval, until the loop ends the run; a
    subscription marked for reinitialization is left alone meanwhile."""
    with continuous_mode.Loop(opts, run, reader.totals) as loop:
        loop.check = reader.definitions_changed
        reader.must_end = loop.must_end
        while True:
            worked = False
            if status != "reinitialize" and _depth(reader):
                run.step = "applying the queue"
                before = reader.totals["transactions"]
                reader.drain(None, loop.go_on)
                reader.forget_taken()
                worked = reader.totals["transactions"] > before
            if loop.ended_by is not None or not loop.idle(worked):
                break
            status = reader.status()
        return run.succeed(loop.summary(_finish(reader)))


def _finish(reader: _QueueReader) -> dict[str, Any]:
    """The run's totals, with what is left queued and whether the subscription is now marked
    for reinitialization."""
    reader.forget_taken()
    totals = reader.totals
    totals["queued"] = _depth(reader)
    totals["reinitialize"] = reader.status() == "reinitialize"
    return totals


def _depth(reader: _QueueReader) -> int:
    depth = subscriber_state.queue_depth(reader.sub, reader.publication)
    reader.sub.commit()
    return depth
