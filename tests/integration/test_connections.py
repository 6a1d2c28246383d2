"""Servers as Airflow Postgres connections: Airflow's own lookup, every extra reaching libpq.

* ``postgres_conninfo`` maps a connection as ``PostgresHook.get_conn`` does (its own keys dropped);
* an agent's connection carries the extras (``application_name`` seen in ``pg_stat_activity``,
  ``options``), and so does the spec file a Spark job reads;
* the command line, in a fresh process, finds connection ids in a secrets backend configured for
  it (Airflow's ``LocalFilesystemBackend``), runs real commands with them, fails in one line when an
  id is missing or an extra (``target_session_attrs``) refuses the server, never printing a password;
* ``airflow providers hooks`` / ``triggers`` list ours.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from harness import AIRFLOW_HOME
from psycopg.conninfo import conninfo_to_dict

from airflow_repl.engine.errors import ConnectionFailed, TopologyError
from airflow_repl.engine.postgres import connections
from airflow_repl.hooks import connections as airflow_connections
from airflow_repl.hooks.replication import ReplicationHook


def _conn_json(conninfo: str, **extra) -> dict:
    """Airflow's JSON form of a sandbox database, with these extras."""
    p = conninfo_to_dict(conninfo)
    fields = {"host": p["host"], "port": int(p["port"]), "login": p["user"], "password": p["password"]}
    return {"conn_type": "postgres", **fields, "schema": p["dbname"], "extra": extra}


def _topology(env, tmp_path: Path, publisher: str, distributor: str, subscriber: str) -> str:
    path = tmp_path / "topology.yaml"
    doc = {
        "publisher": publisher,
        "distributor": distributor,
        "subscribers": {"sub1": subscriber},
        "snapshot_folder": str(tmp_path / "snaps"),
        "publications": [{"name": "p", "articles": ["public.orders"]}],
        "subscriptions": [{"publication": "p", "subscriber": "sub1"}],
    }
    path.write_text(yaml.safe_dump(doc))
    return str(path)


# ---------------------------------------------------------------------- the mapping, on Connection objects
def test_postgres_conninfo_keeps_every_extra_and_drops_the_hooks_own():
    from airflow.providers.postgres.hooks.postgres import PostgresHook
    from airflow.sdk import Connection

    assert PostgresHook.ignored_extra_options == airflow_connections.HOOK_ONLY_EXTRAS
    extra = {"application_name": "a", "target_session_attrs": "any", "sslmode": "prefer", "options": "-c x.y=1"}
    hook_only = {"cursor": "dictcursor", "sqlalchemy_scheme": "postgresql+psycopg", "sqlalchemy_query": {"a": "b"}}
    conn = Connection(
        conn_id="c",
        conn_type="postgres",
        host="h",
        port=5433,
        login="u",
        password="p w",
        schema="db",
        extra=json.dumps({**extra, **hook_only}),
    )
    params = conninfo_to_dict(airflow_connections.postgres_conninfo(conn))
    assert params == {"host": "h", "port": "5433", "user": "u", "password": "p w", "dbname": "db", **extra}
    uri = Connection.from_uri("postgresql://u:pw@h:5/db?application_name=from-uri&keepalives=1", conn_id="u")
    assert conninfo_to_dict(airflow_connections.postgres_conninfo(uri))["application_name"] == "from-uri"


@pytest.mark.parametrize(
    "fields, says",
    [
        ({"conn_type": "mysql", "host": "h"}, "Airflow connection 'c' has connection type 'mysql': the topology's"),
        (
            {"conn_type": "postgres", "extra": '{"sslmod": "x"}'},
            "Airflow connection 'c': extra 'sslmod' is not a libpq",
        ),
    ],
)
def test_postgres_conninfo_refuses_what_is_not_a_postgres_connection(fields, says):
    from airflow.sdk import Connection

    with pytest.raises(TopologyError, match="^" + says):
        airflow_connections.postgres_conninfo(Connection(conn_id="c", **fields))


# ---------------------------------------------------------------------- in this process: env backend
def test_extras_reach_the_agents_connection_and_the_spark_spec(env, tmp_path, monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_REPL_T_PUB",
        json.dumps(_conn_json(env.pub, application_name="repl-t-pub", options="-c work_mem=7777kB", keepalives=True)),
    )
    topo = ReplicationHook(_topology(env, tmp_path, "repl_t_pub", "repl_t_pub", connections.to_uri(env.sub)))
    resolved = topo.get_topology()
    with connections.connect(resolved.publisher.require("publisher"), "publisher") as conn:
        row = conn.execute(
            "SELECT application_name, current_setting('work_mem'), current_setting('search_path') "
            "FROM pg_stat_activity WHERE pid = pg_backend_pid()"
        ).fetchone()
    assert row == ("repl-t-pub", "7777kB", "pg_catalog,public")  # the pinned session settings still apply
    spec = ReplicationHook.write_spec(resolved, tmp_path)
    assert stat.S_IMODE(spec.stat().st_mode) == 0o600
    assert "application_name=repl-t-pub" in json.loads(spec.read_text())["publisher"]["conninfo"]


