"""The Distribution Agent: delivers a publication's pending transactions to one subscriber, in
commit order, exactly once.

Each subscriber commit applies up to ``commit_batch_size`` transactions (or about
``commit_batch_threshold`` commands) *and* moves the subscriber's own watermark
(``airflow_repl.subscription_state``) in the same transaction.  A crash anywhere rolls the
subscriber back to the last watermark; re-running resumes from it, so every transaction is
applied once.  Changes are applied with ``session_replication_role = replica``: ordinary user
triggers and foreign-key triggers do not fire (SQL Server's NOT FOR REPLICATION).
"""

from __future__ import annotations

import logging
import time
from datetime import datetime

import psycopg

from . import apply, connections, distdb
from .articles import ResolvedArticle
from .commands import Command
from .errors import ROW_NOT_FOUND_SQLSTATE, DeliveryError, NotInitialized, ReplError
from .topology import Topology

log = logging.getLogger(__name__)
AGENT = "distribution"
_SYNC_EVERY = 500


class _Applier:
    def __init__(self, conn: psycopg.Connection, articles: dict[str, ResolvedArticle]) -> None:
        self.conn = conn
        self.articles = articles
        self._stmts: dict[tuple[str, str], apply.Statement | None] = {}

    def stmt(self, cmd: Command) -> apply.Statement | None:
        key = (cmd.article, cmd.op)
        if key not in self._stmts:
            art = self.articles.get(cmd.article)
            self._stmts[key] = apply.statement(art, cmd.op) if art is not None else None
        return self._stmts[key]

    def apply(self, rows, *, pipeline: bool) -> int:
        """Apply commands (rows of xact_seqno, command_id, article, op, data); returns how many
        ran.  Without the pipeline, an error is raised as DeliveryError naming the command."""
        n = 0
        cur = self.conn.cursor()
        if pipeline:
            with self.conn.pipeline() as p:
                for xact, cid, article, op, data in rows:
                    cmd = Command.from_json(op, article, data)
                    st = self.stmt(cmd)
                    if st is None:
                        continue
                    cur.execute(st.query, st.params_of(cmd))
                    n += 1
                    if n % _SYNC_EVERY == 0:
                        p.sync()
            return n
        for xact, cid, article, op, data in rows:
            cmd = Command.from_json(op, article, data)
            st = self.stmt(cmd)
            if st is None:
                continue
            try:
                cur.execute(st.query, st.params_of(cmd))
            except psycopg.Error as exc:
                what = apply.describe_command(self.articles.get(article), cmd)
                diag = exc.diag.message_primary or str(exc)
                hint = (" The subscriber is missing a row the publisher had: reinitialize the "
                        "subscription (run the Snapshot Agent) or repair the row."
                        if exc.sqlstate == ROW_NOT_FOUND_SQLSTATE else "")
                raise DeliveryError(
                    f"cannot apply {what} in transaction {xact} (command {cid}): {diag}.{hint}",
                    sqlstate=exc.sqlstate, xact_seqno=str(xact), command_id=cid, article=article) from exc
            n += 1
        return n


def _batch(dist: psycopg.Connection, publication: str, after: str, until: datetime | None,
           size: int, threshold: int) -> list[tuple[str, int]]:
    rows = dist.execute(
        "SELECT xact_seqno::text, command_count FROM airflow_repl.transactions "
        "WHERE publication = %s AND xact_seqno > %s AND (%s::timestamptz IS NULL OR commit_time <= %s) "
        "ORDER BY xact_seqno LIMIT %s", (publication, after, until, until, size)).fetchall()
    out, total = [], 0
    for xact, count in rows:
        if out and total + count > threshold:
            break
        out.append((xact, count))
        total += count
    return out


def _commands(dist: psycopg.Connection, publication: str, first: str, last: str):
    with dist.cursor(name="airflow_repl_cmds") as cur:
        cur.itersize = 2000
        cur.execute("SELECT xact_seqno::text, command_id, article, op, data FROM airflow_repl.commands "
                    "WHERE publication = %s AND xact_seqno BETWEEN %s AND %s "
                    "ORDER BY xact_seqno, command_id", (publication, first, last))
        yield from cur


