"""The Distribution Agent: delivers a publication's pending transactions to one subscriber, in
commit order, exactly once.

Each subscriber commit applies up to ``commit_batch_size`` transactions (or about
``commit_batch_threshold`` commands) *and* moves the subscriber's own watermark
(``airflow_repl.subscription_state``) in the same transaction.  A crash anywhere rolls the
subscriber back to the last watermark; re-running resumes from it, so every transaction is
applied once.  Changes are applied with ``session_replication_role = replica``: ordinary user
triggers and foreign-key triggers do not fire (SQL Server's NOT FOR REPLICATION).

With ``subscription_streams`` > 1 each batch is planned (:func:`plan_streams`): commands that
touch a common key value (primary key or any unique constraint, before or after image) are
connected, and each connected group stays on one stream in commit order, so streams never wait
on each other's locks.  A batch whose groups cannot be spread usefully goes to one stream.  A
spread batch commits on every stream with two-phase commit, so the batch and the watermark still
commit as one.  Any error on any stream rolls the batch back everywhere and replays it on one
stream, transaction by transaction; that replay also implements ``skip_errors`` and names the
failing command.

Positions (``xact_seqno``) are ``pg_lsn`` values: SQL orders and compares the column itself,
never its text, and Python compares them as integers (:func:`lsn.lsn_to_int`).
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
import uuid
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

import psycopg

from airflow_repl.engine.agents.lifecycle import AgentRun
from airflow_repl.engine.articles.commands import DELETE, INSERT, UPDATE, Command
from airflow_repl.engine.articles.resolved import ResolvedArticle, definition_hash
from airflow_repl.engine.errors import ROW_NOT_FOUND_SQLSTATE, AgentBusy, DeliveryError, NotInitialized, ReplError
from airflow_repl.engine.model.topology import SKIPPABLE_ERRORS, Topology
from airflow_repl.engine.postgres import lsn, raw_sql
from airflow_repl.engine.state import distdb
from airflow_repl.engine.subscriber import statements

log = logging.getLogger(__name__)
AGENT = "distribution"
_SYNC_EVERY = 500
#: With several streams, a stream waiting this long for a lock gives up and the batch is
#: replayed on one stream.  Planning keeps conflicting commands on one stream, so only work
#: outside the plan (a custom procedure touching other rows, another session) can wait.
STREAM_LOCK_TIMEOUT = "10s"
_GID_PREFIX = "airflow_repl"
#: A batch with fewer commands is applied on one stream: two-phase commit on every stream
#: costs more than spreading so little work saves.
PARALLEL_MIN_COMMANDS = 64
#: A batch is spread only if its busiest stream gets at most 1 / PARALLEL_MIN_GAIN of its
#: commands (one group dominating the batch gains nothing from several streams).
PARALLEL_MIN_GAIN = 1.5
#: Larger batches (a single huge transaction) are applied on one stream without planning, so
#: that the agent's memory stays bounded.
PLAN_MAX_COMMANDS = 200_000
#: Several streams pay only where the subscriber and this client have cores to spare.  With
#: ADAPTIVE_STREAMS the agent times its spread batches and its one-stream batches (commands per
#: second) and spreads only while spreading is at least as fast; every STREAM_PROBE_EVERY-th
#: batch tries the other way again, so a change of load is noticed.  A run starts from the rates
#: the previous successful run of the subscription measured (kept in its history details).
ADAPTIVE_STREAMS = True
STREAM_PROBE_EVERY = 16


class StreamChooser:
    """Decides, batch by batch, whether a batch may be spread over the streams, from the
    delivery rates measured so far in this run (a pure object: unit-tested without a server)."""

    def __init__(self, adaptive: bool = True, probe_every: int = STREAM_PROBE_EVERY) -> None:
        self.adaptive, self.probe_every = adaptive, probe_every
        self.rate: dict[bool, float | None] = {True: None, False: None}
        self.batches = 0

    def may_spread(self) -> bool:
        """Whether the next batch may be spread (the planner may still keep it on one stream)."""
        self.batches += 1
        if not self.adaptive or self.rate[True] is None:
            return True  # first try spreading
        if self.rate[False] is None:
            return False  # then one stream, to compare
        best = self.rate[True] >= self.rate[False]
        return (not best) if self.batches % self.probe_every == 0 else best

    def resume(self, rates: dict[str, float]) -> None:
        """Start from the rates an earlier run measured (:meth:`rates`)."""
        self.rate[True], self.rate[False] = rates.get("spread"), rates.get("one")

    def rates(self) -> dict[str, float | None]:
        """The measured rates, for the next run: commands per second spread and on one stream."""
        return {"spread": self.rate[True], "one": self.rate[False]}

    def record(self, spread: bool, commands: int, seconds: float) -> None:
        """A batch of ``commands`` took ``seconds`` (spread over streams, or on one stream)."""
        if commands < PARALLEL_MIN_COMMANDS or seconds <= 0:
            return  # too small to say anything about rates
        rate = commands / seconds
        old = self.rate[spread]
        self.rate[spread] = rate if old is None else (old + rate) / 2


#: SQL: the next transactions after a watermark.  Orders and compares the pg_lsn column of the
#: table (qualified: a bare ``xact_seqno`` would bind to the text output column and sort as
#: text), so the primary key's index returns them in order, with no sort of the backlog.
BATCH_QUERY = (
    "SELECT t.xact_seqno::text AS xact, t.command_count, t.article_rows, t.commit_time "
    "FROM airflow_repl.transactions AS t "
    "WHERE t.publication = %s AND t.xact_seqno > %s::pg_lsn ORDER BY t.xact_seqno LIMIT %s"
)
#: SQL: the commands of the transactions first..last, in commit order.
COMMANDS_QUERY = (
    "SELECT c.xact_seqno::text AS xact, c.command_id, c.article, c.op, c.data "
    "FROM airflow_repl.commands AS c "
    "WHERE c.publication = %s AND c.xact_seqno BETWEEN %s::pg_lsn AND %s::pg_lsn "
    "ORDER BY c.xact_seqno, c.command_id"
)


@dataclass
class _Txn:
    xact: str
    count: int
    article_rows: dict


@dataclass
class _Outcome:
    commands: int = 0
    skipped: list = field(default_factory=list)
    failure: DeliveryError | None = None
    last_good: str | None = None


def plan_streams(
    touched: Sequence[Iterable[Hashable] | None],
    streams: int,
    *,
    min_commands: int = PARALLEL_MIN_COMMANDS,
    min_gain: float = PARALLEL_MIN_GAIN,
) -> list[list[int]]:
    """Spread a batch's commands over at most ``streams`` streams so that no two streams ever
    touch the same key value.

    ``touched[i]`` is every key value command ``i`` touches (``None``: it may touch anything,
    a TRUNCATE say).  Commands sharing a key value are connected (union-find); each connected
    group stays on one stream, in commit order, and the groups are balanced over the streams
    (largest first, onto the least loaded).  Returns the command indexes of each stream, each
    list in commit order; a single list when spreading does not pay: fewer than
    ``min_commands`` commands, one group, or a busiest stream holding more than
    1 / ``min_gain`` of the batch.
    """
    n = len(touched)
    everything = [list(range(n))]
    if streams <= 1 or n < max(min_commands, 2):
        return everything
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[Hashable, int] = {}
    for i, keys in enumerate(touched):
        if keys is None:
            return everything
        for key in keys:
            j = owner.setdefault(key, i)
            if j != i:
                a, b = find(i), find(j)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(find(i), []).append(i)
    if len(groups) < 2:
        return everything
    loads = [(0, s) for s in range(streams)]
    assigned: list[list[int]] = [[] for _ in range(streams)]
    for group in sorted(groups.values(), key=len, reverse=True):
        load, s = heapq.heappop(loads)
        assigned[s].extend(group)
        heapq.heappush(loads, (load + len(group), s))
    if n < min_gain * max(len(a) for a in assigned):
        return everything
    return [sorted(a) for a in assigned if a]


def _key_constraints(art: ResolvedArticle) -> list[tuple[tuple, list[int]]]:
    """(constraint, column positions) of the article's primary key and unique constraints; a
    constraint is named by its destination table and columns."""
    names = art.column_names
    return [
        ((art.dest_schema, art.dest_table, tuple(names[i] for i in positions)), positions)
        for positions in [art.pk_positions, *art.unique_positions]
    ]


class _Applier:
    def __init__(self, articles: dict[str, ResolvedArticle]) -> None:
        self.articles = articles
        self._stmts: dict[tuple[str, str], statements.Statement | None] = {}
        self._constraints: dict[str, list[tuple[tuple, list[int]]]] = {}

    def stmt(self, cmd: Command) -> statements.Statement | None:
        key = (cmd.article, cmd.op)
        if key not in self._stmts:
            art = self.articles.get(cmd.article)
            self._stmts[key] = statements.statement(art, cmd.op) if art is not None else None
        return self._stmts[key]

    def commands(self, rows, txns: dict[str, _Txn]):
        """(xact, command_id, Command) in order.  For articles whose single-row key updates stay
        UPDATEs, a transaction's only row change of the article, stored as a DELETE + INSERT
        pair, is merged back into one UPDATE."""
        held = None
        for xact, cid, article, op, data in rows:
            cmd = Command.from_json(op, article, data)
            if held is not None:
                hx, hc, hd = held
                held = None
                if cmd.op == INSERT and cmd.pair and cmd.article == hd.article and xact == hx:
                    yield hx, hc, Command(UPDATE, hd.article, old=hd.old, new=cmd.new)
                    continue
                yield hx, hc, hd
            art = self.articles.get(article)
            if (
                cmd.op == DELETE
                and cmd.pair
                and art is not None
                and art.update_mode == "multi_row_key_changes"
                and txns[xact].article_rows.get(article) == 1
            ):
                held = (xact, cid, cmd)
                continue
            yield xact, cid, cmd
        if held is not None:
            yield held

    def touched(self, cmd: Command) -> list[tuple] | None:
        """Every key value the command touches at the subscriber: its destination table's
        primary key and each unique constraint (without NULLs, which never conflict), in its
        before and after images.  None for a TRUNCATE (it touches every row)."""
        if self.stmt(cmd) is None:
            return []
        if cmd.op == "T":
            return None
        constraints = self._constraints.get(cmd.article)
        if constraints is None:
            constraints = self._constraints[cmd.article] = _key_constraints(self.articles[cmd.article])
        keys = []
        for image in (cmd.old, cmd.new):
            if image is not None:
                for constraint, positions in constraints:
                    values = tuple([image[i] for i in positions])
                    if None not in values:
                        keys.append((constraint, values))
        return keys

    def execute(self, cur: psycopg.Cursor, cmd: Command) -> bool:
        st = self.stmt(cmd)
        if st is None:
            return False
        st.execute(cur, cmd)
        return True

    def describe(self, cmd: Command) -> str:
        return statements.describe_command(self.articles.get(cmd.article), cmd)


class _Stream(threading.Thread):
    """Applies its share of a planned batch on its own connection, pipelined; stops early
    when another stream failed."""

    def __init__(
        self, conn: psycopg.Connection, applier: _Applier, commands: Iterable[Command], failed: threading.Event
    ) -> None:
        super().__init__(daemon=True)
        self.conn, self.applier, self.commands, self.failed = conn, applier, commands, failed
        self.error: BaseException | None = None
        self.count = 0

    def run(self) -> None:
        try:
            self.count = _apply_pipelined(self.conn, self.applier, self.commands, self.failed)
        except BaseException as exc:
            self.error = exc
            self.failed.set()
            try:
                self.conn.rollback()  # release our locks at once
            except psycopg.Error:
                pass


def _apply_pipelined(
    conn: psycopg.Connection, applier: _Applier, commands: Iterable[Command], stop: threading.Event | None = None
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


def _batch(
    dist: psycopg.Connection, publication: str, after: str, until: datetime | None, size: int, threshold: int
) -> list[_Txn]:
    # Commit order is LSN order; commit timestamps of concurrent commits need not follow it, so
    # point-in-time delivery stops at the first transaction (in LSN order) committed after
    # `until`, never skipping an earlier-LSN one.
    rows = dist.execute(BATCH_QUERY, (publication, after, size)).fetchall()
    out, total = [], 0
    for xact, count, article_rows, commit_time in rows:
        if until is not None and commit_time > until:
            break
        if out and total + count > threshold:
            break
        out.append(_Txn(xact, count, article_rows or {}))
        total += count
    return out


def _command_rows(dist: psycopg.Connection, publication: str, first: str, last: str):
    with dist.cursor(name="airflow_repl_cmds") as cur:
        cur.itersize = 2000
        cur.execute(COMMANDS_QUERY, (publication, first, last))
        yield from cur


def _lock_watermark(sub: psycopg.Connection, publication: str, subscriber: str) -> str:
    try:
        row = sub.execute(
            "SELECT xact_seqno::text FROM airflow_repl.subscription_state WHERE publication = %s FOR UPDATE NOWAIT",
            (publication,),
        ).fetchone()
    except psycopg.errors.LockNotAvailable:
        raise AgentBusy(
            f"another Distribution Agent is delivering publication {publication!r} to "
            f"subscriber {subscriber!r}; wait for it to finish"
        ) from None
    except psycopg.errors.UndefinedTable:
        row = None
    if row is None:
        raise NotInitialized(
            f"subscriber {subscriber!r} has no snapshot of publication {publication!r}: "
            f"run the Snapshot Agent to initialize the subscription"
        )
    return row[0]


def _set_watermark(sub: psycopg.Connection, publication: str, xact: str, transactions: int) -> None:
    sub.execute(
        "UPDATE airflow_repl.subscription_state SET xact_seqno = %s, "
        "transactions = transactions + %s, updated_at = now() WHERE publication = %s",
        (xact, transactions, publication),
    )


def recover_prepared(sub: psycopg.Connection, publication: str) -> int:
    """Finish a multi-stream batch whose agent died during two-phase commit.

    A batch's gids carry the batch's last xact_seqno; stream 0's transaction holds the
    subscriber watermark.  So: if the committed watermark already reached the batch, stream 0
    committed and the remaining streams must commit too; if every stream is prepared, the
    batch can commit; anything else (the prepare phase was cut short, or a rollback of the
    batch was interrupted) is rolled back.
    """
    sub.rollback()
    prefix = f"{_GID_PREFIX}|{publication}|"
    gids = [
        r[0]
        for r in sub.execute(
            "SELECT gid FROM pg_catalog.pg_prepared_xacts WHERE gid LIKE %s AND database = current_database()",
            (prefix.replace("_", r"\_") + "%",),
        )
    ]
    row = (
        sub.execute(
            "SELECT xact_seqno::text FROM airflow_repl.subscription_state WHERE publication = %s", (publication,)
        ).fetchone()
        if gids
        else None
    )
    sub.rollback()
    watermark = lsn.lsn_to_int(row[0]) if row else -1
    batches: dict[tuple[str, str], list[tuple[int, int, str]]] = {}
    for gid in gids:
        _, _, batch, last, stream, total = gid.split("|")
        batches.setdefault((batch, last), []).append((int(stream), int(total), gid))
    sub.autocommit = True
    try:
        for (_, last), members in batches.items():
            streams = {m[0] for m in members}
            total = members[0][1]
            commit = watermark >= lsn.lsn_to_int(last) or len(streams) == total
            for _, _, gid in sorted(members, reverse=True):
                sub.execute(
                    psycopg.sql.SQL("COMMIT PREPARED {}" if commit else "ROLLBACK PREPARED {}").format(
                        psycopg.sql.Literal(gid)
                    )
                )
            log.warning(
                "recovered an interrupted multi-stream batch of %s: %s %d prepared transaction(s)",
                publication,
                "committed" if commit else "rolled back",
                len(members),
            )
    finally:
        sub.autocommit = False
    return len(gids)


def _check_stream_capacity(conn: psycopg.Connection, streams: int, publication: str, subscriber: str) -> None:
    """Refuse, before any further connection is opened, more streams than the subscriber can
    serve: one connection each (within max_connections, less the superuser reserve and the
    connections in use, this one included) and one prepared transaction each."""
    max_conn, reserved, in_use, prepared = conn.execute(
        "SELECT current_setting('max_connections')::int, current_setting('superuser_reserved_connections')::int, "
        "(SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE backend_type = 'client backend'), "
        "current_setting('max_prepared_transactions')::int"
    ).fetchone()
    conn.rollback()
    free = max_conn - reserved - (in_use - 1)  # connections left for this agent, this one included
    allowed = min(free, prepared)
    if streams > allowed:
        raise ReplError(
            f"subscription_streams = {streams} is more than subscriber {subscriber!r} can serve: it allows {allowed} "
            f"(max_prepared_transactions {prepared}; free connections {free} = max_connections {max_conn} - "
            f"superuser_reserved_connections {reserved} - {in_use - 1} in use by others); set subscription_streams "
            f"of publication {publication!r} at subscriber {subscriber!r} to at most {max(allowed, 1)}, or raise "
            f"those settings at the subscriber"
        )


class _Delivery:
    """One Distribution Agent run for one subscription."""

    def __init__(
        self,
        topology: Topology,
        publication: str,
        subscriber: str,
        *,
        until,
        size: int,
        threshold: int,
        streams: int,
        skip: set[str],
    ) -> None:
        self.topology, self.publication, self.subscriber = topology, publication, subscriber
        self.until, self.size, self.threshold, self.n, self.skip = until, size, threshold, streams, skip
        self.totals = {
            "transactions": 0,
            "commands": 0,
            "commits": 0,
            "retries": 0,
            "skipped": 0,
            "parallel_batches": 0,
            "last_xact_seqno": None,
        }
        self.chooser = StreamChooser(adaptive=ADAPTIVE_STREAMS)

    def connect(self, run: AgentRun) -> None:
        conninfo = self.topology.subscriber_conninfo(self.subscriber)
        role = f"subscriber {self.subscriber!r}"
        self.subs: list[psycopg.Connection] = []
        for i in range(self.n):
            conn = run.connect(conninfo, role)
            self.subs.append(conn)
            if i == 0 and self.n > 1:  # before opening the others
                _check_stream_capacity(conn, self.n, self.publication, self.subscriber)
            try:
                conn.execute("SET session_replication_role = replica")
                if self.n > 1:
                    conn.execute("SELECT set_config('lock_timeout', %s, false)", (STREAM_LOCK_TIMEOUT,))
                conn.commit()
            except psycopg.errors.InsufficientPrivilege:
                raise ReplError(
                    f"the login of subscriber {self.subscriber!r} may not set "
                    f"session_replication_role; the Distribution Agent needs a superuser login "
                    f"(or one granted SET on that parameter) at the subscriber"
                ) from None
        # One agent per subscription: a session lock, released if this process dies.  Taken before
        # recovery, so that no live agent's two-phase commit is ever "recovered" under its feet.
        run.lock(self.subs[0])
        run.step = "the recovery of an interrupted two-phase commit"
        recover_prepared(self.subs[0], self.publication)

    def lost(self) -> bool:
        """True when a subscriber connection is gone (the batch cannot be replayed on it)."""
        return any(conn.broken or conn.closed for conn in getattr(self, "subs", []))

    def rollback_all(self) -> None:
        """Roll back every stream's open transaction; never raises (it runs on error paths,
        where a connection may be dead: the server rolls a dead session's work back itself)."""
        for conn in getattr(self, "subs", []):
            if conn.closed or conn.broken:
                continue
            try:
                if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    conn.rollback()
            except psycopg.Error:
                try:
                    conn.cancel_safe()
                    conn.rollback()
                except psycopg.Error as exc:
                    log.debug("could not roll back a stream of subscriber %r: %r", self.subscriber, exc)

    # ------------------------------------------------------------------ fast paths
    def _plan(self, applier: _Applier, rows, txns: dict[str, _Txn], may_spread: bool) -> list[Iterable[Command]]:
        """The batch's commands per stream (a single share: apply on one stream).  One stream
        reads the commands as it applies them; several need the whole batch planned first."""
        if self.n == 1 or not may_spread or sum(t.count for t in txns.values()) > PLAN_MAX_COMMANDS:
            return [(cmd for _, _, cmd in applier.commands(rows, txns))]
        cmds = [cmd for _, _, cmd in applier.commands(rows, txns)]
        plan = plan_streams(
            [applier.touched(c) for c in cmds], self.n, min_commands=PARALLEL_MIN_COMMANDS, min_gain=PARALLEL_MIN_GAIN
        )
        return [[cmds[i] for i in share] for share in plan]

    def _apply_streams(self, applier: _Applier, shares: list[Iterable[Command]]) -> int:
        """Apply each share on its own stream, in parallel (share i on stream i)."""
        failed = threading.Event()
        workers = [_Stream(conn, applier, share, failed) for conn, share in zip(self.subs, shares)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        errors = [w.error for w in workers if w.error is not None]
        if errors:
            raise errors[0]
        return sum(w.count for w in workers)

    def _commit_streams(self, last: str, n_txn: int, used: int) -> None:
        """Two-phase commit of one batch over the streams it used, 0..used-1 (stream 0 holds
        the watermark)."""
        batch = uuid.uuid4().hex[:12]
        gids = [f"{_GID_PREFIX}|{self.publication}|{batch}|{last}|{i}|{used}" for i in range(used)]
        _set_watermark(self.subs[0], self.publication, last, n_txn)
        prepared: list[str] = []
        try:
            for conn, gid in zip(self.subs, gids):
                conn.execute(psycopg.sql.SQL("PREPARE TRANSACTION {}").format(psycopg.sql.Literal(gid)))
                conn.commit()  # closes psycopg's transaction block; the work is now prepared
                prepared.append(gid)
        except psycopg.Error:
            # A stream could not prepare: undo the streams that did, so the batch can be replayed.
            self.rollback_all()
            self.subs[0].autocommit = True
            try:
                for gid in reversed(prepared):  # stream 0 (the watermark) last
                    self.subs[0].execute(psycopg.sql.SQL("ROLLBACK PREPARED {}").format(psycopg.sql.Literal(gid)))
            finally:
                self.subs[0].autocommit = False
            raise
        try:
            for conn, gid in zip(self.subs, gids):
                conn.autocommit = True
                try:
                    conn.execute(psycopg.sql.SQL("COMMIT PREPARED {}").format(psycopg.sql.Literal(gid)))
                finally:
                    conn.autocommit = False
        except psycopg.Error as exc:
            # Past the prepare phase the batch must commit, never be replayed: what is still
            # prepared is committed by the next run's recovery.
            if self.lost():
                raise  # reported as a lost connection: run it again
            raise ReplError(
                f"the batch ending at {last} is prepared on every stream but not yet committed "
                f"on all of them ({exc}); run the Distribution Agent again to finish it"
            ) from None

    # ------------------------------------------------------------------ replay
    def _replay(self, applier: _Applier, rows, txns) -> _Outcome:
        """One stream, one command at a time, a savepoint per transaction: skips the
        transactions failing with a skippable error, stops at any other error."""
        sub = self.subs[0]
        cur = raw_sql.cursor(sub)
        out = _Outcome()
        current = None
        failed_txn = None
        for xact, cid, cmd in applier.commands(rows, txns):
            if xact != current:
                if current is not None:  # applied, or skipped: either way it is done
                    out.last_good = current
                    cur.execute("RELEASE SAVEPOINT airflow_repl_txn")
                current = xact
                cur.execute("SAVEPOINT airflow_repl_txn")
            if failed_txn == xact:
                continue  # the rest of a skipped transaction
            try:
                if applier.execute(cur, cmd):
                    out.commands += 1
            except psycopg.Error as exc:
                cur.execute("ROLLBACK TO SAVEPOINT airflow_repl_txn")
                what = applier.describe(cmd)
                diag = exc.diag.message_primary or str(exc)
                if exc.sqlstate in self.skip:
                    failed_txn = xact
                    out.skipped.append(
                        {
                            "xact_seqno": xact,
                            "command_id": cid,
                            "article": cmd.article,
                            "sqlstate": exc.sqlstate,
                            "command": cmd.to_json(),
                            "message": f"skipped transaction {xact}: cannot apply {what} (command {cid}): {diag}",
                        }
                    )
                    continue
                hint = (
                    " The subscriber is missing a row the publisher had: repair the row, reinitialize "
                    "the subscription (Snapshot Agent with reinitialize), or skip such errors with the "
                    "subscription's skip_errors option."
                    if exc.sqlstate == ROW_NOT_FOUND_SQLSTATE
                    else ""
                )
                out.failure = DeliveryError(
                    f"cannot apply {what} in transaction {xact} (command {cid}): {diag}.{hint}",
                    sqlstate=exc.sqlstate,
                    xact_seqno=xact,
                    command_id=cid,
                    article=cmd.article,
                )
                out.failure.command = cmd.to_json()
                return out
        if current is not None:
            cur.execute("RELEASE SAVEPOINT airflow_repl_txn")
            out.last_good = current
        return out

    # ------------------------------------------------------------------ main loop
    def run(self, dist: psycopg.Connection, run_id: int, applier: _Applier) -> None:
        sub0 = self.subs[0]
        while True:
            watermark = _lock_watermark(sub0, self.publication, self.subscriber)
            txns = _batch(dist, self.publication, watermark, self.until, self.size, self.threshold)
            if not txns:
                self.rollback_all()
                dist.rollback()
                return
            first, last = txns[0].xact, txns[-1].xact
            by_xact = {t.xact: t for t in txns}
            rows = _command_rows(dist, self.publication, first, last)
            try:
                may_spread = self.n > 1 and self.chooser.may_spread()
                started = time.monotonic()
                shares = self._plan(applier, rows, by_xact, may_spread)
                if len(shares) == 1:
                    n = _apply_pipelined(sub0, applier, shares[0])
                    _set_watermark(sub0, self.publication, last, len(txns))
                    sub0.commit()  # changes and watermark together: exactly once
                else:
                    n = self._apply_streams(applier, shares)
                    self._commit_streams(last, len(txns), len(shares))
                    self.totals["parallel_batches"] += 1
                if self.n > 1 and may_spread == (len(shares) > 1):  # a batch planned but kept whole says nothing
                    self.chooser.record(may_spread, n, time.monotonic() - started)
                self._delivered(dist, last, len(txns), n)
                continue
            except psycopg.Error as exc:
                rows.close()
                if self.lost() or dist.broken:
                    raise  # a server went away: nothing to replay on (the run is recorded as failed)
                log.info(
                    "batch %s..%s failed on the fast path (%s); replaying it on one stream",
                    first,
                    last,
                    exc.sqlstate or exc,
                )
            self.rollback_all()
            dist.rollback()
            self.totals["retries"] += 1
            now = _lock_watermark(sub0, self.publication, self.subscriber)
            if lsn.lsn_to_int(now) != lsn.lsn_to_int(watermark):  # never re-apply
                raise ReplError(
                    f"the watermark of subscriber {self.subscriber!r} moved while a batch failed; "
                    f"run the Distribution Agent again"
                )
            outcome = self._replay(applier, _command_rows(dist, self.publication, first, last), by_xact)
            done = last if outcome.failure is None else outcome.last_good
            if done is not None:
                applied = txns[: [t.xact for t in txns].index(done) + 1]
                _set_watermark(sub0, self.publication, done, len(applied))
                sub0.commit()
                for s in outcome.skipped:
                    distdb.record_error(
                        dist,
                        run_id=run_id,
                        agent=AGENT,
                        publication=self.publication,
                        subscriber=self.subscriber,
                        skipped=True,
                        commit=False,
                        **s,
                    )
                self.totals["skipped"] += len(outcome.skipped)
                self._delivered(dist, done, len(applied), outcome.commands)
            if outcome.failure is not None:
                raise outcome.failure

    def _delivered(self, dist: psycopg.Connection, last: str, n_txn: int, n_cmd: int) -> None:
        dist.execute(
            "UPDATE airflow_repl.subscriptions SET delivered_xact_seqno = %s, "
            "delivered_at = now() WHERE publication = %s AND subscriber = %s",
            (last, self.publication, self.subscriber),
        )
        dist.commit()
        self.totals["transactions"] += n_txn
        self.totals["commands"] += n_cmd
        self.totals["commits"] += 1
        self.totals["last_xact_seqno"] = last


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
) -> dict:
    """Deliver every pending transaction (committed up to ``until``, when given)."""
    started = time.monotonic()
    if isinstance(until, str):
        until = parse_until(until)
    if until is not None and until.tzinfo is None:
        until = until.replace(tzinfo=timezone.utc)  # a time without offset is UTC, like Airflow's
    opts = topology.subscription(publication, subscriber)
    skip = skip_errors if skip_errors is not None else opts.skip_errors
    unknown = [e for e in skip if str(e) not in SKIPPABLE_ERRORS]
    if unknown:
        raise ReplError(f"skip_errors {unknown} not understood; use row_not_found (20598) and/or duplicate_key (2627)")
    delivery = _Delivery(
        topology,
        publication,
        subscriber,
        until=until,
        size=commit_batch_size or opts.commit_batch_size,
        threshold=commit_batch_threshold or opts.commit_batch_threshold,
        streams=subscription_streams or opts.subscription_streams,
        skip={SKIPPABLE_ERRORS[str(e)] for e in skip},
    )
    with AgentRun(AGENT, publication, subscriber) as run:
        run.step = "connecting"
        dist = run.connect(topology.distributor.require("distributor"), "distributor")
        run.step = "the subscription check"
        articles = distdb.load_articles(dist, publication)
        row = dist.execute(
            "SELECT articles_hash FROM airflow_repl.subscriptions WHERE publication = %s AND subscriber = %s",
            (publication, subscriber),
        ).fetchone()
        if row and row[0] is not None and row[0] != definition_hash(articles):
            raise ReplError(
                f"the articles of publication {publication!r} changed since subscriber {subscriber!r} "
                f"was initialized: run the Snapshot Agent with reinitialize for it"
            )
        applier = _Applier({a.name: a for a in articles})
        if delivery.n > 1:  # start from what the last run learnt about spreading here
            delivery.chooser.resume(distdb.last_stream_rates(dist, publication, subscriber, delivery.n))
        dist.commit()
        run.cleanups.append(delivery.rollback_all)
        delivery.connect(run)
        _lock_watermark(delivery.subs[0], publication, subscriber)  # initialized, and no other agent is alive
        delivery.subs[0].rollback()
        run.begin(dist)
        run.counts = run.details = delivery.totals
        run.step = "delivery"
        delivery.run(dist, run.run_id, applier)
        totals = delivery.totals
        totals["seconds"] = round(time.monotonic() - started, 3)
        if delivery.n > 1:
            totals["stream_rates"] = {"streams": delivery.n, **delivery.chooser.rates()}
        run.succeed(totals, transactions=totals["transactions"], commands=totals["commands"])
        log.info(
            "distribution %s -> %s: %s transactions, %s commands in %.1fs",
            publication,
            subscriber,
            totals["transactions"],
            totals["commands"],
            totals["seconds"],
        )
        return totals
