"""``airflow-repl plan`` and ``apply``: what applying would change, read from real servers
without changing them, carried out exactly, drops refused unless allowed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from harness import cycle, installed_objects

from airflow_repl import cli
from airflow_repl.engine.agents import snapshot_agent
from airflow_repl.engine.model.topology import load
from airflow_repl.engine.postgres.connections import resolve_topology


def _write(env, tmp_path, articles, subscribers, **sub_keys) -> str:
    path = tmp_path / "topology.yaml"
    data = {
        **env.servers(),
        "publications": [{"name": "p", "articles": articles}],
        "subscriptions": [{"publication": "p", "subscriber": s, **sub_keys.get(s, {})} for s in subscribers],
    }
    path.write_text(yaml.safe_dump(data))
    return str(path)


def load_topology(path):
    return resolve_topology(load(path))


def _plan(capsys, path) -> list[tuple[str, str, str]]:
    assert cli.main(["plan", "-t", path, "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    return [(a["kind"], a["object"], a["name"]) for a in out["actions"]]


def _deployed(env) -> dict:
    return {
        "articles": env.rows(env.dist, "SELECT name, definition FROM airflow_repl.articles ORDER BY 1"),
        "subscriptions": env.rows(
            env.dist, "SELECT subscriber, options, update_mode, paused FROM airflow_repl.subscriptions ORDER BY 1"
        ),
        "pg_tables": env.rows(
            env.pub, "SELECT tablename FROM pg_publication_tables WHERE pubname = 'airflow_repl_p' ORDER BY 1"
        ),
    }


def test_plan_lists_creates_then_nothing_then_each_edit_and_apply_refuses_drops_unless_allowed(
    env2, spark, tmp_path, capsys
):
    env2.run(env2.pub, "CREATE TABLE items (id int PRIMARY KEY, v text); CREATE TABLE other (id int PRIMARY KEY)")
    env2.run(env2.pub, "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 10) g")
    items = {"table": "public.items", "row_filter": "id  <>  3"}  # stored deparsed: not a difference
    path = _write(env2, tmp_path, [items], ["sub1", "sub2"])
    assert _plan(capsys, path) == [
        ("create", "publication", "p"),
        ("create", "article", "items"),
        ("create", "subscription", "sub1"),
        ("create", "subscription", "sub2"),
    ]
    assert env2.rows(env2.pub, "SELECT count(*) FROM pg_publication") == [(0,)]  # plan changed nothing

    assert cli.main(["apply", "-t", path]) == 0
    assert len(json.loads(capsys.readouterr().out)["actions"]) == 4
    snapshot_agent.run_snapshot(load_topology(path), "p", spark)
    assert _plan(capsys, path) == []
    assert cli.main(["plan", "-t", path]) == 0
    assert capsys.readouterr().out == "nothing to do: the servers match the topology\n"

    # add an article, change an option, remove a subscription, pause one
    path = _write(env2, tmp_path, [{**items, "row_filter": "id <> 4"}, "public.other"], ["sub1"], sub1={"paused": True})
    assert _plan(capsys, path) == [
        ("drop", "subscription", "sub2"),
        ("create", "article", "other"),
        ("alter", "article", "items"),
        ("alter", "subscription", "sub1"),
        ("reinitialize", "subscription", "sub1"),
    ]
    assert cli.main(["plan", "-t", path]) == 0
    table = capsys.readouterr().out
    assert "alter article 'items' of publication 'p': row_filter: \"(id <> 3)\" -> \"(id <> 4)\"" in table
    assert "alter subscription 'sub1' of publication 'p': paused: false -> true" in table
    assert "--subscriber sub1 --reinitialize" in table

    before, installed = _deployed(env2), installed_objects(env2, env2.subs["sub2"])
    assert cli.main(["apply", "-t", path]) == 2  # a drop: refused, nothing changed
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "applying would drop 1 object(s): drop subscription 'sub2'" in err
    assert "--allow-drop" in err
    assert _deployed(env2) == before and installed_objects(env2, env2.subs["sub2"]) == installed

    assert cli.main(["apply", "-t", path, "--allow-drop"]) == 0
    assert json.loads(capsys.readouterr().out)["actions"][0]["kind"] == "drop"
    after = installed_objects(env2, env2.subs["sub2"])
    assert (after["procs"], after["triggers"], after["watermarks"], after["ledger"]) == ([], [], 0, 0)
    assert env2.rows(env2.dist, "SELECT subscriber, paused FROM airflow_repl.subscriptions") == [("sub1", True)]
    assert env2.rows(env2.pub, "SELECT tablename FROM pg_publication_tables ORDER BY 1") == [("items",), ("other",)]
    assert _plan(capsys, path) == [("reinitialize", "subscription", "sub1")]  # until the snapshot runs
    snapshot_agent.run_snapshot(load_topology(path), "p", spark, reinitialize=True)
    assert _plan(capsys, path) == []

    # an article removed from the file is a planned drop (apply no longer removes it silently)
    path = _write(env2, tmp_path, [{**items, "row_filter": "id <> 4"}], ["sub1"], sub1={"paused": False})
    assert _plan(capsys, path) == [("drop", "article", "other"), ("alter", "subscription", "sub1")]
    assert cli.main(["apply", "-t", path]) == 2
    assert "drop article 'other' of publication 'p'" in capsys.readouterr().err
    assert len(_deployed(env2)["articles"]) == 2
    assert cli.main(["apply", "-t", path, "--allow-drop"]) == 0
    capsys.readouterr()
    assert [r[0] for r in _deployed(env2)["articles"]] == ["items"]
    env2.run(env2.pub, "UPDATE items SET v = 'after' WHERE id = 1")
    assert cycle(load_topology(path))[1]["transactions"] >= 1  # keeps flowing: no reinitialize
    assert _plan(capsys, path) == []


def test_plan_refuses_bad_input_in_one_line_changing_nothing(env, tmp_path, capsys):
    env.run(env.pub, "CREATE TABLE items (id int PRIMARY KEY)")
    path = _write(env, tmp_path, ["public.items", "public.missing"], ["sub1"])
    for command in (["plan"], ["apply"]):
        assert cli.main([*command, "-t", path]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "missing" in err, err
    assert cli.main(["plan", "-t", path, "-p", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'nope'" in err
    assert env.rows(env.pub, "SELECT count(*) FROM pg_publication") == [(0,)]
    assert env.rows(env.dist, "SELECT count(*) FROM pg_namespace WHERE nspname = 'airflow_repl'") == [(0,)]

    data = yaml.safe_load(Path(path).read_text())
    data["publisher"] = "postgresql://repl@127.0.0.1:1/none"  # nothing listens there
    data["publications"][0]["articles"] = ["public.items"]
    path2 = tmp_path / "down.yaml"
    path2.write_text(yaml.safe_dump(data))
    assert cli.main(["plan", "-t", str(path2)]) == 5
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("airflow-repl: error: ") and "publisher" in err


@pytest.mark.e2e
def test_apply_operator_in_a_dag_run_fails_on_a_drop_and_succeeds_with_allow_drop(env2, spark, tmp_path):
    """ApplyTopologyOperator in real DAG runs (dag.test() on a migrated metadata database): the
    file drops sub2's subscription, so the task fails (not retried) and nothing changes; with
    allow_drop it drops it and returns the plan as its XCom value."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db

    from airflow_repl import demo

    env2.run(env2.pub, "CREATE TABLE items (id int PRIMARY KEY, v text)")
    path = _write(env2, tmp_path, ["public.items"], ["sub1", "sub2"])
    assert cli.main(["apply", "-t", path]) == 0
    snapshot_agent.run_snapshot(load_topology(path), "p", spark)
    _write(env2, tmp_path, ["public.items"], ["sub1"])
    demo.migrate_airflow_db()

    # dag.test() runs a DAG its metadata database has serialized: the file is parsed into it as
    # the dag processor would, beside the dags-folder bundle's DAGs
    folder = tmp_path / "dags"
    folder.mkdir()
    (folder / "apply_topology.py").write_text(
        "import pendulum\n"
        "from airflow.sdk import DAG\n"
        "from airflow_repl.operators.topology import ApplyTopologyOperator\n"
        "dags = {}\n"
        "for allow in (False, True):\n"
        "    with DAG(f'apply_topology_{allow}'.lower(), schedule=None, start_date=pendulum.datetime(2026, 1, 1),\n"
        f"             params={{'topology': {path!r}}}) as dag:\n"
        "        ApplyTopologyOperator(task_id='apply', topology='{{ params.topology }}', allow_drop=allow)\n"
        "    dags[allow] = dag\n"
    )
    bag = BundleDagBag(dag_folder=folder, bundle_path=folder, bundle_name="dags-folder")
    assert not bag.import_errors, bag.import_errors
    DagBundlesManager().sync_bundles_to_db()  # the bundle's row, which the DAGs' rows refer to
    sync_bag_to_db(bag, "dags-folder", None)

    def run(allow_drop: bool):
        dr = bag.dags[f"apply_topology_{allow_drop}".lower()].test()
        (ti,) = dr.get_task_instances()
        return str(getattr(ti.state, "value", ti.state)), ti

    state, _ = run(False)
    assert state == "failed"
    assert env2.rows(env2.dist, "SELECT subscriber FROM airflow_repl.subscriptions ORDER BY 1") == [
        ("sub1",),
        ("sub2",),
    ]
    assert installed_objects(env2, env2.subs["sub2"])["procs"]

    state, ti = run(True)
    assert state == "success"
    assert env2.rows(env2.dist, "SELECT subscriber FROM airflow_repl.subscriptions") == [("sub1",)]
    assert installed_objects(env2, env2.subs["sub2"])["procs"] == []
    plan = ti.xcom_pull(task_ids="apply")
    assert [(a["kind"], a["object"], a["name"]) for a in plan["actions"]] == [("drop", "subscription", "sub2")]


