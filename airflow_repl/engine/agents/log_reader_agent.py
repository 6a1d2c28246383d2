"""The Log Reader Agent: moves committed transactions of published tables from the
publisher's write-ahead log (logical slot, pgoutput) into the distribution database.

Safety protocol, per batch:

1. peek (not get) decoded changes from the slot, up to ``batch_changes`` rows, whole
   transactions only, in commit order;
2. store each transaction and its commands in the distribution database, in one distributor
   transaction, streaming commands with COPY in chunks (memory stays bounded by the chunk size
   whatever the size of a publisher transaction);
3. commit at the distributor, *then* advance the slot past the stored transactions.

A crash before 3 leaves the slot behind: the next run peeks the same transactions again and
skips those already stored (keyed by commit LSN), so nothing is lost and nothing is doubled.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass

import psycopg

from airflow_repl.engine.agents.lifecycle import AgentRun
from airflow_repl.engine.articles.commands import DELETE, INSERT, Command, update_commands
from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.errors import NotInitialized, ReplError
from airflow_repl.engine.model import naming
from airflow_repl.engine.model.topology import Topology
from airflow_repl.engine.postgres import lsn, pgoutput
from airflow_repl.engine.state import distdb

log = logging.getLogger(__name__)
AGENT = "logreader"


@dataclass
class _RelMap:
    article: ResolvedArticle
    positions: list[int]  # relation column index for each article column
    child: bool = False  # an inheritance child of the article's table (include_children)


class _TxnWriter:
    """Buffers the commands of the transaction being read and COPYs them in chunks.

    DELETE + INSERT pairs of consecutive key updates of one article form a *run* (typically one
    statement, such as ``SET k = k + 1`` or a swap of two keys): the run's DELETEs are written
    first and its INSERTs after them, so that applying the run never meets a transient
    duplicate key.  A run ends at any other command or at another article.

    A pair whose before image equals an after image the run itself produced cancels against
    it: that INSERT and this DELETE are both dropped and the new INSERT is kept.  Whether the
    row is the one the run produced (a later statement updating it) or an equal row that
    already existed (one statement shifting keys over rows equal apart from the key, possible
    with a DEFERRABLE key), deleting and inserting the same whole row is no change, so the net
    effect is the publisher's.  A long run's INSERTs wait in a temporary table, not in memory
    (only a hash of each image is kept, to find a match there).
    """

    def __init__(self, dist: psycopg.Connection, publication: str, chunk: int) -> None:
        self.dist = dist
        self.publication = publication
        self.chunk = chunk
        self.buffer: list[tuple] = []  # command rows, across transactions, until the next COPY
        self.transactions: list[tuple] = []  # transaction rows of this batch
        self.begin(None)

    def begin(self, xact_seqno: str | None, xid: int = 0) -> None:
        self.xact, self.xid, self.count = xact_seqno, xid, 0
        self.article_rows: dict[str, int] = {}
        self.run_article: str | None = None
        self.run_inserts: list[Command | None] = []  # in memory; None = cancelled
        self.pending: dict[tuple, list[int]] = {}  # after image -> its indexes in run_inserts
        self.staged_hashes: Counter[int] = Counter()  # hash of each staged INSERT's image
        self.staged = 0  # sequence number of the last staged INSERT of the run

    def row_change(self, article: str, commands: list[Command]) -> None:
        """Add the commands one published row change became."""
        self.article_rows[article] = self.article_rows.get(article, 0) + 1
        if len(commands) == 2 and commands[0].pair:
            self._pair(article, *commands)
            return
        self.close_run()
        for cmd in commands:
            self.add(cmd)

    def _pair(self, article: str, delete: Command, insert: Command) -> None:
        before = tuple(delete.old)
        if self.run_article != article:
            self.close_run()
            self.run_article = article
        if self.pending.get(before):
            self.run_inserts[self.pending[before].pop()] = None  # cancels against this DELETE
        elif not self._unstage(before):
            self.add(delete)
        self.pending.setdefault(tuple(insert.new), []).append(len(self.run_inserts))
        self.run_inserts.append(insert)
        if len(self.run_inserts) >= self.chunk:
            self._stage()

    def add(self, cmd: Command) -> None:
        self.count += 1
        self.buffer.append((self.publication, self.xact, self.count, cmd.article, cmd.op, distdb.dumps(cmd.to_json())))
        if len(self.buffer) >= self.chunk:
            self.flush()

    def _stage(self) -> None:
        if not self.staged:
            self.dist.execute(
                "CREATE TEMP TABLE IF NOT EXISTS airflow_repl_staged "
                "(seq bigint, article text, op text, data jsonb) ON COMMIT DELETE ROWS"
            )
        with (
            self.dist.cursor() as cur,
            cur.copy("COPY airflow_repl_staged (seq, article, op, data) FROM STDIN") as copy,
        ):
            for cmd in self.run_inserts:
                if cmd is not None:
                    self.staged += 1
                    copy.write_row((self.staged, cmd.article, cmd.op, distdb.dumps(cmd.to_json())))
                    self.staged_hashes[hash(tuple(cmd.new))] += 1
        self.run_inserts, self.pending = [], {}

    def _unstage(self, image: tuple) -> bool:
        """Cancel a staged INSERT of ``image``; False when none was staged."""
        key = hash(image)
        if not self.staged_hashes[key]:
            return False
        cur = self.dist.execute(
            "DELETE FROM airflow_repl_staged WHERE seq = (SELECT max(seq) FROM airflow_repl_staged "
            "WHERE data -> 'n' = %s::jsonb)",
            (distdb.dumps(list(image)),),
        )
        if not cur.rowcount:  # only the hash was equal
            return False
        self.staged_hashes[key] -= 1
        return True

    def close_run(self) -> None:
        if self.staged:
            self.flush()
            cur = self.dist.execute(
                "INSERT INTO airflow_repl.commands (publication, xact_seqno, command_id, article, op, data) "
                "SELECT %s, %s, %s + row_number() OVER (ORDER BY seq), article, op, data "
                "FROM airflow_repl_staged",
                (self.publication, self.xact, self.count),
            )
            self.count += cur.rowcount
            self.dist.execute("TRUNCATE airflow_repl_staged")
            self.staged = 0
        for cmd in self.run_inserts:
            if cmd is not None:
                self.add(cmd)
        self.run_article, self.run_inserts, self.pending = None, [], {}
        self.staged_hashes = Counter()

    def end(self, commit_time, end_lsn: int) -> None:
        """The transaction committed: queue its row (written with the batch)."""
        self.close_run()
        self.transactions.append(
            (
                self.publication,
                self.xact,
                self.xid,
                commit_time,
                lsn.int_to_lsn(end_lsn),
                self.count,
                distdb.dumps(self.article_rows),
            )
        )

    def flush_batch(self) -> None:
        """Write everything queued (commands, then their transactions) into the open
        distributor transaction."""
        self.flush()
        self._copy(
            "transactions (publication, xact_seqno, xid, commit_time, end_lsn, command_count, article_rows)",
            self.transactions,
        )
        self.transactions = []

    def flush(self) -> None:
        self._copy("commands (publication, xact_seqno, command_id, article, op, data)", self.buffer)
        self.buffer = []

    def _copy(self, target: str, rows: list[tuple]) -> None:
        if rows:
            with self.dist.cursor() as cur, cur.copy(f"COPY airflow_repl.{target} FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)


def relation_articles(articles: list[ResolvedArticle]) -> dict[tuple[str, str], ResolvedArticle]:
    """(schema, table) of every published relation -> its article.  pgoutput names a change by
    the table it happened in, so an article that includes its inheritance children (the child
    set resolved when the topology was applied) is found under each child's name as well."""
    out = {(a.table.schema, a.table.name): a for a in articles}
    for art in articles:
        for schema, table in art.children or []:
            out[(schema, table)] = art
    return out


