"""Delivery to a queued updating subscriber: the publisher's commands meet rows the subscriber
changed itself, and must converge instead of failing or skipping whole transactions.

The Distribution Agent applies a queued subscriber's batches here, one command at a time, each
in a savepoint (:func:`replay_queued`).  For every command it asks the subscriber's queue
whether the command's row (its old or new key) has a change not yet taken by the Queue Reader,
*after* the command ran, so that the command's row lock orders it against the application's
transactions (a change committed before the lock is in the queue; one made after waits for the
command and is based on its row):

* the row has a queued change: the command is rolled back and the subscriber's row kept.  The
  Queue Reader decides that row at the publisher by the publication's policy: under publisher
  wins it compensates the subscriber with the publisher's current row (which includes this
  command); under subscriber wins the queued change overwrites the publisher and is sent back;
* the row's own change was taken by the Queue Reader *after* the command at the publisher (its
  publisher transaction, remembered at the subscriber in ``airflow_repl.queue_taken`` when it
  was dequeued, is later in the log or not read by the Log Reader yet; the Distribution Agent
  passes over it): the subscriber's row is kept too.  It met no conflict there, so the
  publisher's commands of the row before it net to nothing (an insert and a delete of the key
  the subscriber inserted, say), and applying them would lose the subscriber's row;
* a TRUNCATE deletes every row but those two kinds
  (:func:`~airflow_repl.engine.subscriber.statements.truncate_keeping_own`);
* otherwise a command that meets a missing row or a duplicate key converges: an update of a
  missing row, or an insert or update meeting an existing key, writes the publisher's row (an
  upsert of the after image, the old key's row deleted when the key changed); a delete of a
  missing row does nothing.  Each later publisher command of the row does the same, so the row
  ends as the publisher's.

Every such command is recorded as a conflict (:mod:`~airflow_repl.engine.subscriber.conflicts`'
:class:`~airflow_repl.engine.subscriber.conflicts.DeliveryConflict`); any other failure is
handled as at every subscriber (``skip_errors``, or delivery stops naming the command).

Owns :class:`QueueGuard` (the queue question and the converging writes, per article) and
:func:`replay_queued`; nothing here commits.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

import psycopg
from psycopg import sql

from airflow_repl.engine.articles.commands import INSERT, TRUNCATE, Command, Values
from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.model.updating import ConflictPolicy
from airflow_repl.engine.postgres import lsn
from airflow_repl.engine.subscriber import conflicts, row_images, statements
from airflow_repl.engine.subscriber.applier import Applier, Located, ReplayOutcome, replay
from airflow_repl.engine.subscriber.conflicts import Convergence, DeliveryConflict
from airflow_repl.engine.subscriber.superseded import IMMEDIATE, Taken


def _typed(art: ResolvedArticle, positions: list[int]) -> list[sql.Composable]:
    # the type text is the publisher's format_type(), which quotes what needs quoting
    return [sql.SQL("%s::" + art.columns[i].param_type) for i in positions]


def _key_match(art: ResolvedArticle) -> sql.Composable:
    pk = art.pk_positions
    return sql.SQL(" AND ").join(
        sql.SQL("t.{} = {}").format(sql.Identifier(art.column_names[i]), ph)
        for i, ph in zip(pk, _typed(art, pk), strict=True)
    )


class QueueGuard:
    """The queue question and the converging writes at one queued subscriber."""

    def __init__(self, conn: psycopg.Connection[Any], publication: str, policy: ConflictPolicy) -> None:
        self.conn, self.publication, self.policy = conn, publication, policy
        self._sql: dict[tuple[str, str], sql.Composed] = {}
        #: where the transactions that took the subscriber's own changes are in the log
        #: (``airflow_repl.queue_taken``, :mod:`~airflow_repl.engine.subscriber.superseded`)
        self._taken = Taken()

    def taken(self, taken: Taken) -> None:
        """The positions of the transactions that took the subscriber's rows (for the batch to come)."""
        self._taken = taken

    def kept(self, art: ResolvedArticle, key: Values, xact: str) -> DeliveryConflict | None:
        """Why the subscriber's row at ``key`` is its own, for a command at ``xact``: a change of
        it the publisher took after ``xact`` (applied by the Queue Reader, which met no conflict
        there, or an immediate change while the subscription updated immediately: the
        publisher's changes of the row before it are in it), or one still in the queue."""
        row = self.conn.execute(
            self._statement(art, "queued"), [self.publication, art.name, self.publication, art.name, *key]
        ).fetchone()
        assert row is not None
        queued, taken = bool(row[0]), row[1] or []
        at = lsn.lsn_to_int(xact)
        later = [via for xid, via in taken if self._taken.later(int(xid), at)]
        if later:
            return DeliveryConflict.IMMEDIATE_ROW if IMMEDIATE in later else DeliveryConflict.TAKEN_ROW
        return DeliveryConflict.QUEUED_ROW if queued else None

    def _statement(self, art: ResolvedArticle, what: str) -> sql.Composed:
        if (art.name, what) not in self._sql:
            self._sql[(art.name, what)] = _STATEMENTS[what](art)
        return self._sql[(art.name, what)]

    def row(self, art: ResolvedArticle, key: Values) -> dict[str, Any] | None:
        """The subscriber's row at ``key`` (as JSON), None when there is none."""
        row = self.conn.execute(self._statement(art, "row"), key).fetchone()
        return dict(row[0]) if row is not None else None

    def upsert(self, art: ResolvedArticle, image: Values) -> None:
        self.conn.execute(self._statement(art, "upsert"), image)

    def delete(self, art: ResolvedArticle, key: Values) -> None:
        self.conn.execute(self._statement(art, "delete"), key)


