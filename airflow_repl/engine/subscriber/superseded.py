"""The publisher's commands a subscriber's own changes supersede (updatable subscriptions).

A change the subscriber made itself and the publisher took as it was leaves the subscriber's row
at each key it touched equal to the publisher's row when that publisher transaction committed:
an immediate subscriber's transaction commits at both sides (two-phase commit) after the row
version check (an insert: the publisher had no row at the key), and a queued transaction the
Queue Reader applied without a conflict wrote the subscriber's images there.  Every publisher
command of those keys *older* than that transaction (commit order) is therefore in the
subscriber's row already and must not be applied there again; every *newer* one must be.
Applying an older one would fail (an insert meeting the subscriber's row: a duplicate key for
good), or undo the subscriber's change without a word (a delete after that insert was skipped).

The subscriber records each such key with the publisher transaction's id in
``airflow_repl.queue_taken``: the immediate trigger in the subscriber's own transaction
(:mod:`~airflow_repl.engine.codegen.immediate_triggers`, ``via`` 'immediate'), the Queue Reader
when it dequeues (``via`` 'queue').  :class:`Taken` finds where those transactions are in the
log: the Log Reader records them with the subscriber's origin; one it has not stored yet (not
read yet, or still prepared at the publisher) commits after everything stored, so after every
command delivered now.  A record is forgotten in the subscriber transaction that moves the
watermark past its publisher transaction: no older command of its keys is left to deliver.  The
Distribution Agent never delivers those transactions to their own subscriber and cuts its batches
before them, so a batch's commands are all older than a remembered transaction or all newer.

Two users: the per-command convergence at a queued subscriber
(:mod:`~airflow_repl.engine.subscriber.convergence`) asks :meth:`Taken.later` for each command;
delivery to an immediate subscriber (:class:`Superseding`) reads the remembered keys once per
batch, in the text form the commands carry, and leaves the commands they supersede out of the
batch before it is applied, on every path (pipelined, several streams, net change, replay).  A
key the subscriber's application takes *while* a batch is applied (after the keys were read) can
only meet an older command that inserts there (the publisher had no row at the key), which then
fails with a duplicate key: the Distribution Agent replays such a batch with the keys read again
(:meth:`Superseding.covers`), before ``skip_errors`` could skip it.

Every command left out is recorded (:meth:`Superseding.records`, kind
:attr:`~airflow_repl.engine.subscriber.conflicts.DeliveryConflict.IMMEDIATE_ROW`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import psycopg

from airflow_repl.engine.articles.commands import DELETE, INSERT, TRUNCATE, UPDATE, Command, Values
from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.model.updating import ConflictPolicy
from airflow_repl.engine.postgres import lsn
from airflow_repl.engine.state import dist_transactions, subscriber_state
from airflow_repl.engine.subscriber import conflicts, row_images
from airflow_repl.engine.subscriber.applier import Located

#: ``queue_taken.via`` of the keys an immediate subscriber's transactions took.
IMMEDIATE = "immediate"

#: A key's values in the text form commands carry.
TextKey = tuple[str | None, ...]


class Taken:
    """Where the publisher transactions that took the subscriber's own changes are in the log:
    transaction id -> position, None when the Log Reader has not stored it yet."""

    def __init__(self, positions: dict[int, int | None] | None = None) -> None:
        self.positions = positions or {}

    @classmethod
    def load(
        cls,
        sub: psycopg.Connection[Any],
        dist: psycopg.Connection[Any],
        publication: str,
        origin: str,
        watermark: str,
    ) -> Taken:
        """The remembered transactions' positions; those the ``watermark`` has passed are
        forgotten (in the subscriber's transaction, which commits with the watermark)."""
        xids = subscriber_state.taken_xids(sub, publication)
        stored = dist_transactions.origin_positions(dist, publication, origin, xids) if xids else {}
        positions = {x: (lsn.lsn_to_int(stored[x]) if x in stored else None) for x in xids}
        mark = lsn.lsn_to_int(watermark)
        passed = [x for x, at in positions.items() if at is not None and at <= mark]
        if passed:
            subscriber_state.forget_taken(sub, publication, passed)
        return cls({x: at for x, at in positions.items() if x not in passed})

    def later(self, xid: int, at: int) -> bool:
        """Is transaction ``xid`` later than a command at position ``at``?  One not stored yet
        (or remembered since this was loaded) is: the Log Reader stores in commit order."""
        position = self.positions.get(xid)
        return position is None or position > at


@dataclass(frozen=True)
class Left:
    """A command left out of a batch: the subscriber's own later change of its row holds it."""

    xact: str
    command_id: int
    command: Command
    key: dict[str, Any]  # the row's key, as the subscriber recorded it (JSON)


class Superseding:
    """The keys an immediate subscriber's own changes took, read once per batch, and the
    batch's commands they supersede."""

    def __init__(self, conn: psycopg.Connection[Any], publication: str, origin: str, policy: ConflictPolicy) -> None:
        self.conn, self.publication, self.origin, self.policy = conn, publication, origin, policy
        self.taken = Taken()
        self.articles: dict[str, ResolvedArticle] = {}
        #: article -> key (text form) -> (the latest position remembered there, None: not stored
        #: yet; the key as JSON)
        self.keys: dict[str, dict[TextKey, tuple[int | None, dict[str, Any]]]] = {}
        #: the commands left out since the last :meth:`records`
        self.left: list[Left] = []

    def load(self, dist: psycopg.Connection[Any], articles: dict[str, ResolvedArticle], watermark: str) -> bool:
        """Read the remembered keys (forgetting those the ``watermark`` passed), in the batch's
        subscriber transaction; whether any is left."""
        self.taken = Taken.load(self.conn, dist, self.publication, self.origin, watermark)
        self.articles, self.keys = articles, {}
        if not self.taken.positions:
            return False
        for name in subscriber_state.taken_articles(self.conn, self.publication):
            art = articles.get(name)
            if art is None:
                continue
            keys = self.keys.setdefault(name, {})
            table = (art.dest_schema, art.dest_table)
            for xid, _via, key, text in subscriber_state.taken_rows(
                self.conn, self.publication, name, table, art.primary_key
            ):
                at = self.taken.positions.get(xid)
                known = keys.get(tuple(text))
                if known is None or (known[0] is not None and (at is None or at > known[0])):
                    keys[tuple(text)] = (at, key)
        return bool(self.keys)

    def _covered(self, article: str, key: TextKey | None, at: int) -> dict[str, Any] | None:
        """The remembered key (JSON) when ``key`` of ``article`` was taken later than ``at``."""
        if key is None:
            return None
        found = self.keys.get(article, {}).get(key)
        if found is None or (found[0] is not None and found[0] <= at):
            return None
        return found[1]

    def filter(self, located: Iterable[Located], articles: dict[str, ResolvedArticle]) -> Iterator[Located]:
        """The commands without those superseded (remembered in :attr:`left`).  A key update
        superseded at one of its keys only keeps its other side: the row leaves the old key
        (a delete) or arrives at the new one (an insert).  A TRUNCATE of an article with
        remembered keys deletes every row but those (not recorded one by one)."""
        at_of: tuple[str, int] = ("", 0)
        for xact, cid, cmd in located:
            art = articles.get(cmd.article)
            if art is not None and cmd.op == TRUNCATE and self.keys.get(cmd.article):
                # every remembered key is later than the batch: the rows there stay
                yield xact, cid, Command(TRUNCATE, cmd.article, keep_own=True)
                continue
            if art is None or cmd.article not in self.keys or cmd.op not in (INSERT, UPDATE, DELETE):
                yield xact, cid, cmd
                continue
            if at_of[0] != xact:
                at_of = (xact, lsn.lsn_to_int(xact))
            old = _key(art, cmd.old)
            new = _key(art, cmd.new)
            at_old = self._covered(cmd.article, old, at_of[1])
            at_new = self._covered(cmd.article, new, at_of[1]) if new != old else at_old
            if at_old is None and at_new is None:
                yield xact, cid, cmd
                continue
            self.left.append(Left(xact, cid, cmd, at_old if at_old is not None else at_new or {}))
            if cmd.op == UPDATE and new != old and (at_old is None or at_new is None):
                if at_old is None:
                    yield xact, cid, Command(DELETE, cmd.article, old=cmd.old)
                else:
                    yield xact, cid, Command(INSERT, cmd.article, new=cmd.new)

    def covers(self, art: ResolvedArticle | None, command: dict[str, Any] | None, xact: str) -> bool:
        """Does a remembered key supersede a stored command of ``art`` (its JSON: ``o``, ``n``
        images) of transaction ``xact``?"""
        if art is None or command is None or art.name not in self.keys:
            return False
        at = lsn.lsn_to_int(xact)
        return any(self._covered(art.name, _key(art, command.get(i)), at) is not None for i in "on")

    def records(self, through: str | None) -> list[dict[str, Any]]:
        """The conflict records of the commands left out up to transaction ``through`` (those
        the subscriber committed; None: none), with the subscriber's rows now; forgets them all."""
        left, self.left = self.left, []
        if through is None:
            return []
        last = lsn.lsn_to_int(through)
        out = []
        for item in left:
            if lsn.lsn_to_int(item.xact) > last:
                continue
            art = self.articles[item.command.article]
            table = row_images.Table(art.dest_schema, art.dest_table, art.column_names, art.primary_key)
            new = item.command.new
            out.append(
                {
                    "article": item.command.article,
                    "key": item.key,
                    "kind": conflicts.DeliveryConflict.IMMEDIATE_ROW.value,
                    "publisher_row": row_images.typed(self.conn, art, new) if new is not None else None,
                    "subscriber_row": row_images.fetch(self.conn, table, item.key),
                    "policy": self.policy.value,
                    "outcome": conflicts.converge(conflicts.DeliveryConflict.IMMEDIATE_ROW).value,
                    "detected_at": datetime.now(timezone.utc),
                    "xact_seqno": item.xact,
                    "command_id": item.command_id,
                }
            )
        return out


def _key(art: ResolvedArticle, image: Values | None) -> TextKey | None:
    return tuple(image[i] for i in art.pk_positions) if image is not None else None
