"""The Log Reader Agent: moves committed transactions of published tables from the
publisher's write-ahead log (logical slot, pgoutput) into the distribution database.

The slot's changes come over the streaming replication protocol
(:mod:`~airflow_repl.engine.postgres.replication_stream`): the publisher's walsender decodes the
WAL once, while this agent stores what it sent before.  Safety protocol, per batch:

1. read decoded changes from the stream, whole transactions only, in commit order, until the
   batch holds ``batch_changes`` messages or the run's bound is reached;
2. store each transaction and its commands in the distribution database, in one distributor
   transaction, streaming commands with COPY in chunks (memory stays bounded by the chunk size
   whatever the size of a publisher transaction);
3. commit at the distributor, *then* confirm the batch's end to the server, which moves the slot
   there.

A crash before 3, or before the server took the confirmation in, leaves the slot behind: the next
run receives the same transactions again and skips those already stored (keyed by commit LSN),
so nothing is lost and nothing is doubled.

Owns the reading loop (:func:`run_log_reader`) and the order in which a transaction's commands
are stored (:class:`_TxnWriter`).  Which article a change belongs to and the commands it becomes
are :mod:`~airflow_repl.engine.agents.change_mapping`'s; the slot's statements are
:mod:`~airflow_repl.engine.postgres.slots`'; the distribution database's are
:mod:`~airflow_repl.engine.state.dist_transactions`'s; the run's lifecycle is
:class:`~airflow_repl.engine.runtime.lifecycle.AgentRun`'s.
"""

from __future__ import annotations

import json
import re
import struct
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg

from airflow_repl.engine.agents import command_lines
from airflow_repl.engine.agents.change_mapping import (
    Partitions,
    RelationMap,
    map_relation,
    relation_articles,
    row_commands,
    truncate_command,
    truncated_articles,
)
from airflow_repl.engine.articles.commands import SCHEMA, Command, OpCode
from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.errors import ConnectionFailed, NotInitialized, ReplError, ServerLost
from airflow_repl.engine.model import naming
from airflow_repl.engine.model.topology import Topology
from airflow_repl.engine.monitoring import wal_retention
from airflow_repl.engine.postgres import connections, copy_escaping, lsn, pgoutput, replication_stream, slots
from airflow_repl.engine.provisioning import deploy
from airflow_repl.engine.runtime import continuous as continuous_mode
from airflow_repl.engine.runtime import gc_pause, progress_lines
from airflow_repl.engine.runtime.lifecycle import AgentRun, ends_when_stopped, first_line, host_port
from airflow_repl.engine.state import dist_encoding, dist_publications, dist_transactions, progress, publisher_state
from airflow_repl.engine.subscriber import in_doubt

AGENT = "logreader"

#: Seconds without a message from the stream after which the reader asks the server how far it
#: has decoded (a keepalive answers: the run's bound may be reached).
QUIET_SECONDS = 0.05
#: Seconds a run waits for the slot while the walsender of an ended run still holds it.
SLOT_BUSY_SECONDS = 15.0
#: The pgoutput options of the stream (the publication's name is added).
STREAM_OPTIONS = {"proto_version": "1", "messages": "true"}


