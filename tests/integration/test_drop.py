"""``airflow-repl drop``: an article, a subscription and a publication retired against real
servers, what they leave, and drops killed halfway and run again."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest
import yaml
from harness import (
    Env,
    Writer,
    assert_in_sync,
    audit_sql,
    cycle,
    database_calls,
    drain,
    installed_objects,
    items_topology_file,
    kill_seeds,
    queued_topology,
    resolved_topology,
    run_killed_at,
    setup_immediate,
    setup_items,
    setup_queued,
    wait_for,
)
from psycopg import sql

from airflow_repl import cli
from airflow_repl.engine.agents import distribution_agent, log_reader_agent, queue_reader_agent, snapshot_agent
from airflow_repl.engine.errors import AgentBusy, ReplError
from airflow_repl.engine.model import naming
from airflow_repl.engine.postgres import advisory_locks
from airflow_repl.engine.provisioning import drop
from airflow_repl.engine.provisioning.schema_change import schema_change
from airflow_repl.engine.subscriber import in_doubt

ROOT = Path(__file__).resolve().parents[2]


def _topology_file(topo, tmp_path) -> str:
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topo.to_dict(with_secrets=True)))
    return str(path)


def _dist_rows(env, publication="p") -> dict:
    with psycopg.connect(env.dist, autocommit=True) as conn:
        return {
            table: conn.execute(
                f"SELECT count(*) FROM airflow_repl.{table} WHERE {'name' if table == 'publications' else 'publication'} = %s",
                (publication,),
            ).fetchone()[0]
            for table in ("publications", "articles", "subscriptions", "transactions", "commands", "snapshots", "drops")
        }


def test_drop_subscription_of_queued_publication_removes_what_it_installed_and_the_other_keeps_flowing(
    env2, spark, tmp_path
):
    topo = setup_queued(env2, spark)
    env2.run(env2.subs["sub1"], "UPDATE items SET v = 'at sub1' WHERE id = 1")  # queued, then taken
    assert queue_reader_agent.run_queue_reader(topo, "p", "sub1")["transactions"] == 1
    origin = naming.queue_origin("sub1")
    assert env2.rows(env2.pub, "SELECT count(*) FROM pg_replication_origin WHERE roname = %s", (origin,)) == [(1,)]
    env2.run(env2.subs["sub1"], "UPDATE items SET v = 'still queued' WHERE id = 2")  # given up by the drop
    before = installed_objects(env2, env2.subs["sub1"])
    assert before["procs"] and "airflow_repl_queue" in before["triggers"] and "queue" in before["tables"]

    result = drop.drop_subscription(topo, "p", "sub1")

    after = installed_objects(env2, env2.subs["sub1"])
    assert (after["procs"], after["triggers"], after["watermarks"], after["ledger"]) == ([], [], 0, 0)
    assert not {"queue", "queue_commits", "queue_taken"} & set(after["tables"])
    assert not {"queue_capture", "queue_commit", "tran_version"} & set(after["functions"])
    assert "queue" in result["shared_objects_dropped"] and result["origin_dropped"] is True
    assert env2.rows(env2.pub, "SELECT count(*) FROM pg_replication_origin WHERE roname = %s", (origin,)) == [(0,)]
    assert env2.rows(env2.pub, "SELECT count(*) FROM airflow_repl.queue_applied WHERE subscriber = 'sub1'") == [(0,)]
    assert env2.rows(env2.dist, "SELECT subscriber FROM airflow_repl.subscriptions") == [("sub2",)]
    assert env2.rows(env2.subs["sub1"], "SELECT count(*) FROM items") == [(50,)]  # the table and its rows stay
    # sub2 is untouched: its procedures, queue trigger and queue, and it keeps flowing both ways
    assert installed_objects(env2, env2.subs["sub2"])["triggers"] == before["triggers"]
    env2.run(env2.pub, "UPDATE items SET n = n + 1 WHERE id <= 10")
    env2.run(env2.subs["sub2"], "UPDATE items SET v = 'at sub2' WHERE id = 20")
    assert queue_reader_agent.run_queue_reader(topo, "p", "sub2")["transactions"] == 1
    cycle(topo, "sub2")
    assert_in_sync(topo, "sub2")
    assert env2.rows(env2.pub, "SELECT v FROM items WHERE id = 20") == [("at sub2",)]
    with pytest.raises(ReplError, match="subscriber 'sub1' has no subscription to publication 'p'"):
        drop.drop_subscription(topo, "p", "sub1")


def test_drop_subscription_of_immediate_publication_removes_triggers_functions_and_dblink(env2, spark):
    topo = setup_immediate(env2, spark)
    env2.run(env2.subs["sub1"], "UPDATE items SET v = 'immediate' WHERE id = 1")  # through dblink, 2PC
    with pytest.raises(ReplError, match=r"1 transaction\(s\) of immediate subscriber 'sub1' are prepared"):
        drop.drop_subscription(topo, "p", "sub1")  # its prepared transaction is finished first
    assert env2.rows(env2.dist, "SELECT count(*) FROM airflow_repl.drops") == [(0,)]
    assert in_doubt.resolve_in_doubt(topo, "p")["sub1"]["committed"] == 1
    assert env2.rows(env2.pub, "SELECT v FROM items WHERE id = 1") == [("immediate",)]
    before = installed_objects(env2, env2.subs["sub1"])
    assert "airflow_repl_two_phase" in before["triggers"] and before["dblink"] == 1
    assert "immediate_publisher" in before["tables"]

    drop.drop_subscription(topo, "p", "sub1")

    after = installed_objects(env2, env2.subs["sub1"])
    assert (after["procs"], after["triggers"], after["watermarks"], after["dblink"]) == ([], [], 0, 0)
    assert not {"immediate_publisher", "immediate_gids"} & set(after["tables"])
    assert not [f for f in after["functions"] if f.startswith("immediate_")]
    env2.run(env2.subs["sub1"], "UPDATE items SET v = 'local only' WHERE id = 2")  # no longer sent anywhere
    assert env2.rows(env2.pub, "SELECT v FROM items WHERE id = 2") == [("v2",)]
    env2.run(env2.subs["sub2"], "UPDATE items SET v = 'from sub2' WHERE id = 3")
    in_doubt.resolve_in_doubt(topo, "p")
    env2.run(env2.pub, "UPDATE items SET n = 7 WHERE id = 4")
    cycle(topo, "sub2")
    assert_in_sync(topo, "sub2")
    assert env2.rows(env2.pub, "SELECT v FROM items WHERE id = 3") == [("from sub2",)]


def test_drop_publication_refuses_with_subscriptions_then_drops_them_its_slot_and_rows(env, spark, tmp_path, capsys):
    topo = setup_items(env, spark)
    env.run(env.pub, "UPDATE items SET v = 'x'")
    cycle(topo)
    path = items_topology_file(env, tmp_path)
    slot = env.rows(env.dist, "SELECT slot_name FROM airflow_repl.publications")[0][0]
    assert cli.main(["drop", "publication", "-t", path, "-p", "p"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "publication 'p' has subscriptions ('sub1')" in err
    assert _dist_rows(env)["subscriptions"] == 1 and _dist_rows(env)["drops"] == 0

    assert cli.main(["drop", "publication", "-t", path, "-p", "p", "--with-subscriptions"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["subscriptions_dropped"] == ["sub1"] and result["slot_dropped"] is True
    assert env.rows(env.pub, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (slot,)) == [(0,)]
    assert env.rows(env.pub, "SELECT count(*) FROM pg_publication WHERE pubname = 'airflow_repl_p'") == [(0,)]
    assert set(_dist_rows(env).values()) == {0}
    assert installed_objects(env, env.sub)["procs"] == [] and env.rows(env.sub, "SELECT count(*) FROM items") == [(10,)]
    assert env.rows(env.dist, "SELECT status FROM airflow_repl.agent_history WHERE agent = 'drop' ORDER BY run_id") == [
        ("succeeded",),
        ("succeeded",),
    ]
    assert cli.main(["wal-retention", "-t", path, "-p", "p"]) == 3  # no slot left to measure
    assert "publication 'p' is not deployed" in capsys.readouterr().err
    assert cli.main(["drop", "publication", "-t", path, "-p", "p"]) == 2  # gone: one line naming it
    assert capsys.readouterr().err == (
        "airflow-repl: error: publication 'p' does not exist in the distribution database: nothing to drop "
        "(check the name and the topology file's distributor)\n"
    )


def test_drop_article_while_the_publisher_writes_keeps_the_others_flowing_without_reinitialize(
    env, spark, tmp_path, capsys
):
    env.run(env.pub, "CREATE TABLE items (id int PRIMARY KEY, v text); CREATE TABLE other (id int PRIMARY KEY, v text)")
    env.run(env.pub, "INSERT INTO items SELECT g, 'v' FROM generate_series(1, 100) g")
    env.run(env.pub, "INSERT INTO other SELECT g, 'v' FROM generate_series(1, 100) g")
    topo = env.topology(["public.items", "public.other"])
    snapshot_agent.run_snapshot(topo, "p", spark)
    path = _topology_file(topo, tmp_path)
    env.run(env.pub, "UPDATE other SET v = 'read before the drop' WHERE id = 1")
    log_reader_agent.run_log_reader(topo, "p")  # stored, not delivered: discarded by the drop
    stop = threading.Event()

    def write() -> None:
        with psycopg.connect(env.pub, autocommit=True) as conn:
            i = 0
            while not stop.is_set():
                i += 1
                conn.execute("UPDATE items SET v = %s WHERE id = %s", (f"w{i}", i % 100 + 1))
                conn.execute("UPDATE other SET v = %s WHERE id = %s", (f"w{i}", i % 100 + 1))

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        time.sleep(0.5)
        assert cli.main(["drop", "article", "-t", path, "-p", "p", "--article", "other"]) == 0
        result = json.loads(capsys.readouterr().out)
        time.sleep(0.5)
    finally:
        stop.set()
        writer.join()
    assert result["unpublished_tables"] == 1 and result["discarded_commands"] >= 1
    env.run(env.pub, "UPDATE items SET v = 'after' WHERE id <= 5; UPDATE other SET v = 'after' WHERE id <= 5")
    remaining = env.topology(["public.items"])
    _, delivered = cycle(remaining)  # no "articles changed since ... initialized": no reinitialize
    assert delivered["commands"] > 0
    assert_in_sync(remaining)
    assert env.rows(env.sub, "SELECT v FROM other WHERE id = 1") == [("v",)]  # its pending change was discarded
    assert env.rows(env.sub, "SELECT count(*) FROM other WHERE v = 'after'") == [(0,)]  # nothing after the drop
    assert env.rows(env.sub, "SELECT count(*) FROM other") == [(100,)]  # the table stays
    assert [p for p in installed_objects(env, env.sub)["procs"] if "other" in p] == []
    assert env.rows(env.dist, "SELECT count(*) FROM airflow_repl.commands WHERE article = 'other'") == [(0,)]
    assert env.rows(env.pub, "SELECT tablename FROM pg_publication_tables WHERE pubname = 'airflow_repl_p'") == [
        ("items",)
    ]
    assert cli.main(["drop", "article", "-t", path, "-p", "p", "--article", "other"]) == 2
    assert "article 'other' does not exist in publication 'p' (its articles: 'items')" in capsys.readouterr().err
    assert cli.main(["drop", "article", "-t", path, "-p", "p", "--article", "items"]) == 2
    assert "the only article of publication 'p': drop the publication instead" in capsys.readouterr().err


def _drop_process(path: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "airflow_repl.cli", "drop", *args, "-t", path, "-p", "p"],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _waiting_on_lock(conninfo: str) -> bool:
    rows = psycopg.connect(conninfo, autocommit=True).execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    return rows.fetchone()[0] > 0


@pytest.mark.parametrize("where", ["subscriber", "distributor"])
def test_drop_subscription_killed_while_waiting_is_finished_by_running_it_again(env2, spark, tmp_path, where):
    topo = setup_queued(env2, spark)
    path = _topology_file(topo, tmp_path)
    holder = psycopg.connect(env2.subs["sub1"] if where == "subscriber" else env2.dist)
    if where == "subscriber":  # the drop waits on the watermark's row at the subscriber
        holder.execute("SELECT 1 FROM airflow_repl.subscription_state FOR UPDATE")
    else:  # ... or on the subscription's row at the distributor, its last step
        holder.execute("SELECT 1 FROM airflow_repl.subscriptions WHERE subscriber = 'sub1' FOR UPDATE")
    proc = _drop_process(path, "subscription", "--subscriber", "sub1")
    try:
        assert wait_for(lambda: _waiting_on_lock(env2.subs["sub1"] if where == "subscriber" else env2.dist), 60)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        holder.rollback()
        holder.close()
    assert proc.returncode == -signal.SIGKILL
    assert env2.rows(env2.dist, "SELECT kind, name FROM airflow_repl.drops") == [("subscription", "sub1")]
    assert env2.rows(env2.dist, "SELECT count(*) FROM airflow_repl.subscriptions WHERE subscriber = 'sub1'") == [(1,)]
    done = installed_objects(env2, env2.subs["sub1"])
    assert (done["watermarks"] == 0) is (where == "distributor")  # the subscriber's step committed only there
    again = _drop_process(path, "subscription", "--subscriber", "sub1")
    _, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    after = installed_objects(env2, env2.subs["sub1"])
    assert (after["procs"], after["triggers"], after["watermarks"]) == ([], [], 0) and "queue" not in after["tables"]
    assert env2.rows(env2.dist, "SELECT count(*) FROM airflow_repl.drops") == [(0,)]
    assert env2.rows(env2.dist, "SELECT subscriber FROM airflow_repl.subscriptions") == [("sub2",)]
    env2.run(env2.pub, "UPDATE items SET n = n + 1")
    cycle(topo, "sub2")
    assert_in_sync(topo, "sub2")


def test_drop_refuses_unknown_names_and_running_agents_changing_nothing(env, spark, tmp_path, capsys):
    topo = setup_items(env, spark)
    path = items_topology_file(env, tmp_path)
    cases = [
        (["article", "--article", "nope"], "article 'nope' does not exist in publication 'p' (its articles: 'items')"),
        (["subscription", "--subscriber", "nope"], "subscriber 'nope' has no subscription to publication 'p'"),
    ]
    for args, message in cases:
        assert cli.main(["drop", *args, "-t", path, "-p", "p"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err
    assert cli.main(["drop", "publication", "-t", path, "-p", "nope"]) == 2
    assert "publication 'nope' does not exist" in capsys.readouterr().err
    assert cli.main(["drop", "article", "-t", path, "-p", "p"]) == 64  # --article missing: a usage error
    assert "drop article takes --article" in capsys.readouterr().err
    # a Distribution Agent running at the subscriber: refused, retryable, nothing changed
    with psycopg.connect(env.sub, autocommit=True) as busy:
        busy.execute("SELECT pg_advisory_lock(hashtext(%s))", (advisory_locks.agent_lock_key("distribution", "p"),))
        with pytest.raises(AgentBusy, match="the Distribution Agent is running for publication 'p' at subscriber"):
            drop.drop_subscription(topo, "p", "sub1")
    with psycopg.connect(env.dist, autocommit=True) as busy:  # a Log Reader reading the slot
        busy.execute("SELECT pg_advisory_lock(hashtext(%s))", (advisory_locks.agent_lock_key("logreader", "p"),))
        assert cli.main(["drop", "publication", "-t", path, "-p", "p", "--with-subscriptions"]) == 5
        assert "the Log Reader Agent is running for publication 'p'" in capsys.readouterr().err
    assert env.rows(env.dist, "SELECT count(*) FROM airflow_repl.drops") == [(0,)]
    assert env.rows(env.dist, "SELECT count(*) FROM airflow_repl.agent_history WHERE agent = 'drop'") == [(0,)]
    assert env.rows(env.pub, "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()") == [(1,)]
    assert installed_objects(env, env.sub)["procs"]
    env.run(env.pub, "UPDATE items SET v = 'still flowing'")
    assert distribution_agent.run_distribution(topo, "p", "sub1")["commands"] == 0
    cycle(topo)
    assert_in_sync(topo)


def test_drop_article_killed_before_its_last_step_holds_delivery_until_run_again(env, spark, tmp_path, capsys):
    env.run(env.pub, "CREATE TABLE items (id int PRIMARY KEY, v text); CREATE TABLE other (id int PRIMARY KEY, v text)")
    env.run(env.pub, "INSERT INTO items SELECT g, 'v' FROM generate_series(1, 20) g")
    env.run(env.pub, "INSERT INTO other SELECT g, 'v' FROM generate_series(1, 20) g")
    topo = env.topology(["public.items", "public.other"])
    snapshot_agent.run_snapshot(topo, "p", spark)
    path = _topology_file(topo, tmp_path)
    env.run(env.pub, "UPDATE other SET v = 'pending'; UPDATE items SET v = 'pending'")
    log_reader_agent.run_log_reader(topo, "p")
    holder = psycopg.connect(env.dist)  # the distributor's last step waits on the article's row
    holder.execute("SELECT 1 FROM airflow_repl.articles WHERE name = 'other' FOR UPDATE")
    proc = _drop_process(path, "article", "--article", "other")
    try:
        assert wait_for(lambda: _waiting_on_lock(env.dist), 60)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        holder.rollback()
        holder.close()
    assert [p for p in installed_objects(env, env.sub)["procs"] if "other" in p] == []  # the subscriber's step is done
    assert env.rows(env.pub, "SELECT tablename FROM pg_publication_tables WHERE pubname = 'airflow_repl_p'") == [
        ("items",)
    ]
    with pytest.raises(ReplError, match="the drop of article 'other' of publication 'p' did not finish: run "):
        distribution_agent.run_distribution(topo, "p", "sub1")  # not a failed CALL of a dropped procedure
    assert cli.main(["drop", "article", "-t", path, "-p", "p", "--article", "other"]) == 0
    capsys.readouterr()
    remaining = env.topology(["public.items"])
    assert distribution_agent.run_distribution(remaining, "p", "sub1")["commands"] == 20  # items' only
    assert_in_sync(remaining)
    assert env.rows(env.sub, "SELECT count(*) FROM other WHERE v = 'pending'") == [(0,)]


#: A table name a drop must keep inside its quotes: a line break, quotes, a statement, 63 bytes.
HOSTILE = 'x"\nDROP TABLE items; -- é' + "z" * 37


def test_drop_article_with_a_hostile_name_drops_its_objects_only(env, spark, tmp_path, capsys):
    assert len(HOSTILE.encode()) == 63
    env.run(env.pub, "CREATE TABLE items (id int PRIMARY KEY, v text)")
    env.run(env.pub, sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text)").format(sql.Identifier(HOSTILE)))
    env.run(env.pub, "INSERT INTO items VALUES (1, 'a')")
    env.run(env.pub, sql.SQL("INSERT INTO {} VALUES (1, 'a')").format(sql.Identifier(HOSTILE)))
    topo = env.topology(["public.items", {"table": f"public.{HOSTILE}"}])
    snapshot_agent.run_snapshot(topo, "p", spark)
    path = _topology_file(topo, tmp_path)
    procs = installed_objects(env, env.sub)["procs"]
    assert len(procs) == 6
    assert cli.main(["drop", "article", "-t", path, "-p", "p", "--article", HOSTILE]) == 0
    capsys.readouterr()
    assert installed_objects(env, env.sub)["procs"] == sorted(p for p in procs if p.endswith("_publicitems"))
    assert env.rows(env.sub, sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(HOSTILE))) == [(1,)]
    remaining = env.topology(["public.items"])
    env.run(env.pub, "UPDATE items SET v = 'b'")
    cycle(remaining)
    assert_in_sync(remaining)


def test_drop_article_with_schema_changes_keeps_the_subscription_without_reinitialize(env, spark):
    """After a delivered schema change the subscriber records the definitions it has; a schema
    change of the dropped article still undelivered must not count either."""
    env.run(env.pub, "CREATE TABLE items (id int PRIMARY KEY, v text); CREATE TABLE other (id int PRIMARY KEY, v text)")
    env.run(env.pub, "INSERT INTO items SELECT g, 'v' FROM generate_series(1, 10) g; INSERT INTO other VALUES (1, 'v')")
    topo = env.topology(["public.items", "public.other"])
    snapshot_agent.run_snapshot(topo, "p", spark)
    schema_change(topo, "p", "ALTER TABLE items ADD COLUMN c text")
    cycle(topo)  # delivered: the subscriber now records the definitions it has
    assert env.rows(env.sub, "SELECT articles_hash IS NOT NULL FROM airflow_repl.subscription_state") == [(True,)]
    schema_change(topo, "p", "ALTER TABLE other ADD COLUMN d text")
    log_reader_agent.run_log_reader(topo, "p")  # stored, not delivered

    drop.drop_article(topo, "p", "other")

    remaining = env.topology(["public.items"])
    env.run(env.pub, "UPDATE items SET c = 'x' WHERE id <= 3")
    _, delivered = cycle(remaining)
    assert delivered["commands"] == 3
    assert_in_sync(remaining)
    assert env.rows(env.sub, "SELECT count(*) FROM information_schema.columns WHERE column_name = 'd'") == [(0,)]


# ------------------------------------------------------------------ killed at seeded random points

#: (kind, seed) of the random-kill rounds (``AIRFLOW_REPL_KILL_SEEDS`` runs other seeds of every
#: kind, see harness.kill_seeds).  A negative seed is no draw: it kills that many calls before the
#: end (-1: before the commit of the drop's last step).
DROP_ROUNDS = (
    [(k, s) for s in kill_seeds([]) for k in drop.KINDS]
    if kill_seeds([])
    else [("article", 3), ("subscription", 1), ("publication", 2), ("article", -1)]
)
#: kind -> the database calls an unkilled drop of that kind makes (counted once per session)
_BOUNDARIES: dict[str, int] = {}


def _killable(path: str, kill_at: int, *args: str) -> subprocess.CompletedProcess:
    return run_killed_at(kill_at, "drop", *args, "-t", path, "-p", "p")


_AUDIT = audit_sql("items", always=True)


def _two_articles_queued(env, spark, tmp_path) -> tuple:
    """``items`` and ``other`` published with queued updating to sub1 and sub2, snapshotted, a
    change queued at sub1 taken (its origin at the publisher) and everything delivered; every row
    change of ``items`` from then on counted at the publisher and at sub2 (ENABLE ALWAYS)."""
    env.run(env.pub, "CREATE TABLE items (id int PRIMARY KEY, v text, n int NOT NULL DEFAULT 0)")
    env.run(env.pub, "CREATE TABLE other (id int PRIMARY KEY, v text, n int NOT NULL DEFAULT 0)")
    env.run(env.pub, "INSERT INTO items (id, v) SELECT g, 'v' || g FROM generate_series(1, 40) g")
    env.run(env.pub, "INSERT INTO other (id, v) SELECT g, 'v' || g FROM generate_series(1, 40) g")
    data = queued_topology(env).to_dict(with_secrets=True)
    data["publications"][0]["articles"] = ["public.items", "public.other"]
    topo = resolved_topology(data)
    path = _topology_file(topo, tmp_path)
    snapshot_agent.run_snapshot(topo, "p", spark)
    env.run(env.subs["sub1"], "UPDATE items SET v = 'at sub1' WHERE id = 1")
    assert queue_reader_agent.run_queue_reader(topo, "p", "sub1")["transactions"] == 1
    drain(topo)
    env.run(env.pub, _AUDIT)
    env.run(env.subs["sub2"], _AUDIT)
    return topo, path


def _update_both(conn, i: int) -> None:
    conn.execute("UPDATE items SET n = n + 1 WHERE id = %s", (i % 40 + 1,))
    conn.execute("UPDATE other SET n = n + 1 WHERE id = %s", (i % 40 + 1,))


_DROP_ARGS = {
    "article": ["article", "--article", "other"],
    "subscription": ["subscription", "--subscriber", "sub1"],
    "publication": ["publication", "--with-subscriptions"],
}


def _boundaries(kind: str, sandbox, spark, tmp_path) -> int:
    """The database calls an unkilled drop of ``kind`` makes, counted once on servers of its own."""
    if kind not in _BOUNDARIES:
        spare = Env(sandbox, tmp_path / "spare", n_subscribers=2)
        try:
            _, path = _two_articles_queued(spare, spark, tmp_path / "spare")
            _BOUNDARIES[kind] = database_calls(_killable(path, 0, *_DROP_ARGS[kind]))
        finally:
            spare.drop()
    return _BOUNDARIES[kind]


@pytest.mark.parametrize(("kind", "seed"), DROP_ROUNDS)
def test_a_drop_killed_at_a_random_point_is_finished_by_running_it_again(env2, spark, sandbox, tmp_path, kind, seed):
    """kill -9 at a seeded random one of every database call the drop makes (statements,
    commits), with the publisher written throughout; then the drop again: what it drops is gone,
    nothing else is touched, every other change is applied once.  ``AIRFLOW_REPL_KILL_SEEDS=N``
    runs seeds 1..N of every kind (``=7,12``: those seeds; see harness.kill_seeds); a failure
    names its seed and kill point."""
    (tmp_path / "spare").mkdir()
    total = _boundaries(kind, sandbox, spark, tmp_path)
    kill_at = total + seed if seed < 0 else random.Random(seed).randint(1, total)
    seen = (
        f"seed {seed}: drop {kind} killed before database call {kill_at} of {total} (AIRFLOW_REPL_KILL_SEEDS={seed},)"
    )
    topo, path = _two_articles_queued(env2, spark, tmp_path)
    slot = env2.rows(env2.dist, "SELECT slot_name FROM airflow_repl.publications")[0][0]
    before = {name: installed_objects(env2, conninfo) for name, conninfo in env2.subs.items()}
    stored_before = env2.rows(env2.dist, "SELECT count(*) FROM airflow_repl.commands WHERE article = 'items'")[0][0]
    with Writer(env2.pub, _update_both) as writer:
        killed = _killable(path, kill_at, *_DROP_ARGS[kind])
        assert killed.returncode == -signal.SIGKILL, f"{seen}: {killed.stderr}"
        again = _killable(path, 0, *_DROP_ARGS[kind])
        assert wait_for(lambda: writer.n > 20, 30)
    if again.returncode == 2:  # killed after its last commit: it had finished, and says so
        assert "nothing to drop" in again.stderr and again.stderr.count("airflow-repl: error:") == 1, seen
    else:
        assert again.returncode == 0, f"{seen}: {again.stderr}"
    assert env2.rows(env2.dist, "SELECT count(*) FROM airflow_repl.drops") == [(0,)], seen
    runs = dict(
        env2.rows(env2.dist, "SELECT status, count(*) FROM airflow_repl.agent_history WHERE agent = 'drop' GROUP BY 1")
    )
    # each drop run succeeded once (a publication's: its two subscriptions' and its own); the killed
    # one, unless it had finished, is marked abandoned by the run that took over
    assert runs.pop("succeeded", 0) == (3 if kind == "publication" else 1) and runs in ({}, {"abandoned": 1}), (
        seen,
        runs,
    )
    gone_from = ["sub1", "sub2"] if kind == "publication" else ["sub1"] if kind == "subscription" else []
    for name in gone_from:
        left = installed_objects(env2, env2.subs[name])
        assert (left["procs"], left["triggers"], left["watermarks"], left["ledger"]) == ([], [], 0, 0), (seen, left)
        assert not {"queue", "queue_commits", "queue_taken"} & set(left["tables"]), (seen, left)
        origin = naming.queue_origin(name)
        assert env2.rows(env2.pub, "SELECT count(*) FROM pg_replication_origin WHERE roname = %s", (origin,)) == [(0,)]
    for conninfo in env2.subs.values():  # the subscriber tables and their rows stay, whatever was dropped
        assert env2.rows(conninfo, "SELECT count(*) FROM items UNION ALL SELECT count(*) FROM other") == [(40,), (40,)]
    slots_left = env2.rows(env2.pub, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (slot,))
    if kind == "publication":
        assert slots_left == [(0,)], seen
        assert env2.rows(env2.pub, "SELECT count(*) FROM pg_publication WHERE pubname = 'airflow_repl_p'") == [(0,)]
        assert set(_dist_rows(env2).values()) == {0}, (seen, _dist_rows(env2))
        return
    assert slots_left == [(1,)], seen  # the publication stays, with its slot
    data = topo.to_dict(with_secrets=True)
    if kind == "article":
        data["publications"][0]["articles"] = ["public.items"]
        assert env2.rows(env2.pub, "SELECT tablename FROM pg_publication_tables WHERE pubname = 'airflow_repl_p'") == [
            ("items",)
        ], seen
        assert env2.rows(env2.dist, "SELECT count(*) FROM airflow_repl.commands WHERE article = 'other'") == [(0,)]
        for name, conninfo in env2.subs.items():
            left = installed_objects(env2, conninfo)
            assert left["procs"] == [p for p in before[name]["procs"] if p.endswith("_publicitems")], (seen, left)
            assert env2.rows(
                conninfo,
                "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'other'::regclass AND tgname LIKE 'airflow\\_repl%%'",
            ) == [(0,)], seen
    else:
        data["subscriptions"] = [s for s in data["subscriptions"] if s["subscriber"] == "sub2"]
        assert env2.rows(env2.dist, "SELECT subscriber FROM airflow_repl.subscriptions") == [("sub2",)], seen
        assert env2.rows(env2.pub, "SELECT count(*) FROM airflow_repl.queue_applied WHERE subscriber = 'sub1'") == [
            (0,)
        ], seen
    after = installed_objects(env2, env2.subs["sub2"])
    if kind == "subscription":
        assert after == before["sub2"], seen  # the other subscription is untouched
    remaining = resolved_topology(data)
    subs = [s["subscriber"] for s in data["subscriptions"]]
    drain(remaining, queued=subs, delivered=subs)
    # every change of items since the drop began stored once and applied once at sub2
    published = env2.rows(env2.pub, "SELECT count(*) FROM audit WHERE tbl = 'items'")[0][0]
    stored = env2.rows(env2.dist, "SELECT count(*) FROM airflow_repl.commands WHERE article = 'items'")[0][0]
    applied = env2.rows(env2.subs["sub2"], "SELECT count(*) FROM audit WHERE tbl = 'items'")[0][0]
    assert published == stored - stored_before == applied > 20, (seen, published, stored - stored_before, applied)
    env2.run(env2.subs["sub2"], "UPDATE items SET v = 'at sub2' WHERE id = 2")  # queued updating goes on
    drain(remaining, queued=subs, delivered=subs)
    assert env2.rows(env2.pub, "SELECT v FROM items WHERE id = 2") == [("at sub2",)], seen
    for name in subs:
        assert_in_sync(remaining, name)
