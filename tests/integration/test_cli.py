"""The airflow-repl command line against real servers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import yaml
from harness import orders_topology_file, topology_file
from psycopg import sql

from airflow_repl import cli
from airflow_repl.engine.agents import snapshot_folder
from airflow_repl.engine.errors import ROW_NOT_FOUND_SQLSTATE, DifferencesFound
from airflow_repl.engine.model import naming


def test_cli_runs_every_agent_and_validates(env, spark, tmp_path, capsys):
    env.run(
        env.pub,
        "CREATE TABLE orders (id int PRIMARY KEY, v text); "
        "INSERT INTO orders SELECT g, 'v' FROM generate_series(1, 100) g",
    )
    topo = orders_topology_file(env, tmp_path)
    assert cli.main(["apply", "-t", topo]) == 0
    actions = json.loads(capsys.readouterr().out)["actions"]
    assert [(a["kind"], a["object"], a["name"]) for a in actions] == [
        ("create", "publication", "p"),
        ("create", "article", "orders"),
        ("create", "subscription", "sub1"),
    ]
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


#: Published tables whose names would run statements if a script let them out of their quotes:
#: the issue's example, one that leaves a table behind, and a literal ending in a backslash
#: (which ends elsewhere where standard_conforming_strings is off).
HOSTILE_TABLES = ["nl\nSELECT 'injected'; --", "x\nCREATE TABLE injected (); --", "bs\\"]
#: libpq's environment variable for each connection setting the sandbox's conninfo holds.
LIBPQ_ENV = {"host": "PGHOST", "port": "PGPORT", "user": "PGUSER", "password": "PGPASSWORD", "dbname": "PGDATABASE"}
#: A column name holding a batch separator, a psql meta-command and a psql variable.
HOSTILE_COLUMN = "a\ngo\nb\n\\! touch psql_ran\n:'x' /* $$"


@pytest.mark.parametrize("conforming", ["on", "off"])
def test_script_procs_with_hostile_names_runs_through_psql_without_injecting(env, tmp_path, capsys, conforming):
    for table in HOSTILE_TABLES:
        env.run(
            env.pub,
            sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, {} text, v text)").format(
                sql.Identifier(table), sql.Identifier(HOSTILE_COLUMN)
            ),
        )
    topo = topology_file(env, tmp_path, [{"table": t, "upd_cmd": "SCALL"} for t in HOSTILE_TABLES])
    assert cli.main(["script-procs", "-t", topo]) == 0
    (tmp_path / "procs.sql").write_text(capsys.readouterr().out)
    server = psycopg.conninfo.conninfo_to_dict(env.sub)  # the password travels in the environment
    run = subprocess.run(
        [str(env.sandbox.bindir / "psql"), "-X", "-v", "ON_ERROR_STOP=1", "-v", "x=VARIABLE", "-f", "procs.sql"],
        cwd=tmp_path,
        env={
            **{LIBPQ_ENV[k]: str(v) for k, v in server.items()},
            "PGOPTIONS": f"-c standard_conforming_strings={conforming}",
        },
        capture_output=True,
        text=True,
        check=False,
    )
    assert (run.returncode, run.stderr) == (0, "")
    assert run.stdout == "CREATE PROCEDURE\n" * 9  # three per table, and nothing else ran
    assert not (tmp_path / "psql_ran").exists()
    assert env.rows(env.sub, "SELECT pg_catalog.to_regclass('injected')") == [(None,)]
    created = env.rows(
        env.sub, "SELECT proname FROM pg_catalog.pg_proc WHERE pronamespace = 'public'::regnamespace ORDER BY 1"
    )
    expected = [naming.default_procedure(op, "public", t) for t in HOSTILE_TABLES for op in ("ins", "upd", "del")]
    assert [p for (p,) in created] == sorted(expected)
    # the procedures' literals mean what they say in a session of either setting
    with psycopg.connect(env.sub, autocommit=True, options=f"-c standard_conforming_strings={conforming}") as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, {} text, v text)").format(
                sql.Identifier("bs\\"), sql.Identifier(HOSTILE_COLUMN)
            )
        )
        with pytest.raises(psycopg.Error) as err:
            conn.execute(
                sql.SQL("CALL {}(1)").format(
                    sql.Identifier("public", naming.default_procedure("del", "public", "bs\\"))
                )
            )
    assert err.value.sqlstate == ROW_NOT_FOUND_SQLSTATE
    assert "delete of public.bs\\ with key (id)=(1) matched no row" in str(err.value)


def test_script_procs_tsql_refuses_a_name_sqlcmd_would_split_before_printing(env, tmp_path, capsys):
    env.run(env.pub, "CREATE TABLE orders (id int PRIMARY KEY, v text)")
    env.run(env.pub, sql.SQL("CREATE TABLE link (id int PRIMARY KEY, {} text)").format(sql.Identifier("a\ngo\nb")))
    topo = topology_file(env, tmp_path, [{"table": "orders"}, {"table": "link"}])
    assert cli.main(["script-procs", "-t", topo, "--dialect", "tsql"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        "airflow-repl: error: article 'link' cannot be scripted as T-SQL: its column E'a\\ngo\\nb' holds a line "
        "break (sqlcmd and SSMS end a batch at a line that is only go, inside brackets too); leave the column out "
        "(columns:) or rename it, or script the postgresql dialect\n"
    )


def test_script_procs_applies_each_dialects_parameter_limit(env, tmp_path, capsys):
    env.run(env.pub, f"CREATE TABLE wide (id int PRIMARY KEY, {', '.join(f'c{i} int' for i in range(2, 61))})")
    topo = topology_file(env, tmp_path, [{"table": "wide", "upd_cmd": "XCALL", "del_cmd": "XCALL"}])
    assert cli.main(["script-procs", "-t", topo, "--dialect", "tsql"]) == 0  # SQL Server takes 2,100
    out = capsys.readouterr().out
    assert "@c60 int,@c61 int," in out and "@c120 int\n" in out
    assert cli.main(["script-procs", "-t", topo]) == 2
    assert "XCALL syntax passes 120 parameters to the update procedure, but PostgreSQL procedures take at most 100" in (
        capsys.readouterr().err
    )


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


#: A CLI process that reports, after its own output, whether it imported the data files' modules
#: and in which thread pyarrow was imported; $HIDE_MODULE names a module its imports fail for.
_IMPORTS_PROBE = """
import json, os, sys, threading
threads = []
class Who:
    def find_spec(self, name, path=None, target=None):
        if name == "pyarrow":
            threads.append(threading.current_thread().name)
        return None