def test_a_topology_connection_names_the_topology_file(env, tmp_path, monkeypatch):
    path = _topology(
        env, tmp_path, connections.to_uri(env.pub), connections.to_uri(env.dist), connections.to_uri(env.sub)
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_REPL_T_TOPO", json.dumps({"conn_type": "airflow_repl", "extra": {"topology": path}})
    )
    assert ReplicationHook(repl_conn_id="repl_t_topo").get_topology().publications.keys() == {"p"}
    monkeypatch.setenv("AIRFLOW_CONN_REPL_T_TOPO", json.dumps({"conn_type": "postgres", "host": "h"}))
    with pytest.raises(TopologyError, match="Airflow connection 'repl_t_topo' does not name a topology"):
        ReplicationHook(repl_conn_id="repl_t_topo")


def test_the_test_button_connects_to_every_server_or_says_why_not(env, tmp_path, monkeypatch):
    """``Connection.test_connection()``, what the UI's Test button calls: the hook loads the
    topology named by the form's fields (topology file, default publication) and connects to each
    server; (True, the servers reached) or (False, the first reason), never a password."""
    from airflow.models.connection import Connection

    def test(extra: dict) -> tuple[bool, str]:
        monkeypatch.setenv("AIRFLOW_CONN_REPL_T_BUTTON", json.dumps({"conn_type": "airflow_repl", "extra": extra}))
        return Connection(conn_id="repl_t_button", conn_type="airflow_repl", extra=json.dumps(extra)).test_connection()

    uris = [connections.to_uri(c) for c in (env.pub, env.dist, env.sub)]
    passwords = {conninfo_to_dict(c)["password"] for c in (env.pub, env.dist, env.sub)}
    path = _topology(env, tmp_path, *uris)
    ok, message = test({"topology": path, "publication": "p"})
    assert ok is True, message
    assert message.startswith(f"topology {path}: connected to 3 server(s): publisher (")
    assert "subscriber sub1 (" in message and not any(pw in message for pw in passwords)

    ok, message = test({"topology": path, "publication": "nope"})
    assert (ok, message) == (False, "unknown publication 'nope'; the topology defines: p")
    ok, message = test({"topology": str(tmp_path / "missing.yaml")})
    assert ok is False and "missing.yaml" in message, message
    # a subscriber nobody listens for: named, with the fix, and no password
    down = dict(conninfo_to_dict(env.sub), port="1")
    path = _topology(env, tmp_path, uris[0], uris[1], connections.to_uri(" ".join(f"{k}={v}" for k, v in down.items())))
    ok, message = test({"topology": path})
    assert ok is False and message.startswith("cannot connect to the subscriber sub1 at "), message
    assert not any(pw in message for pw in passwords)


# ---------------------------------------------------------------------- the command line, in a fresh process
def _cli(tmp_path: Path, connections_file: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW_CONN_")}
    env |= {
        "AIRFLOW_HOME": str(AIRFLOW_HOME),
        "AIRFLOW__SECRETS__BACKEND": "airflow.secrets.local_filesystem.LocalFilesystemBackend",
        "AIRFLOW__SECRETS__BACKEND_KWARGS": json.dumps({"connections_file_path": str(connections_file)}),
    }
    command = [sys.executable, "-m", "airflow_repl.cli", *argv]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)


def _one_error_line(res: subprocess.CompletedProcess) -> str:
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("airflow-repl: error: "), res.stderr
    return lines[0]


