"""The apply backend at a subscriber: turning a batch's stored commands into statements and
running them there.

Owns :class:`Applier` (the statement of each article and operation, the merging of a stored
DELETE + INSERT pair back into one UPDATE, the key values a command touches, which the stream
planner needs) and the three ways of applying a batch:

* :func:`apply_pipelined`: one connection, pipelined, no round trip per command;
* :func:`apply_parallel`: a planned batch, each share on its own connection (stream) at once;
  a failing stream stops the others;
* :func:`replay`: one connection, one command at a time, a savepoint per transaction, so that
  a failing command is named and a skippable error skips its transaction only (what an error
  means is :mod:`~airflow_repl.engine.subscriber.conflicts`' business).

None of them commits: the caller commits the changes together with the subscriber's watermark.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from airflow_repl.engine.articles.commands import DELETE, INSERT, SCHEMA, TRUNCATE, UPDATE, Command
from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.errors import DeliveryError
from airflow_repl.engine.postgres import lsn, raw_sql
from airflow_repl.engine.state.dist_encoding import load_command
from airflow_repl.engine.state.dist_transactions import CommandRow
from airflow_repl.engine.subscriber import conflicts, schema_changes, statements

#: A pipeline is synchronised every so many commands, so that the server's replies (and a
#: failure) do not wait for the end of a long batch.
_SYNC_EVERY = 500

#: A unique key of a destination table: (schema, table, column names).
Constraint = tuple[str, str, tuple[str, ...]]
#: One key value a command touches: the constraint and the values of its columns.
KeyValue = tuple[Constraint, tuple[str, ...]]
#: A command to apply, with where it comes from: (xact_seqno, command_id, command).
Located = tuple[str, int, Command]


def key_constraints(art: ResolvedArticle) -> list[tuple[Constraint, list[int]]]:
    """(constraint, column positions) of the article's primary key and unique constraints; a
    constraint is named by its destination table and columns."""
    names = art.column_names
    return [
        ((art.dest_schema, art.dest_table, tuple(names[i] for i in positions)), positions)
        for positions in [art.pk_positions, *art.unique_positions]
    ]


class TouchedKeys:
    """The key values a command touches at a subscriber, whatever its engine, for the stream
    planner: its destination table's primary key and each unique constraint (without NULLs,
    which never conflict), in its before and after images; each article's constraints kept."""

    def __init__(self, articles: dict[str, ResolvedArticle]) -> None:
        self.articles = articles
        self._constraints: dict[str, list[tuple[Constraint, list[int]]]] = {}

    def forget(self, article: str) -> None:
        """The article's definition changed."""
        self._constraints.pop(article, None)

    def of(self, cmd: Command, applied: Callable[[], bool]) -> list[KeyValue] | None:
        """``cmd``'s key values; none when it is not ``applied()``; None (every row) for a
        TRUNCATE or a schema change."""
        if cmd.op == SCHEMA:
            return None
        if not applied():
            return []
        if cmd.op == TRUNCATE:
            return None
        constraints = self._constraints.get(cmd.article)
        if constraints is None:
            constraints = self._constraints[cmd.article] = key_constraints(self.articles[cmd.article])
        keys: list[KeyValue] = []
        for image in (cmd.old, cmd.new):
            if image is not None:
                for constraint, positions in constraints:
                    values = [image[i] for i in positions]
                    present = [v for v in values if v is not None]
                    if len(present) == len(values):  # a NULL in a unique key conflicts with nothing
                        keys.append((constraint, tuple(present)))
        return keys


