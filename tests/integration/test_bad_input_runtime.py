"""Runtime bad input through the command line, against real servers: options, connections,
states, folders and servers.  Every case must give exactly one ``airflow-repl: error:`` line
naming the object at fault, the exit code of its error class, no traceback, no password, and
change nothing: subscriber rows, distribution-database rows, publisher publications,
replication slots and prepared transactions; an agent run refused once it reached the distributor
records itself only (a ``blocked`` or ``failed`` history row and an error row, with the line).

(Topology-file cases live in the topology tests; stream limits in the LSN/streams tests.)
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import yaml
from harness import database_state, unused_port
from psycopg.conninfo import conninfo_to_dict

from airflow_repl import cli
from airflow_repl.engine.postgres.connections import to_uri

# ---------------------------------------------------------------------- shared helpers
#: The tables where a refused agent run records itself (:func:`without_run_records`).
RUN_RECORDS = ("table airflow_repl.agent_history", "table airflow_repl.errors")


def without_run_records(state: dict[str, str]) -> dict[str, str]:
    """A database's state without the history and error tables."""
    return {k: v for k, v in state.items() if k not in RUN_RECORDS}


def assert_recorded_only_as_refused(dist: str, line: str | None, history_before: int) -> None:
    """Any history row a refused run added is finished, ``blocked`` or ``failed``, with the line
    (None: with any message)."""
    if not last_run_id(dist):
        return  # no history table, or no row in it
    rows = env_rows(dist, "SELECT status, message FROM airflow_repl.agent_history WHERE run_id > %s", history_before)
    for status, message in rows:
        assert status in ("blocked", "failed"), rows
        assert line is None or message == line.removeprefix("airflow-repl: error: "), rows


def env_rows(conninfo: str, sql: str, after: int) -> list[tuple]:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        return conn.execute(sql, (after,)).fetchall()


def last_run_id(conninfo: str) -> int:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        if conn.execute("SELECT to_regclass('airflow_repl.agent_history')").fetchone()[0] is None:
            return 0
        return int(conn.execute("SELECT coalesce(max(run_id), 0) FROM airflow_repl.agent_history").fetchone()[0])


def world_state(env) -> dict[str, dict[str, str]]:
    """The state of the test's publisher, distribution and subscriber databases."""
    return {
        "publisher": database_state(env.pub),
        "distributor": database_state(env.dist),
        "subscriber": database_state(env.sub),
    }


def assert_one_error_line(err: str, out: str, *fragments: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("airflow-repl: error:")]
    assert len(lines) == 1, f"expected one error line, got:\n{err}"
    assert "Traceback" not in err + out
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"
    return lines[0]


# ---------------------------------------------------------------------- the world of a case
class World:
    """A publisher table ``orders`` in publication ``p`` with one subscriber, and a topology
    file that cases may vary."""

    def __init__(self, env, tmp_path: Path) -> None:
        self.env, self.tmp_path = env, tmp_path
        env.run(
            env.pub,
            "CREATE TABLE orders (id int PRIMARY KEY, v text); "
            "INSERT INTO orders SELECT g, 'v' FROM generate_series(1, 20) g",
        )
        self.doc = {
            "publisher": to_uri(env.pub),
            "distributor": to_uri(env.dist),
            "subscribers": {"sub1": to_uri(env.sub)},
            "snapshot_folder": str(tmp_path / "snaps"),
            "publications": [{"name": "p", "articles": [{"table": "public.orders"}]}],
            "subscriptions": [{"publication": "p", "subscriber": "sub1"}],
        }
        self.password = conninfo_to_dict(env.pub)["password"]
        self.secrets = [self.password]
        self.cleanups: list[Callable[[], None]] = []

    @property
    def topology(self) -> str:
        path = self.tmp_path / "topology.yaml"
        path.write_text(yaml.safe_dump(self.doc))
        return str(path)

    def cli(self, *argv: str) -> int:
        return cli.main(list(argv))

    def with_endpoint(self, role: str, uri: str) -> None:
        if role == "subscriber":
            self.doc["subscribers"]["sub1"] = uri
        else:
            self.doc[role] = uri

    def uri_with(self, conninfo: str, **changes) -> str:
        params = {**conninfo_to_dict(conninfo), **changes}
        return to_uri(psycopg.conninfo.make_conninfo(**params))


@contextlib.contextmanager
def _held_lock(conninfo: str, key: str):
    with psycopg.connect(conninfo, autocommit=True) as other:  # what a running agent holds
        other.execute("SELECT pg_advisory_lock(hashtext(%s))", (key,))
        yield