Image = tuple[Any, ...]  # a row image, as a key


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

    def __init__(
        self, dist: psycopg.Connection[Any], publication: str, chunk: int, line: command_lines.RowLine | None = None
    ) -> None:
        self.dist = dist
        self.line = line  # the compiled command lines (command_lines.row_line()), None: the Python path alone
        #: the compiled transaction lines, with the compiled command lines (None: the Python path's)
        self.transaction_line = command_lines.transaction_line() if line is not None else None
        self.publication = publication
        self.chunk = chunk
        self.buffer: list[
            dist_transactions.NewCommandRow
        ] = []  # command rows, across transactions, until the next COPY
        self.transactions: list[dist_transactions.TransactionRow] = []  # transaction rows of this batch
        self.publication_field = copy_escaping.copy_field(publication)
        self.copy: dist_transactions.CommandCopy | None = None  # the open COPY of command lines, if any
        self.begin(None)

    def begin(self, xact_seqno: str | None, xid: int = 0) -> None:
        self.xact, self.xid, self.count = xact_seqno, xid, 0
        #: the COPY fields every command line of the transaction starts with (dist_transactions.command_line);
        #: pg_lsn text has nothing to escape
        self.prefix = b"%b\t%b\t" % (self.publication_field, xact_seqno.encode() if xact_seqno else b"\\N")
        self.origin: str | None = None  # the replication origin the transaction came from
        self.schema_change = False  # the transaction holds a schema-change command
        self.tokens: list[progress.TokenMessage] = []  # tracer tokens of the publication the transaction carries
        self.article_rows: dict[str, int] = {}
        self.run_article: str | None = None
        self.run_inserts: list[Command | None] = []  # in memory; None = cancelled
        self.pending: dict[Image, list[int]] = {}  # after image -> its indexes in run_inserts
        self.staged_hashes: dict[int, int] = {}  # hash of each staged INSERT's image -> how many
        self.staged = 0  # sequence number of the last staged INSERT of the run

    def ended(self) -> None:
        """Between transactions (the next one's :meth:`begin` starts its state afresh)."""
        self.xact = None

    def row_change(self, article: str, commands: list[Command]) -> None:
        """Add the commands one published row change became."""
        self.article_rows[article] = self.article_rows.get(article, 0) + 1
        if len(commands) == 2 and commands[0].pair:
            self._pair(article, *commands)
            return
        self.close_run()
        for cmd in commands:
            self.add(cmd)

    def row_message(self, relmap: RelationMap, message: bytes | memoryview) -> bool:
        """Add the command of one row message of ``relmap`` as the compiled function writes its
        line; False (nothing added) when the message takes the Python path: the function declined
        it, or a run of pairs is open (the Python path closes it, or adds the message's pair to it)."""
        if self.line is None or self.run_article is not None or self.staged:
            return False
        count = self.count + 1
        line = self.line(
            message, relmap.positions_u16, relmap.keys_u16, relmap.pairs, self.prefix, count, relmap.name_field
        )
        if line is None:
            return False
        rows, name = self.article_rows, relmap.article.name
        rows[name] = rows.get(name, 0) + 1
        self.count = count
        self.buffer.append(line)
        if len(self.buffer) >= self.chunk:
            self.flush()
        return True

    def schema(self, cmd: Command) -> None:
        """Add a schema-change command: a point between the row changes before and after it."""
        self.close_run()
        self.schema_change = True
        self.add(cmd)

    def _pair(self, article: str, delete: Command, insert: Command) -> None:
        before = _image(delete.old)
        if self.run_article != article:
            self.close_run()
            self.run_article = article
        if self.pending.get(before):
            self.run_inserts[self.pending[before].pop()] = None  # cancels against this DELETE
        elif not self._unstage(before):
            self.add(delete)
        self.pending.setdefault(_image(insert.new), []).append(len(self.run_inserts))
        self.run_inserts.append(insert)
        if len(self.run_inserts) >= self.chunk:
            self._stage()

    def add(self, cmd: Command) -> None:
        self.count += 1
        article = _FIELDS.get(cmd.article)
        if article is None:
            article = _FIELDS[cmd.article] = copy_escaping.copy_field(cmd.article)
        data = dist_encoding.command_data(cmd.to_json())
        self.buffer.append(dist_transactions.command_line(self.prefix, self.count, article, _OPS[cmd.op], data))
        if len(self.buffer) >= self.chunk:
            self.flush()

    def _stage(self) -> None:
        rows: list[dist_transactions.StagedRow] = []
        first = not self.staged
        for cmd in self.run_inserts:
            if cmd is not None:
                self.staged += 1
                rows.append((self.staged, cmd.article, cmd.op, dist_encoding.dumps(cmd.to_json())))
                key = hash(_image(cmd.new))
                self.staged_hashes[key] = self.staged_hashes.get(key, 0) + 1
        self.end_copy()
        dist_transactions.stage_inserts(self.dist, rows, first)
        self.run_inserts, self.pending = [], {}

    def _unstage(self, image: Image) -> bool:
        """Cancel a staged INSERT of ``image``; False when none was staged."""
        key = hash(image)
        if not self.staged_hashes.get(key):
            return False
        self.end_copy()
        if not dist_transactions.unstage_insert(self.dist, list(image)):  # only the hash was equal
            return False
        self.staged_hashes[key] -= 1
        return True

    def close_run(self) -> None:
        if self.run_article is None:  # no run open (nothing staged or pending without one)
            return
        if self.staged:
            self.flush()
            self.end_copy()
            self.count += dist_transactions.store_staged(self.dist, self.publication, self.xact, self.count)
            self.staged = 0
        for cmd in self.run_inserts:
            if cmd is not None:
                self.add(cmd)
        self.run_article, self.run_inserts, self.pending = None, [], {}
        self.staged_hashes = {}

    def end(self, commit_time: datetime | int, end_lsn: int) -> None:
        """The transaction committed: queue its row (written with the batch, or with the
        commands before it once ``chunk`` rows wait)."""
        self.close_run()
        assert self.xact is not None  # set by begin() at the transaction's start
        compiled = self.transaction_line
        line = None
        if compiled is not None and type(commit_time) is int:
            line = compiled(
                self.publication_field,
                self.xact,
                self.xid,
                commit_time,
                end_lsn,
                self.count,
                self.article_rows,
                self.origin,
                self.schema_change,
            )
        self.transactions.append(
            line
            or dist_transactions.transaction_line(
                self.publication_field,
                self.xact,
                self.xid,
                commit_time,
                lsn.int_to_lsn(end_lsn),
                self.count,
                self.article_rows,
                self.origin,
                self.schema_change,
            )
        )
        if len(self.transactions) >= self.chunk:
            self.flush_batch()

    def flush_batch(self) -> None:
        """Write everything queued (commands, then their transactions) into the open
        distributor transaction (which holds the whole batch)."""
        self.flush()
        self.end_copy()
        dist_transactions.copy_transactions(self.dist, self.transactions)
        self.transactions = []

    def hand_off(
        self, dist: psycopg.Connection[Any]
    ) -> tuple[dist_transactions.CommandCopy | None, list[dist_transactions.TransactionRow]]:
        """The batch's open COPY and its queued transaction rows, for another thread to finish on
        the batch's connection; the next batch is written on ``dist``."""
        self.flush()
        handed = self.copy, self.transactions
        self.copy, self.transactions, self.dist = None, [], dist
        return handed

    def flush(self) -> None:
        """Send the buffered command lines on the open COPY (opened by the first)."""
        if self.buffer:
            if self.copy is None:
                self.copy = dist_transactions.CommandCopy(self.dist)
            self.copy.write(b"".join(self.buffer))
            self.buffer = []

    def end_copy(self) -> None:
        """End the open COPY (waiting until the distributor has stored its lines): the connection
        runs another statement next."""
        if self.copy is not None:
            copy, self.copy = self.copy, None
            copy.end()

    def abort_copy(self, error: BaseException) -> None:
        """The batch failed: end the open COPY with the error (the batch's transaction is rolled back)."""
        if self.copy is not None:
            copy, self.copy = self.copy, None
            copy.abort(error)