def _map_relation(rel: pgoutput.Relation, articles: dict[tuple[str, str], ResolvedArticle]) -> _RelMap | None:
    art = articles.get((rel.namespace, rel.name))
    if art is None:
        return None
    is_child = (rel.namespace, rel.name) != (art.table.schema, art.table.name)
    if rel.replica_identity != "f":
        raise ReplError(
            f"table {rel.namespace}.{rel.name} (article {art.name!r}) was changed without REPLICA IDENTITY FULL, so "
            f"these changes carry incomplete before images and cannot be replicated exactly: restore it with "
            f"'airflow-repl apply', then drop the publication's slot and run the Snapshot Agent with reinitialize"
        )
    missing = [c for c in art.column_names if c not in rel.columns]
    if missing:
        raise ReplError(
            f"article {art.name!r} ({art.table.qualified}) no longer has column(s) {missing} at the "
            f"publisher; schema changes must go through airflow-repl's schema change operator"
        )
    # a child's columns are the parent's (by name, in any order) plus its own, which are dropped
    return _RelMap(art, [rel.columns.index(c) for c in art.column_names], is_child)


def _truncated_articles(relmaps: list[_RelMap | None]) -> list[str]:
    """The articles one TRUNCATE empties.  An article that includes its inheritance children is
    emptied only when its table and every child were truncated together (TRUNCATE without
    ONLY); any other part cannot be replicated: the subscriber table holds all their rows."""
    hits: dict[str, list[_RelMap]] = {}
    for m in relmaps:
        if m is not None:
            hits.setdefault(m.article.name, []).append(m)
    for name, maps in hits.items():
        art = maps[0].article
        children = sum(m.child for m in maps)
        if art.include_children and (len(maps) - children != 1 or children != len(art.children or [])):
            raise ReplError(
                f"a TRUNCATE of only part of {art.table.qualified} and its inheritance children cannot be "
                f"replicated to article {name!r}, which includes its children (the subscriber table holds "
                f"their rows together): drop the publication's slot and run the Snapshot Agent with reinitialize "
                f"for every subscription; delete rows instead of truncating part of the hierarchy"
            )
    return sorted(hits)


