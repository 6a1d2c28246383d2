"""Continuous mode of the Log Reader and Distribution Agents against real servers: changes keep
arriving without restarting the agents, runs end cleanly at their maximum run time or on
SIGTERM, and a restart resumes with nothing lost or doubled.  No timing goal is asserted here
(live lag is `make bench`'s); the lag seen is only printed."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from harness import (
    AGENT_RUNNER,
    AgentThread,
    assert_in_sync,
    count_applied_rows,
    idle_for,
    lock_waits,
    make_items,
    signal_and_time,
    signal_while_restarting,
    snapshotted_items,
    spec_file,
    wait_for,
    wait_until,
)

from airflow_repl.engine.agents import distribution_agent, log_reader_agent, snapshot_agent
from airflow_repl.engine.errors import ReplError
from airflow_repl.engine.model.topology import from_dict
from airflow_repl.engine.provisioning.schema_change import schema_change
from airflow_repl.engine.state import dist_transactions
from airflow_repl.jobs import agent_job
from airflow_repl.jobs.agent_job import run_agent
from airflow_repl.operators.agents import DistributionAgentOperator, LogReaderAgentOperator, QueueReaderAgentOperator

POLL = 0.2


def _write(conninfo: str, first: int, n: int) -> None:
    """``n`` small transactions (an insert and an update each), a few milliseconds apart."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for i in range(first, first + n):
            with conn.transaction():
                conn.execute("INSERT INTO items (id, grp, payload) VALUES (%s, 1, 'live')", (1_000_000 + i,))
                conn.execute("UPDATE items SET payload = payload || '+' WHERE id = %s", (1 + i % 500,))
            time.sleep(0.005)


@pytest.mark.parametrize("bulk", [False, True], ids=["commands", "bulk_apply"])
def test_continuous_agents_follow_a_writer_and_a_schema_change_and_end_cleanly_at_max_run_seconds(env, spark, bulk):
    """(``bulk_apply``: batches by net change, each next one read ahead while one is applied, a
    schema change between them.)"""
    topo = snapshotted_items(env, spark, 1000, bulk_apply=bulk)
    count_applied_rows(env)
    runs = 10.0
    reader = AgentThread(
        log_reader_agent.run_log_reader, topo, "p", continuous=True, poll_interval=POLL, max_run_seconds=runs
    )
    dist = AgentThread(
        distribution_agent.run_distribution,
        topo,
        "p",
        "sub1",
        continuous=True,
        poll_interval=POLL,
        max_run_seconds=runs,
    )
    reader.start()
    dist.start()
    arrived = lambda n: env.rows(env.sub, "SELECT count(*) FROM items WHERE id >= 1000000")[0][0] >= n  # noqa: E731
    lags = []
    for wave in range(3):  # three waves, each arriving while both agents keep running
        _write(env.pub, wave * 100, 100)
        lag = wait_for(lambda w=wave: arrived((w + 1) * 100), runs)
        assert lag is not None, f"wave {wave} did not arrive ({reader.error!r}, {dist.error!r})"
        assert reader.is_alive() and dist.is_alive()
        lags.append(lag)
        if wave == 0:  # a schema change arrives in order too, and the runs go on with the new columns
            schema_change(topo, "p", "ALTER TABLE items ADD COLUMN extra text DEFAULT 'e'")
    print(f"continuous lag after each wave's last commit: {[round(x, 2) for x in lags]} s")
    reader.join(runs + 30)
    dist.join(runs + 30)
    assert reader.error is None and dist.error is None, (reader.error, dist.error)
    assert reader.summary and dist.summary
    for summary in (reader.summary, dist.summary):
        assert summary["continuous"]["ended_by"] == "max_run_seconds"
        assert (summary["transactions"], summary["commands"]) == (301, 601)  # 300 writes and the schema change
    assert dist.summary["schema_changes"] == 1
    if bulk:  # the subscriber's triggers see net rows
        assert 300 <= env.rows(env.sub, "SELECT count(*) FROM applied")[0][0] <= 600
        assert dist.summary["net_batches"] >= 1
    else:
        assert env.rows(env.sub, "SELECT count(*) FROM applied")[0][0] == 600
    assert env.rows(env.sub, "SELECT count(*) FROM items WHERE extra = 'e'")[0][0] == 1300  # the new column arrived
    history = env.rows(
        env.dist,
        "SELECT agent, status, transactions FROM airflow_repl.agent_history "
        "WHERE agent IN ('logreader', 'distribution') AND started_at > now() - interval '5 minutes' ORDER BY agent",
    )
    assert history == [("distribution", "succeeded", 301), ("logreader", "succeeded", 301)]
    assert_in_sync(topo)


