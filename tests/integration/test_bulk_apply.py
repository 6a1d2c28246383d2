"""Net-change application (subscription option ``bulk_apply``): the same rows as applying the
commands one by one, under every call syntax and SQL statements; what it does not cover falls
back to command-by-command delivery, with the same errors and skip_errors."""

from __future__ import annotations

import gc

import psycopg
import pytest
from harness import assert_in_sync, cycle

from airflow_repl.engine.agents import distribution_agent, log_reader_agent, read_ahead, snapshot_agent
from airflow_repl.engine.errors import DeliveryError, ReplError
from airflow_repl.engine.subscriber import bulk_apply

TABLES = {
    "b_call": {"upd_cmd": "CALL", "del_cmd": "CALL"},
    "b_scall": {"upd_cmd": "SCALL", "del_cmd": "XCALL"},
    "b_mcall": {"upd_cmd": "MCALL"},
    "b_xcall": {"upd_cmd": "XCALL", "del_cmd": "XCALL"},
    "b_sql": {"ins_cmd": "SQL", "upd_cmd": "SQL", "del_cmd": "SQL"},
    "b_multi": {"updates_as_delete_insert": "multi_row_key_changes"},
}


def _env(env, spark, tables=TABLES, **options):
    for t in tables:
        env.run(
            env.pub,
            f"CREATE TABLE {t} (id int PRIMARY KEY, code text UNIQUE, qty int NOT NULL, note text, tags text[]);"
            f"INSERT INTO {t} SELECT g, 'c' || g, g, 'n' || g, ARRAY['a', g::text] FROM generate_series(1, 200) g",
        )
    topo = env.topology([{"table": f"public.{t}", **o} for t, o in tables.items()], **{"bulk_apply": True, **options})
    snapshot_agent.run_snapshot(topo, "p", spark)
    return topo


def _workload(conn, t, base):
    """Every shape a batch can hold: updates, repeated updates of one row, key and unique-key
    changes (DELETE + INSERT pairs), a swap of unique values, inserts then deletes of the same
    row, deletes then inserts of the same key, NULLs and arrays."""
    conn.execute(f"UPDATE {t} SET qty = qty + 1 WHERE id BETWEEN {base} AND {base + 20}")
    conn.execute(f"UPDATE {t} SET note = NULL WHERE id = {base + 1}")
    conn.execute(f"UPDATE {t} SET note = 'again', tags = ARRAY['x', NULL] WHERE id = {base + 1}")
    conn.execute(f"UPDATE {t} SET id = id + 10000 WHERE id = {base + 2}")
    conn.execute(f"UPDATE {t} SET code = 'tmp{base}' WHERE id = {base + 3}")
    conn.execute(f"INSERT INTO {t} VALUES ({base + 5000}, 'new{base}', 1, 'ins', NULL)")
    conn.execute(f"DELETE FROM {t} WHERE id = {base + 5000}")
    conn.execute(f"DELETE FROM {t} WHERE id = {base + 6}")
    conn.execute(f"INSERT INTO {t} VALUES ({base + 6}, 'back{base}', 6, 'reinserted', '{{}}')")
    conn.execute(f"DELETE FROM {t} WHERE id = {base + 7}")
    conn.execute(f"INSERT INTO {t} VALUES ({base + 7000}, 'late{base}', 7, 'after', NULL)")
    conn.execute(f"UPDATE {t} SET qty = qty * 2 WHERE id = {base + 7000}")


def test_net_change_gives_the_rows_command_by_command_gives(env, spark):
    topo = _env(env, spark)
    with psycopg.connect(env.pub) as conn:
        for base in (10, 40, 70):
            for t in TABLES:
                _workload(conn, t, base)
            conn.commit()
        for t in TABLES:  # a transaction's only change of the article, a key change (kept as one UPDATE here)
            conn.execute(f"UPDATE {t} SET id = 99999, qty = -1 WHERE id = 150")
            conn.commit()
    read, delivered = cycle(topo)
    assert delivered["net_batches"] >= 1 and delivered["transactions"] == read["transactions"]
    assert_in_sync(topo)