def _image(values: list, positions: list[int]) -> list:
    return [values[p] for p in positions]


def _commands(change, relmap: _RelMap) -> list[Command]:
    art = relmap.article
    if isinstance(change, pgoutput.Insert):
        return [Command(INSERT, art.name, new=_image(change.new, relmap.positions))]
    if isinstance(change, pgoutput.Delete):
        return [Command(DELETE, art.name, old=_image(change.old, relmap.positions))]
    # Update
    if change.old is None:
        raise ReplError(
            f"table {art.table.qualified} lost REPLICA IDENTITY FULL, so its updates carry no before "
            f"image; re-apply the topology (airflow-repl apply) to restore it"
        )
    old = _image(change.old, relmap.positions)
    new = [o if n is pgoutput.UNCHANGED_TOAST else n for o, n in zip(old, _image(change.new, relmap.positions))]
    return update_commands(art, old, new)


def run_log_reader(
    topology: Topology,
    publication: str,
    *,
    batch_changes: int = 20000,
    chunk: int = 5000,
    max_batches: int | None = None,
) -> dict:
    """Read everything committed before the run started (or ``max_batches`` batches) into the
    distribution database.  Returns a summary (transactions, commands, last xact_seqno,
    read_upto_lsn, seconds)."""
    started = time.monotonic()
    pgpub = naming.pg_publication(publication)
    totals = {"transactions": 0, "commands": 0, "batches": 0, "last_xact_seqno": None}
    with AgentRun(AGENT, publication) as run:
        run.step = "connecting"
        dist = run.connect(topology.distributor.require("distributor"), "distributor")
        pub = run.connect(topology.publisher.require("publisher"), "publisher")
        run.step = "the publication check"
        articles = relation_articles(distdb.load_articles(dist, publication))
        slot = distdb.slot_name(dist, publication)
        run.lock(dist)
        row = pub.execute(
            "SELECT confirmed_flush_lsn FROM pg_catalog.pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone()
        pub.commit()
        if row is None:
            raise NotInitialized(
                f"publication {publication!r} has no replication slot {slot!r} at the "
                f"publisher: run the Snapshot Agent first (if the slot was dropped, its "
                f"subscriptions must be reinitialized: Snapshot Agent with reinitialize)"
            )
        run.begin(dist)
        run.counts = totals
        state = dist.execute(
            "SELECT read_xact_seqno FROM airflow_repl.logreader_state WHERE publication = %s", (publication,)
        ).fetchone()
        read_upto = lsn.lsn_to_int(state[0]) if state and state[0] else 0
        dist.commit()
        writer = _TxnWriter(dist, publication, chunk)
        # A run reads what was committed before it started: with a live workload it finishes
        # instead of chasing the end of the WAL; the next run takes the rest.
        upto = pub.execute("SELECT pg_catalog.pg_current_wal_flush_lsn()::text").fetchone()[0]
        pub.commit()
        totals["read_upto_lsn"] = upto
        while max_batches is None or totals["batches"] < max_batches:
            n_txn, last_commit, last_end = 0, None, None
            relmaps: dict[int, _RelMap | None] = {}
            skip = False
            run.step = f"reading batch {totals['batches'] + 1} from the slot"
            with pub.transaction(), pub.cursor(name="airflow_repl_peek") as cur:
                cur.itersize = 2000
                try:
                    cur.execute(
                        "SELECT data FROM pg_catalog.pg_logical_slot_peek_binary_changes("
                        "%s, %s, %s, 'proto_version', '1', 'publication_names', %s)",
                        (slot, upto, batch_changes, pgpub),
                    )
                except psycopg.errors.ObjectNotInPrerequisiteState as exc:
                    raise ReplError(
                        f"cannot read replication slot {slot!r} of publication {publication!r}: "
                        f"{exc.diag.message_primary}. If the slot was invalidated (max_slot_wal_keep_size), "
                        f"drop it and run the Snapshot Agent with reinitialize for every subscription"
                    ) from None
                for (data,) in cur:
                    msg = pgoutput.decode(data)
                    if isinstance(msg, pgoutput.Begin):
                        xact = lsn.int_to_lsn(msg.final_lsn)
                        skip = (
                            msg.final_lsn <= read_upto
                            and dist.execute(
                                "SELECT 1 FROM airflow_repl.transactions WHERE publication = %s AND xact_seqno = %s",
                                (publication, xact),
                            ).fetchone()
                            is not None
                        )
                        writer.begin(xact, msg.xid)
                    elif isinstance(msg, pgoutput.Relation):
                        relmaps[msg.relid] = _map_relation(msg, articles)
                    elif isinstance(msg, (pgoutput.Insert, pgoutput.Update, pgoutput.Delete)):
                        relmap = relmaps.get(msg.relid)
                        if not skip and relmap is not None:
                            writer.row_change(relmap.article.name, _commands(msg, relmap))
                    elif isinstance(msg, pgoutput.Truncate):
                        if not skip:
                            for name in _truncated_articles([relmaps.get(r) for r in msg.relids]):
                                writer.row_change(name, [Command("T", name)])
                    elif isinstance(msg, pgoutput.Commit):
                        last_end = msg.end_lsn
                        if not skip:
                            writer.close_run()
                        if not skip and writer.count:
                            writer.end(msg.commit_time, msg.end_lsn)
                            n_txn += 1
                            totals["commands"] += writer.count
                            last_commit = writer.xact
                        writer.begin(None)
            if last_end is None:
                # Nothing more of this publication committed up to `upto`: move the slot there,
                # so that a busy publisher's WAL of unpublished tables is not kept forever.
                pub.execute(
                    "SELECT pg_catalog.pg_replication_slot_advance(%s, greatest(%s::pg_lsn, "
                    "confirmed_flush_lsn)) FROM pg_catalog.pg_replication_slots WHERE slot_name = %s",
                    (slot, upto, slot),
                )
                pub.commit()
                break
            run.step = f"storing batch {totals['batches'] + 1} in the distribution database"
            writer.flush_batch()
            if last_commit is not None:
                dist.execute(
                    "INSERT INTO airflow_repl.logreader_state (publication, read_xact_seqno, read_end_lsn) "
                    "VALUES (%s, %s, %s) ON CONFLICT (publication) DO UPDATE SET "
                    "read_xact_seqno = excluded.read_xact_seqno, read_end_lsn = excluded.read_end_lsn, "
                    "updated_at = now()",
                    (publication, last_commit, lsn.int_to_lsn(last_end)),
                )
                totals["last_xact_seqno"] = last_commit
            dist.commit()  # durable at the distributor ...
            pub.execute(
                "SELECT pg_catalog.pg_replication_slot_advance(%s, %s)",  # ... then advance
                (slot, lsn.int_to_lsn(last_end)),
            )
            pub.commit()
            totals["transactions"] += n_txn
            totals["batches"] += 1
        totals["seconds"] = round(time.monotonic() - started, 3)
        run.succeed(totals, transactions=totals["transactions"], commands=totals["commands"])
        log.info(
            "log reader %s: %s transactions, %s commands in %.1fs",
            publication,
            totals["transactions"],
            totals["commands"],
            totals["seconds"],
        )
        return totals
