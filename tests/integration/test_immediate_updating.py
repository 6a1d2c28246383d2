"""Immediate updating subscriptions end to end on real servers: an application's plain changes
at an immediate subscriber committed at both sides with two-phase commit (dblink, PREPARE
TRANSACTION), row-version checks rejecting at both, the coordinator killed before and after the
prepare, the publisher restarted mid-commit, and switching a failover subscription between
immediate and queued updating."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psycopg
import pytest
from harness import (
    IMMEDIATE_ROWS,
    Env,
    assert_in_sync,
    lock_waits,
    setup_immediate,
    signal_and_time,
    signal_while_restarting,
    wait_until,
)

from airflow_repl import cli
from airflow_repl.engine.agents import distribution_agent, log_reader_agent, queue_reader_agent, snapshot_agent
from airflow_repl.engine.errors import NotInitialized
from airflow_repl.engine.model import naming
from airflow_repl.engine.postgres.connections import to_uri
from airflow_repl.engine.provisioning import update_mode
from airflow_repl.engine.subscriber import in_doubt

ROWS = IMMEDIATE_ROWS


def rows(conninfo, where="true"):
    """id -> (v, n, row version)."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        found = conn.execute(f"SELECT id, v, n, msrepl_tran_version::text FROM items WHERE {where}").fetchall()
    return {r[0]: r[1:] for r in found}


def prepared(env):
    return [r[0] for r in env.rows(env.pub, "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()")]


def cycle(topo, *subscribers):
    read = log_reader_agent.run_log_reader(topo, "p")
    return read, [distribution_agent.run_distribution(topo, "p", s) for s in subscribers]


def wait_for(predicate, seconds=20.0):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


# ---------------------------------------------------------------------- commit at both, loop prevention
def test_plain_changes_commit_at_both_and_reach_the_other_subscriber_once(env2, spark):
    topo = setup_immediate(env2, spark, {"sub1": "sync tran", "sub2": "read only"})
    sub1, sub2 = env2.subs["sub1"], env2.subs["sub2"]
    with psycopg.connect(sub1) as conn:  # one application transaction, no special API
        conn.execute("UPDATE items SET v = 'from sub1' WHERE id = 1")
        conn.execute("INSERT INTO items (id, v, n) VALUES (1000, 'new at sub1', 7)")
        conn.execute("DELETE FROM items WHERE id = 2")
    assert len(prepared(env2)) == 1 and 1000 not in rows(env2.pub)  # prepared, not committed yet
    assert rows(sub1, "id = 1")[1][0] == "from sub1"
    assert in_doubt.resolve_in_doubt(topo, "p")["sub1"]["committed"] == 1
    assert prepared(env2) == [] and env2.rows(sub1, "SELECT count(*) FROM airflow_repl.immediate_gids") == [(0,)]
    assert rows(env2.pub) == rows(sub1)  # values and row versions
    assert rows(env2.pub, "id = 1000")[1000][:2] == ("new at sub1", 7) and 2 not in rows(env2.pub)

    read, (back, other) = cycle(topo, "sub1", "sub2")
    assert read["transactions"] == 1
    origins = env2.rows(env2.dist, "SELECT origin FROM airflow_repl.transactions")
    assert origins == [(naming.queue_origin("sub1"),)]
    assert (back["transactions"], back["own_queued"]) == (0, 1)  # not applied again at its origin
    assert other["transactions"] == 1  # applied once at the other subscriber
    assert rows(sub1) == rows(sub2) == rows(env2.pub)
    assert_in_sync(topo, "sub1")
    assert_in_sync(topo, "sub2")
    # a publisher change reaches the immediate subscriber by replication and keeps its version
    env2.run(env2.pub, "UPDATE items SET v = 'pub' WHERE id = 5")
    cycle(topo, "sub1", "sub2")
    assert rows(sub1) == rows(sub2) == rows(env2.pub) and prepared(env2) == []