def test_scall_and_mcall_set_only_the_columns_the_batch_changed(env, spark):
    topo = _env(
        env, spark, {"b_scall": {"upd_cmd": "SCALL"}, "b_mcall": {"upd_cmd": "MCALL"}, "b_call": {"upd_cmd": "CALL"}}
    )
    for t in ("b_scall", "b_mcall", "b_call"):
        env.run(env.sub, f"UPDATE {t} SET note = 'local' WHERE id = 5")
        env.run(env.pub, f"UPDATE {t} SET qty = 99 WHERE id = 5; UPDATE {t} SET tags = NULL WHERE id = 5")
    _, delivered = cycle(topo)
    assert delivered["net_batches"] >= 1
    rows = {
        t: env.rows(env.sub, f"SELECT qty, note, tags FROM {t} WHERE id = 5")[0]
        for t in ("b_scall", "b_mcall", "b_call")
    }
    assert rows["b_scall"] == (99, "local", None) and rows["b_mcall"] == (99, "local", None)
    assert rows["b_call"] == (99, "n5", None)  # CALL sets every column, as one by one


def test_scall_rows_changed_in_many_ways_keep_the_subscribers_other_columns(env, spark):
    """One UPDATE per set of changed columns, or, past ``MASK_STATEMENTS`` sets, one by mask: both
    set only what the batch changed (the subscriber's own values elsewhere stay), NULLs included,
    and an UPDATE that changed nothing still finds its row.  Batches of one and two transactions,
    most of them read ahead; the watermark counts every transaction once."""
    env.run(
        env.pub,
        "CREATE TABLE b_wide (id int PRIMARY KEY, a int, b text, c int, d text[], note text);"
        "INSERT INTO b_wide SELECT g, g, 'b' || g, g, ARRAY['d'], 'n' || g FROM generate_series(1, 50) g",
    )
    topo = env.topology([{"table": "public.b_wide", "upd_cmd": "SCALL"}], bulk_apply=True, commit_batch_size=2)
    snapshot_agent.run_snapshot(topo, "p", spark)
    env.run(env.sub, "UPDATE b_wide SET note = 'local' || id")
    ways = ["a = -a", "b = NULL", "c = 0, d = NULL", "a = 1, b = 'x', c = NULL", "d = ARRAY[NULL, 'q']", "a = a"]
    rounds = [ways[:2], ways[2:4], ways, ways[::-1]]  # a batch of 4 sets (a statement each), then of 6 (by mask)
    with psycopg.connect(env.pub) as conn:
        for r, chosen in enumerate(rounds):
            for w, way in enumerate(chosen):
                conn.execute(f"UPDATE b_wide SET {way} WHERE id = {r * 10 + w + 1}")
            conn.commit()
    read, delivered = cycle(topo)
    assert delivered["net_batches"] == delivered["commits"] == 2 and delivered["read_ahead_batches"] == 1
    assert env.rows(env.sub, "SELECT transactions FROM airflow_repl.subscription_state") == [(read["transactions"],)]
    columns = "id, a, b, c, d"
    assert env.rows(env.sub, f"SELECT {columns} FROM b_wide ORDER BY id") == env.rows(
        env.pub, f"SELECT {columns} FROM b_wide ORDER BY id"
    )
    assert env.rows(env.sub, "SELECT count(*) FROM b_wide WHERE note = 'local' || id") == [(50,)]


def test_a_row_not_found_falls_back_and_fails_or_skips_exactly_as_without(env, spark):
    topo = _env(env, spark, {"b_call": {}})
    env.run(env.sub, "DELETE FROM b_call WHERE id = 9")
    env.run(env.pub, "UPDATE b_call SET qty = 1 WHERE id = 8")
    env.run(env.pub, "UPDATE b_call SET qty = 1 WHERE id = 9")
    env.run(env.pub, "UPDATE b_call SET qty = 1 WHERE id = 10")
    log_reader_agent.run_log_reader(topo, "p")
    with pytest.raises(DeliveryError, match=r"key \(id=9\)"):
        distribution_agent.run_distribution(topo, "p", "sub1")
    assert env.rows(env.sub, "SELECT qty FROM b_call WHERE id IN (8, 10) ORDER BY id") == [(1,), (10,)]
    done = distribution_agent.run_distribution(topo, "p", "sub1", skip_errors=["row_not_found"])
    assert done["skipped"] == 1
    assert env.rows(env.sub, "SELECT qty FROM b_call WHERE id IN (8, 10) ORDER BY id") == [(1,), (1,)]


