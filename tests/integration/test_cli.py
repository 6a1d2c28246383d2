"""The airflow-repl command line against real servers."""

from __future__ import annotations

import json

import yaml
from harness import orders_topology_file

from airflow_repl import cli
from airflow_repl.engine.agents import snapshot_folder
from airflow_repl.engine.errors import DifferencesFound


def test_cli_runs_every_agent_and_validates(env, spark, tmp_path, capsys):
    env.run(
        env.pub,
        "CREATE TABLE orders (id int PRIMARY KEY, v text); "
        "INSERT INTO orders SELECT g, 'v' FROM generate_series(1, 100) g",
    )
    topo = orders_topology_file(env, tmp_path)
    assert cli.main(["apply", "-t", topo]) == 0
    assert json.loads(capsys.readouterr().out) == {"p": ["orders"]}
    assert cli.main(["snapshot", "-t", topo]) == 0
    snap = json.loads(capsys.readouterr().out)
    assert snap["rows"] == 100 and snap["folder"].startswith(str(tmp_path / "snaps"))
    assert snap["tasks"] == "threads" and "spark_application_id" not in snap  # no master named: no JVM
    env.run(env.pub, "UPDATE orders SET v = 'w' WHERE id <= 10")
    assert cli.main(["logreader", "-t", topo]) == 0
    assert json.loads(capsys.readouterr().out)["commands"] == 10
    assert cli.main(["distribution", "-t", topo, "--subscriber", "sub1"]) == 0
    assert json.loads(capsys.readouterr().out)["commands"] == 10
    assert cli.main(["validate", "-t", topo, "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["subscribers"]["sub1"][0]["match"] is True
    env.run(env.sub, "DELETE FROM orders WHERE id = 1")
    assert cli.main(["validate", "-t", topo]) == DifferencesFound.exit_code == 6
    out, err = capsys.readouterr()
    assert "subscriber sub1:" in out and "    key (1): missing at the subscriber" in out
    assert "validation of publication 'p' found differences at sub1/orders (1 missing, 0 extra, 0 different)" in err


def test_cli_scripts_procedures_in_both_dialects(env, tmp_path, capsys):
    env.run(env.pub, "CREATE TABLE orders (id int PRIMARY KEY, v text)")
    topo = orders_topology_file(env, tmp_path)
    assert cli.main(["script-procs", "-t", topo]) == 0
    out = capsys.readouterr().out
    assert 'CREATE OR REPLACE PROCEDURE "public"."sp_MSupd_publicorders"' in out and "bitmap" in out
    assert cli.main(["script-procs", "-t", topo, "--dialect", "tsql"]) == 0
    out = capsys.readouterr().out
    assert "create procedure [sp_MSupd_publicorders]" in out
    assert "case substring(@bitmap,1,1) & 2 when 2 then @c2 else [v] end" in out


def test_cli_errors_name_the_problem(env, tmp_path, capsys):
    topo = orders_topology_file(env, tmp_path)
    assert cli.main(["logreader", "-t", topo, "-p", "nope"]) == 2
    assert "unknown publication 'nope'" in capsys.readouterr().err
    assert cli.main(["apply", "-t", topo]) == 2
    assert "unknown table public.orders at the publisher" in capsys.readouterr().err
    assert cli.main(["apply", "-t", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_cli_schema_change_register_script_and_regenerate_procs(env, spark, tmp_path, capsys):
    env.run(env.pub, "CREATE TABLE orders (id int PRIMARY KEY, v text); INSERT INTO orders VALUES (1, 'a')")
    topo = orders_topology_file(env, tmp_path)
    assert cli.main(["snapshot", "-t", topo]) == 0
    capsys.readouterr()
    # bad input: one line, its own exit code, nothing changed
    assert cli.main(["schema-change", "-t", topo, "--sql", "ALTER TABLE orders ALTER v TYPE int USING v::int"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("airflow-repl: error: schema change") and "USING" in err and err.count("\n") == 1
    assert cli.main(["schema-change", "-t", topo, "--sql", "ALTER TABLE orders ADD COLUMN w int DEFAULT 1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kind"] == "add_column" and out["articles"] == ["p.orders"]
    env.run(env.pub, "INSERT INTO orders VALUES (2, 'b', 2)")
    assert cli.main(["logreader", "-t", topo]) == 0
    capsys.readouterr()
    assert cli.main(["distribution", "-t", topo]) == 0
    assert json.loads(capsys.readouterr().out)["subscriptions"][0]["schema_changes"] == 1
    assert env.rows(env.sub, "SELECT id, w FROM orders ORDER BY id") == [(1, 1), (2, 2)]
    script = tmp_path / "procs.sql"
    script.write_text("SELECT count(*) FROM {{table}}")
    assert cli.main(["register-script", "-t", topo, "--article", "orders", "--sql-file", str(script)]) == 0
    capsys.readouterr()
    assert cli.main(["register-script", "-t", topo, "--article", "nope", "--sql-file", str(script)]) == 2
    assert "has no article 'nope'" in capsys.readouterr().err
    assert cli.main(["register-script", "-t", topo, "--article", "orders", "--sql-file", str(tmp_path / "x.sql")]) == 2
    assert "x.sql" in capsys.readouterr().err
    env.run(env.sub, 'DROP PROCEDURE "sp_MSins_publicorders"')
    assert cli.main(["regenerate-procs", "-t", topo]) == 0
    assert json.loads(capsys.readouterr().out)["subscribers"] == {"sub1": ["orders"]}
    assert env.rows(env.sub, "SELECT count(*) FROM pg_proc WHERE proname = 'sp_MSins_publicorders'") == [(1,)]
    assert cli.main(["register-script", "-t", topo, "--article", "orders", "--drop"]) == 0


def test_cli_snapshot_runs_its_tasks_in_threads_unless_a_master_is_named(env2, spark, tmp_path, capsys, monkeypatch):
    """Without $AIRFLOW_REPL_SPARK_MASTER the read tasks run in threads of the CLI (several at once,
    every row once at every subscriber); naming a master runs them on Spark."""
    env = env2
    env.run(
        env.pub,
        "CREATE TABLE orders (id int PRIMARY KEY, v text); "
        "INSERT INTO orders SELECT g, repeat('v', g % 50) FROM generate_series(1, 40000) g",
    )
    monkeypatch.setattr(snapshot_folder, "ROWS_PER_PARTITION", 4000)
    path = tmp_path / "topology.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                **env.servers(),
                "publications": [{"name": "p", "articles": [{"table": "public.orders"}]}],
                "subscriptions": [{"publication": "p", "subscriber": s} for s in env.subs],
            }
        )
    )
    monkeypatch.delenv("AIRFLOW_REPL_SPARK_MASTER", raising=False)
    assert cli.main(["snapshot", "-t", str(path)]) == 0
    snap = json.loads(capsys.readouterr().out)
    assert snap["tasks"] == "threads" and "spark_application_id" not in snap
    assert snap["rows"] == 40000 and snap["partitions"] > 2 and snap["initialized"] == ["sub1", "sub2"]
    for sub in env.subs.values():
        assert env.rows(sub, "SELECT count(*), count(DISTINCT id), sum(length(v)) FROM orders") == env.rows(
            env.pub, "SELECT count(*), count(DISTINCT id), sum(length(v)) FROM orders"
        )
    monkeypatch.setenv("AIRFLOW_REPL_SPARK_MASTER", "local[2]")
    assert cli.main(["snapshot", "-t", str(path), "--reinitialize"]) == 0
    snap = json.loads(capsys.readouterr().out)
    assert snap["tasks"] == "spark" and snap["spark_application_id"] == spark.sparkContext.applicationId
    assert snap["rows"] == 40000 and env.rows(env.sub, "SELECT count(*) FROM orders") == [(40000,)]