def test_a_session_commits_its_previous_transaction_and_agent_runs_resolve_the_rest(env, spark):
    topo = setup_immediate(env, spark)
    with psycopg.connect(env.sub, autocommit=True) as conn:  # one session, many transactions
        for i in range(1, 6):
            conn.execute("UPDATE items SET n = n + 1 WHERE id = %s", (i,))
            assert len(prepared(env)) == 1  # the session's next transaction committed the previous one
        conn.execute("UPDATE items SET n = n + 10 WHERE id <= 3")  # rows the earlier transactions changed
        with conn.transaction():
            conn.execute("UPDATE items SET v = 'rolled back' WHERE id = 9")
            raise psycopg.Rollback()
        assert prepared(env) == []
    env.run(env.sub, "UPDATE items SET v = 'last' WHERE id = 10")  # a session that ends after its commit
    assert len(prepared(env)) == 1
    read = log_reader_agent.run_log_reader(topo, "p")  # resolves first, then reads every committed change
    assert prepared(env) == [] and read["transactions"] == 7
    origins = env.rows(env.dist, "SELECT DISTINCT origin FROM airflow_repl.transactions")
    assert origins == [(naming.queue_origin("sub1"),)]
    assert rows(env.pub) == rows(env.sub)
    assert [rows(env.pub, f"id = {i}")[i][1] for i in (1, 4, 9)] == [11, 1, 0]
    assert rows(env.pub, "id = 9")[9][0] == "v9" and rows(env.pub, "id = 10")[10][0] == "last"


# ---------------------------------------------------------------------- row-version checks
def test_row_version_mismatch_rejects_at_both_naming_table_and_key(env, spark):
    topo = setup_immediate(env, spark)
    env.run(env.pub, "UPDATE items SET v = 'pub' WHERE id = 1")  # not yet at the subscriber
    env.run(env.pub, "DELETE FROM items WHERE id = 2")
    before_sub, before_pub = rows(env.sub), rows(env.pub)
    with psycopg.connect(env.sub, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.SerializationFailure) as err:
            conn.execute("UPDATE items SET v = 'sub' WHERE id = 1")
        message = str(err.value)
        assert 'table "public"."items" with key {"id": 1} changed at the publisher' in message
        assert "rejected at the publisher and at the subscriber" in message
        with pytest.raises(
            psycopg.errors.SerializationFailure, match=r'key \{"id": 2\} does not exist at the publisher'
        ):
            conn.execute("UPDATE items SET v = 'sub' WHERE id = 2")
        with conn.transaction():  # a rejected change inside a larger transaction rejects all of it
            conn.execute("UPDATE items SET v = 'kept?' WHERE id = 3")
            with pytest.raises(psycopg.errors.SerializationFailure):
                conn.execute("DELETE FROM items WHERE id = 2")
            raise psycopg.Rollback()
        conn.execute("UPDATE items SET v = 'fine' WHERE id = 4")  # the session goes on
    assert in_doubt.resolve_in_doubt(topo, "p")["sub1"]["committed"] == 1
    after_sub, after_pub = rows(env.sub), rows(env.pub)
    assert after_pub[1] == before_pub[1] and after_sub[1] == before_sub[1] and after_sub[3] == before_sub[3]
    assert after_pub[4][0] == after_sub[4][0] == "fine" and after_pub[4] == after_sub[4]
    cycle(topo, "sub1")  # the publisher's changes arrive; then the subscriber's update applies
    env.run(env.sub, "UPDATE items SET v = 'sub' WHERE id = 1")
    in_doubt.resolve_in_doubt(topo, "p")
    assert rows(env.pub) == rows(env.sub)


def test_savepoint_rolled_back_after_an_applied_change_rejects_the_transaction(env, spark):
    topo = setup_immediate(env, spark)
    before = rows(env.pub)
    with psycopg.connect(env.sub) as conn:
        conn.execute("UPDATE items SET v = 'a' WHERE id = 1")
        conn.execute("SAVEPOINT s")
        conn.execute("UPDATE items SET v = 'b' WHERE id = 2")
        conn.execute("ROLLBACK TO SAVEPOINT s")
        with pytest.raises(psycopg.errors.SerializationFailure, match="rolled back a savepoint"):
            conn.commit()
    in_doubt.resolve_in_doubt(topo, "p")
    assert rows(env.pub) == before and rows(env.sub) == before and prepared(env) == []