def test_batches_it_does_not_cover_are_applied_command_by_command(env, spark):
    topo = _env(env, spark, {"b_call": {}, "b_none": {"del_cmd": "NONE"}})
    env.run(env.pub, "DELETE FROM b_none WHERE id = 3; UPDATE b_call SET qty = 0 WHERE id = 3")
    env.run(env.pub, "TRUNCATE b_call")
    _, delivered = cycle(topo)
    assert delivered.get("net_batches", 0) == 0 and delivered["transactions"] == 2
    assert env.rows(env.sub, "SELECT count(*) FROM b_none WHERE id = 3") == [(1,)]  # NONE: not deleted
    assert env.rows(env.sub, "SELECT count(*) FROM b_call") == [(0,)]


def test_a_server_error_in_the_pipeline_falls_back_then_later_batches_go_net_again(env, spark):
    """A duplicate key raised by a statement of the batch's pipeline: the batch is applied command
    by command (the usual error naming the key, skip_errors), and the next batch goes by net change."""
    topo = _env(env, spark, {"b_call": {}})
    env.run(env.sub, "INSERT INTO b_call VALUES (300, 'sub-only', 1, NULL, NULL)")
    env.run(env.pub, "INSERT INTO b_call VALUES (300, 'c300', 3, NULL, NULL); UPDATE b_call SET qty = 0 WHERE id = 1")
    log_reader_agent.run_log_reader(topo, "p")
    with pytest.raises(DeliveryError, match=r"key \(id=300\).*duplicate key"):
        distribution_agent.run_distribution(topo, "p", "sub1")
    assert env.rows(env.sub, "SELECT qty FROM b_call WHERE id = 1") == [(1,)]  # nothing of the batch applied
    done = distribution_agent.run_distribution(topo, "p", "sub1", skip_errors=["duplicate_key"])
    assert done["skipped"] == 1
    env.run(env.pub, "UPDATE b_call SET qty = 5 WHERE id = 2")
    _, delivered = cycle(topo)
    assert delivered["net_batches"] == 1
    assert env.rows(env.sub, "SELECT id, qty FROM b_call WHERE id IN (1, 2, 300) ORDER BY id") == [
        (1, 1),
        (2, 5),
        (300, 1),
    ]


def test_a_batch_larger_than_a_chunk_is_applied_chunk_by_chunk_in_one_transaction(env, spark, monkeypatch):
    """Net change holds CHUNK_COMMANDS commands at a time (7 here): one publisher transaction of
    every shape, cut anywhere (an insert in one chunk, its update or delete in the next, a key
    change's DELETE and INSERT apart), ends as command by command; a row not found in a late
    chunk rolls back the chunks before it and fails as without net change."""
    monkeypatch.setattr(bulk_apply, "CHUNK_COMMANDS", 7)
    topo = _env(env, spark)
    with psycopg.connect(env.pub) as conn:  # one transaction
        for base in (10, 40):
            for t in TABLES:
                _workload(conn, t, base)
    read, delivered = cycle(topo)
    assert read["transactions"] == 1 and read["commands"] > 7 * 20
    assert delivered["net_batches"] == 1 and delivered["net_chunks"] > 20
    assert_in_sync(topo)

    env.run(env.sub, "DELETE FROM b_sql WHERE id = 199")
    with psycopg.connect(env.pub) as conn:
        for t in TABLES:
            conn.execute(f"UPDATE {t} SET qty = -5 WHERE id BETWEEN 180 AND 189")
        conn.execute("UPDATE b_sql SET qty = -5 WHERE id = 199")  # in the last chunk: not at the subscriber
    log_reader_agent.run_log_reader(topo, "p")
    with pytest.raises(DeliveryError, match=r"key \(id=199\)"):
        distribution_agent.run_distribution(topo, "p", "sub1")
    assert env.rows(env.sub, "SELECT count(*) FROM b_call WHERE qty = -5") == [(0,)]  # the earlier chunks: undone
    done = distribution_agent.run_distribution(topo, "p", "sub1", skip_errors=["row_not_found"])
    assert done["skipped"] == 1 and env.rows(env.sub, "SELECT count(*) FROM b_call WHERE qty = -5") == [(0,)]