# ---------------------------------------------------------------------- the cases
@dataclass
class Case:
    id: str
    state: str  # "fresh" (nothing deployed) or "applied" (airflow-repl apply ran)
    arrange: Callable[[World], list[str]]  # returns the command line
    exit_code: int
    fragments: tuple[str, ...]
    context: Callable[[World], contextlib.AbstractContextManager] = lambda w: contextlib.nullcontext()


def _unreachable(role: str, command: str) -> Callable[[World], list[str]]:
    def arrange(w: World) -> list[str]:
        base = w.env.sub if role == "subscriber" else w.env.pub
        w.with_endpoint(role, w.uri_with(base, port=str(unused_port())))
        return [command, "-t", w.topology]

    return arrange


def _wrong_password(role: str, command: str) -> Callable[[World], list[str]]:
    def arrange(w: World) -> list[str]:
        base = w.env.sub if role == "subscriber" else w.env.pub
        w.secrets.append("Wr0ng-S3cret-pw")
        w.with_endpoint(role, w.uri_with(base, password="Wr0ng-S3cret-pw"))
        return [command, "-t", w.topology]

    return arrange


def _conn_env(value: str) -> Callable[[World], list[str]]:
    """The publisher named by Airflow connection id repl_pub, defined by AIRFLOW_CONN_REPL_PUB."""

    def arrange(w: World) -> list[str]:
        value_ = value.replace("PASSWORD", w.password)
        old = os.environ.get("AIRFLOW_CONN_REPL_PUB")
        os.environ["AIRFLOW_CONN_REPL_PUB"] = value_
        w.cleanups.append(
            lambda: (
                os.environ.pop("AIRFLOW_CONN_REPL_PUB")
                if old is None
                else os.environ.__setitem__("AIRFLOW_CONN_REPL_PUB", old)
            )
        )
        w.with_endpoint("publisher", "repl_pub")
        return ["snapshot", "-t", w.topology]

    return arrange


def _folder(kind: str) -> Callable[[World], list[str]]:
    def arrange(w: World) -> list[str]:
        if kind == "under-a-file":
            (w.tmp_path / "a-file").write_text("not a folder")
            w.doc["snapshot_folder"] = str(w.tmp_path / "a-file" / "snaps")
        else:  # read-only
            ro = w.tmp_path / "read-only"
            ro.mkdir()
            if os.geteuid() == 0:  # root writes through permissions: use a read-only file system
                res = subprocess.run(
                    ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], capture_output=True
                )
                if res.returncode != 0:
                    pytest.skip("cannot mount a read-only file system here")
                w.cleanups.append(lambda: subprocess.run(["umount", str(ro)], check=True))
            else:
                ro.chmod(0o555)
            w.doc["snapshot_folder"] = str(ro)
        return ["snapshot", "-t", w.topology]

    return arrange


def _custom_proc(create: str | None) -> Callable[[World], list[str]]:
    def arrange(w: World) -> list[str]:
        w.doc["publications"][0]["articles"] = [{"table": "public.orders", "upd_cmd": "XCALL custom.upd_orders"}]
        w.env.run(w.env.sub, "CREATE SCHEMA custom")
        if create:
            w.env.run(w.env.sub, create)
        return ["snapshot", "-t", w.topology]

    return arrange


def _endpoint(role: str, ref: str, command: str) -> Callable[[World], list[str]]:
    def arrange(w: World) -> list[str]:
        w.with_endpoint(role, ref)
        return [command, "-t", w.topology]

    return arrange


def _argv(*argv: str) -> Callable[[World], list[str]]:
    return lambda w: [a.replace("TOPOLOGY", w.topology) for a in argv]


