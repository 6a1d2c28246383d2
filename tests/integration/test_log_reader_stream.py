"""The Log Reader over the streaming replication protocol, against a real publisher: a run ends
with its slot free and confirmed past what it stored, a slot still held by another session is
waited for (then named busy), and a continuous run keeps its stream through idle time longer
than the publisher's ``wal_sender_timeout`` and wakes when a transaction arrives."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from harness import AgentThread, assert_in_sync, cycle, resolved_topology, snapshotted_items, to_uri, wait_for

from airflow_repl.engine.agents import log_reader_agent
from airflow_repl.engine.errors import AgentBusy, ConnectionFailed
from airflow_repl.engine.postgres import replication_stream

SLOT = "SELECT slot_name, active, confirmed_flush_lsn FROM pg_replication_slots WHERE database = current_database()"


def _hold_slot(env):
    """Another session streaming the publication's slot (as a walsender does for a reader)."""
    slot = env.rows(env.pub, SLOT)[0][0]
    conn = psycopg.connect(env.pub, autocommit=True, replication="database")
    return replication_stream.SlotStream(conn, slot, {"proto_version": "1", "publication_names": '"airflow_repl_p"'})


def test_a_run_ends_with_its_slot_free_and_confirmed_past_what_it_stored(env, spark):
    topo = snapshotted_items(env, spark, 100)
    for i in range(5):
        env.run(env.pub, "UPDATE items SET grp = grp + 1 WHERE id = %s", (i + 1,))
    env.run(env.pub, "CREATE TABLE not_published (id int); INSERT INTO not_published VALUES (1)")
    after = env.rows(env.pub, "SELECT pg_current_wal_flush_lsn()")[0][0]
    read = log_reader_agent.run_log_reader(topo, "p")
    assert read["transactions"] == 5
    _, active, confirmed = env.rows(env.pub, SLOT)[0]
    last_end = env.rows(env.dist, "SELECT max(end_lsn) FROM airflow_repl.transactions")[0][0]
    assert not active  # let go before the run returned: the next agent may use it at once
    assert confirmed >= after >= last_end  # past the stored transactions and the unpublished work after them
    stream = _hold_slot(env)  # the next reader starts there: nothing is sent again
    stream.confirm(0, reply=True)
    message = stream.fetch(5)
    assert message is not None and message[0] == ord("k")  # a keepalive, no transaction
    stream.finish()
    stream.close()
    assert log_reader_agent.run_log_reader(topo, "p")["transactions"] == 0
    cycle(topo)
    assert_in_sync(topo)


def test_a_slot_held_by_another_session_is_waited_for_then_named_busy(env, spark, monkeypatch):
    topo = snapshotted_items(env, spark, 100)
    env.run(env.pub, "UPDATE items SET grp = 7 WHERE id = 1")
    stream = _hold_slot(env)
    threading.Timer(1.0, stream.close).start()  # its walsender ends a second later
    read = log_reader_agent.run_log_reader(topo, "p")
    assert read["transactions"] == 1
    stream = _hold_slot(env)
    monkeypatch.setattr(log_reader_agent, "SLOT_BUSY_SECONDS", 0.5)
    try:
        with pytest.raises(AgentBusy, match=r"found an object in use by another session .*is active for PID"):
            log_reader_agent.run_log_reader(topo, "p")
    finally:
        stream.close()
    failed = env.rows(env.dist, "SELECT status FROM airflow_repl.agent_history ORDER BY run_id DESC LIMIT 1")
    assert failed == [("failed",)]
    env.run(env.pub, "UPDATE items SET grp = 8 WHERE id = 1")
    read, delivered = cycle(topo)
    assert read["transactions"] == 1 and delivered["transactions"] == 2  # the first run's and this one
    assert_in_sync(topo)


