"""The replicated transactions and their commands in the distribution database: the Log
Reader's writes (COPY lines, the staged INSERTs of a run of key updates, its read position) and
the Distribution Agent's reads (the next transactions after a watermark and their commands, in
commit order)."""

from __future__ import annotations

import select
import time
from collections.abc import Generator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import orjson
import psycopg
from psycopg import sql

from airflow_repl.engine.postgres import lsn
from airflow_repl.engine.postgres.copy_escaping import copy_field
from airflow_repl.engine.postgres.pgoutput import PG_EPOCH
from airflow_repl.engine.state.dist_encoding import counts_json, dumps

#: A row written to ``airflow_repl.commands`` by the Log Reader, as one line of COPY's text
#: format (:func:`command_line`): publication, xact_seqno, command_id, article, op, data (JSON).
NewCommandRow = bytes


#: A row of ``airflow_repl.transactions`` written by the Log Reader, as one line of COPY's text
#: format (:func:`transaction_line`): publication, xact_seqno, xid, commit_time, end_lsn,
#: command_count, article_rows (JSON), origin (the replication origin it came from, or NULL),
#: schema_change (it holds a schema-change command).
TransactionRow = bytes


#: A staged INSERT of the Log Reader: seq, article, op, data (JSON text).
StagedRow = tuple[int, str, str, str]


def command_line(prefix: bytes, command_id: int, article: bytes, op: bytes, data: bytes) -> bytes:
    """One row of ``airflow_repl.commands`` as a line of COPY's text format: ``prefix`` is the
    publication's and the xact_seqno's fields with their tabs (:func:`copy_field`), ``article``
    a COPY field, ``data`` compact JSON (:func:`dumps_bytes`: its only backslashes are escapes,
    doubled here; it holds no newline, carriage return or tab)."""
    return b"%b%d\t%b\t%b\t%b\n" % (prefix, command_id, article, op, data.replace(b"\\", b"\\\\"))


#: The Log Reader's staging table of the INSERTs of a long run of key updates (see
#: ``log_reader_agent._TxnWriter``): temporary, emptied at each commit.
_STAGED = "airflow_repl_staged"


def last_read_lsn(conn: psycopg.Connection[Any], publication: str) -> int:
    """The commit LSN of the last transaction the Log Reader stored, as a number (0: none)."""
    row = conn.execute(
        "SELECT read_xact_seqno::text FROM airflow_repl.logreader_state WHERE publication = %s", (publication,)
    ).fetchone()
    return lsn.lsn_to_int(row[0]) if row is not None and row[0] else 0


def transaction_stored(conn: psycopg.Connection[Any], publication: str, xact_seqno: str) -> bool:
    """Is the transaction that commits at ``xact_seqno`` stored already?"""
    row = conn.execute(
        "SELECT 1 FROM airflow_repl.transactions WHERE publication = %s AND xact_seqno = %s",
        (publication, xact_seqno),
    ).fetchone()
    return row is not None