#: The publisher's reasons to refuse a replication connection (PostgreSQL 15's and later wordings).
_WALSENDER_REFUSAL = re.compile(
    r"must be superuser or replication role to start walsender"
    r"|permission denied to start WAL sender"
    r"|number of requested standby connections exceeds max_wal_senders \(currently \d+\)"
)
_ROW_CHANGES = (pgoutput.Insert, pgoutput.Update, pgoutput.Delete)
#: The kind bytes of their messages, and where the relation id follows (unsigned 32-bit, network order).
_ROW_KINDS = frozenset(b"IUD")
#: XLogData messages of the stream: their kind byte, and where the pgoutput message starts.
_XLOG_DATA, _XLOG_DATA_HEADER = replication_stream.XLOG_DATA_KIND, replication_stream.XLOG_DATA_HEADER
_RELID_AT = struct.Struct("!I").unpack_from
#: Begin and Commit messages: their kind bytes, the size of their fields after it, and the fields.
_BEGIN_KIND, _COMMIT_KIND = b"B"[0], b"C"[0]
_BEGIN_SIZE, _COMMIT_SIZE = pgoutput.BEGIN_FIELDS.size, pgoutput.COMMIT_FIELDS.size
_BEGIN_AT, _COMMIT_AT = pgoutput.BEGIN_FIELDS.unpack_from, pgoutput.COMMIT_FIELDS.unpack_from
#: Article names as COPY fields, and operations as their byte: the same few for every command.
_FIELDS: dict[str, bytes] = {}
_OPS: dict[str, bytes] = {op: op.value.encode() for op in OpCode}


def _image(values: list[Any] | None) -> Image:
    assert values is not None  # a pair's DELETE has its before image and its INSERT its after image
    return tuple(values)


@dataclass
class _Batch:
    """What one batch read from the stream."""

    number: int
    transactions: int = 0  # transactions of published changes read (and to be stored)
    last_commit: str | None = None  # xact_seqno of the last of them
    last_end: int | None = None  # end LSN of the last transaction read, published changes or not
    #: relation id -> its last Relation message.  The stream's, not the batch's: the server sends
    #: a relation once per stream (and again when its definition changes), before its first change.
    relations: dict[int, pgoutput.Relation] = field(default_factory=dict)
    relmaps: dict[int, RelationMap | None] = field(default_factory=dict)  # relation id -> its map, once used
    partitions: Partitions = field(default_factory=Partitions)  # the stream's, as relations
    tokens: list[progress.ReadToken] = field(default_factory=list)  # tracer tokens read, with their commit LSN
    skip: bool = False  # the transaction being read is stored already

    def relmap(self, relid: int, articles: dict[tuple[str, str], ResolvedArticle]) -> RelationMap | None:
        """The map of a relation whose change is stored (mapped on first use, so that a change
        already stored by an earlier run is never checked against today's definitions)."""
        try:
            return self.relmaps[relid]
        except KeyError:  # not mapped yet
            pass
        rel = self.relations.get(relid)
        if rel is None:  # never: a change of it would be lost without a word
            raise ReplError(
                f"the replication stream sent a change of relation {relid} before describing it; "
                f"nothing of the batch is stored: run the Log Reader again"
            )
        relmap = self.relmaps[relid] = map_relation(rel, articles, self.partitions)
        return relmap


