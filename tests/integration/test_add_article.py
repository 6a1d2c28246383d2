"""An article added to a live publication: the next Snapshot Agent run copies only it to each
subscription, from a snapshot of its own with its own hand-off, while the other articles keep
being delivered; ``--article A --reinitialize`` copies one article again; a copy killed halfway
is finished by running the Snapshot Agent again.  Real servers, writers running throughout."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from harness import (
    AgentThread,
    Env,
    Writer,
    assert_in_sync,
    audit_sql,
    cycle,
    database_calls,
    drain,
    every_subscriber_file,
    kill_seeds,
    resolved_topology,
    run_killed_at,
    setup_queued,
    wait_for,
)

from airflow_repl import cli
from airflow_repl.engine.agents import distribution_agent, log_reader_agent, snapshot_agent
from airflow_repl.engine.model.topology import load
from airflow_repl.engine.postgres.connections import resolve_topology
from airflow_repl.engine.provisioning import plan

ROOT = Path(__file__).resolve().parents[2]
ITEMS, STORES = 2000, 1000


def _tables(env) -> None:
    env.run(
        env.pub, "CREATE TABLE items (id int PRIMARY KEY, v text); CREATE TABLE stores (id int PRIMARY KEY, v text)"
    )
    env.run(env.pub, "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, %s) g", (ITEMS,))
    env.run(env.pub, "INSERT INTO stores SELECT g, 's' || g FROM generate_series(1, %s) g", (STORES,))


_write = every_subscriber_file


def _topology(path):
    return resolve_topology(load(path))


def _write_both(conn, i: int) -> None:
    """Updates, inserts and deletes in both tables, in one transaction."""
    conn.execute("UPDATE items SET v = %s WHERE id = %s", (f"w{i}", i % ITEMS + 1))
    conn.execute("UPDATE stores SET v = %s WHERE id = %s", (f"w{i}", i % STORES + 1))
    conn.execute("INSERT INTO stores VALUES (%s, %s)", (100000 + i, f"new{i}"))
    conn.execute("INSERT INTO items VALUES (%s, %s)", (100000 + i, f"new{i}"))
    if i % 3 == 0:
        conn.execute("DELETE FROM stores WHERE id = %s", (100000 + i - 1,))


def _writer(env) -> Writer:
    return Writer(env.pub, _write_both)


def _last_snapshot_run(env) -> tuple[int, dict]:
    return env.rows(
        env.dist,
        "SELECT rows_copied, details FROM airflow_repl.agent_history WHERE agent = 'snapshot' ORDER BY run_id DESC LIMIT 1",
    )[0]


def _held(env) -> list[tuple]:
    return env.rows(
        env.dist,
        "SELECT subscriber, article, status, handoff_xact_seqno IS NOT NULL FROM airflow_repl.subscription_articles "
        "ORDER BY 1, 2",
    )


def test_an_article_added_while_both_tables_are_written_is_copied_alone_and_delivered_once(
    env2, spark, tmp_path, capsys
):
    _tables(env2)
    path = _write(env2, tmp_path, ["public.items"])
    snapshot_agent.run_snapshot(_topology(path), "p", spark)
    with _writer(env2) as writer:
        assert wait_for(lambda: writer.n > 20, 30)
        log_reader_agent.run_log_reader(_topology(path), "p")
        path = _write(env2, tmp_path, ["public.items", "public.stores"])
        assert cli.main(["plan", "-t", path, "-o", "json"]) == 0
        actions = [
            (a["kind"], a["name"], a["details"].split(":")[0]) for a in json.loads(capsys.readouterr().out)["actions"]
        ]
        assert actions == [
            ("create", "stores", "public.stores"),
            ("copy", "stores", "to subscriber 'sub1'"),
            ("copy", "stores", "to subscriber 'sub2'"),
        ]
        assert cli.main(["apply", "-t", path]) == 0
        capsys.readouterr()
        topo = _topology(path)
        assert wait_for(lambda: writer.n > 60, 30)
        # no refusal: items keep flowing to both, stores' commands wait for its copy
        for sub in ("sub1", "sub2"):
            assert cycle(topo, sub)[1]["transactions"] > 0
        assert env2.rows(env2.subs["sub1"], "SELECT to_regclass('public.stores') IS NULL") == [(True,)]
        # sub1 keeps being delivered (continuous) while the copy of stores is taken
        reader = AgentThread(
            log_reader_agent.run_log_reader, topo, "p", continuous=True, poll_interval=0.2, max_run_seconds=20
        )
        delivery = AgentThread(
            distribution_agent.run_distribution,
            topo,
            "p",
            "sub1",
            continuous=True,
            poll_interval=0.2,
            max_run_seconds=20,
        )
        reader.start()
        delivery.start()
        time.sleep(1)
        summary = snapshot_agent.run_snapshot(topo, "p", spark)
    for agent in (reader, delivery):
        agent.join(60)
        assert agent.error is None, agent.error
    assert delivery.summary["transactions"] > 0

    assert summary["articles_copied"] == {
        "sub1": {"stores": summary["tables"]["public.stores"]},
        "sub2": {"stores": summary["tables"]["public.stores"]},
    }
    assert list(summary["tables"]) == ["public.stores"]  # items was not copied again
    rows_copied, details = _last_snapshot_run(env2)
    assert rows_copied == summary["rows"] == summary["tables"]["public.stores"] > STORES
    assert list(details["tables"]) == ["public.stores"]
    manifest = env2.rows(env2.dist, "SELECT manifest FROM airflow_repl.snapshots ORDER BY created_at DESC LIMIT 1")
    assert [a["name"] for a in manifest[0][0]["articles"]] == ["stores"]
    assert _held(env2) == [
        ("sub1", "items", "active", False),
        ("sub1", "stores", "active", True),
        ("sub2", "items", "active", False),
        ("sub2", "stores", "active", True),
    ]
    env2.run(env2.pub, "UPDATE stores SET v = 'after' WHERE id <= 5; DELETE FROM items WHERE id = 7")
    for sub in ("sub1", "sub2"):
        cycle(topo, sub)
        assert_in_sync(topo, sub)  # every article, row by row
    assert env2.rows(env2.subs["sub2"], "SELECT count(*) FROM stores WHERE v = 'after'") == [(5,)]
    assert cli.main(["plan", "-t", path, "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["actions"] == []
    # nothing more to copy: the next run says so
    again = snapshot_agent.run_snapshot(topo, "p", spark)
    assert again["message"] == "every subscription is already initialized; nothing to do"


def test_one_article_is_reinitialized_alone_for_one_subscriber(env2, spark, tmp_path, capsys):
    _tables(env2)
    path = _write(env2, tmp_path, ["public.items", "public.stores"])
    topo = _topology(path)
    snapshot_agent.run_snapshot(topo, "p", spark)
    env2.run(env2.subs["sub1"], "DELETE FROM stores WHERE id <= 10")  # drifted at the subscriber
    with _writer(env2) as writer:
        assert wait_for(lambda: writer.n > 20, 30)
        assert (
            cli.main(
                ["snapshot", "-t", path, "-p", "p", "--subscriber", "sub1", "--article", "stores", "--reinitialize"]
            )
            == 0
        )
        out = json.loads(capsys.readouterr().out)
        assert wait_for(lambda: writer.n > 60, 30)
    assert out["articles_copied"] == {"sub1": {"stores": out["tables"]["public.stores"]}}
    assert list(out["tables"]) == ["public.stores"]
    for sub in ("sub1", "sub2"):
        cycle(topo, sub)
        assert_in_sync(topo, sub)
    held = _held(env2)
    assert ("sub1", "stores", "active", True) in held and ("sub2", "stores", "active", False) in held


def test_bad_article_input_is_one_line_and_changes_nothing(env, spark, tmp_path, capsys):
    _tables(env)
    path = _write(env, tmp_path, ["public.items"])
    snapshot_agent.run_snapshot(_topology(path), "p", spark)
    before = env.rows(env.dist, "SELECT count(*) FROM airflow_repl.agent_history")
    for args, words in (
        (
            ["--article", "nope", "--reinitialize"],
            "article 'nope' does not exist in publication 'p' (its articles: 'items')",
        ),
        (["--article", "items"], "give --reinitialize with it"),
    ):
        assert cli.main(["snapshot", "-t", path, "-p", "p", *args]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("airflow-repl: error: ") and words in err, err
    assert env.rows(env.dist, "SELECT count(*) FROM airflow_repl.agent_history") == before
    # an article whose table is missing at the publisher: one line, nothing changed
    path = _write(env, tmp_path, ["public.items", "public.missing"])
    deployed = env.rows(env.dist, "SELECT name FROM airflow_repl.articles")
    for command in (["plan", "-t", path], ["apply", "-t", path], ["snapshot", "-t", path, "-p", "p"]):
        assert cli.main(command) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "missing" in err, err
    assert env.rows(env.dist, "SELECT name FROM airflow_repl.articles") == deployed
    assert env.rows(env.pub, "SELECT tablename FROM pg_publication_tables") == [("items",)]


def _snapshot_process(path: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "airflow_repl.cli", "snapshot", "-t", path, "-p", "p"],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("where", ["export", "load"])
def test_an_article_copy_killed_halfway_is_finished_by_running_it_again(env, spark, tmp_path, capsys, where):
    _tables(env)
    path = _write(env, tmp_path, ["public.items"])
    snapshot_agent.run_snapshot(_topology(path), "p", spark)
    path = _write(env, tmp_path, ["public.items", "public.stores"])
    assert cli.main(["apply", "-t", path]) == 0
    capsys.readouterr()
    topo = _topology(path)
    if where == "export":  # the copy's slot waits for this transaction at the publisher: killed then
        holder = psycopg.connect(env.pub)
        holder.execute("SELECT pg_current_xact_id()")
    else:  # the copy waits to load stores at the subscriber (its table is locked there): killed then
        holder = psycopg.connect(env.sub)
        holder.execute("CREATE TABLE stores (id int)")  # the copy drops and creates it: it waits on the lock
        holder.execute("LOCK TABLE stores IN ACCESS EXCLUSIVE MODE")
    with _writer(env) as writer:
        proc = _snapshot_process(path)
        try:
            started = wait_for(lambda: _copying(env, handoff=where == "load"), 120)
            assert started is not None, proc.stderr.read() if proc.poll() is not None else ""
            assert wait_for(lambda: writer.n > 30, 30)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        finally:
            holder.rollback()
            holder.close()
        assert proc.returncode == -signal.SIGKILL
        # while the copy is unfinished, delivery goes on up to its hand-off and no further (no
        # hand-off yet: it stays where it is)
        before = env.rows(env.sub, "SELECT xact_seqno FROM airflow_repl.subscription_state")[0][0]
        delivered = cycle(topo)[1]["transactions"]
        handoff = env.rows(
            env.dist, "SELECT handoff_xact_seqno::text FROM airflow_repl.subscription_articles WHERE article = 'stores'"
        )[0][0]
        watermark = env.rows(env.sub, "SELECT xact_seqno FROM airflow_repl.subscription_state")[0][0]
        if where == "export":
            assert handoff is None and delivered == 0 and watermark == before
        else:
            assert delivered > 0
            assert env.rows(env.dist, "SELECT %s::pg_lsn <= %s::pg_lsn", (watermark, handoff)) == [(True,)]
        again = _snapshot_process(path)
        _, err = again.communicate(timeout=300)
        assert again.returncode == 0, err
        assert wait_for(lambda: writer.n > 60, 30)
    cycle(topo)
    assert _held(env) == [("sub1", "items", "active", False), ("sub1", "stores", "active", True)]
    assert_in_sync(topo)  # every article equal: nothing lost, nothing applied twice (keys would break)
    assert env.rows(env.sub, "SELECT count(*) FROM items") == env.rows(env.pub, "SELECT count(*) FROM items")


def _copying(env, *, handoff: bool) -> bool:
    """A copy of its own is under way, its hand-off recorded (or not yet)."""
    found = env.rows(
        env.dist,
        "SELECT count(*) FROM airflow_repl.subscription_articles WHERE status = 'copying' "
        "AND (handoff_xact_seqno IS NOT NULL) = %s",
        (handoff,),
    )
    return bool(found[0][0])


def test_an_article_added_to_a_queued_publication_gets_its_queue_trigger_and_both_ways_flow(env2, spark):
    topo = setup_queued(env2, spark)
    env2.run(env2.pub, "CREATE TABLE stores (id int PRIMARY KEY, v text)")
    env2.run(env2.pub, "INSERT INTO stores SELECT g, 's' || g FROM generate_series(1, 30) g")
    data = topo.to_dict(with_secrets=True)
    data["publications"][0]["articles"].append("public.stores")
    bigger = resolved_topology(data)
    plan.apply(bigger)
    env2.run(env2.subs["sub1"], "UPDATE items SET v = 'from sub1' WHERE id = 1")  # queued: not refused
    drain(bigger)  # the Queue Readers and Distribution Agents go on: no refusal before the copy
    summary = snapshot_agent.run_snapshot(bigger, "p", spark)
    assert sorted(summary["articles_copied"]) == ["sub1", "sub2"] and list(summary["tables"]) == ["public.stores"]
    env2.run(env2.subs["sub2"], "UPDATE stores SET v = 'from sub2' WHERE id = 2")  # through its new queue trigger
    env2.run(env2.pub, "UPDATE stores SET v = 'from pub' WHERE id = 3")
    drain(bigger)
    assert env2.rows(env2.pub, "SELECT v FROM stores WHERE id IN (1, 2, 3) ORDER BY id") == [
        ("s1",),
        ("from sub2",),
        ("from pub",),
    ]
    assert env2.rows(env2.pub, "SELECT v FROM items WHERE id = 1") == [("from sub1",)]
    for sub in ("sub1", "sub2"):
        assert_in_sync(bigger, sub)


# ------------------------------------------------------------------ killed at seeded random points

#: Every row change of items and stores counted: at the publisher by a trigger, at the subscriber
#: by ENABLE ALWAYS triggers (they fire for the agents' changes and the copy's load); the copy
#: creates stores anew, so an event trigger puts the trigger back on each new stores and starts
#: its count again.
_PUBLISHER_AUDIT = audit_sql("items", "stores")
_SUBSCRIBER_AUDIT = (
    audit_sql("items", always=True)
    + """