class CommandCopy:
    """One COPY of command rows (publication, xact_seqno, command_id, article, op, data), each a
    line of COPY's text format (:func:`command_line`), kept open while the lines come: the server
    stores what it has received while the caller makes the next lines.  End it (:meth:`end`)
    before the connection runs anything else; :meth:`abort` ends it with an error (nothing of it
    is stored)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._stack = ExitStack()
        cur = self._stack.enter_context(conn.cursor())
        self._copy = self._stack.enter_context(
            cur.copy("COPY airflow_repl.commands (publication, xact_seqno, command_id, article, op, data) FROM STDIN")
        )

    def write(self, lines: bytes) -> None:
        self._copy.write(lines)

    def end(self) -> None:
        """Send the end of the data and wait until the server has stored it all."""
        self._stack.close()

    def abort(self, error: BaseException) -> None:
        """End the COPY with ``error`` (the server discards it); a failure to do so is not raised
        over the error that ends the run."""
        try:
            self._stack.__exit__(type(error), error, error.__traceback__)
        except Exception:
            pass


def copy_transactions(conn: psycopg.Connection[Any], lines: list[TransactionRow]) -> None:
    """COPY transaction rows (:func:`transaction_line`); their commands first, in the same
    distributor transaction."""
    if lines:
        with (
            conn.cursor() as cur,
            cur.copy(
                "COPY airflow_repl.transactions (publication, xact_seqno, xid, commit_time, end_lsn, command_count, "
                "article_rows, origin, schema_change) FROM STDIN"
            ) as copy,
        ):
            copy.write(b"".join(lines))


def transaction_line(
    publication: bytes,
    xact_seqno: str,
    xid: int,
    commit_time: datetime | int,
    end_lsn: str,
    command_count: int,
    article_rows: dict[str, int],
    origin: str | None,
    schema_change: bool,
) -> TransactionRow:
    """One row of ``airflow_repl.transactions`` as a line of COPY's text format: ``publication``
    a COPY field (:func:`copy_field`), the positions pg_lsn text (nothing to escape), the commit
    time (a datetime, or a replication message's microseconds since 2000-01-01 UTC) ISO 8601
    text with its offset, the article rows compact JSON (:func:`dist_encoding.counts_json`: its
    only backslashes are escapes, doubled here; it holds no newline, carriage return or tab)."""
    return b"%b\t%b\t%d\t%b\t%b\t%d\t%b\t%b\t%b\n" % (
        publication,
        xact_seqno.encode(),
        xid,
        commit_time.isoformat().encode() if isinstance(commit_time, datetime) else _time_field(commit_time),
        end_lsn.encode(),
        command_count,
        counts_json(article_rows).replace(b"\\", b"\\\\"),
        copy_field(origin),
        b"t" if schema_change else b"f",
    )


def _time_field(us: int) -> bytes:
    """Microseconds since 2000-01-01 UTC (a replication message's time) as timestamptz text in
    UTC, ``YYYY-MM-DD HH:MM:SS.ffffff+00``: the text of the second made once for the commits of
    that second (a backlog's transactions commit thousands a second)."""
    second, fraction = divmod(us, 1_000_000)
    text = _SECOND_TEXT.get(second)
    if text is None:
        _SECOND_TEXT.clear()  # one second at a time: they come in commit order
        text = _SECOND_TEXT[second] = (PG_EPOCH + timedelta(seconds=second)).strftime("%Y-%m-%d %H:%M:%S").encode()
    return b"%b.%06d+00" % (text, fraction)


_SECOND_TEXT: dict[int, bytes] = {}


def stage_inserts(conn: psycopg.Connection[Any], rows: list[StagedRow], first: bool) -> None:
    """COPY (seq, article, op, data) rows into the staging table (created by the ``first``
    call of a transaction)."""
    if first:
        conn.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS {_STAGED} "
            "(seq bigint, article text, op text, data jsonb) ON COMMIT DELETE ROWS"
        )
    with conn.cursor() as cur, cur.copy(f"COPY {_STAGED} (seq, article, op, data) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


def unstage_insert(conn: psycopg.Connection[Any], image: list[Any]) -> bool:
    """Drop the last staged INSERT whose after image is ``image``; False when there is none."""
    cur = conn.execute(
        f"DELETE FROM {_STAGED} WHERE seq = (SELECT max(seq) FROM {_STAGED} WHERE data -> 'n' = %s::jsonb)",
        (dumps(image),),
    )
    return cur.rowcount > 0


def store_staged(conn: psycopg.Connection[Any], publication: str, xact_seqno: str | None, after: int) -> int:
    """Move the staged INSERTs, in staging order, into the transaction's commands, numbered
    from ``after`` + 1; returns how many."""
    cur = conn.execute(
        "INSERT INTO airflow_repl.commands (publication, xact_seqno, command_id, article, op, data) "
        f"SELECT %s, %s, %s + row_number() OVER (ORDER BY seq), article, op, data FROM {_STAGED}",
        (publication, xact_seqno, after),
    )
    conn.execute(f"TRUNCATE {_STAGED}")
    return cur.rowcount


def save_read_position(conn: psycopg.Connection[Any], publication: str, xact_seqno: str, end_lsn: str) -> None:
    """The Log Reader stored every transaction up to ``xact_seqno`` (committed by the caller,
    with them)."""
    conn.execute(
        "INSERT INTO airflow_repl.logreader_state (publication, read_xact_seqno, read_end_lsn) "
        "VALUES (%s, %s, %s) ON CONFLICT (publication) DO UPDATE SET "
        "read_xact_seqno = excluded.read_xact_seqno, read_end_lsn = excluded.read_end_lsn, "
        "updated_at = now()",
        (publication, xact_seqno, end_lsn),
    )


#: The channel on which the Log Reader's storing transaction announces that a publication has new
#: transactions (the payload: the publication's name); a continuous Distribution Agent listens
#: on it and looks at once instead of at its next poll (its poll stays: a missed notice costs
#: one poll interval, never a transaction).
STORED_CHANNEL = "airflow_repl_stored"


def announce_stored(conn: psycopg.Connection[Any], publication: str) -> None:
    """Tell the listening Distribution Agents that ``publication`` has new transactions: sent
    when the caller's transaction, which stores them, commits (never before)."""
    conn.execute("SELECT pg_catalog.pg_notify(%s, %s)", (STORED_CHANNEL, publication))


def listen_stored(conn: psycopg.Connection[Any]) -> None:
    """Listen on :data:`STORED_CHANNEL` (committed here: the connection must be between
    transactions)."""
    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(STORED_CHANNEL)))
    conn.commit()


class StoredWake:
    """A continuous Distribution Agent's wait when nothing is pending
    (:meth:`~airflow_repl.engine.runtime.continuous.Loop.idle`'s ``wake``): it ends as soon as
    ``publication``'s transactions are stored, else after the poll interval as before.  Listens
    on ``conn`` (between transactions); take the notices of a busy run with :func:`forget_stored`.
    A connection lost while it waits is not reported here: the wait goes on as a sleep, and the
    run's next statement, at the poll as before, finds it lost (a run signalled meanwhile ends
    on the signal)."""

    def __init__(self, conn: psycopg.Connection[Any], publication: str) -> None:
        self.conn, self.publication, self.lost = conn, publication, False
        listen_stored(conn)

    def __call__(self, seconds: float) -> bool:
        if not self.lost:
            started = time.monotonic()
            try:
                return wait_stored(self.conn, self.publication, seconds)
            except psycopg.OperationalError:
                self.lost = True
            seconds -= time.monotonic() - started
        time.sleep(max(0.0, seconds))
        return False


def wait_stored(conn: psycopg.Connection[Any], publication: str, seconds: float) -> bool:
    """Wait up to ``seconds`` for :func:`announce_stored` of ``publication`` on a connection
    that :func:`listen_stored` (between transactions); True when one came (also one received
    during the connection's earlier statements).  Notices of other publications are consumed.
    The wait itself is a ``select`` on the connection's socket: psycopg's own timed wait for
    notices costs about a millisecond of CPU per call, which an idle agent pays every slice."""
    deadline = time.monotonic() + seconds
    while not forget_stored(conn, publication):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([conn.fileno()], [], [], left)[0]:
            return False
    return True


def forget_stored(conn: psycopg.Connection[Any], publication: str | None = None) -> bool:
    """Take the notices received so far, without waiting (a busy agent takes them between
    batches, so that they do not pile up in the client while it never waits); whether one of
    them was ``publication``'s."""
    came = False
    for notice in conn.notifies(timeout=0):
        came = came or notice.payload == publication
    return came


#: SQL: the next transactions after a watermark.  Orders and compares the pg_lsn column of the
#: table (qualified: a bare ``xact_seqno`` would bind to the text output column and sort as
#: text), so the primary key's index returns them in order, with no sort of the backlog.
BATCH_QUERY = (
    "SELECT t.xact_seqno::text AS xact, t.command_count, t.article_rows::text, t.commit_time, t.origin, t.schema_change "
    "FROM airflow_repl.transactions AS t "
    "WHERE t.publication = %s AND t.xact_seqno > %s::pg_lsn ORDER BY t.xact_seqno LIMIT %s"
)


#: SQL: the commands of the transactions first..last, in commit order (their JSON as text, for
#: :func:`~airflow_repl.engine.state.dist_encoding.load_command`).
COMMANDS_QUERY = (
    "SELECT c.xact_seqno::text AS xact, c.command_id, c.article, c.op, c.data::text AS data "
    "FROM airflow_repl.commands AS c "
    "WHERE c.publication = %s AND c.xact_seqno BETWEEN %s::pg_lsn AND %s::pg_lsn "
    "ORDER BY c.xact_seqno, c.command_id"
)


#: A stored command as the Distribution Agent reads it: (xact_seqno, command_id, article, op,
#: data): its JSON as text, which :meth:`~airflow_repl.engine.subscriber.applier.Applier.commands`
#: decodes (:func:`~airflow_repl.engine.state.dist_encoding.load_command`) as it makes the command.
CommandRow = tuple[str, int, str, str, str]


@dataclass(slots=True)
class PendingTransaction:
    """A replicated transaction waiting for delivery (a row of ``airflow_repl.transactions``);
    read by the hundred for each batch: slots, not frozen (a frozen dataclass takes four times
    as long to make); nothing changes one once read."""

    xact: str  # its xact_seqno, as text
    command_count: int
    article_rows: dict[str, int]  # article -> rows the transaction changed
    commit_time: datetime
    origin: str | None = None  # the replication origin it came from (a Queue Reader's), if any
    schema_change: bool = False  # it holds a schema-change command


def pending_transactions(
    conn: psycopg.Connection, publication: str, after: str, limit: int
) -> list[PendingTransaction]:
    """Up to ``limit`` transactions of the publication after xact_seqno ``after``, in commit
    (LSN) order (:data:`BATCH_QUERY`)."""
    with conn.cursor() as cur:
        return pending_rows(send_pending(cur, publication, after, limit))


def send_pending(cur: psycopg.Cursor[Any], publication: str, after: str, limit: int) -> psycopg.Cursor[Any]:
    """Execute :data:`BATCH_QUERY` on ``cur`` (in a pipeline: sent, its rows read later by
    :func:`pending_rows`)."""
    return cur.execute(BATCH_QUERY, (publication, after, limit))


def pending_rows(cur: psycopg.Cursor[Any]) -> list[PendingTransaction]:
    """The pending transactions of :func:`send_pending`'s cursor.  Their rows per article come
    as JSON text, which only ever holds article names and counts (:func:`counts_json`): orjson
    reads it, with no call per value through a loader."""
    return [
        PendingTransaction(xact, count, orjson.loads(article_rows), commit_time, origin, bool(ddl))
        for xact, count, article_rows, commit_time, origin, ddl in cur.fetchall()
    ]


def batch_commands(
    conn: psycopg.Connection, publication: str, first: str, last: str
) -> Generator[CommandRow, None, None]:
    """The commands of the transactions ``first``..``last`` in commit order, read through a
    server-side cursor as they are consumed (:data:`COMMANDS_QUERY`); close the generator to
    close the cursor early."""
    with conn.cursor(name="airflow_repl_cmds") as cur:
        cur.itersize = 2000
        cur.execute(COMMANDS_QUERY, (publication, first, last))
        yield from cur


def batch_commands_list(conn: psycopg.Connection, publication: str, first: str, last: str) -> list[CommandRow]:
    """The commands of :func:`batch_commands`, read in one round trip (a caller that holds the
    whole batch in memory anyway)."""
    return conn.execute(COMMANDS_QUERY, (publication, first, last)).fetchall()


def origin_positions(conn: psycopg.Connection, publication: str, origin: str, xids: list[int]) -> dict[int, str]:
    """xid -> xact_seqno of the stored transactions of replication origin ``origin`` with those ids."""
    rows = conn.execute(
        "SELECT xid, xact_seqno::text FROM airflow_repl.transactions WHERE publication = %s AND origin = %s "
        "AND xid = ANY(%s)",
        (publication, origin, xids),
    ).fetchall()
    return {int(x): str(s) for x, s in rows}