class Applier:
    """Applies the commands of a publication's articles at one subscriber."""

    def __init__(
        self, articles: dict[str, ResolvedArticle], schema: schema_changes.SchemaContext | None = None
    ) -> None:
        self.articles = articles
        self.schema = schema  # what applying a schema change needs (None: none expected)
        self._stmts: dict[tuple[str, str, bool], statements.Statement | None] = {}
        self._keys = TouchedKeys(articles)
        self.schema_changes = 0  # schema changes applied
        #: article -> its commands at or before this position (int LSN) are left out, being in a
        #: copy of the article taken on its own (None: all of them); set batch by batch
        self.skip: dict[str, int | None] = {}

    def change_schema(self, conn: psycopg.Connection, cmd: Command) -> None:
        """Apply a schema-change command; the commands after it use the article's new definition."""
        after = schema_changes.apply(conn, cmd, self.schema or schema_changes.SchemaContext("?"))
        self.articles[after.name] = after
        self._stmts = {k: v for k, v in self._stmts.items() if k[0] != after.name}
        self._keys.forget(after.name)
        self.schema_changes += 1

    def stmt(self, cmd: Command) -> statements.Statement | None:
        """The statement applying ``cmd``; None when its article or operation is not applied."""
        key = (cmd.article, cmd.op, cmd.keep_own)
        if key not in self._stmts:
            art = self.articles.get(cmd.article)
            self._stmts[key] = statements.statement(art, cmd.op, keep_own=cmd.keep_own) if art is not None else None
        return self._stmts[key]

    def commands(self, rows: Iterable[CommandRow], article_rows: Mapping[str, Mapping[str, int]]) -> Iterator[Located]:
        """(xact, command_id, Command) in order, without those :attr:`skip` leaves out; each
        row's JSON is decoded here, as its command is made.  For articles whose single-row key
        updates stay UPDATEs, a transaction's only row change of the article (``article_rows``:
        per transaction, the rows it changed per article), stored as a DELETE + INSERT pair, is
        merged back into one UPDATE."""
        held: Located | None = None
        skip = self.skip
        for xact, cid, article, op, data in rows:
            if skip and article in skip and ((upto := skip[article]) is None or lsn.lsn_to_int(xact) <= upto):
                continue  # in the article's copy (or in one still to take)
            cmd = Command.from_json(op, article, load_command(op, data))  # decoded here: one pass over the rows
            if held is not None:
                hx, hc, hd = held
                held = None
                if cmd.op == INSERT and cmd.pair and cmd.article == hd.article and xact == hx:
                    yield hx, hc, Command(UPDATE, hd.article, old=hd.old, new=cmd.new)
                    continue
                yield hx, hc, hd
            if self._holds_pair(cmd, xact, article_rows):
                held = (xact, cid, cmd)
                continue
            yield xact, cid, cmd
        if held is not None:
            yield held

    def _holds_pair(self, cmd: Command, xact: str, article_rows: Mapping[str, Mapping[str, int]]) -> bool:
        """Whether ``cmd`` is the DELETE half of a pair that may become one UPDATE again."""
        art = self.articles.get(cmd.article)
        return (
            cmd.op == DELETE
            and cmd.pair
            and art is not None
            and art.update_mode == "multi_row_key_changes"
            and article_rows[xact].get(cmd.article) == 1
        )

    def touched(self, cmd: Command) -> list[KeyValue] | None:
        """Every key value the command touches at the subscriber (:class:`TouchedKeys`); None
        for a TRUNCATE (it touches every row)."""
        return self._keys.of(cmd, lambda: self.stmt(cmd) is not None)

    def execute(self, cur: psycopg.RawCursor, cmd: Command) -> bool:
        """Run ``cmd``'s statement; False when the command is not applied (nothing ran)."""
        if cmd.op == SCHEMA:
            self.change_schema(cur.connection, cmd)
            return True
        st = self.stmt(cmd)
        if st is None:
            return False
        st.execute(cur, cmd)
        return True

    def describe(self, cmd: Command) -> str:
        return statements.describe_command(self.articles.get(cmd.article), cmd)


# ---------------------------------------------------------------------- one stream, pipelined
def apply_pipelined(
    conn: psycopg.Connection, applier: Applier, commands: Iterable[Command], stop: threading.Event | None = None
) -> int:
    """Execute commands on one connection in a pipeline; returns how many were executed."""
    cur = raw_sql.cursor(conn)
    n = 0
    with conn.pipeline() as p:
        for cmd in commands:
            if stop is not None and stop.is_set():
                break
            if applier.execute(cur, cmd):
                n += 1
                if n % _SYNC_EVERY == 0:
                    p.sync()
    return n


# ---------------------------------------------------------------------- several streams at once
#: One stream's share of a planned batch: applies it (stopping early once the event is set,
#: another stream having failed) and returns how many commands it executed.
ShareJob = Callable[[threading.Event], int]


class _Stream(threading.Thread):
    """Runs one stream's share in its own thread; a failure stops the other streams."""

    def __init__(self, job: ShareJob, failed: threading.Event) -> None:
        super().__init__(daemon=True)
        self.job, self.failed = job, failed
        self.error: BaseException | None = None
        self.count = 0

    def run(self) -> None:
        try:
            self.count = self.job(self.failed)
        except BaseException as exc:
            self.error = exc
            self.failed.set()