def test_cli_resolves_connection_ids_from_a_secrets_backend(env, tmp_path):
    env.run(env.pub, "CREATE TABLE orders (id int PRIMARY KEY, v text); INSERT INTO orders VALUES (1, 'a')")
    secrets = {
        "repl_t_pub": _conn_json(env.pub, application_name="repl-t-cli", target_session_attrs="read-write"),
        "repl_t_dist": _conn_json(env.dist, cursor="dictcursor"),  # the hook's own key: dropped
        "repl_t_sub": _conn_json(env.sub, connect_timeout=5),
    }
    passwords = {conninfo_to_dict(env.pub)["password"], conninfo_to_dict(env.sub)["password"]}
    file = tmp_path / "connections.json"
    file.write_text(json.dumps(secrets))
    topo = _topology(env, tmp_path, "repl_t_pub", "repl_t_dist", "repl_t_sub")

    res = _cli(tmp_path, file, "apply", "-t", topo)
    assert res.returncode == 0 and [a["name"] for a in json.loads(res.stdout)["actions"]] == ["p", "orders", "sub1"], (
        res.stderr
    )
    res = _cli(tmp_path, file, "status", "-t", topo, "-o", "json")
    assert res.returncode == 0, res.stderr
    assert [(r["publication"], r["subscriber"]) for r in json.loads(res.stdout)] == [("p", "sub1")]
    assert not any(pw in res.stdout + res.stderr for pw in passwords)

    # an extra that refuses the server reaches libpq too: a primary is not a standby
    file.write_text(json.dumps({**secrets, "repl_t_pub": _conn_json(env.pub, target_session_attrs="standby")}))
    res = _cli(tmp_path, file, "validate", "-t", topo)
    line = _one_error_line(res)
    assert res.returncode == ConnectionFailed.exit_code and "cannot connect to the publisher" in line, line
    assert not any(pw in res.stdout + res.stderr for pw in passwords)

    del secrets["repl_t_sub"]
    file.write_text(json.dumps(secrets))
    res = _cli(tmp_path, file, "status", "-t", topo)
    line = _one_error_line(res)
    assert res.returncode == TopologyError.exit_code, res.stderr
    assert (
        f"subscribers.sub1: connection id 'repl_t_sub' is not defined (looked up in the metadata database of AIRFLOW_HOME={AIRFLOW_HOME}): set the environment variable "
        in line
    )
    assert "AIRFLOW_CONN_REPL_T_SUB" in line and "airflow connections add repl_t_sub" in line


def test_uri_servers_touch_no_airflow_home_and_an_id_names_the_home_it_searched(env, tmp_path):
    """Without AIRFLOW_HOME: a topology of URIs never creates ~/airflow (no metadata database, no
    logs), whatever the command; an undefined connection id's error names the home Airflow used."""
    env.run(env.pub, "CREATE TABLE orders (id int PRIMARY KEY, v text); INSERT INTO orders VALUES (1, 'a')")
    home = tmp_path / "home"
    home.mkdir()
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_", "AIRFLOW__"))}
    clean |= {"HOME": str(home), "AIRFLOW_REPL_SPARK_CLASS_ARCHIVE": "off"}

    def cli(*argv: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "airflow_repl.cli", *argv]
        return subprocess.run(command, capture_output=True, text=True, env=clean, cwd=tmp_path, timeout=300)

    uris = _topology(env, tmp_path, *(connections.to_uri(c) for c in (env.pub, env.dist, env.sub)))
    for argv in (["apply"], ["snapshot"], ["logreader"], ["distribution"], ["status"], ["validate"], ["report"]):
        res = cli(*argv, "-t", uris)
        assert res.returncode == 0, (argv, res.stderr)
        assert list(home.iterdir()) == [], (argv, list(home.rglob("*")))  # nothing created under HOME
    ids = tmp_path / "ids.yaml"
    ids.write_text(Path(uris).read_text().replace(connections.to_uri(env.pub), "repl_t_nowhere"))
    line = _one_error_line(cli("status", "-t", str(ids)))
    assert (
        f"connection id 'repl_t_nowhere' is not defined (looked up in the metadata database of "
        f"AIRFLOW_HOME={home / 'airflow'}, Airflow's default: AIRFLOW_HOME is not set): set the environment" in line
    ), line


@pytest.mark.parametrize(
    "what, ours", [("hooks", "airflow_repl.hooks.replication.ReplicationHook"), ("triggers", None)]
)
def test_airflow_providers_lists_our_hooks_and_triggers(what, ours):
    env = {**os.environ, "AIRFLOW_HOME": str(AIRFLOW_HOME)}
    command = [sys.executable, "-m", "airflow", "providers", what, "-o", "json"]
    out = subprocess.run(command, capture_output=True, text=True, check=True, env=env, timeout=300).stdout
    rows = [r for r in json.loads(out[out.index("[") :]) if r.get("package_name") == "airflow-repl"]
    if what == "hooks":
        assert rows == [
            {
                "connection_type": "airflow_repl",
                "class": ours,
                "conn_id_attribute_name": "repl_conn_id",
                "package_name": "airflow-repl",
                "hook_name": "Replication topology (airflow-repl)",
            }
        ]
    else:
        assert {r["class"] for r in rows} == {
            "airflow_repl.triggers.quiescing",
            "airflow_repl.triggers.wal_retention",
            "airflow_repl.triggers.health",
        }
