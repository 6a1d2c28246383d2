"""Fault injection: while a workload writes to the publisher, Log Reader and Distribution Agents
run in their own processes and are killed (SIGKILL) at seeded random moments, and the publisher
(which also hosts the distribution database) and the subscriber are crashed and restarted
(``pg_ctl restart -m immediate``) at random moments.  Then the agents run to the end.

The publisher's WAL starts just below 0/10000000, where an LSN's text gains a digit, and the
workload crosses it during the run (its backlog spans the boundary).

What must hold: the subscriber's table equals the publisher's row by row; every row change
the publisher made after the snapshot was stored once and applied once (counted by triggers on
both sides); every agent that was not killed either succeeded or failed with one
``airflow-repl: error:`` line and a retryable exit code; no output holds a traceback; no run is
left 'running'.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time

import psycopg
import pytest
from harness import AGENT_RUNNER, Outcome, count_applied_rows, run_agent_process

from airflow_repl.engine.agents import snapshot_agent

SEED = int(os.environ.get("AIRFLOW_REPL_FAULT_SEED", "8"))
CHAOS_SECONDS = float(os.environ.get("AIRFLOW_REPL_FAULT_SECONDS", "18"))


class Workload(threading.Thread):
    """Inserts, updates, key updates and deletes on ``items``, reconnecting whenever the
    publisher goes away (a transaction cut off by a crash either committed or did not: the
    comparison at the end is against what the publisher holds)."""

    def __init__(self, conninfo: str, rng: random.Random) -> None:
        super().__init__(daemon=True)
        self.conninfo, self.rng = conninfo, rng
        self.stop_event = threading.Event()
        self.commits = self.errors = 0

    def run(self) -> None:
        i = 0
        while not self.stop_event.is_set():
            try:
                with psycopg.connect(self.conninfo, autocommit=True, connect_timeout=5) as conn:
                    while not self.stop_event.is_set():
                        i += 1
                        with conn.transaction():
                            conn.execute(
                                "INSERT INTO items (id, grp, payload) VALUES (%s, %s, %s)",
                                (100_000 + i, i % 7, f"new {i}"),
                            )
                            conn.execute(
                                "UPDATE items SET payload = payload || '+' WHERE id = %s", (1 + (i * 37) % 2000,)
                            )
                            conn.execute("UPDATE items SET id = id + 1000000 WHERE id = %s", (1 + (i * 101) % 2000,))
                            conn.execute("DELETE FROM items WHERE id = %s", (1 + (i * 53) % 2000,))
                            if i % 40 == 0:  # now and then a bigger transaction
                                conn.execute("UPDATE items SET grp = grp + 1 WHERE id %% 40 = %s", (i % 40,))
                        self.commits += 1
                        time.sleep(0.002)
            except psycopg.OperationalError:
                self.errors += 1
                time.sleep(0.2)


class Crasher(threading.Thread):
    """Restarts the publisher's or the subscriber's cluster with ``-m immediate`` (a crash) at
    random moments."""

    def __init__(self, sandbox, clusters: dict[str, str], rng: random.Random) -> None:
        super().__init__(daemon=True)
        self.sandbox, self.clusters, self.rng = sandbox, clusters, rng
        self.stop_event = threading.Event()
        self.restarts: list[str] = []

    def run(self) -> None:
        while not self.stop_event.wait(self.rng.uniform(1.5, 4.0)):
            role = self.rng.choice(sorted(self.clusters))
            self.sandbox.restart_cluster(self.clusters[role], "immediate")
            self.restarts.append(role)


def _wait_until_up(conninfo: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            psycopg.connect(conninfo, connect_timeout=5).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _run_to_the_end(agent: str, spec: str, kwargs: dict, outcomes: list[Outcome]) -> Outcome:
    """Run an agent until it succeeds (retryable failures, e.g. a server still recovering,
    are retried the way Airflow would)."""
    for _ in range(20):
        outcome = run_agent_process(agent, spec, kwargs)
        outcomes.append(outcome)
        if outcome.code == 0:
            return outcome
        assert outcome.code == 5, outcome.err
        time.sleep(0.5)
    raise AssertionError(f"{agent} never succeeded: {outcome.err}")


def _cross(env) -> str:
    """Move the publisher's WAL past the boundary (it may be down: a crash is being injected)."""
    for _ in range(100):
        try:
            return env.cross_boundary()
        except psycopg.OperationalError:
            time.sleep(0.2)
    raise AssertionError("the publisher never came back to cross the boundary")


def _count_row_changes(env) -> None:
    """Triggers that count every row change: at the publisher (a key update counts 2, the
    DELETE + INSERT pair it becomes) and at the subscriber (rows the agents apply)."""
    env.run(
        env.pub,
        """
        CREATE TABLE changes (n int NOT NULL);
        CREATE FUNCTION count_change() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN
            INSERT INTO changes VALUES (CASE WHEN TG_OP = 'UPDATE' AND OLD.id <> NEW.id THEN 2 ELSE 1 END);
            RETURN NULL; END$$;
        CREATE TRIGGER count_change AFTER INSERT OR UPDATE OR DELETE ON items
            FOR EACH ROW EXECUTE FUNCTION count_change();""",
    )
    count_applied_rows(env)