def test_sigterm_ends_a_continuous_distribution_cleanly_and_a_restart_resumes(env, spark, tmp_path):
    topo = snapshotted_items(env, spark, 5000, commit_batch_size=4)
    count_applied_rows(env)
    for i in range(200):  # 200 transactions x 25 updates = 5000 commands
        env.run(env.pub, "UPDATE items SET grp = grp + 1, payload = payload || 'x' WHERE id %% 200 = %s", (i,))
    assert log_reader_agent.run_log_reader(topo, "p")["transactions"] == 200
    kwargs = json.dumps({"continuous": True, "poll_interval": POLL, "max_run_seconds": 120})
    proc = subprocess.Popen(
        [sys.executable, AGENT_RUNNER, "distribution", spec_file(topo, tmp_path), kwargs],
        stdout=subprocess.PIPE,
        text=True,
    )
    state = lambda: env.rows(env.sub, "SELECT transactions FROM airflow_repl.subscription_state")[0][0]  # noqa: E731
    assert wait_for(lambda: state() >= 8 or proc.poll() is not None, 60) is not None
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    summary = json.loads(out)
    assert summary["continuous"]["ended_by"] == "SIGTERM"
    partial = state()
    assert summary["transactions"] == partial and 8 <= partial <= 200
    assert env.rows(env.sub, "SELECT count(*) FROM applied")[0][0] == partial * 25  # whole batches only
    last = env.rows(env.dist, "SELECT status FROM airflow_repl.agent_history ORDER BY run_id DESC LIMIT 1")
    assert last == [("succeeded",)]
    rest = distribution_agent.run_distribution(topo, "p", "sub1")
    assert rest["transactions"] == 200 - partial and state() == 200
    assert env.rows(env.sub, "SELECT count(*) FROM applied")[0][0] == 5000
    assert_in_sync(topo)


def test_operators_pass_continuous_options_to_the_job_and_refuse_bad_ones():
    common = {"topology": "t.yaml", "publication": "p"}
    reader = LogReaderAgentOperator(task_id="r", continuous=True, poll_interval=0.5, max_run_seconds=600, **common)
    assert reader._extra_args() == ["--continuous", "--poll-interval", "0.5", "--max-run-seconds", "600"]
    assert LogReaderAgentOperator(task_id="once", **common)._extra_args() == []
    dist = DistributionAgentOperator(task_id="d", continuous=True, **common)
    assert dist._extra_args() == ["--continuous"]
    with pytest.raises(ReplError, match="cannot be combined"):
        DistributionAgentOperator(task_id="d2", continuous=True, until="{{ data_interval_end }}", **common)
    queues = QueueReaderAgentOperator(task_id="q", continuous=True, poll_interval=2, max_run_seconds=900, **common)
    assert queues._extra_args() == ["--continuous", "--poll-interval", "2", "--max-run-seconds", "900"]
    assert QueueReaderAgentOperator(task_id="q1", **common)._extra_args() == []
    with pytest.raises(ReplError, match=r"max_run_seconds \(--max-run-seconds\) 0 is not a positive number"):
        QueueReaderAgentOperator(task_id="q2", continuous=True, max_run_seconds=0, **common)
    with pytest.raises(ReplError, match=r"poll_interval \(--poll-interval\) -1 is not a positive number"):
        LogReaderAgentOperator(task_id="r2", continuous=True, poll_interval=-1, **common)


def test_the_example_dag_runs_both_agents_continuously_side_by_side(monkeypatch):
    from airflow_repl import demo

    monkeypatch.syspath_prepend(str(demo.DAGS))  # the DAGs import repl_common, as in Airflow's dags folder
    dag = demo.load_dag("repl_continuous.py")
    assert dag.dag_id == "airflow_repl_continuous" and dag.max_active_runs == 1
    assert type(dag.timetable).__name__ == "ContinuousTimetable"  # schedule="@continuous"
    tasks = {t.task_id: t for t in dag.tasks}
    assert set(tasks) == {"log_reader", "distribution"}
    for task in tasks.values():
        assert not task.upstream_task_ids  # parallel, not one after the other
        assert task._extra_args() == ["--continuous", "--poll-interval", "1.0", "--max-run-seconds", "600"]


