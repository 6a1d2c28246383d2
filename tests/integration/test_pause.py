"""Pausing and resuming one subscription on real servers: while the publisher is written, a paused
subscription gets nothing (the Distribution Agent's run says paused, over all subscribers it
delivers the others), the cleanup keeps its backlog, ``status`` shows it paused and warns as its
expiry nears; resume delivers the backlog exactly once (row by row, and counted by a trigger at the
subscriber).  No-ops, an unknown subscription, the topology key ``paused`` through ``apply``, a
continuous run idling on a paused subscription, and expiry while paused."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import psycopg
import pytest
import yaml
from harness import AgentThread, Env, assert_in_sync, count_applied_rows, items_topology_file, setup_items, wait_for

from airflow_repl import cli
from airflow_repl.engine.agents import cleanup_agent, distribution_agent, log_reader_agent, snapshot_agent
from airflow_repl.engine.errors import ReplError
from airflow_repl.engine.provisioning import pausing
from airflow_repl.jobs.agent_job import run_agent

ROWS = 100
RESUME = "airflow-repl resume -t TOPOLOGY -p p --subscriber sub1"


class _Writer(threading.Thread):
    """Writes the publisher's ``items`` until stopped: each transaction inserts a row and updates
    another; counts the rows it changed."""

    def __init__(self, conninfo: str) -> None:
        super().__init__(daemon=True)
        self.conninfo, self.changed, self.stop = conninfo, 0, threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            n = ROWS
            while not self.stop.is_set() or n < ROWS + 20:
                n += 1
                with conn.transaction():
                    conn.execute("INSERT INTO items VALUES (%s, %s)", (n, f"new {n}"))
                    conn.execute("UPDATE items SET v = v || '+' WHERE id = %s", ((n * 7) % ROWS + 1,))
                self.changed += 2

    def finish(self) -> int:
        self.stop.set()
        self.join(60)
        return self.changed


def _main(capsys, *argv: str) -> tuple[int, object, str]:
    """Run the command line: its exit code, the JSON it printed (None: nothing) and stderr."""
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    lines = out.splitlines(keepends=True)  # after any log lines Airflow's logging sent to stdout
    start = next((i for i, line in enumerate(lines) if line.rstrip() in ("{", "[")), None)
    return code, (json.loads("".join(lines[start:])) if start is not None else out), err


def _paused_column(env) -> dict[str, bool]:
    return dict(env.rows(env.dist, "SELECT subscriber, paused FROM airflow_repl.subscriptions"))


def _items(conninfo):
    return Env.rows(conninfo, "SELECT id, v FROM items ORDER BY id")


def _applied(env) -> int:
    return env.rows(env.sub, "SELECT count(*) FROM applied")[0][0]


@pytest.fixture
def writer(env2):
    """A writer of ``env2``'s publisher (start it once ``items`` exists), stopped at the end."""
    w = _Writer(env2.pub)
    yield w
    w.stop.set()
    if w.is_alive():
        w.join(30)