sys.meta_path.insert(0, Who())
if os.environ.get("HIDE_MODULE"):
    sys.modules[os.environ["HIDE_MODULE"]] = None
from airflow_repl.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "pyarrow": "pyarrow" in sys.modules, "numpy": "numpy" in sys.modules,
                  "pyarrow_thread": threads[0] if threads else None}))
"""


def _probed_snapshot(env, tmp_path, *args: str, hide: str = "") -> tuple[subprocess.CompletedProcess[str], dict]:
    """``airflow-repl snapshot`` of ``orders`` (100 rows, created on the first call) in a CLI
    process of its own, its tasks in threads (no Spark master named), with ``hide`` failing to
    import; the process and its probe (:data:`_IMPORTS_PROBE`)."""
    if env.rows(env.pub, "SELECT count(*) FROM pg_class WHERE relname = 'orders'") == [(0,)]:
        env.run(
            env.pub,
            "CREATE TABLE orders (id int PRIMARY KEY, v text); "
            "INSERT INTO orders SELECT g, 'v' FROM generate_series(1, 100) g",
        )
    environment = {k: v for k, v in os.environ.items() if k != "AIRFLOW_REPL_SPARK_MASTER"}
    environment["PYTHONPATH"] = str(Path(cli.__file__).resolve().parents[2])
    run = subprocess.run(
        [sys.executable, "-c", _IMPORTS_PROBE, "snapshot", "-t", orders_topology_file(env, tmp_path), *args],
        cwd=tmp_path,
        env={**environment, "HIDE_MODULE": hide},
        capture_output=True,
        text=True,
        timeout=300,
    )
    *output, probe = run.stdout.strip().splitlines()
    return subprocess.CompletedProcess(run.args, run.returncode, "\n".join(output), run.stderr), json.loads(probe)


def test_a_snapshot_run_imports_the_data_files_modules_only_when_it_copies(env, tmp_path):
    """pyarrow (with numpy) is imported by a run that has rows to copy, in a thread of its own while
    the run checks, creates the slot and plans (its tasks run in threads: no JVM start to overlap),
    what the run still waited for in the summary's ``import_seconds``; a run that finds every
    subscription initialized, and a refusal, never import it; a run copying an article on its own
    imports them as an initializing one does."""
    run, probe = _probed_snapshot(env, tmp_path)
    assert probe == {"code": 0, "pyarrow": True, "numpy": True, "pyarrow_thread": "file-modules-import"}
    assert json.loads(run.stdout)["rows"] == 100 and json.loads(run.stdout)["import_seconds"] >= 0
    assert env.rows(env.sub, "SELECT count(*) FROM orders") == [(100,)]
    run, probe = _probed_snapshot(env, tmp_path)
    assert "already initialized" in json.loads(run.stdout)["message"]
    assert probe == {"code": 0, "pyarrow": False, "numpy": False, "pyarrow_thread": None}
    run, probe = _probed_snapshot(env, tmp_path, "--subscriber", "nobody")
    assert probe["code"] != 0 and probe["pyarrow"] is False
    run, probe = _probed_snapshot(env, tmp_path, "--article", "orders", "--reinitialize")  # a copy on its own
    assert probe == {"code": 0, "pyarrow": True, "numpy": True, "pyarrow_thread": "file-modules-import"}
    assert json.loads(run.stdout)["articles_copied"] == {"sub1": {"orders": 100}}


def test_a_snapshot_whose_data_files_modules_cannot_be_imported_fails_with_one_line(env, tmp_path):
    """The data files' driver missing from the Python environment (its import fails in the thread
    that imports it ahead of the read): one line naming the module and the fix, the run recorded
    as not succeeded, the subscriber's table never loaded; with the module back, the next run copies."""
    run, probe = _probed_snapshot(env, tmp_path, hide="adbc_driver_postgresql")
    assert probe["code"] == 2 and probe["pyarrow_thread"] == "file-modules-import"
    assert (
        run.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "airflow-repl: error: the Snapshot Agent cannot import 'adbc_driver_postgresql', which it reads and "
            "writes the snapshot's data files with"
        )
    )
    assert "install airflow-repl with its dependencies" in run.stderr and "Traceback" not in run.stderr
    history = "SELECT status FROM airflow_repl.agent_history WHERE agent = 'snapshot' ORDER BY run_id"
    assert [status for (status,) in env.rows(env.dist, history)][-1:] in (["failed"], ["blocked"])
    assert env.rows(env.sub, "SELECT count(*) FROM orders") == [(0,)]  # prepared, never loaded
    run, probe = _probed_snapshot(env, tmp_path)
    assert json.loads(run.stdout)["rows"] == 100, run.stderr
    assert env.rows(env.sub, "SELECT count(*) FROM orders") == [(100,)]