BOUNDARY = "0/10000000"


@pytest.mark.parametrize(("streams", "bulk"), [(1, False), (3, False), (1, True)])
def test_agents_killed_and_servers_crashed_at_random_lose_and_double_nothing(streams, bulk, wal_env, spark, sandbox):
    """(``bulk``: by net change, each next batch read and prepared ahead on a second distributor session.)"""
    rng = random.Random(SEED * 10 + streams + 5 * bulk)
    env = wal_env(BOUNDARY)
    tmp_path = env.tmp_path
    tmp_path.mkdir(parents=True, exist_ok=True)
    env.run(env.pub, "CREATE TABLE items (id bigint PRIMARY KEY, grp int NOT NULL, payload text)")
    env.run(env.pub, "INSERT INTO items SELECT g, g % 7, md5(g::text) FROM generate_series(1, 2000) g")
    topo = env.topology(["public.items"], subscription_streams=streams, commit_batch_size=5, bulk_apply=bulk)
    snapshot_agent.run_snapshot(topo, "p", spark)
    _count_row_changes(env)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(topo.to_dict(with_secrets=True)))
    kwargs = {"logreader": {"batch_changes": 300}, "distribution": {}}

    workload = Workload(env.pub, random.Random(rng.random()))
    crasher = Crasher(
        sandbox, {"publisher": env.publisher_cluster, "subscriber": "subscriber"}, random.Random(rng.random())
    )
    cross_at = rng.uniform(0.2, 0.6) * CHAOS_SECONDS
    crossed = None
    outcomes: list[Outcome] = []
    workload.start()
    crasher.start()
    started = time.monotonic()
    try:
        while time.monotonic() - started < CHAOS_SECONDS:
            if crossed is None and time.monotonic() - started > cross_at:
                crossed = _cross(env)
            agent = rng.choice(["logreader", "distribution"])
            kill_after = rng.uniform(0.05, 1.2) if rng.random() < 0.6 else None
            outcomes.append(run_agent_process(agent, str(spec), kwargs[agent], kill_after))
    finally:
        crasher.stop_event.set()
        crasher.join()
        workload.stop_event.set()
        workload.join()
    _wait_until_up(env.pub)
    _wait_until_up(env.sub)
    chaos = list(outcomes)
    final_read = _run_to_the_end("logreader", str(spec), kwargs["logreader"], outcomes)
    final_delivery = _run_to_the_end("distribution", str(spec), kwargs["distribution"], outcomes)

    kills = sum(o.killed for o in chaos)
    failures = [o for o in outcomes if not o.killed and o.code != 0]
    report = {
        "streams": streams,
        "bulk_apply": bulk,
        "seed": SEED,
        "boundary": BOUNDARY,
        "crossed_at": crossed,
        "agent_runs": len(outcomes),
        "kills": kills,
        "restarts": len(crasher.restarts),
        "restarted": crasher.restarts,
        "failed_runs": len(failures),
        "workload_commits": workload.commits,
        "workload_reconnects": workload.errors,
        "final_read": json.loads(final_read.out)["transactions"],
        "final_delivery": json.loads(final_delivery.out)["transactions"],
        "errors": sorted({o.err.strip().splitlines()[-1][:160] for o in failures}),
    }
    print("fault injection:", json.dumps(report))
    assert kills >= 3 and len(crasher.restarts) >= 2 and workload.commits > 100, report

    for o in outcomes:  # no traceback anywhere; a failure is one line and a retryable exit code
        assert "Traceback" not in o.out + o.err, o.err
        if not o.killed and o.code != 0:
            assert o.code == 5, o.err
            lines = [line for line in o.err.splitlines() if line.startswith("airflow-repl: error:")]
            assert len(lines) == 1, o.err
    lost = [o for o in failures if "lost connection to the" in o.err]
    assert all("(127.0.0.1:" in o.err for o in lost)

    # tables equal row by row; nothing stored or applied twice, nothing lost
    pub_rows = env.rows(env.pub, "SELECT id, grp, payload FROM items ORDER BY id")
    sub_rows = env.rows(env.sub, "SELECT id, grp, payload FROM items ORDER BY id")
    assert len(pub_rows) == len(sub_rows) and pub_rows == sub_rows
    published = env.rows(env.pub, "SELECT coalesce(sum(n), 0) FROM changes")[0][0]
    stored = env.rows(env.dist, "SELECT coalesce(sum(command_count), 0) FROM airflow_repl.transactions")[0][0]
    applied = env.rows(env.sub, "SELECT count(*) FROM applied")[0][0]
    if bulk:  # the subscriber's triggers see each batch's net rows, never more than its commands
        assert published == stored >= applied, (published, stored, applied)
    else:
        assert published == stored == applied, (published, stored, applied)
    # each stored transaction committed at the subscriber once (the watermark's count of them)
    (stored_txns,) = env.rows(env.dist, "SELECT count(*) FROM airflow_repl.transactions")[0]
    assert env.rows(env.sub, "SELECT transactions FROM airflow_repl.subscription_state") == [(stored_txns,)]
    assert env.rows(env.sub, "SELECT count(*) FROM pg_prepared_xacts") == [(0,)]
    # the delivered backlog spans the boundary
    below, above = env.rows(
        env.dist,
        "SELECT count(*) FILTER (WHERE xact_seqno < %s), "
        "count(*) FILTER (WHERE xact_seqno > %s) FROM airflow_repl.transactions",
        (BOUNDARY, BOUNDARY),
    )[0]
    assert below > 0 and above > 0, (below, above)
    # every run ended: killed ones are marked abandoned by the next run, the rest succeeded or failed
    assert env.rows(env.dist, "SELECT count(*) FROM airflow_repl.agent_history WHERE status = 'running'") == [(0,)]