CASES = [
    Case(
        "publisher-unreachable",
        "fresh",
        _unreachable("publisher", "snapshot"),
        5,
        ("cannot connect to the publisher", "127.0.0.1:"),
    ),
    Case(
        "subscriber-unreachable",
        "applied",
        _unreachable("subscriber", "distribution"),
        5,
        ("cannot connect to the subscriber 'sub1'",),
    ),
    Case(
        "distributor-unreachable",
        "fresh",
        _unreachable("distributor", "logreader"),
        5,
        ("cannot connect to the distributor",),
    ),
    Case(
        "unknown-host",
        "fresh",
        _endpoint("publisher", "postgresql://postgres@no-such-host.invalid:5432/db", "apply"),
        5,
        ("cannot connect to the publisher", "no-such-host.invalid"),
    ),
    Case(
        "publisher-wrong-password",
        "fresh",
        _wrong_password("publisher", "apply"),
        5,
        ("cannot connect to the publisher", "password authentication failed"),
    ),
    Case(
        "subscriber-wrong-password",
        "applied",
        _wrong_password("subscriber", "distribution"),
        5,
        ("cannot connect to the subscriber 'sub1'", "password authentication failed"),
    ),
    Case(
        "logreader-before-anything",
        "fresh",
        _argv("logreader", "-t", "TOPOLOGY"),
        3,
        ("publication 'p' is not deployed", "run the Snapshot Agent"),
    ),
    Case(
        "distribution-before-anything",
        "fresh",
        _argv("distribution", "-t", "TOPOLOGY"),
        3,
        ("publication 'p' is not deployed",),
    ),
    Case(
        "logreader-before-snapshot",
        "applied",
        _argv("logreader", "-t", "TOPOLOGY"),
        3,
        ("has no replication slot", "run the Snapshot Agent first"),
    ),
    Case(
        "distribution-before-snapshot",
        "applied",
        _argv("distribution", "-t", "TOPOLOGY"),
        3,
        ("subscriber 'sub1' has no snapshot of publication 'p'",),
    ),
    Case(
        "validate-before-snapshot",
        "fresh",
        _argv("validate", "-t", "TOPOLOGY"),
        3,
        ("publication 'p' is not deployed",),
    ),
    Case(
        "until-not-a-date",
        "applied",
        _argv("distribution", "-t", "TOPOLOGY", "--until", "not-a-date"),
        64,  # a usage error (EX_USAGE)
        ("argument --until: 'not-a-date' is not an ISO-8601 time",),
    ),
    Case(
        "until-month-13",
        "applied",
        _argv("distribution", "-t", "TOPOLOGY", "--until", "2026-13-01T00:00"),
        64,
        ("argument --until: '2026-13-01T00:00'",),
    ),
    Case(
        "snapshot-unknown-subscriber",
        "applied",
        _argv("snapshot", "-t", "TOPOLOGY", "--subscriber", "nope"),
        2,
        ("subscriber 'nope'",),
    ),
    Case(
        "distribution-unknown-subscriber",
        "applied",
        _argv("distribution", "-t", "TOPOLOGY", "--subscriber", "nope"),
        2,
        ("subscriber 'nope'",),
    ),
    Case(
        "validate-unknown-subscriber",
        "applied",
        _argv("validate", "-t", "TOPOLOGY", "--subscriber", "nope"),
        2,
        ("subscriber 'nope'",),
    ),
    Case(
        "unknown-publication",
        "fresh",
        _argv("snapshot", "-t", "TOPOLOGY", "-p", "nope"),
        2,
        ("unknown publication 'nope'",),
    ),
    Case("snapshot-folder-under-a-file", "fresh", _folder("under-a-file"), 2, ("snapshot folder", "a-file")),
    Case("snapshot-folder-read-only", "fresh", _folder("read-only"), 2, ("snapshot folder", "read-only")),
    Case(
        "custom-procedure-missing",
        "fresh",
        _custom_proc(None),
        2,
        ("custom procedure custom.upd_orders", "does not exist at subscriber 'sub1'"),
    ),
    Case(
        "custom-procedure-wrong-arguments",
        "fresh",
        _custom_proc("CREATE PROCEDURE custom.upd_orders(a int) LANGUAGE sql AS 'SELECT 1'"),
        2,
        ("custom procedure custom.upd_orders", "takes 1 parameter(s)"),
    ),
    Case(
        "conn-env-bad-json",
        "fresh",
        _conn_env('{"host": "127.0.0.1", "password": "PASSWORD",'),
        2,
        ("AIRFLOW_CONN_REPL_PUB is malformed", "not valid JSON"),
    ),
    Case(
        "conn-env-host-not-a-string",
        "fresh",
        _conn_env('{"conn_type": "postgres", "host": ["127.0.0.1"], "password": "PASSWORD"}'),
        2,
        ("AIRFLOW_CONN_REPL_PUB is malformed", "'host' must be a string, not list"),
    ),
    Case(
        "conn-env-bad-port",
        "fresh",
        _conn_env('{"host": "127.0.0.1", "port": "fifty", "password": "PASSWORD"}'),
        2,
        ("AIRFLOW_CONN_REPL_PUB is malformed", "Expected integer value for `port`"),
    ),
    Case(
        "conn-env-bad-uri-port",
        "fresh",
        _conn_env("postgres://postgres:PASSWORD@127.0.0.1:port/db"),
        2,
        ("AIRFLOW_CONN_REPL_PUB is malformed", "Port could not be cast to integer"),
    ),
    Case(
        "conn-env-garbage",
        "fresh",
        _conn_env("PASSWORD"),
        2,
        ("Airflow connection 'repl_pub' has connection type ''", "give it the type postgres"),
    ),
    Case(
        "conn-env-undefined",
        "fresh",
        _endpoint("publisher", "repl_undefined", "snapshot"),
        2,
        ("connection id 'repl_undefined' is not defined", "AIRFLOW_CONN_REPL_UNDEFINED"),
    ),
    Case(
        "snapshot-agent-busy",
        "applied",
        _argv("snapshot", "-t", "TOPOLOGY"),
        5,
        ("another Snapshot Agent is running for publication 'p'",),
        lambda w: _held_lock(w.env.dist, "airflow_repl.snapshot.p"),
    ),
    Case(
        "logreader-agent-busy",
        "applied",
        _argv("logreader", "-t", "TOPOLOGY"),
        5,
        ("another Log Reader Agent is running for publication 'p'",),
        lambda w: _held_lock(w.env.dist, "airflow_repl.logreader.p"),
    ),
    Case(
        "distribution-agent-busy",
        "applied",
        _argv("distribution", "-t", "TOPOLOGY"),
        5,
        ("another Distribution Agent is delivering publication 'p' to subscriber 'sub1'",),
        lambda w: _held_lock(w.env.sub, "airflow_repl.distribution.p"),
    ),
    Case(
        "unknown-option",
        "fresh",
        _argv("distribution", "-t", "TOPOLOGY", "--bogus"),
        64,
        ("unrecognized arguments: --bogus",),
    ),
    Case("missing-topology-option", "fresh", _argv("logreader"), 64, ("--topology",)),
    Case(
        "bad-dialect",
        "fresh",
        _argv("script-procs", "-t", "TOPOLOGY", "--dialect", "oracle"),
        64,
        ("invalid choice: 'oracle'",),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_runtime_input_is_one_line_and_changes_nothing(case: Case, env, spark, tmp_path, capsys):
    w = World(env, tmp_path)
    try:
        if case.state == "applied":
            assert cli.main(["apply", "-t", w.topology]) == 0
        argv = case.arrange(w)
        capsys.readouterr()
        before = world_state(env)
        history_before = last_run_id(env.dist)
        snaps_before = sorted(p.name for p in (tmp_path / "snaps").rglob("*")) if (tmp_path / "snaps").exists() else []
        with case.context(w):
            code = w.cli(*argv)
        out, err = capsys.readouterr()
        assert code == case.exit_code, err
        line = assert_one_error_line(err, out, *case.fragments)
        for secret in w.secrets:
            assert secret not in err + out, f"a password appears in the output: {line}"
        after = world_state(env)
        assert {**after, "distributor": without_run_records(after["distributor"])} == {
            **before,
            "distributor": without_run_records(before["distributor"]),
        }
        assert_recorded_only_as_refused(env.dist, line, history_before)
        snaps_after = sorted(p.name for p in (tmp_path / "snaps").rglob("*")) if (tmp_path / "snaps").exists() else []
        assert snaps_after == snaps_before
    finally:
        for cleanup in reversed(w.cleanups):
            cleanup()


def test_a_failure_inside_a_spark_task_is_the_agents_own_line(env2, spark, tmp_path, capsys):
    """With several subscribers, deliveries run as Spark tasks: each subscription's failure comes
    back as its outcome and is reported as the agent's one line, naming the subscriber, with its
    exit code."""
    env2.run(env2.pub, "CREATE TABLE orders (id int PRIMARY KEY, v text)")
    doc = {
        "publisher": to_uri(env2.pub),
        "distributor": to_uri(env2.dist),
        "subscribers": {name: to_uri(ci) for name, ci in env2.subs.items()},
        "snapshot_folder": str(tmp_path / "snaps"),
        "publications": [{"name": "p", "articles": [{"table": "public.orders"}]}],
        "subscriptions": [{"publication": "p", "subscriber": name} for name in env2.subs],
    }
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert cli.main(["apply", "-t", str(path)]) == 0
    capsys.readouterr()
    before = {name: without_run_records(database_state(ci)) for name, ci in [("dist", env2.dist), *env2.subs.items()]}
    history_before = last_run_id(env2.dist)
    assert cli.main(["distribution", "-t", str(path)]) == 3
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.startswith("airflow-repl: error:")]
    assert "Traceback" not in err + out
    assert lines == [
        f"airflow-repl: error: subscriber '{name}': subscriber '{name}' has no snapshot of publication 'p': run the "
        "Snapshot Agent to initialize the subscription"
        for name in env2.subs
    ]
    after = {name: without_run_records(database_state(ci)) for name, ci in [("dist", env2.dist), *env2.subs.items()]}
    assert after == before
    assert_recorded_only_as_refused(env2.dist, None, history_before)
