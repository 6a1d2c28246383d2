"""Updatable subscriptions set up by ``airflow-repl apply``, the snapshot and ``set-update-mode``,
on real servers: recorded options, refusals, row versions at the publisher and subscribers."""

from __future__ import annotations

import json

import pytest

from airflow_repl import cli
from airflow_repl.engine.agents import distribution_agent, log_reader_agent, snapshot_agent
from airflow_repl.engine.errors import USAGE_EXIT_CODE, NotInitialized, ReplError, TopologyError
from airflow_repl.engine.model import topology as topology_mod
from airflow_repl.engine.postgres.connections import resolve_topology, to_uri
from airflow_repl.engine.provisioning import deploy, update_mode

QUEUED = {"allow_queued_tran": True}
BOTH = {"allow_sync_tran": True, "allow_queued_tran": True}


def _topology(env, articles, pub=None, modes=None):
    """``env``'s topology with publication options ``pub`` and subscriber -> update_mode ``modes``."""
    modes = modes or {}
    return resolve_topology(
        topology_mod.from_dict(
            {
                **env.servers(),
                "publications": [{"name": "p", "articles": articles, **(pub or {})}],
                "subscriptions": [
                    {"publication": "p", "subscriber": name, **({"update_mode": modes[name]} if name in modes else {})}
                    for name in env.subs
                ],
            }
        )
    )


def _items(env):
    env.run(
        env.pub, "CREATE TABLE items (id int PRIMARY KEY, v text NOT NULL); INSERT INTO items VALUES (1, 'a'), (2, 'b')"
    )


def _version(conninfo, env, key):
    return env.rows(conninfo, "SELECT msrepl_tran_version FROM items WHERE id = %s", (key,))[0][0]


def _has_trigger(env, conninfo, table="items"):
    return bool(
        env.rows(
            conninfo,
            "SELECT 1 FROM pg_trigger WHERE tgrelid = %s::regclass AND tgname = 'airflow_repl_tran_version'",
            (table,),
        )
    )


# ---------------------------------------------------------------------- apply: options and refusals
def test_apply_records_options_and_refuses_turning_updating_off(env):
    _items(env)
    deploy.apply_topology(_topology(env, ["items"], {**BOTH, "conflict_policy": "subscriber wins"}))
    assert env.rows(
        env.dist, "SELECT allow_sync_tran, allow_queued_tran, conflict_policy FROM airflow_repl.publications"
    ) == [(True, True, "sub wins")]
    deploy.apply_topology(_topology(env, ["items"], {**BOTH, "conflict_policy": "pub wins"}))  # the policy may change
    for pub, option in [
        (QUEUED, "allow_sync_tran"),
        ({"allow_sync_tran": True}, "allow_queued_tran"),
        ({}, "allow_sync_tran"),
    ]:
        with pytest.raises(TopologyError) as err:
            deploy.apply_topology(_topology(env, ["items"], pub))
        message = str(err.value)
        assert "\n" not in message
        assert "publication 'p' allows" in message and f"({option})" in message
        assert "drop and recreate the publication" in message
    assert env.rows(
        env.dist, "SELECT allow_sync_tran, allow_queued_tran, conflict_policy FROM airflow_repl.publications"
    ) == [(True, True, "pub wins")]


def test_refused_turn_off_changes_nothing(env):
    _items(env)
    deploy.apply_topology(_topology(env, ["items"], QUEUED))
    env.run(env.pub, "CREATE TABLE more (id int PRIMARY KEY)")
    with pytest.raises(TopologyError, match="allows queued updating"):
        deploy.apply_topology(_topology(env, ["items", "more"]))
    assert env.rows(env.pub, "SELECT tablename FROM pg_publication_tables WHERE pubname = 'airflow_repl_p'") == [
        ("items",)
    ]
    assert env.rows(env.dist, "SELECT name FROM airflow_repl.articles") == [("items",)]