@pytest.mark.parametrize("bulk", [True, False])
def test_the_agents_make_no_cyclic_garbage_per_change(env, spark, bulk):
    """The agents pause the cyclic garbage collector for a batch (gc_pause): that holds no memory
    longer only because their objects form no reference cycles.  2,400 changes with the
    collector off leave (nearly) nothing for it: not one object per change, or per command."""
    tables = {"b_call": {"upd_cmd": "CALL"}, "b_multi": {"updates_as_delete_insert": "multi_row_key_changes"}}
    topo = _env(env, spark, tables, bulk_apply=bulk, **({} if bulk else {"apply_mode": "per_command"}))
    with psycopg.connect(env.pub) as conn:
        for i in range(60):
            for t in tables:
                conn.execute(f"UPDATE {t} SET qty = qty + 1 WHERE id %% 10 = %s", (i % 10,))
                conn.execute(f"UPDATE {t} SET id = id + 1000 WHERE id = %s", (1 + i,))  # a key change: a pair
            conn.commit()
    gc.collect()
    gc.disable()
    try:
        read = log_reader_agent.run_log_reader(topo, "p")
        delivered = distribution_agent.run_distribution(topo, "p", "sub1")
    finally:
        gc.enable()
    found = gc.collect()
    assert read["commands"] >= 2400 and delivered["commands"] == read["commands"]
    assert (delivered.get("net_batches", 0) > 0) == bulk
    assert found < 100, f"{found} objects in reference cycles after {read['commands']} commands"
    assert_in_sync(topo)


# ---------------------------------------------------------------------- read-ahead
def test_each_next_batch_is_read_and_prepared_while_one_is_applied(env, spark):
    """Batch after batch of every shape, one of them holding what net change does not cover (a
    TRUNCATE): the batches after the first come from the read-ahead, the uncovered one goes
    command by command, and the rest by net change again."""
    topo = _env(env, spark, {**TABLES, "b_t": {}}, commit_batch_size=2)
    with psycopg.connect(env.pub) as conn:
        for i, base in enumerate(range(10, 190, 30)):
            for t in TABLES:
                _workload(conn, t, base)
                conn.commit()  # a transaction per table and round: 3 batches of 2 per round
            if i == 2:
                conn.execute("TRUNCATE b_t")
                conn.commit()
    read, delivered = cycle(topo)
    batches = delivered["commits"]
    assert read["transactions"] == 6 * len(TABLES) + 1 and batches == (read["transactions"] + 1) // 2
    assert delivered["read_ahead_batches"] == batches - 1  # every batch but the first
    assert delivered["net_batches"] == batches - 1  # every batch but the one with the TRUNCATE
    assert_in_sync(topo)
    assert env.rows(env.sub, "SELECT count(*) FROM b_t") == [(0,)]


def test_a_row_not_found_in_a_batch_read_ahead_fails_it_alone(env, spark):
    """The batches before it are committed; it fails naming the key; skip_errors skips it."""
    topo = _env(env, spark, {"b_call": {}}, commit_batch_size=1)
    env.run(env.sub, "DELETE FROM b_call WHERE id = 9")
    for i in range(1, 13):
        env.run(env.pub, f"UPDATE b_call SET qty = -1 WHERE id = {i}")
    log_reader_agent.run_log_reader(topo, "p")
    with pytest.raises(DeliveryError, match=r"key \(id=9\)"):
        distribution_agent.run_distribution(topo, "p", "sub1")
    assert env.rows(env.sub, "SELECT count(*) FROM b_call WHERE qty = -1") == [(8,)]  # ids 1 to 8
    done = distribution_agent.run_distribution(topo, "p", "sub1", skip_errors=["row_not_found"])
    assert done["skipped"] == 1 and done["read_ahead_batches"] == 3  # all but the first (skipped) batch
    assert env.rows(env.sub, "SELECT count(*) FROM b_call WHERE qty = -1") == [(11,)]