def _queued_sql(art: ResolvedArticle) -> sql.Composed:
    """Whether the queue holds a change of the row at a key, and the publisher transactions that
    took one (``[xid, via]``).  Parameters: publication, article (twice), the key's values."""
    pk = art.pk_positions
    pairs = sql.SQL(", ").join(
        sql.SQL("{}, {}").format(sql.Literal(art.column_names[i]), ph)
        for i, ph in zip(pk, _typed(art, pk), strict=True)
    )
    return sql.SQL(
        "SELECT EXISTS (SELECT 1 FROM airflow_repl.queue q WHERE q.publication = %s AND q.article = %s "
        "AND (q.old @> k OR q.new @> k)), (SELECT jsonb_agg(jsonb_build_array(t.publisher_xid, t.via)) "
        "FROM airflow_repl.queue_taken t WHERE t.publication = %s AND t.article = %s AND t.key = k) "
        "FROM (SELECT jsonb_build_object({}) AS k) AS key"
    ).format(pairs)


def _row_sql(art: ResolvedArticle) -> sql.Composed:
    return sql.SQL("SELECT to_jsonb(t) FROM {} AS t WHERE {}").format(
        sql.Identifier(art.dest_schema, art.dest_table), _key_match(art)
    )


def _upsert_sql(art: ResolvedArticle) -> sql.Composed:
    names = art.column_names
    others = [c for c in names if c not in art.primary_key]
    action = (
        sql.SQL("UPDATE SET {}").format(
            sql.SQL(", ").join(sql.SQL("{c} = excluded.{c}").format(c=sql.Identifier(c)) for c in others)
        )
        if others
        else sql.SQL("NOTHING")
    )
    return sql.SQL("INSERT INTO {t} ({cols}) VALUES ({vals}) ON CONFLICT ({pk}) DO {action}").format(
        t=sql.Identifier(art.dest_schema, art.dest_table),
        cols=sql.SQL(", ").join(map(sql.Identifier, names)),
        vals=sql.SQL(", ").join(_typed(art, list(range(len(names))))),
        pk=sql.SQL(", ").join(map(sql.Identifier, art.primary_key)),
        action=action,
    )


def _delete_sql(art: ResolvedArticle) -> sql.Composed:
    return sql.SQL("DELETE FROM {} AS t WHERE {}").format(
        sql.Identifier(art.dest_schema, art.dest_table), _key_match(art)
    )


_STATEMENTS = {"queued": _queued_sql, "row": _row_sql, "upsert": _upsert_sql, "delete": _delete_sql}


# ---------------------------------------------------------------------- one command
def _keys(art: ResolvedArticle, cmd: Command) -> list[Values]:
    """The distinct keys a command touches: its old image's and its new image's."""
    keys: list[Values] = []
    for image in ("old", "new"):
        if getattr(cmd, image) is not None:
            key = cmd.key(art, image)
            if key not in keys:
                keys.append(key)
    return keys


