"""The airflow-repl command line against real servers."""

from __future__ import annotations

import json

import yaml

from airflow_repl import cli
from airflow_repl.engine.postgres.connections import to_uri


def _topology_file(env, tmp_path):
    path = tmp_path / "topology.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "publisher": to_uri(env.pub),
                "distributor": to_uri(env.dist),
                "subscribers": {"sub1": to_uri(env.sub)},
                "snapshot_folder": "snaps",
                "publications": [{"name": "p", "articles": [{"table": "public.orders", "upd_cmd": "MCALL"}]}],
                "subscriptions": [{"publication": "p", "subscriber": "sub1"}],
            }
        )
    )
    return str(path)


def test_cli_runs_every_agent_and_validates(env, spark, tmp_path, capsys):
    env.run(
        env.pub,
        "CREATE TABLE orders (id int PRIMARY KEY, v text); "
        "INSERT INTO orders SELECT g, 'v' FROM generate_series(1, 100) g",
    )
    topo = _topology_file(env, tmp_path)
    assert cli.main(["apply", "-t", topo]) == 0
    assert json.loads(capsys.readouterr().out) == {"p": ["orders"]}
    assert cli.main(["snapshot", "-t", topo]) == 0
    snap = json.loads(capsys.readouterr().out)
    assert snap["rows"] == 100 and snap["folder"].startswith(str(tmp_path / "snaps"))
    env.run(env.pub, "UPDATE orders SET v = 'w' WHERE id <= 10")
    assert cli.main(["logreader", "-t", topo]) == 0
    assert json.loads(capsys.readouterr().out)["commands"] == 10
    assert cli.main(["distribution", "-t", topo, "--subscriber", "sub1"]) == 0
    assert json.loads(capsys.readouterr().out)["commands"] == 10
    assert cli.main(["validate", "-t", topo]) == 0
    assert json.loads(capsys.readouterr().out)["sub1"][0]["match"] is True
    env.run(env.sub, "DELETE FROM orders WHERE id = 1")
    assert cli.main(["validate", "-t", topo]) == 2
    assert "validation found differences" in capsys.readouterr().err


def test_cli_scripts_procedures_in_both_dialects(env, tmp_path, capsys):
    env.run(env.pub, "CREATE TABLE orders (id int PRIMARY KEY, v text)")
    topo = _topology_file(env, tmp_path)
    assert cli.main(["script-procs", "-t", topo]) == 0
    out = capsys.readouterr().out
    assert 'CREATE OR REPLACE PROCEDURE "public"."sp_MSupd_publicorders"' in out and "bitmap" in out
    assert cli.main(["script-procs", "-t", topo, "--dialect", "tsql"]) == 0
    out = capsys.readouterr().out
    assert "create procedure [sp_MSupd_publicorders]" in out
    assert "case substring(@bitmap,1,1) & 2 when 2 then @c2 else [v] end" in out


def test_cli_errors_name_the_problem(env, tmp_path, capsys):
    topo = _topology_file(env, tmp_path)
    assert cli.main(["logreader", "-t", topo, "-p", "nope"]) == 2
    assert "unknown publication 'nope'" in capsys.readouterr().err
    assert cli.main(["apply", "-t", topo]) == 2
    assert "unknown table public.orders at the publisher" in capsys.readouterr().err
    assert cli.main(["apply", "-t", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err