@dataclass
class _StoredBatch:
    """A batch whose lines are all sent on its own distributor connection: the rest of its
    distributor transaction, finished by the committer thread while the next batch is read."""

    batch: _Batch
    end_lsn: int
    heard: int  # the server's position heard before the batch was stored (confirmed with it)
    publication: str
    conn: psycopg.Connection[Any]
    copy: dist_transactions.CommandCopy | None
    transactions: list[dist_transactions.TransactionRow]
    definitions: list[ResolvedArticle]
    change_ids: list[int]

    def commit(self) -> None:
        """End the COPY of its commands, write its transaction rows, the article definitions its
        schema changes made, its tracer tokens and the read position, and commit."""
        if self.copy is not None:
            self.copy.end()
        dist_transactions.copy_transactions(self.conn, self.transactions)
        for article in self.definitions:
            dist_publications.save_article_definition(self.conn, article)
        progress.record_read(self.conn, self.batch.tokens)
        if self.batch.last_commit is not None:
            dist_transactions.save_read_position(
                self.conn, self.publication, self.batch.last_commit, lsn.int_to_lsn(self.end_lsn)
            )
            dist_transactions.announce_stored(self.conn, self.publication)  # delivered at the commit
        self.conn.commit()


class _LogReader:
    """One run of the Log Reader: the publication's slot, articles and the run's totals."""

    def __init__(self, run: AgentRun, topology: Topology, publication: str) -> None:
        self.run, self.publication, self.topology = run, publication, topology
        run.step = "connecting"
        self.dist = run.connect(topology.distributor.require("distributor"), "distributor")
        self.pub = run.connect(topology.publisher.require("publisher"), "publisher")
        run.step = "the publication check"
        self.articles: dict[tuple[str, str], ResolvedArticle] = relation_articles(
            dist_publications.load_articles(self.dist, publication)
        )
        self.slot = dist_publications.slot_name(self.dist, publication)
        self.pg_publication = naming.pg_publication(publication)
        self.pub_conninfo = topology.publisher.require("publisher")
        self.stream: replication_stream.SlotStream | None = None
        self.heard = 0  # the server decoded up to here, and sent every transaction committed before it
        self.relations: dict[int, pgoutput.Relation] = {}  # the stream's relations (see _Batch)
        self.relmaps: dict[int, RelationMap | None] = {}
        self.partitions = Partitions()  # the stream's partitions of partitioned articles (see _Batch)
        self.at_bound = False  # everything committed before the run's bound is read
        self.changed: dict[str, ResolvedArticle] = {}  # definitions changed by this batch's schema changes
        self.change_ids: list[int] = []  # the batch's schema changes, forgotten at the publisher once stored
        self.totals: dict[str, Any] = {"transactions": 0, "commands": 0, "batches": 0, "last_xact_seqno": None}
        self.batches_stored = 0  # handed to the committer (the totals count them once committed)
        #: a stored batch whose distributor transaction the committer thread finishes (one at a time)
        self.committer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="airflow-repl-logreader-commit")
        self.in_flight: tuple[Future[None], _StoredBatch] | None = None
        self.lines: progress_lines.Lines | None = None  # the run's progress lines, one when due after a settled batch

    def check_slot(self) -> None:
        """The publication's slot exists (the Snapshot Agent creates it)."""
        found = slots.exists(self.pub, self.slot)
        self.pub.commit()
        if not found:
            raise NotInitialized(
                f"publication {self.publication!r} has no replication slot {self.slot!r} at the "
                f"publisher: run the Snapshot Agent first (if the slot was dropped, its "
                f"subscriptions must be reinitialized: Snapshot Agent with reinitialize)"
            )

    def load_state(self, chunk: int) -> None:
        """Where the last run stopped, and where this one stops: at what was committed before
        it started (with a live workload it finishes instead of chasing the end of the WAL;
        the next run takes the rest)."""
        self.read_upto = dist_transactions.last_read_lsn(self.dist, self.publication)
        self.dist.commit()
        # batches alternate between two connections of their own: one commits while the next is written
        conninfo = self.topology.distributor.require("distributor")
        first = self.run.connect(conninfo, "distributor")
        self.spare = self.run.connect(conninfo, "distributor")
        self.writer = _TxnWriter(first, self.publication, chunk, command_lines.row_line())
        self.lsn_text = command_lines.lsn_text()  # lsn.int_to_lsn, compiled when the command lines are
        self.new_bound()
        self.open_stream()

    def open_stream(self) -> None:
        """Start streaming the slot from where it was confirmed.  A slot still held by the
        walsender of a run that just ended (it lets go when its process notices) is waited for,
        at most :data:`SLOT_BUSY_SECONDS`; after that, ObjectInUse says so."""
        self.run.step = "the start of the replication stream"
        options = {**STREAM_OPTIONS, "publication_names": replication_stream.quoted_names([self.pg_publication])}
        waited_until = time.monotonic() + SLOT_BUSY_SECONDS
        while True:
            conn = self._replication_connection()
            try:
                self.stream = replication_stream.SlotStream(conn, self.slot, options)
                return
            except psycopg.errors.ObjectInUse:
                conn.close()
                if time.monotonic() >= waited_until:
                    raise
                time.sleep(0.1)
            except psycopg.errors.ObjectNotInPrerequisiteState as exc:
                conn.close()
                raise ReplError(
                    f"cannot read replication slot {self.slot!r} of publication {self.publication!r}: "
                    f"{exc.diag.message_primary}. If the slot was invalidated (max_slot_wal_keep_size), "
                    f"drop it and run the Snapshot Agent with reinitialize for every subscription"
                ) from None
            except BaseException:
                conn.close()
                raise

    def _replication_connection(self) -> psycopg.Connection[Any]:
        """A logical replication connection to the publisher; refused for the login (no
        ``REPLICATION`` attribute) or for want of a WAL sender: a message that says so."""
        try:
            return connections.connect(self.pub_conninfo, "publisher", autocommit=True, replication="database")
        except ConnectionFailed as exc:
            refusal = _WALSENDER_REFUSAL.search(str(exc))
            if refusal is None:
                raise
            raise ConnectionFailed(
                f"the publisher ({connections.describe(self.pub_conninfo)}) refused the Log Reader's replication "
                f"connection: {refusal.group(0)}. The Log Reader streams the slot over a logical replication "
                f"connection: its login needs the REPLICATION attribute (ALTER ROLE ... REPLICATION), and the "
                f"publisher a free WAL sender (max_wal_senders)"
            ) from None

    def close_stream(self, cleanly: bool) -> None:
        """End the stream: ``cleanly``, the server takes in the last confirmation and lets go of
        the slot before this returns; else the connection is only closed."""
        stream, self.stream = self.stream, None
        if stream is None:
            return
        try:
            if cleanly:
                stream.finish()
        finally:
            stream.close()

    def stream_lost(self) -> bool:
        """Whether the stream's connection is gone (the server ended it, or the network)."""
        stream = self.stream
        return stream is not None and (stream.ended or stream.pgconn.status == psycopg.pq.ConnStatus.BAD)

    def new_bound(self) -> None:
        """Read up to what is committed now (a continuous run takes a new bound each round)."""
        self.upto = slots.current_flush_lsn(self.pub)
        self.pub.commit()
        self.bound = lsn.lsn_to_int(self.upto)
        self.at_bound = False
        self.totals["read_upto_lsn"] = self.upto

    def reload_articles(self) -> None:
        """The publication's article definitions as stored now (between rounds of a continuous
        run; the schema changes this run read are stored with their batches)."""
        self.articles = relation_articles(dist_publications.load_articles(self.dist, self.publication))
        self.dist.commit()
        self.relmaps.clear()  # mapped again, with these definitions, on their next change
        self.full_identity_of_partitions()

    def full_identity_of_partitions(self) -> None:
        """REPLICA IDENTITY FULL on the partitions of the partitioned articles that lack it
        (created or attached since the topology was applied), before their rows are updated
        or deleted, whose changes would otherwise stop this agent (:class:`Partitions`)."""
        partitioned = {a.name: a for a in self.articles.values() if a.table.partitioned}
        if not partitioned:
            return
        self.run.step = "the replica identity of the partitions"
        self.pub.commit()  # each partition's change in a savepoint of a transaction of its own
        deploy.full_replica_identity_of_partitions(self.pub, list(partitioned.values()))

    def read_batch(self, batch_changes: int) -> _Batch:
        """Read up to ``batch_changes`` messages (whole transactions) from the stream into the
        writer; nothing once the run's bound is reached."""
        batch = _Batch(
            self.batches_stored + 1, relations=self.relations, relmaps=self.relmaps, partitions=self.partitions
        )
        self.run.step = f"reading batch {batch.number} from the slot"
        try:
            if not self.at_bound:
                self._read_stream(batch, batch_changes)
        except BaseException as exc:
            self.writer.abort_copy(exc)
            raise
        return batch

    def _read_stream(self, batch: _Batch, batch_changes: int) -> None:
        """Messages until, at the end of a transaction, the batch holds ``batch_changes`` of
        them or the run's bound is reached: a commit at or past it, or, between transactions, a
        keepalive saying the server has decoded past it (so every transaction committed before
        it was received).  Messages are taken raw from the connection (the stream's
        :meth:`~replication_stream.SlotStream.fetch` only when none is at hand): this loop runs
        once per message of the backlog."""
        assert self.stream is not None  # opened by load_state
        stream, decode, read = self.stream, pgoutput.decode, self._read
        rows, relmap_of, row_message = _ROW_KINDS, batch.relmap, self.writer.row_message
        get, view = stream.pgconn.get_copy_data, stream.take_pending()
        messages = 0
        while True:
            if view is None:
                n, view = get(1)
                if (
                    n <= 0
                ):  # none at hand (or the stream's end): wait a little for one, else ask how far the server has decoded
                    view = stream.fetch(QUIET_SECONDS, got=n)
                    if view is None:
                        self._heard(None)
                        continue
            if view[0] != _XLOG_DATA:
                position = stream.keepalive(view)
                view = None
                if self._heard(position):
                    return
                continue
            data, view = view[_XLOG_DATA_HEADER:], None
            messages += 1
            kind = data[0] if data else 0
            if kind in rows:  # its compiled command line (command_lines), else the Python path, which
                # takes a transaction stored already, a relation not mapped, and all without the compiled module
                relmap = None if batch.skip or len(data) < 5 else relmap_of(_RELID_AT(data, 1)[0], self.articles)
                if relmap is None or relmap.incomplete or not row_message(relmap, data):
                    read(decode(bytes(data)), batch)
            elif kind == _BEGIN_KIND and len(data) > _BEGIN_SIZE:  # every transaction's two messages:
                final_lsn, _, xid = _BEGIN_AT(data, 1)  # their fields straight from the bytes
                self._begin(final_lsn, xid, batch)
            elif kind == _COMMIT_KIND and len(data) > _COMMIT_SIZE:
                _, _, end_lsn, at = _COMMIT_AT(data, 1)
                self._commit(end_lsn, at, batch)
            else:
                read(decode(bytes(data)), batch)
            if kind == _COMMIT_KIND and self._batch_ends(batch, messages >= batch_changes):
                return

    def _batch_ends(self, batch: _Batch, full: bool) -> bool:
        """After a commit: whether the batch ends (``full``, or the run's bound reached)."""
        if batch.last_end is None:
            return False
        self.at_bound = batch.last_end >= self.bound
        return self.at_bound or full

    def _heard(self, position: int | None) -> bool:
        """No message for a while (None): ask the server how far it has decoded.  A keepalive's
        ``position`` between transactions: everything committed before it was received; True
        when that reaches the run's bound."""
        assert self.stream is not None  # opened by load_state
        if position is None:
            self.stream.confirm(self.stream.confirmed, reply=True)
            return False
        if self.writer.xact is not None:
            return False
        self.heard = max(self.heard, position)
        self.at_bound = position >= self.bound
        return self.at_bound

    def _read(self, msg: Any, batch: _Batch) -> None:
        """One decoded pgoutput message (row changes, the most frequent, first)."""
        if type(msg) in _ROW_CHANGES:
            relmap = None if batch.skip else batch.relmap(msg.relid, self.articles)
            if relmap is not None:
                self.writer.row_change(relmap.article.name, row_commands(msg, relmap))
        elif isinstance(msg, pgoutput.Begin):
            self._begin(msg.final_lsn, msg.xid, batch)
        elif isinstance(msg, pgoutput.Origin):
            self.writer.origin = msg.name
        elif isinstance(msg, pgoutput.LogicalMessage) and msg.transactional:
            self._message(msg, batch)
        elif isinstance(msg, pgoutput.Relation):
            batch.relations[msg.relid] = msg
            batch.relmaps.pop(msg.relid, None)
            batch.partitions.relation(msg, self.articles)
        elif isinstance(msg, pgoutput.Truncate):
            if not batch.skip:
                for name in truncated_articles([batch.relmap(r, self.articles) for r in msg.relids]):
                    self.writer.row_change(name, [truncate_command(name)])
        elif isinstance(msg, pgoutput.Commit):
            self._commit(msg.end_lsn, msg.commit_time, batch)

    def _message(self, msg: pgoutput.LogicalMessage, batch: _Batch) -> None:
        """A transactional logical message: ours mark an immediate subscriber's change (its
        origin), a schema change or a tracer token; others are not ours."""
        if msg.prefix == naming.ORIGIN_MESSAGE:
            self.writer.origin = msg.content.decode()  # an immediate subscriber's change (see naming)
        elif msg.prefix == naming.DDL_MESSAGE:
            self._schema_change(json.loads(msg.content), batch)
        elif msg.prefix == naming.TRACER_MESSAGE:
            self._tracer(msg.content)

    def _schema_change(self, message: dict[str, Any], batch: _Batch) -> None:
        """A schema change of one article (``airflow-repl schema-change``): store it as a
        command at this point of the transaction, and map the changes after it with the
        article's new definition.  Another publication's message is not ours."""
        if message.get("publication") != self.publication:
            return
        after = ResolvedArticle.from_dict(message["definition"])
        before = next((a for a in self.articles.values() if a.name == after.name), None)
        if before is None:
            raise ReplError(
                f"a schema change of article {after.name!r} reached the Log Reader of publication "
                f"{self.publication!r}, which has no such article: run 'airflow-repl apply', then the Log Reader"
            )
        for key in [k for k, a in self.articles.items() if a.name == after.name]:
            del self.articles[key]
        self.articles[(after.table.schema, after.table.name)] = after
        batch.relmaps.clear()  # mapped again, with the new definition, on their next change
        if message.get("change_id") is not None:
            self.change_ids.append(int(message["change_id"]))
        if batch.skip:
            return  # stored already (and its definition with it)
        change = {"change": message["change"], "statement": message["statement"]}
        self.writer.schema(
            Command(SCHEMA, after.name, schema={**change, "before": before.to_dict(), "after": message["definition"]})
        )
        self.changed[after.name] = after

    def _tracer(self, content: bytes) -> None:
        """A tracer token: kept with its transaction when it is this publication's (every slot of
        the publisher's database decodes every message)."""
        token = progress.parse_token(content)
        if token is not None and token.publication == self.publication:
            self.writer.tokens.append(token)

    def _begin(self, final_lsn: int, xid: int, batch: _Batch) -> None:
        """A transaction (its commit record at ``final_lsn``) starts: skip it when an earlier run
        stored it already."""
        xact = self.lsn_text(final_lsn)
        if final_lsn <= self.read_upto:
            self.writer.end_copy()  # the distributor is asked
            batch.skip = dist_transactions.transaction_stored(self.writer.dist, self.publication, xact)
        else:
            batch.skip = False
        self.writer.begin(xact, xid)

    def _commit(self, end_lsn: int, commit_time: datetime | int, batch: _Batch) -> None:
        """A transaction ends (``commit_time``: a datetime, or the message's microseconds since
        2000): queue it when it changed published rows or carries a tracer token (a transaction
        without commands, delivered like any other: the token arrives in order)."""
        batch.last_end = end_lsn
        writer = self.writer
        if not batch.skip:
            writer.close_run()
        if not batch.skip and (writer.count or writer.tokens):
            writer.end(commit_time, end_lsn)
            if writer.tokens:
                batch.tokens += [(token, str(writer.xact)) for token in writer.tokens]
            batch.transactions += 1
            self.totals["commands"] += writer.count
            batch.last_commit = writer.xact
        writer.ended()

    def store(self, batch: _Batch, end_lsn: int) -> None:
        """Hand the batch, with its article definitions, tokens and the read position, to the
        committer thread, which finishes its distributor transaction and commits while the next
        batch is read (on the other connection).  The batch before is settled first
        (:meth:`settle`): batches commit in order."""
        self.run.step = f"storing batch {batch.number} in the distribution database"
        conn = self.writer.dist
        self.writer.flush()
        self.settle()
        copy, transactions = self.writer.hand_off(self.spare)
        self.spare = conn
        work = _StoredBatch(
            batch,
            end_lsn,
            self.heard,
            self.publication,
            conn,
            copy,
            transactions,
            list(self.changed.values()),
            self.change_ids,
        )
        self.changed, self.change_ids = {}, []
        self.in_flight = (self.committer.submit(work.commit), work)
        self.batches_stored += 1

    def settle(self) -> None:
        """Wait for the batch being committed (its error, if any, is raised here), then confirm
        it to the server: never before it is committed at the distributor, the slot moves to its
        end, and the publisher may drop the WAL before it."""
        if self.in_flight is None:
            return
        (future, work), self.in_flight = self.in_flight, None
        self.run.step = f"storing batch {work.batch.number} in the distribution database"
        try:
            future.result()
        except BaseException as exc:
            self.writer.abort_copy(exc)  # the next batch's, on the other connection: nothing of it is stored
            raise
        self.confirm(work)
        if work.batch.last_commit is not None:
            self.totals["last_xact_seqno"] = work.batch.last_commit
        self.totals["transactions"] += work.batch.transactions
        self.totals["batches"] += 1
        if self.lines is not None:
            self.report(self.lines, work.end_lsn)

    def confirm(self, work: _StoredBatch) -> None:
        """Confirm a committed batch to the server, and forget the schema changes it stored."""
        assert self.stream is not None  # opened by load_state
        self.stream.confirm(max(work.end_lsn, work.heard))
        publisher_state.forget_schema_changes(self.pub, work.change_ids)
        self.pub.commit()

    def abandon(self) -> None:
        """A failed run: wait for the committer thread to let go of its connection (its error is
        the run's to report, if the run has none) and stop it."""
        if self.in_flight is not None:
            future, _ = self.in_flight
            self.in_flight = None
            wait([future])
        self.committer.shutdown(wait=True)

    def report(self, lines: progress_lines.Lines, end_lsn: int) -> None:
        """A progress line, when one is due: what the run read, and the LSN it reached against
        the publisher's WAL end now."""
        if not lines.due():
            return
        wal_end = slots.current_flush_lsn(self.pub)
        self.pub.commit()
        t = self.totals
        reached = lsn.int_to_lsn(end_lsn)
        behind = lsn.lsn_to_int(wal_end) - end_lsn
        lines.log(
            progress_lines.log_reader_line(t["transactions"], t["commands"], t["batches"], reached, wal_end, behind)
        )

    def confirm_idle(self) -> None:
        """Nothing more of this publication committed up to where the run stops: once the last
        batch is settled, confirm where the server has decoded to, so that a busy publisher's WAL
        of unpublished tables is not kept forever."""
        self.settle()
        assert self.stream is not None  # opened by load_state
        self.stream.confirm(self.heard)