@pytest.mark.parametrize("mode", ["sync tran", "failover"])
def test_apply_accepts_immediate_modes(env, mode):
    _items(env)
    deploy.apply_topology(_topology(env, ["items"], BOTH, {"sub1": mode}))
    assert env.rows(env.dist, "SELECT update_mode FROM airflow_repl.subscriptions") == [(mode,)]


def test_column_filter_of_immediate_publication_keeps_not_null_columns_without_default(env):
    env.run(
        env.pub,
        "CREATE TABLE wide (id int PRIMARY KEY, must text NOT NULL, dflt text NOT NULL DEFAULT 'x', "
        "opt text, ident int GENERATED ALWAYS AS IDENTITY)",
    )
    with pytest.raises(TopologyError) as err:
        deploy.apply_topology(_topology(env, [{"table": "wide", "columns": ["id", "opt"]}], {"allow_sync_tran": True}))
    message = str(err.value)
    assert "article 'wide'" in message and "filters out column 'must'" in message
    assert "add 'must' to the article's columns" in message
    assert env.rows(env.pub, "SELECT count(*) FROM pg_publication")[0][0] == 0
    # NOT NULL with a default, nullable and identity columns may be left out; so may 'must' under queued updating
    topo = _topology(env, [{"table": "wide", "columns": ["id", "must"]}], {"allow_sync_tran": True})
    (art,) = deploy.apply_topology(topo)["p"]
    assert art.column_list == ["id", "must", "msrepl_tran_version"]


def test_queued_only_publication_may_filter_out_not_null_columns(env):
    env.run(env.pub, "CREATE TABLE wide (id int PRIMARY KEY, must text NOT NULL, opt text)")
    (art,) = deploy.apply_topology(_topology(env, [{"table": "wide", "columns": ["opt"]}], QUEUED))["p"]
    assert art.column_list == ["id", "opt", "msrepl_tran_version"]


def test_existing_row_version_column_of_another_type_is_an_error(env):
    env.run(env.pub, "CREATE TABLE items (id int PRIMARY KEY, msrepl_tran_version bigint NOT NULL)")
    with pytest.raises(TopologyError, match=r"has a column 'msrepl_tran_version' of type bigint.*rename or drop"):
        deploy.apply_topology(_topology(env, ["items"], QUEUED))
    assert env.rows(env.pub, "SELECT count(*) FROM pg_publication")[0][0] == 0


# ---------------------------------------------------------------------- row versions at the publisher
def test_row_version_column_and_trigger_at_the_publisher(env):
    _items(env)
    topo = _topology(env, ["items"], QUEUED)
    for _ in range(2):  # idempotent
        (art,) = deploy.apply_topology(topo)["p"]
    assert art.column_names == ["id", "v", "msrepl_tran_version"]
    assert env.rows(
        env.pub,
        "SELECT format_type(atttypid, atttypmod), attnotnull, pg_get_expr(d.adbin, d.adrelid) FROM pg_attribute a "
        "JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
        "WHERE a.attrelid = 'items'::regclass AND attname = 'msrepl_tran_version'",
    ) == [("uuid", True, "gen_random_uuid()")]
    stored = env.rows(env.dist, "SELECT definition FROM airflow_repl.articles")[0][0]
    assert [c["name"] for c in stored["table"]["columns"]] == ["id", "v", "msrepl_tran_version"]
    before = _version(env.pub, env, 1)
    env.run(env.pub, "UPDATE items SET v = 'A' WHERE id = 1")
    changed = _version(env.pub, env, 1)
    assert changed != before
    env.run(env.pub, "UPDATE items SET v = v WHERE id = 1")  # every update, even one that changes nothing
    assert _version(env.pub, env, 1) != changed
    # the Distribution Agent's role: ordinary triggers do not fire, the version is kept
    replicated = _version(env.pub, env, 1)
    env.run(env.pub, "SET session_replication_role = replica; UPDATE items SET v = 'B' WHERE id = 1")
    assert _version(env.pub, env, 1) == replicated
    # an insert without a column list still works: the new column is last and has a default
    env.run(env.pub, "INSERT INTO items VALUES (3, 'c')")
    assert _version(env.pub, env, 3) is not None
    # INSERT ... SELECT * from a copy of the table without the column does not
    env.run(env.pub, "CREATE TABLE old_items (id int, v text); INSERT INTO old_items VALUES (4, 'd')")
    env.run(env.pub, "INSERT INTO items SELECT * FROM old_items")  # fewer columns: still fine (default)
    # but INSERT ... SELECT * from the published table into a copy made before the column was added fails
    with pytest.raises(Exception, match=r"INSERT has more expressions than target columns"):
        env.run(env.pub, "INSERT INTO old_items SELECT * FROM items")