@pytest.fixture
def short_sender_timeout(env):
    """The publisher ends a walsender whose client says nothing for 2 s (asking for a reply after 1 s)."""
    env.run(env.pub, "ALTER SYSTEM SET wal_sender_timeout = '2s'")
    env.run(env.pub, "SELECT pg_reload_conf()")
    assert wait_for(lambda: env.rows(env.pub, "SHOW wal_sender_timeout") == [("2s",)], 5) is not None
    yield
    env.run(env.pub, "ALTER SYSTEM RESET wal_sender_timeout")
    env.run(env.pub, "SELECT pg_reload_conf()")


def test_a_stream_answers_the_servers_requests_for_a_reply(env, spark, short_sender_timeout):
    snapshotted_items(env, spark, 10)
    stream = _hold_slot(env)
    asked = 0
    started = time.monotonic()
    while time.monotonic() - started < 5:  # reading only: the replies are the stream's own
        message = stream.fetch(0.2)
        if message is not None:
            stream.keepalive(message)
            asked += 1
    assert asked >= 3  # a keepalive a second, each answered: the walsender is still there
    stream.finish()
    stream.close()


def test_a_stream_the_publisher_ends_fails_the_run_naming_the_publisher(env, spark):
    topo = snapshotted_items(env, spark, 10)
    reader = AgentThread(
        log_reader_agent.run_log_reader, topo, "p", continuous=True, poll_interval=0.2, max_run_seconds=30
    )
    reader.start()
    walsender = "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walsender' AND datname = current_database()"
    assert wait_for(lambda: env.rows(env.pub, walsender), 10) is not None
    env.run(env.pub, f"SELECT pg_terminate_backend(pid) FROM ({walsender}) w")
    reader.join(20)
    assert not reader.is_alive() and reader.error is not None
    message = str(reader.error)
    assert message.startswith("lost the replication stream from the publisher (127.0.0.1:"), message
    assert "the run is recorded as failed; run it again" in message and "\n" not in message
    status = env.rows(env.dist, "SELECT status FROM airflow_repl.agent_history ORDER BY run_id DESC LIMIT 1")
    assert status == [("failed",)]
    env.run(env.pub, "UPDATE items SET grp = 5 WHERE id = 3")  # the next run goes on
    read, delivered = cycle(topo)
    assert read["transactions"] == delivered["transactions"] == 1
    assert_in_sync(topo)


def test_a_continuous_run_keeps_its_stream_past_wal_sender_timeout_and_wakes_on_a_commit(
    env, spark, short_sender_timeout
):
    topo = snapshotted_items(env, spark, 100)
    reader = AgentThread(
        log_reader_agent.run_log_reader, topo, "p", continuous=True, poll_interval=60, max_run_seconds=12
    )
    reader.start()
    time.sleep(6)  # idle three times the timeout: the walsender asks for replies, the run answers
    assert reader.is_alive(), reader.error
    env.run(env.pub, "UPDATE items SET grp = 9 WHERE id = 2")
    stored = lambda: env.rows(env.dist, "SELECT count(*) FROM airflow_repl.transactions")[0][0] == 1  # noqa: E731
    waited = wait_for(stored, 5)
    assert waited is not None  # woken by the stream: the 60 s poll interval would not be over
    reader.join(20)
    assert reader.error is None and reader.summary is not None
    assert reader.summary["transactions"] == 1
    assert reader.summary["continuous"]["ended_by"] == "max_run_seconds"
    cycle(topo)
    assert_in_sync(topo)