def _apply(cur: psycopg.RawCursor[Any], applier: Applier, cmd: Command) -> DeliveryConflict | None:
    """Run the command in its savepoint; the delivery conflict it failed with (rolled back),
    None when it applied.  Any other failure is raised."""
    cur.execute("SAVEPOINT airflow_repl_cmd")
    try:
        applier.execute(cur, cmd)
        return None
    except psycopg.Error as exc:
        kind = conflicts.delivery_conflict(cmd.op, exc.sqlstate)
        if kind is None:
            raise
        cur.execute("ROLLBACK TO SAVEPOINT airflow_repl_cmd")
        return kind


def deliver(
    cur: psycopg.RawCursor[Any], applier: Applier, guard: QueueGuard, xact: str, cmd: Command
) -> tuple[bool, dict[str, Any] | None]:
    """Apply one command at the queued subscriber, converging as the module says: (whether the
    command counts as applied, the conflict's record or None)."""
    art = applier.articles.get(cmd.article)
    if art is not None and cmd.op == TRUNCATE:  # the rows with a queued or a later taken change stay
        statements.truncate_keeping_own(art, queued=True).execute(cur, cmd)
        return True, None
    if art is None or applier.stmt(cmd) is None:
        return applier.execute(cur, cmd), None
    kind = _apply(cur, applier, cmd)
    own = [(key, why) for key in _keys(art, cmd) if (why := guard.kept(art, key, xact)) is not None]
    pending = [key for key, _ in own]
    if own:
        if kind is None:
            cur.execute("ROLLBACK TO SAVEPOINT airflow_repl_cmd")
        kind = own[0][1]
    if kind is None:
        cur.execute("RELEASE SAVEPOINT airflow_repl_cmd")
        return True, None
    record = _record(art, cmd, kind, guard)
    if kind is not DeliveryConflict.DELETE_MISSING:
        _publishers_rows(art, cmd, pending, guard)
    cur.execute("RELEASE SAVEPOINT airflow_repl_cmd")
    return conflicts.converge(kind) is Convergence.PUBLISHERS_ROW, record


def _publishers_rows(art: ResolvedArticle, cmd: Command, pending: list[Values], guard: QueueGuard) -> None:
    """The command's rows become the publisher's, except at the keys in ``pending`` (kept): the
    old key's row goes when the key changed (an update) or the row was deleted; the new key's
    row becomes the after image."""
    old = cmd.key(art, "old") if cmd.old is not None else None
    new = cmd.key(art, "new") if cmd.new is not None else None
    if old is not None and old != new and old not in pending:
        guard.delete(art, old)
    if new is not None and cmd.new is not None and new not in pending:
        guard.upsert(art, cmd.new)


def _record(art: ResolvedArticle, cmd: Command, kind: DeliveryConflict, guard: QueueGuard) -> dict[str, Any]:
    """The conflict's record: the publisher's row (the command's after image) and the
    subscriber's, the values typed as the subscriber's own images are (an integer a number)."""
    key = cmd.key(art, "new" if cmd.op == INSERT else "old")
    publisher_row = row_images.typed(guard.conn, art, cmd.new) if cmd.new is not None else None
    image = publisher_row if cmd.op == INSERT else row_images.typed(guard.conn, art, cmd.old or [])
    assert image is not None
    return {
        "article": cmd.article,
        "key": {c: image[c] for c in art.primary_key},
        "kind": kind.value,
        "publisher_row": publisher_row,
        "subscriber_row": guard.row(art, key),
        "policy": guard.policy.value,
        "outcome": conflicts.converge(kind).value,
        "detected_at": datetime.now(timezone.utc),
    }


# ---------------------------------------------------------------------- a batch
def replay_queued(
    conn: psycopg.Connection[Any],
    applier: Applier,
    commands: Iterable[Located],
    skip: set[str],
    guard: QueueGuard,
) -> ReplayOutcome:
    """:func:`~airflow_repl.engine.subscriber.applier.replay` (a savepoint per transaction; a
    failure ``skip`` names skips its transaction, any other stops) with each command delivered by
    :func:`deliver`; the conflicts are in the outcome, with their transaction and command."""
    return replay(conn, applier, commands, skip, lambda cur, xact, cmd: deliver(cur, applier, guard, xact, cmd))