# ---------------------------------------------------------------------- snapshot
@pytest.fixture
def two_subscribers(env2, spark):
    """sub1 queued, sub2 read only, both snapshotted from a queued publication."""
    _items(env2)
    topo = _topology(env2, ["items"], QUEUED, {"sub1": "queued tran"})
    snapshot_agent.run_snapshot(topo, "p", spark)
    return env2, topo


def test_snapshot_creates_row_versions_at_updatable_subscribers_only(two_subscribers):
    env, topo = two_subscribers
    sub1, sub2 = env.subs["sub1"], env.subs["sub2"]
    for sub in (sub1, sub2):  # the column replicates like any other: same versions everywhere
        assert env.rows(sub, "SELECT id, msrepl_tran_version FROM items ORDER BY id") == env.rows(
            env.pub, "SELECT id, msrepl_tran_version FROM items ORDER BY id"
        )
    assert _has_trigger(env, sub1) and not _has_trigger(env, sub2)
    default = "SELECT pg_get_expr(adbin, adrelid) FROM pg_attrdef WHERE adrelid = 'items'::regclass"
    assert env.rows(sub1, default) == [("gen_random_uuid()",)] and env.rows(sub2, default) == []
    # a local update at the updatable subscriber changes its version there
    before = _version(sub1, env, 2)
    env.run(sub1, "UPDATE items SET v = 'local' WHERE id = 2")
    assert _version(sub1, env, 2) != before
    env.run(sub1, "INSERT INTO items (id, v) VALUES (10, 'new')")
    assert _version(sub1, env, 10) is not None
    # a publisher update reaches both subscribers with the publisher's version
    env.run(env.pub, "UPDATE items SET v = 'pub' WHERE id = 1")
    log_reader_agent.run_log_reader(topo, "p")
    for name in ("sub1", "sub2"):
        distribution_agent.run_distribution(topo, "p", name)
        assert _version(env.subs[name], env, 1) == _version(env.pub, env, 1)