def test_paused_subscription_keeps_its_backlog_and_resume_delivers_it_once(env2, spark, tmp_path, capsys, writer):
    topo = setup_items(env2, spark, ROWS)
    path = items_topology_file(env2, tmp_path)
    count_applied_rows(env2)  # every row applied at sub1, counted
    writer.start()
    assert wait_for(lambda: writer.changed >= 20, 30) is not None
    log_reader_agent.run_log_reader(topo, "p")
    first = run_agent("distribution", topo, "p", spark=spark)
    assert first["transactions"] > 0 and "paused" not in first

    code, paused, err = _main(capsys, "pause", "-t", path, "--subscriber", "sub1")
    assert code == 0 and err == ""
    assert paused["changed"] is True and paused["paused"] is True and RESUME in paused["message"]
    assert _paused_column(env2) == {"sub1": True, "sub2": False}
    at_pause = _items(env2.sub)
    applied_at_pause = _applied(env2)
    assert wait_for(lambda: writer.changed >= 60, 30) is not None  # the publisher is still written
    log_reader_agent.run_log_reader(topo, "p")

    # over all subscribers: sub2 delivered, sub1 skipped and named
    both = run_agent("distribution", topo, "p", spark=spark)
    assert both["paused"] == ["sub1"]
    by_name = {s["subscriber"]: s for s in both["subscriptions"]}
    assert by_name["sub1"]["paused"] is True and by_name["sub1"]["transactions"] == 0
    assert by_name["sub2"]["transactions"] > 0 and "paused" not in by_name["sub2"]
    # for the one subscriber: exit 0, the summary and the history row say paused and how to resume
    code, one, err = _main(capsys, "distribution", "-t", path, "--subscriber", "sub1")
    assert code == 0 and err == ""
    (summary,) = one["subscriptions"]
    assert summary["paused"] is True and summary["transactions"] == 0 and RESUME in summary["message"]
    assert one["paused"] == ["sub1"]
    history = env2.rows(
        env2.dist,
        "SELECT status, message FROM airflow_repl.agent_history WHERE agent = 'distribution' "
        "AND subscriber = 'sub1' ORDER BY run_id DESC LIMIT 2",
    )
    assert [h[0] for h in history] == ["paused", "paused"] and all(RESUME in h[1] for h in history)
    assert _items(env2.sub) == at_pause and _applied(env2) == applied_at_pause  # nothing delivered

    # status shows it paused, with its backlog
    code, rows, _ = _main(capsys, "status", "-t", path, "-o", "json")
    assert code == 0
    state = {r["subscriber"]: r for r in rows}
    assert (state["sub1"]["status"], state["sub1"]["paused"]) == ("paused", True)
    assert (state["sub2"]["status"], state["sub2"]["paused"]) == ("active", False)
    backlog = state["sub1"]["backlog"]["transactions"]
    assert backlog > 0 and state["sub1"]["expires_at"] is not None and state["sub1"]["warning"] is None
    assert _main(capsys, "status", "-t", path)[1].splitlines()[1].split()[:3] == ["p", "sub1", "paused"]

    # the cleanup keeps every command sub1 has not received
    code, cleaned, _ = _main(capsys, "cleanup", "-t", path, "--min-retention", "0")
    assert code == 0 and cleaned["held_by"] == ["sub1"] and cleaned["expired"] == []
    waiting = env2.rows(
        env2.dist,
        "SELECT count(*) FROM airflow_repl.transactions AS t JOIN airflow_repl.subscriptions AS s "
        "ON s.publication = t.publication AND s.subscriber = 'sub1' WHERE t.xact_seqno > s.delivered_xact_seqno",
    )[0][0]
    assert waiting == backlog

    # no-ops say so
    code, again, _ = _main(capsys, "pause", "-t", path, "--subscriber", "sub1")
    assert code == 0 and again["changed"] is False and "was paused already: nothing changed" in again["message"]
    code, active, _ = _main(capsys, "resume", "-t", path, "--subscriber", "sub2")
    assert code == 0 and active["changed"] is False and "was not paused: nothing changed" in active["message"]

    changed = writer.finish()
    log_reader_agent.run_log_reader(topo, "p")
    code, resumed, _ = _main(capsys, "resume", "-t", path, "--subscriber", "sub1")
    assert code == 0 and resumed["changed"] is True and resumed["paused"] is False
    assert _paused_column(env2) == {"sub1": False, "sub2": False}
    done = run_agent("distribution", topo, "p", spark=spark)
    assert "paused" not in done
    for name in ("sub1", "sub2"):
        assert_in_sync(topo, name)
        assert _items(env2.subs[name]) == _items(env2.pub)  # row by row
    assert _applied(env2) == changed  # every change applied once at sub1: none lost, none twice
    again = distribution_agent.run_distribution(topo, "p", "sub1")
    assert again["transactions"] == 0 and _applied(env2) == changed


def test_pausing_an_unknown_or_unapplied_subscription_is_one_line_and_changes_nothing(env, spark, tmp_path, capsys):
    setup_items(env, spark)
    path = items_topology_file(env, tmp_path)
    before = env.rows(env.dist, "SELECT * FROM airflow_repl.subscriptions")
    for action in ("pause", "resume"):
        code, out, err = _main(capsys, action, "-t", path, "--subscriber", "nope")
        assert code == 2 and out == ""
        assert err.splitlines() == [
            "airflow-repl: error: no subscription of subscriber 'nope' to publication 'p' in the topology: "
            "name one of its subscribers ('sub1')"
        ]
    hostile = "x'); UPDATE airflow_repl.subscriptions SET paused = true; --\n/* go */ ü"
    code, _, err = _main(capsys, "pause", "-t", path, "--subscriber", hostile)
    assert code == 2 and err.splitlines() == [
        f"airflow-repl: error: no subscription of subscriber {hostile!r} to publication 'p' in the topology: "
        "name one of its subscribers ('sub1')"
    ]
    code, _, err = _main(capsys, "pause", "-t", path, "-p", "other", "--subscriber", "sub1")
    assert code == 2 and err.splitlines() == [
        "airflow-repl: error: unknown publication 'other'; the topology defines: p"
    ]
    # in the file, not applied: the fix is apply
    data = yaml.safe_load(Path(path).read_text())
    data["subscribers"]["sub9"] = data["subscribers"]["sub1"]
    data["subscriptions"].append({"publication": "p", "subscriber": "sub9"})
    with open(path, "w") as fh:
        yaml.safe_dump(data, fh)
    code, _, err = _main(capsys, "pause", "-t", path, "--subscriber", "sub9")
    assert code == 3 and len(err.splitlines()) == 1
    assert "does not record the subscription of subscriber 'sub9' to publication 'p': run 'airflow-repl apply'" in err
    assert env.rows(env.dist, "SELECT * FROM airflow_repl.subscriptions") == before