def run_parallel(jobs: Sequence[ShareJob]) -> int:
    """Run each stream's share at once, each in its own thread (whatever the subscriber's
    engine); returns how many commands were executed, or raises the first stream's error once
    all have stopped."""
    failed = threading.Event()
    workers = [_Stream(job, failed) for job in jobs]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    errors = [w.error for w in workers if w.error is not None]
    if errors:
        raise errors[0]
    return sum(w.count for w in workers)


def apply_parallel(conns: Sequence[psycopg.Connection], applier: Applier, shares: Sequence[Iterable[Command]]) -> int:
    """Apply each share on its own stream, in parallel (share i on ``conns[i]``, pipelined); a
    failing stream stops the others (:func:`run_parallel`)."""

    def job(conn: psycopg.Connection, share: Iterable[Command]) -> ShareJob:
        def apply(stop: threading.Event) -> int:
            try:
                return apply_pipelined(conn, applier, share, stop)
            except BaseException:
                try:
                    conn.rollback()  # release our locks at once
                except psycopg.Error:
                    pass
                raise

        return apply

    return run_parallel([job(conn, share) for conn, share in zip(conns, shares, strict=False)])


# ---------------------------------------------------------------------- replay, command by command
@dataclass
class ReplayOutcome:
    """What a replay applied: commands executed, transactions skipped, the failure it stopped
    at (if any) and the last transaction done (applied or skipped) before it."""

    commands: int = 0
    skipped: list[conflicts.Skipped] = field(default_factory=list)
    failure: DeliveryError | None = None
    last_good: str | None = None
    #: conflicts met at a queued subscriber (:mod:`~airflow_repl.engine.subscriber.convergence`)
    conflicts: list[dict[str, Any]] = field(default_factory=list)


#: Applies one command at a subscriber: (whether it was applied, a conflict record or None).
Deliver = Callable[[psycopg.RawCursor, str, Command], "tuple[bool, dict[str, Any] | None]"]


def replay(
    conn: psycopg.Connection,
    applier: Applier,
    commands: Iterable[Located],
    skip: set[str],
    deliver: Deliver | None = None,
) -> ReplayOutcome:
    """One stream, one command at a time, a savepoint per transaction: skips the transactions
    failing with a skippable error (SQLSTATEs ``skip``), stops at any other error.  ``deliver``
    applies one command (default: its statement); at a queued subscriber it converges the row
    and returns the conflict it met (:mod:`~airflow_repl.engine.subscriber.convergence`)."""
    run = deliver or (lambda cur, xact, cmd: (applier.execute(cur, cmd), None))
    cur = raw_sql.cursor(conn)
    out = ReplayOutcome()
    current: str | None = None
    failed_txn: str | None = None
    for xact, cid, cmd in commands:
        if xact != current:
            next_transaction(cur, out, current)
            current = xact
        if failed_txn == xact:
            continue  # the rest of a skipped transaction
        try:
            applied, record = run(cur, xact, cmd)
        except psycopg.Error as exc:
            if not _skipped(cur, out, exc, conflicts.FailedCommand(xact, cid, cmd, applier.describe(cmd)), skip):
                return out  # out.failure says why
            failed_txn = xact
            continue
        out.commands += int(applied)
        if record is not None:
            out.conflicts.append({**record, "xact_seqno": xact, "command_id": cid})
    if current is not None:
        cur.execute("RELEASE SAVEPOINT airflow_repl_txn")
        out.last_good = current
    return out


def _skipped(
    cur: psycopg.RawCursor, out: ReplayOutcome, exc: psycopg.Error, failed: conflicts.FailedCommand, skip: set[str]
) -> bool:
    """Roll the failed command's transaction back; True when it is skipped (a ``skip`` error),
    False when delivery stops (``out.failure``)."""
    cur.execute("ROLLBACK TO SAVEPOINT airflow_repl_txn")
    out.conflicts = [c for c in out.conflicts if c["xact_seqno"] != failed.xact]  # rolled back with it
    resolution = conflicts.resolve(exc, failed, skip)
    if isinstance(resolution, DeliveryError):
        out.failure = resolution
        return False
    out.skipped.append(resolution)
    return True


def next_transaction(cur: psycopg.RawCursor, out: ReplayOutcome, done: str | None) -> None:
    """Close the savepoint of transaction ``done`` (applied, or skipped: either way it is done)
    and open the next one's."""
    if done is not None:
        out.last_good = done
        cur.execute("RELEASE SAVEPOINT airflow_repl_txn")
    cur.execute("SAVEPOINT airflow_repl_txn")