# ---------------------------------------------------------------------- set-update-mode
def test_set_update_mode_rules(env, spark):
    _items(env)
    topo = _topology(env, ["items"], BOTH, {"sub1": "queued failover"})
    deploy.apply_topology(topo)
    mode = "SELECT update_mode FROM airflow_repl.subscriptions"
    assert env.rows(env.dist, mode) == [("queued failover",)]
    # queued -> queued: nothing to do
    assert update_mode.set_update_mode(topo, "p", "sub1", "queued")["changed"] is False
    # queued -> immediate: not initialized yet
    with pytest.raises(NotInitialized, match="is not initialized: run the Snapshot Agent"):
        update_mode.set_update_mode(topo, "p", "sub1", "immediate")
    snapshot_agent.run_snapshot(topo, "p", spark)
    with pytest.raises(NotInitialized, match=r"Queue Reader Agent has not run successfully.*airflow-repl queuereader"):
        update_mode.set_update_mode(topo, "p", "sub1", "immediate")
    # a Queue Reader run before the initialization does not count; one after it does
    env.run(
        env.dist,
        "INSERT INTO airflow_repl.agent_history (agent, publication, subscriber, started_at, status) "
        "VALUES ('queuereader', 'p', 'sub1', now() - interval '1 day', 'succeeded')",
    )
    with pytest.raises(NotInitialized, match="Queue Reader Agent has not run"):
        update_mode.set_update_mode(topo, "p", "sub1", "immediate")
    env.run(
        env.dist,
        "INSERT INTO airflow_repl.agent_history (agent, publication, subscriber, status) "
        "VALUES ('queuereader', 'p', 'sub1', 'succeeded')",
    )
    # queued changes waiting
    env.run(
        env.sub,
        "INSERT INTO airflow_repl.queue (publication, article, op) "
        "VALUES ('p', 'items', 'U'), ('p', 'items', 'U'), ('other', 'items', 'U')",
    )
    with pytest.raises(
        NotInitialized, match=r"2 queued change.*run 'airflow-repl queuereader' until the queue is empty"
    ):
        update_mode.set_update_mode(topo, "p", "sub1", "immediate")
    env.run(env.sub, "DELETE FROM airflow_repl.queue WHERE publication = 'p'")
    # every rule holds: switched (the immediate-updating triggers enabled, the queue's disabled)
    assert update_mode.set_update_mode(topo, "p", "sub1", "immediate")["changed"] is True
    assert env.rows(env.dist, mode) == [("failover",)]
    enabled = (
        "SELECT tgname, tgenabled FROM pg_trigger WHERE tgrelid = 'items'::regclass AND NOT tgisinternal ORDER BY 1"
    )
    assert env.rows(env.sub, enabled) == [
        ("airflow_repl_queue", "D"),
        ("airflow_repl_tran_version", "O"),
        ("airflow_repl_two_phase", "O"),
        ("airflow_repl_two_phase_commit", "O"),
    ]
    # immediate -> queued at any time (immediate recorded as a later release would)
    env.run(env.dist, "UPDATE airflow_repl.subscriptions SET update_mode = 'failover'")
    env.run(env.sub, "INSERT INTO airflow_repl.queue (publication, article, op) VALUES ('p', 'items', 'U')")
    result = update_mode.set_update_mode(topo, "p", "sub1", "queued")
    assert (result["previous"], result["update_mode"], result["changed"]) == ("failover", "queued failover", True)
    assert env.rows(env.dist, mode) == [("queued failover",)]
    # apply keeps the switched mode of a failover subscription
    env.run(env.dist, "UPDATE airflow_repl.subscriptions SET update_mode = 'failover'")
    deploy.apply_topology(topo)
    assert env.rows(env.dist, mode) == [("failover",)]


def test_set_update_mode_only_for_failover_subscriptions(env):
    _items(env)
    topo = _topology(env, ["items"], QUEUED, {"sub1": "queued tran"})
    deploy.apply_topology(topo)
    with pytest.raises(TopologyError, match="has update_mode 'queued tran'; only a failover subscription switches"):
        update_mode.set_update_mode(topo, "p", "sub1", "queued")
    with pytest.raises(ReplError, match="update mode 'sync' is not one of: immediate, queued"):
        update_mode.set_update_mode(topo, "p", "sub1", "sync")


def test_set_update_mode_cli(env, tmp_path, capsys):
    _items(env)
    topo = _topology(env, ["items"], BOTH, {"sub1": "queued failover"})
    deploy.apply_topology(topo)
    path = tmp_path / "t.yaml"
    path.write_text(
        json.dumps(
            topo.to_dict(with_secrets=False)
            | {"publisher": to_uri(env.pub), "distributor": to_uri(env.dist), "subscribers": {"sub1": to_uri(env.sub)}}
        )
    )
    args = ["set-update-mode", "-t", str(path), "--subscriber", "sub1", "--mode"]
    assert cli.main([*args, "queued"]) == 0
    assert json.loads(capsys.readouterr().out)["update_mode"] == "queued failover"
    assert cli.main([*args, "immediate"]) == 3
    assert "is not initialized: run the Snapshot Agent" in capsys.readouterr().err
    assert cli.main([*args, "sideways"]) == USAGE_EXIT_CODE  # not one of the choices