def test_the_topology_key_paused_through_apply(env, spark, tmp_path, capsys):
    topo = setup_items(env, spark)
    path = items_topology_file(env, tmp_path)

    def write(paused):
        data = yaml.safe_load(Path(path).read_text())
        data["subscriptions"][0].pop("paused", None)
        if paused is not None:
            data["subscriptions"][0]["paused"] = paused
        with open(path, "w") as fh:
            yaml.safe_dump(data, fh)

    write(True)
    assert _main(capsys, "apply", "-t", path)[0] == 0
    assert _paused_column(env) == {"sub1": True}
    env.run(env.pub, "UPDATE items SET v = 'x' WHERE id = 1")
    log_reader_agent.run_log_reader(topo, "p")
    skipped = distribution_agent.run_distribution(topo, "p", "sub1")
    assert skipped["paused"] is True and skipped["transactions"] == 0
    write(None)  # absent: apply leaves the state pause/resume set
    assert _main(capsys, "apply", "-t", path)[0] == 0
    assert _paused_column(env) == {"sub1": True}
    write(False)
    assert _main(capsys, "apply", "-t", path)[0] == 0
    assert _paused_column(env) == {"sub1": False}
    assert distribution_agent.run_distribution(topo, "p", "sub1")["transactions"] == 1
    assert_in_sync(topo)
    write("yes please")
    code, _, err = _main(capsys, "apply", "-t", path)
    assert code == 2 and "paused" in err and len(err.splitlines()) == 1
    assert _paused_column(env) == {"sub1": False}


def test_a_continuous_run_idles_on_a_paused_subscription_and_delivers_once_resumed(env, spark):
    topo = setup_items(env, spark)
    pausing.pause_subscription(topo, "p", "sub1")
    env.run(env.pub, "UPDATE items SET v = 'c' WHERE id <= 3")
    log_reader_agent.run_log_reader(topo, "p")
    run = AgentThread(
        distribution_agent.run_distribution, topo, "p", "sub1", continuous=True, poll_interval=0.1, max_run_seconds=8
    )
    run.start()
    assert wait_for(lambda: run.summary is not None or run.error is not None, 1.5) is None  # still running, idle
    assert env.rows(env.sub, "SELECT count(*) FROM items WHERE v = 'c'")[0][0] == 0
    assert pausing.resume_subscription(topo, "p", "sub1")["changed"] is True
    assert wait_for(lambda: env.rows(env.sub, "SELECT count(*) FROM items WHERE v = 'c'")[0][0] == 3, 6) is not None
    pausing.pause_subscription(topo, "p", "sub1")  # paused again while it runs: it idles to its end
    env.run(env.pub, "UPDATE items SET v = 'd' WHERE id = 4")
    log_reader_agent.run_log_reader(topo, "p")
    run.join(20)
    assert run.error is None and run.summary is not None
    assert run.summary["transactions"] == 1 and run.summary["paused"] is True
    assert run.summary["continuous"]["ended_by"] == "max_run_seconds"
    assert env.rows(env.sub, "SELECT v FROM items WHERE id = 4") == [("v4",)]
    last = env.rows(
        env.dist,
        "SELECT status FROM airflow_repl.agent_history WHERE agent = 'distribution' ORDER BY run_id DESC LIMIT 1",
    )
    assert last == [("paused",)]