def test_a_read_ahead_is_used_only_after_the_watermark_it_was_read_after(env, spark):
    """What was read after one watermark is never taken for another (a batch committed short of
    where it was expected to end, or the subscription reinitialized meanwhile), nor for another
    cut of the transactions."""
    from airflow_repl.engine.state import dist_transactions

    topo = _env(env, spark, {"b_call": {}})
    for i in range(1, 4):
        env.run(env.pub, f"UPDATE b_call SET qty = -1 WHERE id = {i}")
    log_reader_agent.run_log_reader(topo, "p")
    with psycopg.connect(env.dist, autocommit=True) as conn:
        pending = dist_transactions.pending_transactions(conn, "p", "0/0", 10)
        ahead = read_ahead.ReadAhead(conn, "p", 10, lambda txns: txns[:2], lambda rows, txns: len(rows))  # type: ignore[arg-type,return-value]
        try:
            ahead.start("0/0")
            assert ahead.take(pending[0].xact) is None  # read after another watermark
            ahead.start("0/0")
            read = ahead.take("0/0")
            assert read is not None and read.prepared == 2 and read.batch == pending[:2]
            assert read.prepared_for(pending[:2]) == 2
            assert read.prepared_for(pending[:1]) is None and read.prepared_for(pending) is None  # another cut
            ahead.start(pending[-1].xact)
            assert ahead.take(pending[-1].xact) is None  # nothing after it: the agent asks again itself
            assert ahead.take("0/0") is None  # nothing started
        finally:
            ahead.close()


def _reads_counted(monkeypatch):
    """The calls of dist_transactions.pending_transactions (the read-ahead's reads of pending
    transactions; the agent's own go with its locks, in a pipeline): their limits."""
    from airflow_repl.engine.state import dist_transactions

    limits = []
    read = dist_transactions.pending_transactions

    def counted(conn, publication, after, limit):
        limits.append(limit)
        return read(conn, publication, after, limit)

    monkeypatch.setattr(dist_transactions, "pending_transactions", counted)
    return limits


def _after_records(monkeypatch, n, action):
    """``action()`` once the run recorded its ``n``-th batch at the distributor (committed
    there), each batch recorded at once."""
    monkeypatch.setattr(distribution_agent, "RECORD_INTERVAL", 0.0)
    record, calls = distribution_agent._Delivery.record, []

    def recorded(self, dist):
        had = self.unrecorded is not None
        record(self, dist)
        if had:
            calls.append(1)
            if len(calls) == n:
                action()

    monkeypatch.setattr(distribution_agent._Delivery, "record", recorded)


def test_the_read_ahead_reads_several_batches_transactions_at_once(env, spark, monkeypatch):
    """Twelve transactions in batches of two: the read-ahead asks for the pending transactions
    of four batches at once and cuts the next batches from what it kept (three reads: two for
    the five batches it reads, one after the last finding nothing; a read a batch before), each
    batch still two transactions."""
    limits = _reads_counted(monkeypatch)
    topo = _env(env, spark, {"b_call": {}}, commit_batch_size=2)
    for i in range(1, 13):
        env.run(env.pub, f"UPDATE b_call SET qty = -1 WHERE id = {i}")
    log_reader_agent.run_log_reader(topo, "p")
    limits.clear()
    delivered = distribution_agent.run_distribution(topo, "p", "sub1")
    assert delivered["commits"] == 6 and delivered["read_ahead_batches"] == 5
    assert limits == [2 * read_ahead.BATCHES_PER_READ] * 3
    assert_in_sync(topo)


@pytest.mark.parametrize("change", ["pause", "expire"])
def test_a_pause_or_expiry_between_batches_read_ahead_stops_delivery_there(env, spark, monkeypatch, change):
    """The next batches were read (and prepared) ahead when the subscription is paused or
    expires: nothing more is delivered (an expired one is refused), the watermark stays after
    the third batch; resumed, the next run delivers the rest once."""
    topo = _env(env, spark, {"b_call": {}}, commit_batch_size=1)
    for i in range(1, 13):
        env.run(env.pub, f"UPDATE b_call SET qty = qty + {i} WHERE id <= {i}")
    log_reader_agent.run_log_reader(topo, "p")
    column = "paused = true" if change == "pause" else "status = 'expired'"
    _after_records(monkeypatch, 3, lambda: env.run(env.dist, f"UPDATE airflow_repl.subscriptions SET {column}"))
    if change == "pause":
        summary = distribution_agent.run_distribution(topo, "p", "sub1")
        assert summary["paused"] is True and summary["transactions"] == 3
    else:
        with pytest.raises(ReplError, match="expired"):
            distribution_agent.run_distribution(topo, "p", "sub1")
    third = env.rows(env.dist, "SELECT xact_seqno::text FROM airflow_repl.transactions ORDER BY xact_seqno")[2]
    assert env.rows(env.sub, "SELECT xact_seqno::text FROM airflow_repl.subscription_state") == [third]
    assert env.rows(env.sub, "SELECT sum(qty) FROM b_call WHERE id <= 12") == [(78 + 1 + 4 + 9,)]  # i added to 1..i
    env.run(env.dist, "UPDATE airflow_repl.subscriptions SET paused = false, status = 'active'")
    monkeypatch.undo()
    rest = distribution_agent.run_distribution(topo, "p", "sub1")
    assert rest["transactions"] == 9
    assert_in_sync(topo)