def _lock_watermark(sub: psycopg.Connection, publication: str, subscriber: str) -> str:
    try:
        row = sub.execute("SELECT xact_seqno::text FROM airflow_repl.subscription_state "
                          "WHERE publication = %s FOR UPDATE NOWAIT", (publication,)).fetchone()
    except psycopg.errors.LockNotAvailable:
        raise ReplError(f"another Distribution Agent is delivering publication {publication!r} to "
                        f"subscriber {subscriber!r}; wait for it to finish") from None
    except psycopg.errors.UndefinedTable:
        row = None
    if row is None:
        raise NotInitialized(f"subscriber {subscriber!r} has no snapshot of publication {publication!r}: "
                             f"run the Snapshot Agent to initialize the subscription")
    return row[0]


def run_distribution(topology: Topology, publication: str, subscriber: str, *,
                     until: datetime | str | None = None, commit_batch_size: int | None = None,
                     commit_batch_threshold: int | None = None) -> dict:
    """Deliver every pending transaction (committed up to ``until``, when given)."""
    started = time.monotonic()
    if isinstance(until, str):
        until = datetime.fromisoformat(until)
    sub_opts = topology.subscription(publication, subscriber)
    size = commit_batch_size or sub_opts.commit_batch_size
    threshold = commit_batch_threshold or sub_opts.commit_batch_threshold
    dist = connections.connect(topology.distributor.require("distributor"), "distributor")
    sub = None
    run_id = None
    totals = {"transactions": 0, "commands": 0, "commits": 0, "last_xact_seqno": None}
    try:
        articles = {a.name: a for a in distdb.load_articles(dist, publication)}
        dist.commit()
        sub = connections.connect(topology.subscriber_conninfo(subscriber), f"subscriber {subscriber!r}")
        try:
            sub.execute("SET session_replication_role = replica")
            sub.commit()
        except psycopg.errors.InsufficientPrivilege:
            raise ReplError(f"the login of subscriber {subscriber!r} may not set session_replication_role; "
                            f"the Distribution Agent needs a superuser login (or one granted SET on "
                            f"that parameter) at the subscriber") from None
        run_id = distdb.start_run(dist, AGENT, publication, subscriber)
        applier = _Applier(sub, articles)
        while True:
            watermark = _lock_watermark(sub, publication, subscriber)
            batch = _batch(dist, publication, watermark, until, size, threshold)
            if not batch:
                sub.rollback()
                dist.rollback()
                break
            first, last = batch[0][0], batch[-1][0]
            try:
                n = applier.apply(_commands(dist, publication, first, last), pipeline=True)
            except psycopg.Error:
                # Find and name the failing command: replay the batch one command at a time.
                sub.rollback()
                dist.rollback()
                watermark = _lock_watermark(sub, publication, subscriber)
                n = applier.apply(_commands(dist, publication, first, last), pipeline=False)
            sub.execute("UPDATE airflow_repl.subscription_state SET xact_seqno = %s, "
                        "transactions = transactions + %s, updated_at = now() WHERE publication = %s",
                        (last, len(batch), publication))
            sub.commit()  # changes and watermark together: exactly once
            dist.execute("UPDATE airflow_repl.subscriptions SET delivered_xact_seqno = %s, "
                         "delivered_at = now() WHERE publication = %s AND subscriber = %s",
                         (last, publication, subscriber))
            dist.commit()
            totals["transactions"] += len(batch)
            totals["commands"] += n
            totals["commits"] += 1
            totals["last_xact_seqno"] = last
        totals["seconds"] = round(time.monotonic() - started, 3)
        distdb.finish_run(dist, run_id, "succeeded", transactions=totals["transactions"],
                          commands=totals["commands"], details=totals)
        log.info("distribution %s -> %s: %s transactions, %s commands in %.1fs", publication, subscriber,
                 totals["transactions"], totals["commands"], totals["seconds"])
        return totals
    except Exception as exc:
        if sub is not None and not sub.closed:
            sub.rollback()
        if run_id is not None and not dist.closed:
            dist.rollback()
            distdb.finish_run(dist, run_id, "failed", transactions=totals["transactions"],
                              commands=totals["commands"], message=str(exc))
            d = exc if isinstance(exc, DeliveryError) else None
            distdb.record_error(dist, run_id=run_id, agent=AGENT, publication=publication,
                                subscriber=subscriber, message=str(exc),
                                xact_seqno=d.xact_seqno if d else None,
                                command_id=d.command_id if d else None,
                                article=d.article if d else None, sqlstate=d.sqlstate if d else None)
        raise
    finally:
        if sub is not None:
            sub.close()
        dist.close()