def test_a_paused_subscription_expires_by_the_same_rule_status_warns_first_and_reinitializing_keeps_it_paused(
    env, spark, tmp_path, capsys
):
    topo = setup_items(env, spark)
    path = items_topology_file(env, tmp_path)
    pausing.pause_subscription(topo, "p", "sub1")
    env.run(env.pub, "UPDATE items SET v = 'e' WHERE id <= 2")
    log_reader_agent.run_log_reader(topo, "p")

    def age(hours: int) -> None:
        env.run(env.dist, f"UPDATE airflow_repl.transactions SET entry_time = entry_time - interval '{hours} hours'")
        env.run(
            env.dist,
            f"UPDATE airflow_repl.subscriptions SET delivered_at = delivered_at - interval '{hours} hours', "
            f"initialized_at = initialized_at - interval '{hours} hours'",
        )

    age(60)  # 60 of 72 hours: more than 80%
    code, table, _ = _main(capsys, "status", "-t", path)
    assert code == 0
    (warning,) = [line for line in table.splitlines() if line.startswith("warning: ")]
    assert "subscriber 'sub1' to publication 'p' (paused) expires at" in warning
    assert "more than 80% of max_retention_hours (72)" in warning and RESUME in warning
    assert cleanup_agent.run_cleanup(topo, "p")["expired"] == []  # not yet
    age(20)
    expired = cleanup_agent.run_cleanup(topo, "p")
    assert expired["expired"] == ["sub1"] and "it was paused and not synchronized" in expired["messages"][0]
    assert "it stays paused" in expired["messages"][0]
    with pytest.raises(ReplError, match="expired: it was paused and not synchronized"):
        distribution_agent.run_distribution(topo, "p", "sub1")
    snapshot_agent.run_snapshot(topo, "p", spark, subscribers=["sub1"], reinitialize=True)
    assert env.rows(env.dist, "SELECT status, paused FROM airflow_repl.subscriptions") == [("active", True)]
    assert distribution_agent.run_distribution(topo, "p", "sub1")["paused"] is True
    assert_in_sync(topo)  # the snapshot brought it up to date, paused or not
    pausing.resume_subscription(topo, "p", "sub1")
    env.run(env.pub, "UPDATE items SET v = 'f' WHERE id = 5")
    log_reader_agent.run_log_reader(topo, "p")
    assert distribution_agent.run_distribution(topo, "p", "sub1")["transactions"] == 1
    assert_in_sync(topo)


def test_pausing_during_a_delivery_stops_it_between_batches_and_resume_delivers_the_rest_once(env, spark):
    topo = setup_items(env, spark, ROWS)
    count_applied_rows(env)
    # each applied row takes 10 ms more at the subscriber, so that the 400 transactions take 4 s
    # at least and the pause always comes while they are delivered, however busy the machine
    env.run(
        env.sub,
        """CREATE FUNCTION slow_apply() RETURNS trigger LANGUAGE plpgsql AS
               $$BEGIN PERFORM pg_sleep(0.01); RETURN NULL; END$$;
           CREATE TRIGGER slow_apply AFTER UPDATE ON items FOR EACH ROW EXECUTE FUNCTION slow_apply();
           ALTER TABLE items ENABLE ALWAYS TRIGGER slow_apply;""",
    )
    with psycopg.connect(env.pub, autocommit=True) as conn:
        for i in range(400):  # 400 transactions of one row each
            conn.execute("UPDATE items SET v = %s WHERE id = %s", (f"w{i}", i % ROWS + 1))
    log_reader_agent.run_log_reader(topo, "p")

    def watermark():
        return env.rows(env.sub, "SELECT xact_seqno::text FROM airflow_repl.subscription_state")[0][0]

    run = AgentThread(distribution_agent.run_distribution, topo, "p", "sub1", commit_batch_size=1)
    run.start()
    assert wait_for(lambda: _applied(env) >= 20, 60) is not None
    assert pausing.pause_subscription(topo, "p", "sub1")["changed"] is True  # waits for the batch in flight
    at_pause = watermark()
    run.join(60)
    assert run.error is None and run.summary is not None
    delivered = run.summary["transactions"]
    assert run.summary["paused"] is True and 20 <= delivered < 400 and watermark() == at_pause
    assert f"{delivered} transaction(s) delivered before the pause" in run.summary["message"]
    assert _applied(env) == delivered
    last = env.rows(
        env.dist,
        "SELECT h.status, h.transactions, s.delivered_xact_seqno::text FROM airflow_repl.agent_history AS h, "
        "airflow_repl.subscriptions AS s WHERE h.agent = 'distribution' ORDER BY h.run_id DESC LIMIT 1",
    )
    assert last == [("paused", delivered, at_pause)]
    pausing.resume_subscription(topo, "p", "sub1")
    assert distribution_agent.run_distribution(topo, "p", "sub1")["transactions"] == 400 - delivered
    assert _applied(env) == 400  # each transaction once
    assert _items(env.sub) == _items(env.pub)
