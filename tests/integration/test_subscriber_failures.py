"""Runs over several subscribers on Spark, one subscriber broken: every subscriber's work ends on
its own.  A broken one (its table dropped, its server down, a wrong password) is one line on
standard error naming it, its run recorded where it began; the others' rows arrive and their
summaries are printed; the exit code is the most serious of the subscribers'; no Python
traceback, no Java stack, no Spark progress bar or log4j line reaches the console."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psycopg
import pytest
import yaml
from harness import Env, database_state, setup_queued, unused_port

from airflow_repl import cli
from airflow_repl.engine.agents import log_reader_agent, snapshot_agent
from airflow_repl.engine.errors import ConnectionFailed, DeliveryError, NotInitialized, SubscribersFailed
from airflow_repl.engine.model import topology
from airflow_repl.engine.postgres.connections import resolve_topology, to_uri
from airflow_repl.jobs.agent_job import run_agent

#: What must never reach the console of a run whose subscribers fail (unless -v).
NOISE = ("Traceback", "at java.", "at org.apache", "PythonException", "TaskSetManager", "[Stage ", "WARN ", "ERROR ")


def wrong_password(conninfo: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(conninfo)
    return to_uri(psycopg.conninfo.make_conninfo(**{**params, "password": "Wr0ng-S3cret-pw"}))


def closed_port(conninfo: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(conninfo)
    return to_uri(psycopg.conninfo.make_conninfo(**{**params, "port": str(unused_port())}))


def replicated(env: Env, spark, tmp_path, updates: int = 3) -> dict:
    """``orders`` published to every subscriber of ``env`` and snapshotted there, ``updates``
    updates read by the Log Reader and waiting for delivery; returns the topology document."""
    env.run(
        env.pub,
        "CREATE TABLE orders (id int PRIMARY KEY, v text); "
        "INSERT INTO orders SELECT g, 'v' FROM generate_series(1, 20) g",
    )
    doc = {
        **{k: v for k, v in env.servers().items() if k != "subscribers"},
        "subscribers": {name: to_uri(ci) for name, ci in env.subs.items()},
        "publications": [{"name": "p", "articles": [{"table": "public.orders"}]}],
        "subscriptions": [{"publication": "p", "subscriber": name} for name in env.subs],
    }
    topo = env.topology(["public.orders"])
    snapshot_agent.run_snapshot(topo, "p", spark)
    env.run(env.pub, "UPDATE orders SET v = 'w' WHERE id <= %s", (updates,))
    assert log_reader_agent.run_log_reader(topo, "p")["transactions"] == 1
    return doc


def write(doc: dict, tmp_path) -> str:
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("airflow-repl: error:")]


def assert_quiet(out: str, err: str) -> None:
    for noise in NOISE:
        assert noise not in out + err, f"{noise!r} in the output:\n{out}\n{err}"


def last_run(env: Env, subscriber: str) -> tuple:
    return env.rows(
        env.dist,
        "SELECT h.status, h.message, e.message FROM airflow_repl.agent_history h "
        "LEFT JOIN airflow_repl.errors e ON e.run_id = h.run_id "
        "WHERE h.agent = 'distribution' AND h.subscriber = %s ORDER BY h.run_id DESC LIMIT 1",
        (subscriber,),
    )[0]


def test_the_cli_delivers_to_the_healthy_subscribers_and_names_each_broken_one(env3, spark, tmp_path):
    """Through the command line as a user runs it (its own process, its own local Spark): sub2's
    table is gone (a delivery error, 4), sub3's password is wrong (retryable, 5); sub1 gets its
    rows, every summary is on standard output, one line per broken subscriber on standard error,
    and the exit code is 4, the more serious."""
    env = env3
    doc = replicated(env, spark, tmp_path)
    env.run(env.subs["sub2"], "DROP TABLE orders")
    doc["subscribers"]["sub3"] = wrong_password(env.subs["sub3"])
    path = write(doc, tmp_path)
    environ = {k: v for k, v in os.environ.items() if k != "AIRFLOW_REPL_SPARK_MASTER"}
    res = subprocess.run(
        [sys.executable, "-m", "airflow_repl.cli", "distribution", "-t", path, "-p", "p"],
        capture_output=True,
        text=True,
        timeout=300,
        env=environ,
    )
    assert res.returncode == DeliveryError.exit_code == 4, res.stderr
    assert_quiet(res.stdout, res.stderr)
    lines = error_lines(res.stderr)
    assert len(lines) == 2, res.stderr
    assert lines[0].startswith("airflow-repl: error: subscriber 'sub2': cannot apply update")
    assert 'relation "public.orders" does not exist' in lines[0]
    assert lines[1].startswith("airflow-repl: error: subscriber 'sub3': cannot connect to the subscriber 'sub3'")
    assert "Wr0ng-S3cret-pw" not in res.stdout + res.stderr
    summary = json.loads(res.stdout)
    by_name = {s["subscriber"]: s for s in summary["subscriptions"]}
    assert by_name["sub1"]["status"] == "succeeded" and by_name["sub1"]["transactions"] == 1
    assert (by_name["sub2"]["status"], by_name["sub2"]["exit_code"]) == ("failed", 4)
    assert (by_name["sub3"]["status"], by_name["sub3"]["exit_code"], by_name["sub3"]["retryable"]) == (
        "failed",
        5,
        True,
    )
    assert summary["transactions"] == 1 and summary["commands"] == 3 and summary["spark_application_id"]
    assert env.rows(env.subs["sub1"], "SELECT count(*) FROM orders WHERE v = 'w'") == [(3,)]
    status, message, error = last_run(env, "sub2")
    assert status == "failed" and message == error and lines[0].endswith(message.splitlines()[0])


@pytest.mark.parametrize("broken", ["missing table", "server down"])
def test_two_subscribers_one_broken_the_other_delivered(broken, env2, spark, tmp_path, capfd):
    """In this process, on the shared SparkSession: sub1 broken, sub2 delivered."""
    env = env2
    doc = replicated(env, spark, tmp_path)
    if broken == "missing table":
        env.run(env.subs["sub1"], "DROP TABLE orders")
    else:
        doc["subscribers"]["sub1"] = closed_port(env.subs["sub1"])
    capfd.readouterr()
    code = cli.main(["distribution", "-t", write(doc, tmp_path)])
    out, err = capfd.readouterr()
    expected = DeliveryError if broken == "missing table" else ConnectionFailed
    assert code == expected.exit_code, err
    assert_quiet(out, err)
    lines = error_lines(err)
    assert len(lines) == 1 and lines[0].startswith("airflow-repl: error: subscriber 'sub1': "), err
    assert ("cannot apply update" if broken == "missing table" else "cannot connect to the subscriber 'sub1'") in lines[
        0
    ]
    summary = json.loads(out)
    assert [(s["subscriber"], s["status"]) for s in summary["subscriptions"]] == [
        ("sub1", "failed"),
        ("sub2", "succeeded"),
    ]
    assert env.rows(env.subs["sub2"], "SELECT count(*) FROM orders WHERE v = 'w'") == [(3,)]
    assert env.rows(env.subs["sub1" if broken == "server down" else "sub2"], "SELECT count(*) FROM orders") == [(20,)]
    # the next run, the subscriber repaired, delivers the rest there and nothing again at sub2
    if broken == "missing table":
        env.run(env.subs["sub1"], "CREATE TABLE orders (id int PRIMARY KEY, v text)")
        env.run(env.subs["sub1"], "INSERT INTO orders SELECT g, 'v' FROM generate_series(1, 20) g")
    doc["subscribers"]["sub1"] = to_uri(env.subs["sub1"])
    assert cli.main(["distribution", "-t", write(doc, tmp_path)]) == 0
    again = {s["subscriber"]: s["transactions"] for s in json.loads(capfd.readouterr().out)["subscriptions"]}
    assert again == {"sub1": 1, "sub2": 0}
    for sub in env.subs.values():
        assert env.rows(sub, "SELECT count(*) FROM orders WHERE v = 'w'") == [(3,)]


def test_three_subscribers_the_exit_code_is_the_most_serious(env3, spark, tmp_path):
    """run_agent, as the job and the operators call it: sub1 not initialized (3), sub3's server
    down (5), sub2 delivered; SubscribersFailed carries the summary, exit 3, not retryable."""
    env = env3
    doc = replicated(env, spark, tmp_path)
    env.run(env.subs["sub1"], "DELETE FROM airflow_repl.subscription_state")  # its snapshot was never loaded
    doc["subscribers"]["sub3"] = closed_port(env.subs["sub3"])
    topo = resolve_topology(topology.load(write(doc, tmp_path)))
    with pytest.raises(SubscribersFailed) as info:
        run_agent("distribution", topo, "p", spark=spark)
    exc = info.value
    assert exc.exit_code == NotInitialized.exit_code == 3 and not exc.retryable
    assert [f["subscriber"] for f in exc.failures] == ["sub1", "sub3"]
    assert str(exc).splitlines()[0].startswith("subscriber 'sub1': subscriber 'sub1' has no snapshot")
    assert [s["status"] for s in exc.summary["subscriptions"]] == ["failed", "succeeded", "failed"]
    assert env.rows(env.subs["sub2"], "SELECT count(*) FROM orders WHERE v = 'w'") == [(3,)]


def test_validate_reports_the_healthy_subscribers_and_names_the_broken_one(env2, spark, tmp_path, capfd):
    env = env2
    doc = replicated(env, spark, tmp_path)
    path = write(doc, tmp_path)
    assert cli.main(["distribution", "-t", path]) == 0
    env.run(env.subs["sub1"], "DROP TABLE orders")
    before = database_state(env.subs["sub2"])
    capfd.readouterr()
    code = cli.main(["validate", "-t", path, "-o", "json"])
    out, err = capfd.readouterr()
    assert code == NotInitialized.exit_code, err
    assert_quiet(out, err)
    lines = error_lines(err)
    assert len(lines) == 1 and lines[0].startswith("airflow-repl: error: subscriber 'sub1': subscriber 'sub1' has no")
    report = json.loads(out)
    assert list(report["subscribers"]) == ["sub2"] and report["subscribers"]["sub2"][0]["match"] is True
    assert report["failures"][0]["subscriber"] == "sub1"
    assert database_state(env.subs["sub2"]) == before


def test_the_queue_reader_applies_the_healthy_queues_and_names_the_broken_one(env2, spark):
    """Queued updating, two subscribers' queues read as Spark tasks: sub2's server is down; sub1's
    change reaches the publisher."""
    topo = setup_queued(env2, spark)
    env2.run(env2.subs["sub1"], "UPDATE items SET v = 'one' WHERE id = 1")
    doc = topo.to_dict(with_secrets=True)
    doc["subscribers"]["sub2"] = closed_port(env2.subs["sub2"])
    with pytest.raises(SubscribersFailed) as info:
        run_agent("queuereader", resolve_topology(topology.from_dict(doc)), "p", spark=spark)
    exc = info.value
    assert exc.exit_code == ConnectionFailed.exit_code and exc.retryable
    assert [f["subscriber"] for f in exc.failures] == ["sub2"]
    assert str(exc).startswith("subscriber 'sub2': cannot connect to the subscriber 'sub2'")
    (done,) = [s for s in exc.summary["subscriptions"] if s["status"] == "succeeded"]
    assert done["subscriber"] == "sub1" and done["transactions"] == exc.summary["transactions"] == 1
    assert env2.rows(env2.pub, "SELECT v FROM items WHERE id = 1") == [("one",)]