@ends_when_stopped
def run_log_reader(
    topology: Topology,
    publication: str,
    *,
    batch_changes: int = 20000,
    chunk: int = 5000,
    max_batches: int | None = None,
    continuous: bool = False,
    poll_interval: float | None = None,
    max_run_seconds: float | None = None,
) -> dict[str, Any]:
    """Read everything committed before the run started (or ``max_batches`` batches) into the
    distribution database.  Returns a summary (transactions, commands, batches, last
    xact_seqno, read_upto_lsn, seconds).  ``continuous``: keep reading what is committed
    later, every ``poll_interval`` seconds when idle, until ``max_run_seconds`` or SIGTERM
    (:mod:`~airflow_repl.engine.runtime.continuous`)."""
    opts = continuous_mode.options(continuous, poll_interval, max_run_seconds)
    in_doubt.resolve_quietly(topology, publication)  # immediate subscribers' prepared transactions first
    with AgentRun(AGENT, publication) as run:
        lines = progress_lines.Lines(run)  # its interval checked before anything changes
        reader = _LogReader(run, topology, publication)
        reader.lines = lines
        run.lock(reader.dist)
        reader.check_slot()
        run.begin(reader.dist)
        run.counts = totals = reader.totals
        wal_retention.warn_if_exceeded(reader.pub, topology, publication, reader.slot, totals)  # before reading
        reader.full_identity_of_partitions()
        try:
            reader.load_state(chunk)
            with continuous_mode.Loop(opts, run, totals) as loop:
                _read_loop(reader, loop, batch_changes, max_batches)
            reader.settle()
            run.step = "the end of the replication stream"
            reader.close_stream(cleanly=True)
        except psycopg.OperationalError as exc:
            if reader.stream_lost():  # named: the run's other connections are all fine
                raise ServerLost(
                    f"lost the replication stream from the publisher ({host_port(reader.pub_conninfo)}): {first_line(exc)}"
                ) from None
            raise
        finally:  # a failed run closes its stream, and its committer lets go, before the failure is looked into
            reader.abandon()
            reader.close_stream(cleanly=False)
        return run.succeed(loop.summary(totals))


def _read_loop(
    reader: _LogReader,
    loop: continuous_mode.Loop,
    batch_changes: int,
    max_batches: int | None,
) -> None:
    """Batch after batch up to the run's bound; a continuous run then takes a new bound (at
    once when the round stored transactions, else when the stream brings something or after
    ``poll_interval``)."""
    worked = False
    while max_batches is None or reader.batches_stored < max_batches:
        with gc_pause.paused():
            batch = reader.read_batch(batch_changes)
        if batch.last_end is None:
            reader.confirm_idle()
            assert reader.stream is not None  # opened by load_state
            if not loop.idle(worked, wake=reader.stream.wait):
                return
            reader.reload_articles()  # as the next ordinary run would: an 'apply' meanwhile counts
            reader.new_bound()
            worked = False
            continue
        reader.store(batch, batch.last_end)  # committed at the distributor, then confirmed to the server
        worked = worked or batch.transactions > 0
        if not loop.go_on():
            return