def test_the_updatable_example_dag_runs_all_three_agents_continuously_side_by_side(monkeypatch):
    from airflow_repl import demo

    monkeypatch.syspath_prepend(str(demo.DAGS))
    dag = demo.load_dag("repl_updatable_continuous.py")
    assert dag.dag_id == "airflow_repl_updatable_continuous" and dag.max_active_runs == 1
    assert type(dag.timetable).__name__ == "ContinuousTimetable"
    tasks = {t.task_id: t for t in dag.tasks}
    assert {t: type(task).__name__ for t, task in tasks.items()} == {
        "queue_reader": "QueueReaderAgentOperator",
        "log_reader": "LogReaderAgentOperator",
        "distribution": "DistributionAgentOperator",
    }
    for task in tasks.values():
        assert not task.upstream_task_ids
        assert task._extra_args() == ["--continuous", "--poll-interval", "1.0", "--max-run-seconds", "600"]


def test_a_continuous_job_whose_parent_is_killed_ends_cleanly_and_writes_its_summary(env, spark, tmp_path):
    """Airflow stops a task by killing spark-submit, whose Python driver would be left running:
    the job notices that its parent went away and ends like on SIGTERM."""
    topo = snapshotted_items(env, spark, 100)
    job = str(Path(agent_job.__file__).resolve())
    result = tmp_path / "result.json"
    argv = [sys.executable, job, "logreader", "--spec", spec_file(topo, tmp_path), "--result", str(result)]
    argv += ["--publication", "p", "--continuous", "--poll-interval", str(POLL), "--max-run-seconds", "120"]
    parent = subprocess.Popen(["bash", "-c", f"{shlex.join(argv)} & wait"])  # stands in for spark-submit's JVM
    _write(env.pub, 0, 5)
    stored = lambda: env.rows(env.dist, "SELECT count(*) FROM airflow_repl.transactions")[0][0] >= 5  # noqa: E731
    assert wait_for(stored, 60) is not None
    parent.kill()
    parent.wait()
    assert wait_for(result.exists, 30) is not None, "the orphaned job did not end"
    outcome = json.loads(result.read_text())
    assert outcome["status"] == "succeeded" and outcome["transactions"] == 5
    assert outcome["continuous"]["ended_by"] == "parent process gone"


@pytest.mark.parametrize(
    ("agent", "says"),
    [
        ("distribution", "continuous delivery of publication 'p' to 3 subscribers needs 3 Spark tasks at once"),
        (
            "queuereader",
            "continuous reading of the queues of publication 'p' at 3 subscribers needs 3 Spark tasks at once",
        ),
    ],
)
def test_continuous_runs_for_more_subscribers_than_task_slots_are_refused(spark, agent, says):
    """Each subscriber's continuous delivery (or queue) holds a Spark task for the whole run:
    with more subscribers than slots (local[2] here) some would wait for a whole window."""
    subscribers = {f"s{i}": f"postgresql://nowhere.invalid/s{i}" for i in range(3)}
    topo = from_dict(
        {
            "publisher": "postgresql://nowhere.invalid/pub",
            "distributor": "postgresql://nowhere.invalid/dist",
            "subscribers": subscribers,
            "publications": [{"name": "p", "articles": [{"table": "public.t"}]}],
            "subscriptions": [{"publication": "p", "subscriber": s} for s in subscribers],
        }
    )
    with pytest.raises(ReplError, match=f"{says}, and the application has 2 task slots"):
        run_agent(agent, topo, "p", subscribers=list(subscribers), spark=spark, continuous={"continuous": True})