def test_a_run_that_dies_after_a_batch_read_ahead_applies_nothing_twice(env, spark, monkeypatch):
    """The run dies between a batch's subscriber commit and its record, the next batches read
    ahead: run again, it delivers each transaction once."""
    topo = _env(env, spark, {"b_call": {}}, commit_batch_size=1)
    for i in range(1, 13):
        env.run(env.pub, f"UPDATE b_call SET qty = qty + {i} WHERE id <= {i}")
    log_reader_agent.run_log_reader(topo, "p")
    delivered, calls = distribution_agent._Delivery._delivered, []

    def dies(self, dist, txns, *args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise RuntimeError("killed")
        return delivered(self, dist, txns, *args, **kwargs)

    monkeypatch.setattr(distribution_agent._Delivery, "_delivered", dies)
    with pytest.raises(RuntimeError, match="killed"):
        distribution_agent.run_distribution(topo, "p", "sub1")
    monkeypatch.undo()
    rest = distribution_agent.run_distribution(topo, "p", "sub1")
    assert rest["transactions"] == 8  # the fourth was committed at the subscriber before the run died
    assert_in_sync(topo)


def test_ordinary_batches_are_recorded_at_the_distributor_once_a_second_tokens_at_once(env, spark, monkeypatch):
    """The distributor's record of a delivery (the subscription's delivered position, the
    tracer tokens' arrivals) is one for the ordinary batches committed within RECORD_INTERVAL;
    a batch with a tracer token is recorded at once (its arrival time is the distributor's clock
    then); the run ends with everything recorded, at the subscriber's watermark."""
    from airflow_repl.engine.monitoring import tracer
    from airflow_repl.engine.state import subscriber_state

    topo = _env(env, spark, {"b_call": {}}, commit_batch_size=1)
    env.run(
        env.dist,
        "CREATE TABLE delivered_log (n serial, xact pg_lsn); "
        "CREATE FUNCTION log_delivered() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN INSERT INTO delivered_log (xact) VALUES (NEW.delivered_xact_seqno); RETURN NEW; END $$; "
        "CREATE TRIGGER log_delivered AFTER UPDATE OF delivered_xact_seqno ON airflow_repl.subscriptions "
        "FOR EACH ROW WHEN (OLD.delivered_xact_seqno IS DISTINCT FROM NEW.delivered_xact_seqno) "
        "EXECUTE FUNCTION log_delivered()",
    )
    for i in range(1, 11):
        env.run(env.pub, f"UPDATE b_call SET qty = -1 WHERE id = {i}")
    token = tracer.post_tracer_token(topo, "p")
    for i in range(11, 21):
        env.run(env.pub, f"UPDATE b_call SET qty = -1 WHERE id = {i}")
    log_reader_agent.run_log_reader(topo, "p")
    monkeypatch.setattr(distribution_agent, "RECORD_INTERVAL", 3600.0)
    done = distribution_agent.run_distribution(topo, "p", "sub1")
    assert done["commits"] == 21 and done["net_batches"] == 21
    with psycopg.connect(env.sub) as conn:
        watermark = subscriber_state.watermark(conn, "p")
    token_xact, delivered = env.rows(
        env.dist,
        "SELECT (SELECT xact_seqno::text FROM airflow_repl.tracer_tokens WHERE token_id = %s), "
        "(SELECT delivered_xact_seqno::text FROM airflow_repl.subscriptions WHERE subscriber = 'sub1')",
        (token,),
    )[0]
    # the token's batch and the run's end: two records for 21 batches
    assert env.rows(env.dist, "SELECT xact::text FROM delivered_log ORDER BY n") == [(token_xact,), (watermark,)]
    assert delivered == watermark
    assert [r.subscriber for r in tracer.tracer_history(topo, "p", token) if r.subscriber_at] == ["sub1"]
    assert_in_sync(topo)