def test_a_publication_removed_from_the_file_is_dropped_only_with_allow_drop(env, tmp_path, capsys):
    env.run(env.pub, "CREATE TABLE items (id int PRIMARY KEY); CREATE TABLE other (id int PRIMARY KEY)")
    path = tmp_path / "topology.yaml"
    data = {
        **env.servers(),
        "publications": [{"name": "p", "articles": ["public.items"]}, {"name": "q_gone", "articles": ["public.other"]}],
        "subscriptions": [{"publication": "p", "subscriber": "sub1"}, {"publication": "q_gone", "subscriber": "sub1"}],
    }
    path.write_text(yaml.safe_dump(data))
    assert cli.main(["apply", "-t", str(path)]) == 0
    capsys.readouterr()
    del data["publications"][1], data["subscriptions"][1]
    path.write_text(yaml.safe_dump(data))
    assert _plan(capsys, str(path)) == [("drop", "publication", "q_gone")]
    assert cli.main(["apply", "-t", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "drop publication 'q_gone': not in the topology file" in err
    assert "with its subscriptions ('sub1')" in err
    assert env.rows(env.pub, "SELECT count(*) FROM pg_publication") == [(2,)]
    assert cli.main(["apply", "-t", str(path), "--allow-drop"]) == 0
    capsys.readouterr()
    assert env.rows(env.pub, "SELECT pubname FROM pg_publication") == [("airflow_repl_p",)]
    assert env.rows(env.dist, "SELECT name FROM airflow_repl.publications") == [("p",)]
    assert env.rows(env.dist, "SELECT publication FROM airflow_repl.subscriptions") == [("p",)]
    assert _plan(capsys, str(path)) == []