@pytest.mark.parametrize(("waits_on", "signum"), [("a lock", signal.SIGTERM), ("a restarted server", signal.SIGINT)])
def test_a_signal_ends_a_continuous_run_within_its_interval_whatever_it_waits_on(
    waits_on, signum, env, spark, sandbox, tmp_path
):
    """The command line's continuous Distribution Agent, poll interval 2 s, signalled while it waits
    on a row lock at the subscriber (its batch's statement is cancelled, the batch rolled back: the
    run is recorded as succeeded up to there, and the next run delivers the batch), or while the
    distributor's server restarts: it ends within the interval, without a traceback."""
    interval = 2.0
    topo = snapshotted_items(env, spark, 100)
    path = tmp_path / "topology.yaml"
    doc = {
        **env.servers(),
        "publications": [{"name": "p", "articles": ["public.items"]}],
        "subscriptions": [{"publication": "p", "subscriber": "sub1"}],
    }
    path.write_text(json.dumps(doc))
    argv = [sys.executable, "-m", "airflow_repl.cli", "distribution", "-t", str(path), "--continuous"]
    argv += ["--poll-interval", str(interval), "--max-run-seconds", "300"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    history = "SELECT status FROM airflow_repl.agent_history WHERE agent = 'distribution' ORDER BY run_id DESC LIMIT 1"
    wait_until(lambda: env.rows(env.dist, history) == [("running",)] or proc.poll() is not None, what="the run")
    if waits_on == "a lock":
        with psycopg.connect(env.sub) as holder:
            holder.execute("SELECT * FROM items WHERE id = 1 FOR UPDATE")  # an application holds the row
            env.run(env.pub, "UPDATE items SET payload = 'blocked' WHERE id = 1")
            assert log_reader_agent.run_log_reader(topo, "p")["transactions"] == 1
            wait_until(lambda: lock_waits(env.sub) == 1 or proc.poll() is not None, what="the lock wait")
            assert proc.poll() is None, proc.communicate()
            took, out, err = signal_and_time(proc, signum)
            holder.rollback()
    else:
        # restarted while the run waits out its interval (its first pass over, every session idle)
        wait_until(lambda: idle_for(env.dist, 0.5) or proc.poll() is not None, what="the run's idle wait")
        ended, out, err = signal_while_restarting(proc, sandbox, env.publisher_cluster, signum, may_end_first=True)
        if ended is None:  # it met the restart in a poll's statement, on a loaded machine: one line, retryable
            assert proc.returncode == 5, err
            assert [line for line in err.splitlines() if line.startswith("airflow-repl: error:")], err
        took = ended if ended is not None else 0.0
    print(
        f"{signal.Signals(signum).name} while waiting on {waits_on}: ended {took:.2f} s later (exit {proc.returncode})"
    )
    assert took < interval + 1.5, f"ended {took:.1f} s after the signal:\n{err}"
    assert "Traceback" not in out + err
    if waits_on == "a lock":
        assert proc.returncode == 0, err
        (summary,) = json.loads(out)["subscriptions"]
        assert summary["continuous"]["ended_by"] == signal.Signals(signum).name
        assert "rolled_back" in summary["continuous"] and summary["transactions"] == 0
        assert env.rows(env.dist, history) == [("succeeded",)]
        assert distribution_agent.run_distribution(topo, "p", "sub1")["transactions"] == 1  # the batch, delivered
        assert env.rows(env.sub, "SELECT payload FROM items WHERE id = 1") == [("blocked",)]
    else:  # the distributor went away with the run: one line, retryable; or it ended before
        assert proc.returncode in (0, 5), err
        if proc.returncode:
            assert len([line for line in err.splitlines() if line.startswith("airflow-repl: error:")]) == 1, err
    assert_in_sync(topo)


def test_a_signal_to_the_driver_ends_the_continuous_runs_of_its_spark_tasks(env2, spark, tmp_path):
    """Two subscribers, each a Spark task of the command line's application running a continuous
    delivery: SIGTERM to the command ends both runs cleanly (recorded as succeeded), and the
    command prints both summaries and exits 0."""
    interval = 2.0
    make_items(env2, 50)
    topo = env2.topology(["public.items"])
    snapshot_agent.run_snapshot(topo, "p", spark)
    path = tmp_path / "topology.yaml"
    doc = {
        **env2.servers(),
        "publications": [{"name": "p", "articles": ["public.items"]}],
        "subscriptions": [{"publication": "p", "subscriber": name} for name in env2.subs],
    }
    path.write_text(json.dumps(doc))
    argv = [sys.executable, "-m", "airflow_repl.cli", "distribution", "-t", str(path), "--continuous"]
    argv += ["--poll-interval", str(interval), "--max-run-seconds", "300"]
    environ = {k: v for k, v in os.environ.items() if k != "AIRFLOW_REPL_SPARK_MASTER"}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ)
    running = "SELECT count(*) FROM airflow_repl.agent_history WHERE agent = 'distribution' AND status = 'running'"
    wait_until(lambda: env2.rows(env2.dist, running) == [(2,)] or proc.poll() is not None, 120, "both runs")
    assert proc.poll() is None, proc.communicate()
    took, out, err = signal_and_time(proc, signal.SIGTERM)
    print(f"SIGTERM to the driver of two continuous Spark tasks: ended {took:.2f} s later")
    assert proc.returncode == 0 and "Traceback" not in out + err, err
    summary = json.loads(out)
    assert [s["continuous"]["ended_by"] for s in summary["subscriptions"]] == ["driver stopped"] * 2
    assert took < interval + 5
    statuses = "SELECT status FROM airflow_repl.agent_history WHERE agent = 'distribution' ORDER BY run_id"
    assert env2.rows(env2.dist, statuses) == [("succeeded",), ("succeeded",)]