CREATE FUNCTION audit_new_stores() RETURNS event_trigger LANGUAGE plpgsql AS $$BEGIN
    IF EXISTS (SELECT FROM pg_event_trigger_ddl_commands() WHERE object_identity = 'public.stores') THEN
        DELETE FROM audit WHERE tbl = 'stores';
        CREATE TRIGGER audit_stores AFTER INSERT OR UPDATE OR DELETE ON public.stores
            FOR EACH ROW EXECUTE FUNCTION audit_row();
        ALTER TABLE public.stores ENABLE ALWAYS TRIGGER audit_stores;
    END IF;
END$$;
CREATE EVENT TRIGGER audit_new_stores ON ddl_command_end WHEN TAG IN ('CREATE TABLE')
    EXECUTE FUNCTION audit_new_stores();
ALTER EVENT TRIGGER audit_new_stores ENABLE ALWAYS;
"""
)
#: the seeds of the random-kill rounds (``AIRFLOW_REPL_KILL_SEEDS``: see harness.kill_seeds)
COPY_SEEDS = kill_seeds([1, 4])
#: the database calls an unkilled copy of stores makes (counted once per session)
_COPY_CALLS: list[int] = []


def _stores_added(env, spark, tmp_path) -> str:
    """items snapshotted to sub1, every row change counted from then on, stores added to the
    publication (applied, not copied yet); returns the topology file."""
    _tables(env)
    path = _write(env, tmp_path, ["public.items"])
    snapshot_agent.run_snapshot(_topology(path), "p", spark)
    env.run(env.pub, _PUBLISHER_AUDIT)
    env.run(env.sub, _SUBSCRIBER_AUDIT)
    path = _write(env, tmp_path, ["public.items", "public.stores"])
    assert cli.main(["apply", "-t", path]) == 0
    return path


def _copy_calls(sandbox, spark, tmp_path) -> int:
    if not _COPY_CALLS:
        spare = Env(sandbox, tmp_path / "spare")
        try:
            path = _stores_added(spare, spark, tmp_path / "spare")
            _COPY_CALLS.append(database_calls(run_killed_at(0, "snapshot", "-t", path, "-p", "p")))
        finally:
            spare.drop()
    return _COPY_CALLS[0]


def _count(conninfo: str, query: str, params=None) -> int:
    return psycopg.connect(conninfo, autocommit=True).execute(query, params).fetchone()[0]


@pytest.mark.parametrize("seed", COPY_SEEDS)
def test_an_article_copy_killed_at_a_random_point_is_finished_and_applies_every_change_once(
    env, spark, sandbox, tmp_path, capsys, seed
):
    """kill -9 the Snapshot Agent copying an added article at a seeded random one of every
    database call it makes (statements, COPY, commits; in any of its threads), both tables written
    throughout; delivery between; then the Snapshot Agent again.  Every article equal row by row,
    and counted: every change of items stored once and applied once, stores holding its copy and
    exactly the changes after its hand-off.  ``AIRFLOW_REPL_KILL_SEEDS=N`` runs seeds 1..N
    (``=7,12``: those); a failure names its seed and kill point (the copy's read tasks run in
    threads, so the same K can fall in another thread's call on a replay)."""
    (tmp_path / "spare").mkdir()
    total = _copy_calls(sandbox, spark, tmp_path)
    kill_at = random.Random(seed).randint(1, total)
    seen = f"seed {seed}: copy killed before database call {kill_at} of {total} (AIRFLOW_REPL_KILL_SEEDS={seed},)"
    path = _stores_added(env, spark, tmp_path)
    capsys.readouterr()
    topo = _topology(path)
    with _writer(env) as writer:
        assert wait_for(lambda: writer.n > 10, 30)
        killed = run_killed_at(kill_at, "snapshot", "-t", path, "-p", "p")
        assert killed.returncode == -signal.SIGKILL, f"{seen}: {killed.stderr}"
        cycle(topo)  # items flow; stores' commands wait for (or skip up to) its hand-off
        again = run_killed_at(0, "snapshot", "-t", path, "-p", "p")
        assert again.returncode == 0, f"{seen}: {again.stderr}"
        assert wait_for(lambda: writer.n > 60, 30)
    cycle(topo)
    assert _held(env) == [("sub1", "items", "active", False), ("sub1", "stores", "active", True)], seen
    assert_in_sync(topo)  # every article, row by row
    runs = env.rows(env.dist, "SELECT status FROM airflow_repl.agent_history WHERE agent = 'snapshot' ORDER BY run_id")
    # the killed run, if it had begun, is marked abandoned by the next (unless it had finished)
    assert runs in ([("succeeded",)] * 2, [("succeeded",)] * 3, [("succeeded",), ("abandoned",), ("succeeded",)]), (
        seen,
        runs,
    )
    # items: every change stored once and applied once (command by command: a trigger is there)
    published = _count(env.pub, "SELECT count(*) FROM audit WHERE tbl = 'items'")
    stored = _count(env.dist, "SELECT count(*) FROM airflow_repl.commands WHERE article = 'items'")
    applied = _count(env.sub, "SELECT count(*) FROM audit WHERE tbl = 'items'")
    assert published == stored == applied > 60, (seen, published, stored, applied)
    # stores: its last copy's rows, then exactly its changes after the hand-off, each once
    handoff, copied = env.rows(
        env.dist,
        "SELECT handoff_xact_seqno::text, rows_copied FROM airflow_repl.subscription_articles WHERE article = 'stores'",
    )[0]
    published = _count(env.pub, "SELECT count(*) FROM audit WHERE tbl = 'stores'")
    stored = _count(env.dist, "SELECT count(*) FROM airflow_repl.commands WHERE article = 'stores'")
    after = _count(
        env.dist,
        "SELECT count(*) FROM airflow_repl.commands WHERE article = 'stores' AND xact_seqno > %s::pg_lsn",
        (handoff,),
    )
    applied = _count(env.sub, "SELECT count(*) FROM audit WHERE tbl = 'stores'")
    assert published == stored and applied == copied + after and after > 0, (seen, published, stored, copied, after)