# ---------------------------------------------------------------------- coordinator killed, publisher restarted
COORDINATOR = textwrap.dedent(
    """
    import sys, psycopg
    conn = psycopg.connect(sys.argv[1], application_name="coordinator")
    conn.execute(sys.argv[2])
    print("changed", flush=True)
    if sys.argv[3] == "commit":
        conn.commit()
        print("committed", flush=True)
    sys.stdin.read()
    """
)


def coordinator(conninfo, statement, then):
    proc = subprocess.Popen(
        [sys.executable, "-c", COORDINATOR, conninfo, statement, then],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "changed"
    return proc


def kill(proc):
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def pause_at_commit(env, seconds: float):
    """A user deferred trigger firing after the immediate-updating one: the subscriber's commit
    waits ``seconds`` after the PREPARE at the publisher."""
    env.run(
        env.sub,
        "CREATE FUNCTION pause() RETURNS trigger LANGUAGE plpgsql AS "
        f"$$BEGIN PERFORM pg_sleep({seconds}); RETURN NULL; END$$",
    )
    env.run(
        env.sub,
        "CREATE CONSTRAINT TRIGGER zz_pause AFTER UPDATE ON items DEFERRABLE INITIALLY DEFERRED "
        "FOR EACH ROW EXECUTE FUNCTION pause()",
    )


def publisher_row_free(env, key: int) -> bool:
    try:
        with psycopg.connect(env.pub) as conn:
            conn.execute("SELECT 1 FROM items WHERE id = %s FOR UPDATE NOWAIT", (key,))
        return True
    except psycopg.errors.LockNotAvailable:
        return False


def test_coordinator_killed_before_the_prepare_leaves_nothing_at_either_side(env, spark):
    topo = setup_immediate(env, spark)
    before = rows(env.pub)
    proc = coordinator(env.sub, "UPDATE items SET v = 'killed' WHERE id = 3", "wait")
    assert not publisher_row_free(env, 3)  # the publisher holds the row for the open transaction
    kill(proc)
    wait_for(lambda: publisher_row_free(env, 3))  # released as soon as the subscriber's session ends
    assert in_doubt.resolve_in_doubt(topo, "p")["sub1"] == {
        "committed": 0,
        "rolled_back": 0,
        "in_progress": 0,
        "forgotten": 0,
    }
    assert rows(env.pub) == before == rows(env.sub) and prepared(env) == []


def test_coordinator_killed_after_the_prepare_is_resolved_both_ways(env, spark):
    topo = setup_immediate(env, spark)
    before = rows(env.pub)
    # killed after the local commit: prepared at the publisher, committed at the subscriber -> commit
    proc = coordinator(env.sub, "UPDATE items SET v = 'committed' WHERE id = 4", "commit")
    assert proc.stdout is not None and proc.stdout.readline().strip() == "committed"
    kill(proc)
    assert len(prepared(env)) == 1
    # killed during its commit, after the PREPARE: the local transaction aborts -> rollback
    pause_at_commit(env, 30)
    proc = coordinator(env.sub, "UPDATE items SET v = 'aborted' WHERE id = 5", "commit")
    wait_for(lambda: len(prepared(env)) == 2)
    kill(proc)
    env.run(env.sub, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'coordinator'")
    wait_for(
        lambda: (
            env.rows(env.sub, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'coordinator'")[0][0] == 0
        )
    )
    result = in_doubt.resolve_in_doubt(topo, "p")["sub1"]
    assert (result["committed"], result["rolled_back"]) == (1, 1)
    assert prepared(env) == [] and publisher_row_free(env, 5)
    assert rows(env.pub, "id = 4")[4][0] == rows(env.sub, "id = 4")[4][0] == "committed"
    assert rows(env.pub, "id = 5") == rows(env.sub, "id = 5") == {5: before[5]}
    assert rows(env.pub) == rows(env.sub)


def test_publisher_restarted_mid_commit_is_resolved(env, spark):
    topo = setup_immediate(env, spark)
    pause_at_commit(env, 3)
    with psycopg.connect(env.sub, autocommit=True) as session:
        proc = coordinator(env.sub, "UPDATE items SET v = 'across a restart' WHERE id = 6", "commit")
        wait_for(lambda: len(prepared(env)) == 1)
        env.sandbox.restart_cluster("publisher")  # the prepared transaction survives it
        assert proc.stdout is not None and proc.stdout.readline().strip() == "committed"
        kill(proc)
        assert len(prepared(env)) == 1
        assert in_doubt.resolve_in_doubt(topo, "p")["sub1"]["committed"] == 1
        assert rows(env.pub, "id = 6")[6][0] == "across a restart"
        # a session whose publisher connection the restart broke connects again
        session.execute("UPDATE items SET v = 'before' WHERE id = 7")
        env.sandbox.restart_cluster("publisher")
        session.execute("UPDATE items SET v = 'after' WHERE id = 8")
    in_doubt.resolve_in_doubt(topo, "p")
    assert rows(env.pub) == rows(env.sub) and prepared(env) == []
    assert rows(env.pub, "id = 8")[8][0] == "after"


# ---------------------------------------------------------------------- switching update modes
def queued(conninfo):
    with psycopg.connect(conninfo, autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM airflow_repl.queue").fetchone()[0]


def test_failover_switches_between_immediate_and_queued(env, spark):
    topo = setup_immediate(env, spark, {"sub1": "failover"})
    env.run(env.sub, "UPDATE items SET v = 'immediate' WHERE id = 1")
    in_doubt.resolve_in_doubt(topo, "p")
    assert rows(env.pub, "id = 1") == rows(env.sub, "id = 1") and queued(env.sub) == 0
    # immediate -> queued at any time: the change is queued, the publisher is not touched
    assert update_mode.set_update_mode(topo, "p", "sub1", "queued")["changed"] is True
    env.run(env.sub, "UPDATE items SET v = 'queued' WHERE id = 2")
    assert queued(env.sub) == 1 and prepared(env) == [] and rows(env.pub, "id = 2")[2][0] == "v2"
    # queued -> immediate only after the Queue Reader ran and emptied the queue
    with pytest.raises(NotInitialized, match="Queue Reader Agent has not run successfully"):
        update_mode.set_update_mode(topo, "p", "sub1", "immediate")
    queue_reader_agent.run_queue_reader(topo, "p", "sub1")
    env.run(env.sub, "UPDATE items SET v = 'queued again' WHERE id = 2")
    with pytest.raises(NotInitialized, match="1 queued change"):
        update_mode.set_update_mode(topo, "p", "sub1", "immediate")
    queue_reader_agent.run_queue_reader(topo, "p", "sub1")
    assert update_mode.set_update_mode(topo, "p", "sub1", "immediate")["update_mode"] == "failover"
    env.run(env.sub, "UPDATE items SET v = 'immediate again' WHERE id = 3")
    assert queued(env.sub) == 0 and len(prepared(env)) == 1
    in_doubt.resolve_in_doubt(topo, "p")
    cycle(topo, "sub1")
    assert rows(env.pub) == rows(env.sub)
    assert [rows(env.pub, f"id = {i}")[i][0] for i in (1, 2, 3)] == ["immediate", "queued again", "immediate again"]
    # a new snapshot keeps the recorded mode: immediate
    snapshot_agent.run_snapshot(topo, "p", spark, reinitialize=True)
    env.run(env.sub, "UPDATE items SET v = 'after snapshot' WHERE id = 4")
    assert queued(env.sub) == 0 and len(prepared(env)) == 1


# ---------------------------------------------------------------------- the resolver loop and the CLI
def test_follow_commits_at_once_when_the_subscriber_commits(env, spark, tmp_path, capsys):
    topo = setup_immediate(env, spark)
    done: dict = {}
    loop = threading.Thread(
        target=lambda: done.update(in_doubt.follow(topo, "p", "sub1", interval=30, rounds=2)), daemon=True
    )
    loop.start()
    listening = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %%'"
    wait_for(lambda: env.rows(env.sub, listening)[0][0] == 1)  # the loop listens
    started = time.monotonic()
    env.run(env.sub, "UPDATE items SET v = 'followed' WHERE id = 11")
    loop.join(timeout=20)
    assert not loop.is_alive() and time.monotonic() - started < 10  # woken by the commit, not the interval
    assert done["committed"] == 1 and prepared(env) == []
    assert rows(env.pub, "id = 11") == rows(env.sub, "id = 11")
    # the command line: one round for every immediate subscriber of the publication
    env.run(env.sub, "UPDATE items SET v = 'by the cli' WHERE id = 12")
    path = tmp_path / "t.yaml"
    path.write_text(
        json.dumps(
            topo.to_dict(with_secrets=False)
            | {"publisher": to_uri(env.pub), "distributor": to_uri(env.dist), "subscribers": {"sub1": to_uri(env.sub)}}
        )
    )
    assert cli.main(["resolve-in-doubt", "-t", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["sub1"]["committed"] == 1
    assert rows(env.pub, "id = 12")[12][0] == "by the cli"


@pytest.mark.parametrize(("waits_on", "signum"), [("a restarted server", signal.SIGTERM), ("a lock", signal.SIGINT)])
def test_follow_survives_a_restart_and_a_signal_ends_it_within_its_interval(
    waits_on, signum, env, spark, sandbox, tmp_path
):
    """``resolve-in-doubt --follow`` (interval 2 s) through the command line: after the publisher
    restarts it connects again and resolves what the subscriber commits; SIGTERM while the
    publisher restarts once more, or SIGINT while a round waits on a lock at the subscriber, ends
    it within the interval with its totals."""
    interval = 2.0
    topo = setup_immediate(env, spark)
    path = tmp_path / "t.yaml"
    path.write_text(
        json.dumps(
            topo.to_dict(with_secrets=False)
            | {"publisher": to_uri(env.pub), "distributor": to_uri(env.dist), "subscribers": {"sub1": to_uri(env.sub)}}
        )
    )
    argv = [sys.executable, "-m", "airflow_repl.cli", "resolve-in-doubt", "-t", str(path), "--subscriber", "sub1"]
    argv += ["--follow", "--interval", str(interval)]
    if waits_on == "a lock":
        with psycopg.connect(env.sub) as holder:  # every round forgets finished gids there: it waits for the lock
            holder.execute("LOCK TABLE airflow_repl.immediate_gids IN ACCESS EXCLUSIVE MODE")
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            wait_until(lambda: lock_waits(env.sub) == 1 or proc.poll() is not None, what="the lock wait")
            assert proc.poll() is None, proc.communicate()
            took, out, err = signal_and_time(proc, signum)
            holder.rollback()
    else:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        listening = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %%'"
        wait_until(lambda: env.rows(env.sub, listening)[0][0] == 1 or proc.poll() is not None, what="LISTEN")
        sandbox.restart_cluster(env.publisher_cluster, "fast")
        env.run(env.sub, "UPDATE items SET v = 'after a restart' WHERE id = 11")  # prepared at the publisher
        wait_until(lambda: prepared(env) == [] or proc.poll() is not None, 30, "the resolver to commit it")
        assert rows(env.pub, "id = 11")[11][0] == "after a restart"
        took, out, err = signal_while_restarting(proc, sandbox, env.publisher_cluster, signum)
    print(f"{signal.Signals(signum).name} while waiting on {waits_on}: ended {took:.2f} s later")
    assert took < interval + 1.5, f"ended {took:.1f} s after the signal:\n{err}"
    assert proc.returncode == 0 and "Traceback" not in out + err, err
    totals = json.loads(out)["sub1"]
    assert totals["ended_by"] == signal.Signals(signum).name
    if waits_on == "a restarted server":
        assert totals["committed"] == 1 and totals["reconnects"] >= 1
        assert "resolver of subscriber sub1:" in err and "trying again every interval" in err


def test_row_versions_chain_within_a_transaction_and_across_sessions(env, spark):
    topo = setup_immediate(env, spark)
    with psycopg.connect(env.sub) as conn:  # insert, then update and delete rows it changed itself
        conn.execute("INSERT INTO items (id, v, n) VALUES (2000, 'new', 0)")
        conn.execute("UPDATE items SET v = 'updated', n = 5 WHERE id = 2000")
        conn.execute("UPDATE items SET n = n + 1 WHERE id = 14")
        conn.execute("DELETE FROM items WHERE id = 14")
    first, second = psycopg.connect(env.sub, autocommit=True), psycopg.connect(env.sub, autocommit=True)
    try:
        first.execute("UPDATE items SET v = 'first' WHERE id = 15")  # committed here, prepared there
        resolver = threading.Timer(1.0, in_doubt.resolve_in_doubt, (topo, "p"))
        resolver.start()  # the second session's change waits for the first's row lock at the publisher
        started = time.monotonic()
        second.execute("UPDATE items SET v = v || ' then second' WHERE id = 15")
        assert time.monotonic() - started >= 0.5
        resolver.join()
    finally:
        first.close()
        second.close()
    in_doubt.resolve_in_doubt(topo, "p")
    assert rows(env.pub) == rows(env.sub) and prepared(env) == []
    assert rows(env.pub, "id = 15")[15][0] == "first then second" and 14 not in rows(env.pub)
    assert rows(env.pub, "id = 2000")[2000][:2] == ("updated", 5)


# ---------------------------------------------------------------------- an immediate change older history has not reached
#: sub1 and sub2 immediate, sub3 queued, sub4 read only: every update mode on one publication
MIXED = {"sub1": "sync tran", "sub2": "sync tran", "sub3": "queued tran", "sub4": "read only"}


def immediate_conflicts(env, subscriber="sub1"):
    """(kind, key, xact_seqno) of the Distribution Agent's conflicts at ``subscriber``."""
    return env.rows(
        env.dist,
        "SELECT kind, key, xact_seqno::text FROM airflow_repl.conflicts WHERE subscriber = %s AND agent = 'distribution' "
        "ORDER BY xact_seqno, command_id",
        (subscriber,),
    )


def drain(topo, subscribers=("sub1", "sub2", "sub3", "sub4"), **options):
    """Resolve, read and deliver until nothing moves (a queued change goes through the Queue Reader)."""
    for _ in range(4):
        in_doubt.resolve_in_doubt(topo, "p")
        moved = queue_reader_agent.run_queue_reader(topo, "p", "sub3")["transactions"]
        moved += log_reader_agent.run_log_reader(topo, "p")["transactions"]
        for s in subscribers:
            moved += distribution_agent.run_distribution(topo, "p", s, **options)["transactions"]
        if not moved:
            return
    raise AssertionError("the agents did not settle")


def older_history_of_key_50(env, topo, source: str) -> None:
    """An insert and a delete of key 50, committed at the publisher by ``source`` and delivered
    to nobody yet."""
    if source == "publisher":
        env.run(env.pub, "INSERT INTO items (id, v, n) VALUES (50, 'one', 1)")
        env.run(env.pub, "DELETE FROM items WHERE id = 50")
    elif source == "queued subscriber":
        env.run(env.subs["sub3"], "INSERT INTO items (id, v, n) VALUES (50, 'one', 1)")
        env.run(env.subs["sub3"], "DELETE FROM items WHERE id = 50")
        assert queue_reader_agent.run_queue_reader(topo, "p", "sub3")["transactions"] == 2
    else:  # another immediate subscriber
        env.run(env.subs["sub2"], "INSERT INTO items (id, v, n) VALUES (50, 'one', 1)")
        in_doubt.resolve_in_doubt(topo, "p")  # committed at the publisher: the next session finds the row
        env.run(env.subs["sub2"], "DELETE FROM items WHERE id = 50")
        in_doubt.resolve_in_doubt(topo, "p")
    assert 50 not in rows(env.pub)


@pytest.mark.parametrize("source", ["publisher", "queued subscriber", "immediate subscriber"])
@pytest.mark.parametrize("skip", [[], ["duplicate_key"]])
def test_an_immediate_insert_of_a_key_whose_older_history_is_undelivered_converges(
    sandbox, tmp_path, spark, source, skip
):
    env = Env(sandbox, tmp_path, n_subscribers=4)
    try:
        topo = setup_immediate(env, spark, MIXED)
        older_history_of_key_50(env, topo, source)
        env.run(env.subs["sub1"], "INSERT INTO items (id, v, n) VALUES (50, 'two', 2)")  # accepted: no row 50 there
        in_doubt.resolve_in_doubt(topo, "p")
        log_reader_agent.run_log_reader(topo, "p")
        delivered = distribution_agent.run_distribution(topo, "p", "sub1", skip_errors=skip)
        assert delivered["skipped"] == 0 and delivered["superseded"] == 2
        assert rows(env.subs["sub1"], "id = 50")[50][:2] == ("two", 2)
        found = immediate_conflicts(env)
        assert [(k, key) for k, key, _ in found] == [("older than the subscriber's immediate change", {"id": 50})] * 2
        drain(topo, skip_errors=skip)
        publisher = rows(env.pub)
        assert publisher[50][:2] == ("two", 2)
        for name in env.subs:
            assert rows(env.subs[name]) == publisher, name
    finally:
        env.drop()


def test_a_failover_subscription_updating_immediately_keeps_its_insert_too(env2, spark):
    """A failover subscription's batches converge command by command (it has a queue): a command
    older than its immediate change is kept out there too, and recorded with the same kind."""
    topo = setup_immediate(env2, spark, {"sub1": "failover", "sub2": "read only"})
    env2.run(env2.pub, "INSERT INTO items (id, v, n) VALUES (50, 'pub', 0)")
    env2.run(env2.pub, "DELETE FROM items WHERE id = 50")
    env2.run(env2.subs["sub1"], "INSERT INTO items (id, v, n) VALUES (50, 'sub', 0)")
    in_doubt.resolve_in_doubt(topo, "p")
    _, (delivered, _) = cycle(topo, "sub1", "sub2")
    assert delivered["conflicts"] == 2 and delivered["skipped"] == 0
    found = immediate_conflicts(env2)
    assert [(k, key) for k, key, _ in found] == [("older than the subscriber's immediate change", {"id": 50})] * 2
    cycle(topo, "sub1", "sub2")
    assert rows(env2.subs["sub1"], "id = 50")[50][0] == "sub"
    assert rows(env2.subs["sub1"]) == rows(env2.subs["sub2"]) == rows(env2.pub)


@pytest.mark.parametrize("options", [{"bulk_apply": True}, {"subscription_streams": 2}])
def test_commands_older_than_an_immediate_insert_are_left_out_on_every_path(env2, spark, options):
    topo = setup_immediate(env2, spark, {"sub1": "sync tran", "sub2": "read only"}, **options)
    with psycopg.connect(env2.pub) as conn:  # one transaction: its other changes are applied as usual
        conn.execute("INSERT INTO items (id, v, n) VALUES (50, 'pub', 0)")
        conn.execute("UPDATE items SET v = 'pub' WHERE id <= 10")
    env2.run(env2.pub, "DELETE FROM items WHERE id = 50")
    env2.run(env2.subs["sub1"], "INSERT INTO items (id, v, n) VALUES (50, 'sub', 0)")
    in_doubt.resolve_in_doubt(topo, "p")
    _, (delivered, _) = cycle(topo, "sub1", "sub2")
    assert (delivered["superseded"], delivered["skipped"], delivered["retries"]) == (2, 0, 0)
    if options.get("bulk_apply"):
        assert delivered["net_batches"] >= 1
    assert rows(env2.subs["sub1"], "id = 50")[50][0] == "sub"
    cycle(topo, "sub1", "sub2")
    assert rows(env2.subs["sub1"]) == rows(env2.subs["sub2"]) == rows(env2.pub)


def test_key_updates_older_than_an_immediate_insert_keep_their_other_side(env2, spark):
    topo = setup_immediate(env2, spark, {"sub1": "sync tran", "sub2": "read only"})
    sub1 = env2.subs["sub1"]
    env2.run(env2.pub, "UPDATE items SET id = 60 WHERE id = 3")  # row 3 moves to 60 ...
    env2.run(env2.pub, "DELETE FROM items WHERE id = 60")  # ... and goes
    env2.run(env2.pub, "INSERT INTO items (id, v, n) VALUES (70, 'pub 70', 0)")  # a new row 70 ...
    env2.run(env2.pub, "UPDATE items SET id = 71 WHERE id = 70")  # ... moves to 71
    with psycopg.connect(sub1) as conn:  # keys the publisher has no row at (nor the subscriber): accepted
        conn.execute("INSERT INTO items (id, v, n) VALUES (60, 'sub 60', 0)")
        conn.execute("INSERT INTO items (id, v, n) VALUES (70, 'sub 70', 0)")
    in_doubt.resolve_in_doubt(topo, "p")
    _, (delivered, _) = cycle(topo, "sub1", "sub2")
    # 3 -> 60 only leaves 3, 60's delete and 70's insert are left out, 70 -> 71 only arrives at 71
    assert delivered["superseded"] == 4 and delivered["skipped"] == 0
    assert [k for k, _, _ in immediate_conflicts(env2)] == ["older than the subscriber's immediate change"] * 4
    here = rows(sub1)
    assert 3 not in here and here[60][0] == "sub 60" and here[70][0] == "sub 70" and here[71][0] == "pub 70"
    cycle(topo, "sub1", "sub2")
    assert rows(sub1) == rows(env2.subs["sub2"]) == rows(env2.pub)
    assert env2.rows(sub1, "SELECT count(*) FROM airflow_repl.queue_taken") == [(0,)]  # forgotten once passed


@pytest.mark.parametrize("skip", [[], ["duplicate_key"]])
def test_an_immediate_insert_committed_while_the_batch_is_applied_supersedes_it(env2, spark, skip):
    """The keys are read before the batch is applied; the application takes one of its keys in
    between (the Distribution Agent's insert waits on a lock the test holds), first on the fast
    path, then during the replay: neither becomes a skipped transaction or a failure."""
    topo = setup_immediate(env2, spark, {"sub1": "sync tran", "sub2": "read only"})
    sub1 = env2.subs["sub1"]
    env2.run(
        sub1,
        "CREATE FUNCTION wait_for_test() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN "
        "IF current_setting('session_replication_role') = 'replica' THEN PERFORM pg_advisory_xact_lock(NEW.id); END IF; "
        "RETURN NEW; END$$",
    )
    env2.run(sub1, "CREATE TRIGGER aa_wait BEFORE INSERT ON items FOR EACH ROW EXECUTE FUNCTION wait_for_test()")
    env2.run(sub1, "ALTER TABLE items ENABLE ALWAYS TRIGGER aa_wait")
    for key in (50, 51):  # inserted and deleted at the publisher, not delivered yet
        env2.run(env2.pub, "INSERT INTO items (id, v, n) VALUES (%s, 'pub', 0)", (key,))
        env2.run(env2.pub, "DELETE FROM items WHERE id = %s", (key,))
    log_reader_agent.run_log_reader(topo, "p")
    waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = %s AND NOT granted"
    with psycopg.connect(sub1, autocommit=True) as locks:
        locks.execute("SELECT pg_advisory_lock(50), pg_advisory_lock(51)")
        done: dict = {}
        agent = threading.Thread(
            target=lambda: done.update(distribution_agent.run_distribution(topo, "p", "sub1", skip_errors=skip))
        )
        agent.start()
        for key in (50, 51):
            wait_for(lambda key=key: env2.rows(sub1, waiting, (key,))[0][0] == 1)  # its insert of the key waits
            env2.run(sub1, "INSERT INTO items (id, v, n) VALUES (%s, 'sub', 0)", (key,))  # the application's
            in_doubt.resolve_in_doubt(topo, "p")
            locks.execute("SELECT pg_advisory_unlock(%s)", (key,))
        agent.join(timeout=60)
    assert not agent.is_alive() and done, "the Distribution Agent did not finish"
    # replayed twice: after the fast path met the application's 50, after the first replay met its 51
    assert done["skipped"] == 0 and done["superseded"] == 4 and done["retries"] == 2
    assert {i: r[0] for i, r in rows(sub1, "id IN (50, 51)").items()} == {50: "sub", 51: "sub"}
    cycle(topo, "sub1", "sub2")
    assert rows(sub1) == rows(env2.subs["sub2"]) == rows(env2.pub)


def test_a_publisher_truncate_older_than_an_immediate_insert_keeps_that_row(env2, spark):
    topo = setup_immediate(env2, spark, {"sub1": "sync tran", "sub2": "read only"})
    env2.run(env2.pub, "TRUNCATE items")
    env2.run(env2.subs["sub1"], "INSERT INTO items (id, v, n) VALUES (50, 'sub', 0)")  # the publisher has no 50
    in_doubt.resolve_in_doubt(topo, "p")
    cycle(topo, "sub1", "sub2")
    assert rows(env2.subs["sub1"]) == rows(env2.subs["sub2"]) == rows(env2.pub)
    assert list(rows(env2.pub)) == [50]