def test_a_continuous_distribution_is_woken_by_the_log_readers_stored_batch_not_its_poll(env, spark):
    """The Distribution Agent, idle with a poll interval longer than its run, delivers what a Log
    Reader run stores within seconds: the storing transaction's notice ends its wait (before,
    it slept to the end of its run and delivered nothing)."""
    topo = snapshotted_items(env, spark, 100)
    runs = 40.0
    dist = AgentThread(
        distribution_agent.run_distribution, topo, "p", "sub1", continuous=True, poll_interval=600, max_run_seconds=runs
    )
    dist.start()
    history = "SELECT status FROM airflow_repl.agent_history WHERE agent = 'distribution' ORDER BY run_id DESC LIMIT 1"
    wait_until(lambda: env.rows(env.dist, history) == [("running",)] or not dist.is_alive(), what="the run")
    time.sleep(1)  # idle, waiting
    for n in (1, 2):  # twice: the notices of the first batch do not leave the agent awake or deaf
        env.run(env.pub, "UPDATE items SET payload = %s WHERE id = 1", (f"woken {n}",))
        assert log_reader_agent.run_log_reader(topo, "p")["transactions"] == 1
        took = wait_for(
            lambda n=n: env.rows(env.sub, "SELECT payload FROM items WHERE id = 1") == [(f"woken {n}",)], 15
        )
        assert took is not None, f"not delivered within 15 s of being stored ({dist.error!r})"
        print(f"delivered {took:.3f} s after the Log Reader's run ended")
    assert dist.is_alive()
    dist.join(runs + 30)
    assert dist.error is None and dist.summary["transactions"] == 2
    assert dist.summary["continuous"]["ended_by"] == "max_run_seconds"
    assert_in_sync(topo)


def test_waiting_for_stored_transactions_wakes_for_its_own_publication_only(env):
    with psycopg.connect(env.dist) as listener, psycopg.connect(env.dist, autocommit=True) as sender:
        dist_transactions.listen_stored(listener)
        assert not dist_transactions.wait_stored(listener, "p", 0.2)
        dist_transactions.announce_stored(sender, "other")
        assert not dist_transactions.wait_stored(listener, "p", 0.5)
        dist_transactions.announce_stored(sender, "p\n'x\"")  # any name, as a payload
        assert dist_transactions.wait_stored(listener, "p\n'x\"", 5)
        listener.execute("SELECT 1").fetchone()  # a notice that arrives during a statement is kept for the wait
        dist_transactions.announce_stored(sender, "p")
        listener.execute("SELECT pg_sleep(0.2)").fetchone()
        listener.commit()
        assert dist_transactions.wait_stored(listener, "p", 0)
        dist_transactions.announce_stored(sender, "p")
        time.sleep(0.2)
        listener.execute("SELECT 1").fetchone()
        listener.commit()
        dist_transactions.forget_stored(listener)  # dropped: the wait finds none
        assert not dist_transactions.wait_stored(listener, "p", 0.2)


def test_a_distributor_connection_lost_while_waiting_for_notices_leaves_the_wait_a_sleep(env):
    """The run's next statement finds the loss, at the poll as before: the wait neither raises
    (a signal meanwhile still ends the run on the signal) nor spins on the closed socket."""
    with psycopg.connect(env.dist) as listener, psycopg.connect(env.dist, autocommit=True) as admin:
        wake = dist_transactions.StoredWake(listener, "p")
        admin.execute("SELECT pg_terminate_backend(%s)", (listener.info.backend_pid,))
        started, cpu = time.monotonic(), time.process_time()
        assert not wake(1.0)
        assert not wake(0.5)
        assert time.monotonic() - started >= 1.4
        assert time.process_time() - cpu < 0.5  # slept
        with pytest.raises(psycopg.OperationalError):
            listener.execute("SELECT 1")
