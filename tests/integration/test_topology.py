"""Topology errors found against a real publisher, and `apply` preparing it (the static checks
are in ``tests/unit/test_topology_loading.py``)."""

from __future__ import annotations

import socket

import pytest

from airflow_repl.engine.errors import ConnectionFailed, TopologyError
from airflow_repl.engine.provisioning import deploy, plan


def test_catalog_errors_name_table_and_fix(env):
    env.run(env.pub, "CREATE TABLE nopk (a int, b text); CREATE TABLE ok (id int PRIMARY KEY)")
    with pytest.raises(TopologyError, match=r"table public.nopk has no primary key.*ADD PRIMARY KEY"):
        deploy.apply_topology(env.topology(["public.nopk"]))
    with pytest.raises(TopologyError, match=r"unknown table public.missing at the publisher"):
        deploy.apply_topology(env.topology(["public.missing"]))
    # nothing was deployed by the failed attempts
    assert env.rows(env.pub, "SELECT count(*) FROM pg_publication")[0][0] == 0


def test_unreachable_server_is_named(env):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    topo = env.topology(["public.ok"])
    topo.subscribers["sub1"].conninfo = f"host=127.0.0.1 port={port} user=x password=secret dbname=y"
    env.run(env.pub, "CREATE TABLE ok (id int PRIMARY KEY)")
    with pytest.raises(ConnectionFailed) as err:
        deploy.apply_topology(topo)
    assert f"subscriber 'sub1' at x@127.0.0.1:{port}/y" in str(err.value)
    assert "secret" not in str(err.value)


def test_apply_is_idempotent_and_prepares_publisher(env):
    env.run(env.pub, "CREATE TABLE t1 (id int PRIMARY KEY, v text); CREATE TABLE t2 (k text PRIMARY KEY)")
    topo = env.topology(["public.t1", "public.t2"])
    for _ in range(2):
        resolved = deploy.apply_topology(topo)
    assert [a.name for a in resolved["p"]] == ["t1", "t2"]
    assert env.rows(env.pub, "SELECT relname, relreplident FROM pg_class WHERE relname IN ('t1','t2') ORDER BY 1") == [
        ("t1", "f"),
        ("t2", "f"),
    ]
    assert env.rows(
        env.pub, "SELECT tablename FROM pg_publication_tables WHERE pubname = 'airflow_repl_p' ORDER BY 1"
    ) == [("t1",), ("t2",)]
    assert env.rows(env.dist, "SELECT count(*) FROM airflow_repl.articles")[0][0] == 2
    # removing an article from the topology is a drop: refused by a bare apply_topology (as by the
    # Snapshot Agent, which calls it), carried out by apply with allow_drop
    with pytest.raises(TopologyError, match=r"article\(s\) 't2' of publication 'p' are deployed but not in the"):
        deploy.apply_topology(env.topology(["public.t1"]))
    assert env.rows(env.dist, "SELECT count(*) FROM airflow_repl.articles")[0][0] == 2
    plan.apply(env.topology(["public.t1"]), allow_drop=True)
    assert env.rows(env.pub, "SELECT tablename FROM pg_publication_tables WHERE pubname = 'airflow_repl_p'") == [
        ("t1",)
    ]
    assert env.rows(env.dist, "SELECT name FROM airflow_repl.articles") == [("t1",)]