def test_a_login_without_replication_is_told_what_the_log_reader_needs(env, spark):
    topo = snapshotted_items(env, spark, 10)
    env.run(env.pub, "UPDATE items SET grp = 3 WHERE id = 1")
    env.run(env.pub, "DROP ROLE IF EXISTS lr_plain")
    env.run(env.pub, "CREATE ROLE lr_plain LOGIN PASSWORD 'lr-plain-pw'")
    try:
        servers = env.servers()
        plain = psycopg.conninfo.make_conninfo(env.pub, user="lr_plain", password="lr-plain-pw")
        plain_topo = resolved_topology(
            {**servers, "publisher": to_uri(plain), "publications": [{"name": "p", "articles": ["public.items"]}]}
        )
        with pytest.raises(ConnectionFailed) as failed:
            log_reader_agent.run_log_reader(plain_topo, "p")
        message = str(failed.value)
        assert "refused the Log Reader's replication connection: must be superuser or replication role" in message
        assert "REPLICATION attribute" in message and "max_wal_senders" in message
        assert "lr-plain-pw" not in message and "\n" not in message
    finally:
        env.run(env.pub, "DROP ROLE lr_plain")
    assert env.rows(env.dist, "SELECT count(*) FROM airflow_repl.transactions") == [(0,)]  # nothing stored
    read, delivered = cycle(topo)
    assert read["transactions"] == delivered["transactions"] == 1
    assert_in_sync(topo)


def test_a_batch_whose_commit_fails_fails_the_run_and_the_next_run_stores_the_rest_once(env, spark, monkeypatch):
    """A batch commits on its own connection while the next one is read: a failed commit fails
    the run (the batch being written is dropped), the batches before it stay, and the slot is
    never confirmed past what was committed."""
    topo = snapshotted_items(env, spark, 100)
    for i in range(60):
        env.run(env.pub, "UPDATE items SET grp = grp + 1 WHERE id = %s", (i + 1,))
    commit = log_reader_agent._StoredBatch.commit

    def failing(self):
        if self.batch.number == 3:
            raise psycopg.errors.DiskFull("could not extend file: No space left on device")
        commit(self)

    monkeypatch.setattr(log_reader_agent._StoredBatch, "commit", failing)
    with pytest.raises(psycopg.errors.DiskFull):
        log_reader_agent.run_log_reader(topo, "p", batch_changes=20)
    monkeypatch.undo()
    stored = env.rows(env.dist, "SELECT count(*) FROM airflow_repl.transactions")[0][0]
    assert 0 < stored < 60  # the first two batches
    confirmed = env.rows(env.pub, SLOT)[0][2]
    last = env.rows(env.dist, "SELECT max(end_lsn) FROM airflow_repl.transactions")[0][0]
    assert confirmed <= last  # not past what the distributor holds
    again = log_reader_agent.run_log_reader(topo, "p", batch_changes=20)
    assert stored + again["transactions"] == 60
    assert env.rows(
        env.dist, "SELECT count(*), count(DISTINCT xact_seqno), sum(command_count) FROM airflow_repl.transactions"
    ) == [(60, 60, 60)]
    assert env.rows(env.dist, "SELECT count(*) FROM airflow_repl.commands") == [(60,)]
    cycle(topo)
    assert_in_sync(topo)


def test_the_end_a_raw_reader_meets_raises_the_servers_own_error(env, spark):
    """The Log Reader takes messages straight from the connection; when that says the server
    ended the stream, the stream raises the error the server ended it with (not "no COPY in
    progress") and counts as ended, so the run names the publisher."""
    snapshotted_items(env, spark, 10)
    stream = _hold_slot(env)
    walsender = "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walsender' AND datname = current_database()"
    env.run(env.pub, f"SELECT pg_terminate_backend(pid) FROM ({walsender}) w")
    n, deadline = 0, time.monotonic() + 10
    while time.monotonic() < deadline:  # as the reader's loop: get_copy_data(1) until it says -1
        n, _ = stream.pgconn.get_copy_data(1)
        if n < 0:
            break
        time.sleep(0.05)
        try:
            stream.pgconn.consume_input()
        except psycopg.OperationalError:  # the closed socket; the error message before it is kept
            pass
    assert n == -1
    with pytest.raises(psycopg.errors.AdminShutdown, match="terminating connection due to administrator command"):
        stream.fetch(0.1, got=n)
    assert stream.ended
    stream.close()