@pytest.mark.parametrize(
    ("role", "bulk"), [("subscriber", False), ("distributor", False), ("subscriber", True), ("distributor", True)]
)
def test_a_server_going_away_mid_run_is_one_line_and_the_run_is_recorded(role, bulk, env, spark, tmp_path):
    """The Distribution Agent's session at the subscriber (or the distributor) is terminated
    mid-delivery: one line naming the server by role and host:port, exit 5, and the run's
    history row says failed (or, the distributor being gone, the next run marks it abandoned);
    the next run delivers the rest exactly once.  With ``bulk_apply`` the agent has a second
    distributor session, reading the next batch ahead: it goes too."""
    env.run(env.pub, "CREATE TABLE items (id bigint PRIMARY KEY, grp int NOT NULL, payload text)")
    env.run(env.pub, "INSERT INTO items SELECT g, 0, 'x' FROM generate_series(1, 100) g")
    topo = env.topology(["public.items"], commit_batch_size=1, bulk_apply=bulk)
    snapshot_agent.run_snapshot(topo, "p", spark)
    _count_row_changes(env)
    env.run(
        env.sub,
        "CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS "
        "$$BEGIN PERFORM pg_sleep(0.02); RETURN NULL; END$$; "
        "CREATE TRIGGER slow AFTER UPDATE ON items FOR EACH ROW EXECUTE FUNCTION slow(); "
        "ALTER TABLE items ENABLE ALWAYS TRIGGER slow",
    )
    for i in range(40):
        env.run(env.pub, "UPDATE items SET grp = grp + 1 WHERE id %% 40 = %s", (i,))
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(topo.to_dict(with_secrets=True)))
    assert run_agent_process("logreader", str(spec), {}).code == 0
    target = env.sub if role == "subscriber" else env.dist
    proc = subprocess.Popen(
        [sys.executable, AGENT_RUNNER, "distribution", str(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while env.rows(env.sub, "SELECT transactions FROM airflow_repl.subscription_state")[0][0] < 3:
        assert proc.poll() is None and time.monotonic() < deadline, "the agent finished too early"
        time.sleep(0.01)
    env.run(
        target,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 5, err
    assert "Traceback" not in out + err
    lines = [line for line in err.splitlines() if line.startswith("airflow-repl: error:")]
    port = psycopg.conninfo.conninfo_to_dict(target)["port"]
    who = "subscriber 'sub1'" if role == "subscriber" else "distributor"
    assert len(lines) == 1 and f"lost connection to the {who} (127.0.0.1:{port}) during delivery" in lines[0], err
    status, message = env.rows(
        env.dist,
        "SELECT status, message FROM airflow_repl.agent_history "
        "WHERE agent = 'distribution' ORDER BY run_id DESC LIMIT 1",
    )[0]
    if role == "subscriber":
        assert lines[0].endswith("the run is recorded as failed; run it again")
        assert status == "failed" and message == lines[0].removeprefix("airflow-repl: error: ")
    else:
        assert lines[0].endswith("the next run will record this run as abandoned; run it again")
        assert status == "running"
    assert run_agent_process("distribution", str(spec), {}).code == 0
    statuses = [
        r[0]
        for r in env.rows(
            env.dist, "SELECT status FROM airflow_repl.agent_history WHERE agent = 'distribution' ORDER BY run_id"
        )
    ]
    assert statuses == ["failed" if role == "subscriber" else "abandoned", "succeeded"]
    assert env.rows(env.pub, "SELECT id, grp FROM items ORDER BY id") == env.rows(
        env.sub, "SELECT id, grp FROM items ORDER BY id"
    )
    assert env.rows(env.pub, "SELECT sum(n) FROM changes") == env.rows(env.sub, "SELECT count(*) FROM applied")
