"""Retention on real servers: the cleanup agent never deletes what a subscription still needs
(a property test over subscriptions at different watermarks and statuses), deletes in batches
that a killed run resumes, keeps recent rows for the minimum retention, expires the subscription
idle past the maximum retention (the Distribution Agent then refuses it until a reinitialize);
the Log Reader's WAL-retention warning, the CLI, ``CleanupOperator`` and ``WalRetentionSensor``
(poke and deferred, its trigger run to its event)."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import subprocess
import sys
import time

import psycopg
import pytest
from harness import Env, topology_file
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from airflow_repl import cli
from airflow_repl.engine.agents import cleanup_agent, distribution_agent, log_reader_agent, snapshot_agent
from airflow_repl.engine.errors import USAGE_EXIT_CODE, AgentBusy, NotInitialized, ReplError, TopologyError
from airflow_repl.engine.postgres.lsn import lsn_to_int
from airflow_repl.engine.state import dist_schema
from airflow_repl.engine.subscriber import validation

MIN_H, MAX_H = 1.0, 50.0  # the property test's retention (hours)
AGES = {"fresh": 0.25, "old": 5.0, "ancient": 100.0}  # hours: within min, between, beyond max
STATUSES = ["active", "pending", "initializing", "reinitialize", "expired"]


def pos(i: int) -> str:
    """xact_seqno of the i-th stored transaction (-1: before every one)."""
    return "0/10" if i < 0 else f"0/{(i + 1) * 0x100:X}"


# ---------------------------------------------------------------------- the property
@pytest.fixture(scope="module")
def dist_world(sandbox, tmp_path_factory):
    env = Env(sandbox, tmp_path_factory.mktemp("retention"))
    with psycopg.connect(env.dist) as conn:
        dist_schema.ensure_schema(conn)
    yield env, env.topology(["public.items"])
    env.drop()


subscriptions = st.lists(
    st.tuples(
        st.sampled_from(STATUSES),
        st.one_of(st.none(), st.integers(-1, 9)),  # delivered_xact_seqno (transaction index)
        st.one_of(st.none(), st.integers(-1, 9)),  # start_xact_seqno
        st.one_of(st.none(), st.sampled_from(sorted(AGES))),  # hours since it last synchronized
    ),
    max_size=4,
)
transactions = st.lists(
    st.tuples(st.integers(0, 3), st.sampled_from(sorted(AGES)), st.sampled_from([False, False, False, True])),
    max_size=10,
)


def _load(conn, subs, txns) -> None:
    conn.execute(
        "TRUNCATE airflow_repl.commands, airflow_repl.transactions, airflow_repl.cleanup_state, "
        "airflow_repl.subscriptions, airflow_repl.publications CASCADE"
    )
    conn.execute(
        "INSERT INTO airflow_repl.publications (name, pg_publication, slot_name) "
        "VALUES ('p', 'x', 'slot_p'), ('q', 'x', 'slot_q')"
    )
    for n, (status, delivered, start, age) in enumerate(subs):
        at = f"now() - interval '{AGES[age]} hours'" if age else "NULL"
        conn.execute(
            "INSERT INTO airflow_repl.subscriptions (publication, subscriber, status, delivered_xact_seqno, "
            f"start_xact_seqno, delivered_at, initialized_at) VALUES ('p', %s, %s, %s, %s, {at}, {at})",
            (f"s{n}", status, None if delivered is None else pos(delivered), None if start is None else pos(start)),
        )
    for i, (commands, age, origin) in enumerate(txns):
        for pub in ("p", "q"):
            conn.execute(
                "INSERT INTO airflow_repl.transactions (publication, xact_seqno, xid, commit_time, end_lsn, "
                "command_count, origin, entry_time) VALUES (%s, %s, %s, now(), %s, %s, %s, now() - %s * interval '1h')",
                (pub, pos(i), 1000 + i, pos(i), commands, "queue_s0" if origin else None, AGES[age]),
            )
            for k in range(1, commands + 1):
                conn.execute(
                    "INSERT INTO airflow_repl.commands (publication, xact_seqno, command_id, article, op, data) "
                    "VALUES (%s, %s, %s, 'items', 'I', '{}')",
                    (pub, pos(i), k),
                )


def _oracle(subs, txns):
    """(expired subscribers, indexes of the transactions the cleanup must delete)."""

    def hold(status, delivered, start):
        if status == "expired":
            return None
        if status in ("pending", "initializing"):
            return None if start is None else lsn_to_int(pos(start))
        return (
            lsn_to_int(pos(delivered if delivered is not None else start)) if (delivered, start) != (None, None) else 0
        )

    expired = set()
    for n, (status, delivered, start, age) in enumerate(subs):
        if status != "active":
            continue  # only an active subscription expires
        h = hold(status, delivered, start)
        waiting = [i for i in range(len(txns)) if lsn_to_int(pos(i)) > h]
        idle = age is None or AGES[age] > MAX_H
        if idle and waiting and AGES[txns[waiting[0]][1]] > MAX_H:
            expired.add(f"s{n}")
    holds = [hold("expired" if f"s{n}" in expired else s, d, st_) for n, (s, d, st_, _) in enumerate(subs)]
    holds = [h for h in holds if h is not None]
    bound = min(holds) if holds else None
    deleted = []
    for i, (_, age, _) in enumerate(txns):
        if (bound is not None and lsn_to_int(pos(i)) > bound) or AGES[age] <= MIN_H:
            break
        deleted.append(i)
    return expired, deleted, bound


def _state(conn, pub):
    txns = {
        r[0]: r[1]
        for r in conn.execute(
            "SELECT xact_seqno::text, origin FROM airflow_repl.transactions WHERE publication = %s", (pub,)
        )
    }
    cmds = {}
    for x, n in conn.execute(
        "SELECT xact_seqno::text, count(*) FROM airflow_repl.commands WHERE publication = %s GROUP BY 1", (pub,)
    ):
        cmds[x] = n
    status = dict(
        conn.execute(
            "SELECT subscriber, status FROM airflow_repl.subscriptions WHERE publication = %s", (pub,)
        ).fetchall()
    )
    return txns, cmds, status


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(subscriptions, transactions, st.integers(1, 4), st.integers(1, 4), st.integers(0, 2))
@example(  # each status at once; an active subscription that has no position yet holds everything
    [("active", None, None, "fresh"), ("pending", None, 2, None), ("initializing", None, None, None)],
    [(1, "old", False)] * 4,
    2,
    2,
    1,
)
@example(  # an idle active one expires and holds nothing more; a reinitialize one still holds
    [("active", 0, -1, "ancient"), ("reinitialize", 2, -1, "ancient"), ("expired", -1, -1, None)],
    [(2, "ancient", False), (1, "ancient", True), (3, "ancient", False), (1, "old", False), (0, "fresh", False)],
    1,
    1,
    0,
)
def test_cleanup_never_deletes_what_a_subscription_still_needs(dist_world, subs, txns, per_batch, budget, killed_after):
    env, topo = dist_world
    with psycopg.connect(env.dist, autocommit=True) as conn:
        _load(conn, subs, txns)
        q_before = _state(conn, "q")
    expired, deleted, bound = _oracle(subs, txns)
    options = {
        "min_retention_hours": MIN_H,
        "max_retention_hours": MAX_H,
        "batch_transactions": per_batch,
        "batch_commands": budget,
    }
    first = cleanup_agent.run_cleanup(topo, "p", max_batches=killed_after or None, **options)  # a run stopped early...
    second = cleanup_agent.run_cleanup(topo, "p", **options)  # ... and the run that finishes the job
    third = cleanup_agent.run_cleanup(topo, "p", **options)
    assert set(first["expired"]) == expired and second["expired"] == [] and third["expired"] == []
    assert (third["transactions_deleted"], third["commands_deleted"]) == (0, 0)  # idempotent
    with psycopg.connect(env.dist, autocommit=True) as conn:
        left, commands, status = _state(conn, "p")
        assert _state(conn, "q") == q_before  # another publication is never touched
    assert {s for s, v in status.items() if v == "expired"} == expired | {
        f"s{n}" for n, sub in enumerate(subs) if sub[0] == "expired"
    }
    for i, (n_cmds, _, origin) in enumerate(txns):
        x = pos(i)
        if i in deleted:
            assert x not in commands, (i, bound)
            assert (x in left) == origin  # a subscriber's own change keeps its row, not its commands
        else:  # kept whole: a subscription still needs it, or it is too recent, or a later one of those
            assert x in left and commands.get(x, 0) == n_cmds, (i, bound)
    deleted_cmds = sum(txns[i][0] for i in deleted)
    total = [r["commands_deleted"] for r in (first, second)]
    assert sum(total) == deleted_cmds
    assert first["transactions_deleted"] + second["transactions_deleted"] == sum(1 for i in deleted if not txns[i][2])
    # the safety property itself, independent of the oracle's cut: every subscription still holding
    # something has every transaction after its position, with all its commands
    for n, (st_, delivered, start, _) in enumerate(subs):
        if status[f"s{n}"] == "expired":
            continue
        hold = delivered if st_ not in ("pending", "initializing") and delivered is not None else start
        if st_ in ("pending", "initializing") and start is None:
            continue
        for i, (n_cmds, _, _) in enumerate(txns):
            if hold is None or i > hold:
                assert commands.get(pos(i), 0) == n_cmds and pos(i) in left


# ---------------------------------------------------------------------- with the real agents
ROWS = 20


def _setup(env, spark):
    env.run(env.pub, "CREATE TABLE items (id int PRIMARY KEY, v text)")
    env.run(env.pub, "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, %s) g", (ROWS,))
    topo = env.topology(["public.items"])
    snapshot_agent.run_snapshot(topo, "p", spark)
    return topo


def _change(env, n, tag):
    for i in range(1, n + 1):
        env.run(env.pub, "UPDATE items SET v = %s WHERE id = %s", (f"{tag}{i}", i))


def _stored(env):
    return env.rows(
        env.dist,
        "SELECT (SELECT count(*) FROM airflow_repl.transactions WHERE publication = 'p'), "
        "(SELECT count(*) FROM airflow_repl.commands WHERE publication = 'p')",
    )[0]


def _in_sync(topo, sub):
    report = validation.compare(topo, "p", sub)
    assert report and all(r["match"] for r in report), validation.format_report(report)


def test_cleanup_waits_for_every_subscriber_then_min_retention_then_expires_the_idle_one(env2, spark, caplog):
    topo = _setup(env2, spark)
    _change(env2, 3, "a")
    read = log_reader_agent.run_log_reader(topo, "p")
    assert read["slot_retained_wal_mb"] >= 0 and "wal_retention_warning" not in read  # no limit set
    distribution_agent.run_distribution(topo, "p", "sub1")
    assert _stored(env2) == (3, 3)
    nothing = cleanup_agent.run_cleanup(topo, "p")
    assert (nothing["transactions_deleted"], nothing["held_by"]) == (0, ["sub2"])  # sub2 still needs all three
    assert _stored(env2) == (3, 3)
    distribution_agent.run_distribution(topo, "p", "sub2")
    done = cleanup_agent.run_cleanup(topo, "p")
    assert (done["transactions_deleted"], done["commands_deleted"], done["expired"]) == (3, 3, [])
    assert _stored(env2) == (0, 0)
    # minimum retention: delivered everywhere but recent -> kept, until it is old enough
    _change(env2, 2, "b")
    log_reader_agent.run_log_reader(topo, "p")
    for s in ("sub1", "sub2"):
        distribution_agent.run_distribution(topo, "p", s)
    kept = cleanup_agent.run_cleanup(topo, "p", min_retention_hours=1)
    assert kept["transactions_deleted"] == 0 and _stored(env2) == (2, 2)
    env2.run(env2.dist, "UPDATE airflow_repl.transactions SET entry_time = entry_time - interval '2 hours'")
    assert cleanup_agent.run_cleanup(topo, "p", min_retention_hours=1)["transactions_deleted"] == 2
    # maximum retention: sub2 stops synchronizing for longer than it, with changes waiting
    _change(env2, 4, "c")
    log_reader_agent.run_log_reader(topo, "p")
    distribution_agent.run_distribution(topo, "p", "sub1")
    not_yet = cleanup_agent.run_cleanup(topo, "p")  # idle, but not for 72 hours
    assert not_yet["expired"] == [] and _stored(env2) == (4, 4)
    env2.run(env2.dist, "UPDATE airflow_repl.transactions SET entry_time = entry_time - interval '80 hours'")
    env2.run(
        env2.dist,
        "UPDATE airflow_repl.subscriptions SET delivered_at = delivered_at - interval '80 hours', "
        "initialized_at = initialized_at - interval '80 hours' WHERE subscriber = 'sub2'",
    )
    with caplog.at_level(logging.WARNING, logger="airflow_repl.engine.agents.cleanup_agent"):
        expired = cleanup_agent.run_cleanup(topo, "p")
    assert expired["expired"] == ["sub2"] and expired["transactions_deleted"] == 4
    assert "subscriber 'sub2' to publication 'p' expired" in expired["messages"][0]
    assert any("'sub2'" in r.getMessage() and "reinitialize" in r.getMessage() for r in caplog.records)
    status = dict(env2.rows(env2.dist, "SELECT subscriber, status FROM airflow_repl.subscriptions"))
    assert status == {"sub1": "active", "sub2": "expired"}
    # the Distribution Agent refuses it, naming it and the fix, and changes nothing
    before = env2.rows(env2.subs["sub2"], "SELECT id, v FROM items ORDER BY id")
    with pytest.raises(ReplError) as info:
        distribution_agent.run_distribution(topo, "p", "sub2")
    assert "subscriber 'sub2' to publication 'p' expired" in str(info.value)
    assert "--subscriber sub2 --reinitialize" in str(info.value) and "\n" not in str(info.value)
    assert env2.rows(env2.subs["sub2"], "SELECT id, v FROM items ORDER BY id") == before
    # reinitialize brings it back; later changes reach both
    snapshot_agent.run_snapshot(topo, "p", spark, subscribers=["sub2"], reinitialize=True)
    _change(env2, 2, "d")
    log_reader_agent.run_log_reader(topo, "p")
    for s in ("sub1", "sub2"):
        distribution_agent.run_distribution(topo, "p", s)
        _in_sync(topo, s)
    assert dict(env2.rows(env2.dist, "SELECT subscriber, status FROM airflow_repl.subscriptions"))["sub2"] == "active"


def test_a_transaction_larger_than_a_batch_is_deleted_over_several_and_a_killed_run_resumes(env, spark):
    topo = _setup(env, spark)
    env.run(env.pub, "UPDATE items SET v = v || '+'")  # one transaction of ROWS commands
    _change(env, 2, "e")
    log_reader_agent.run_log_reader(topo, "p")
    distribution_agent.run_distribution(topo, "p", "sub1")
    assert _stored(env) == (3, ROWS + 2)
    with psycopg.connect(env.dist) as conn:  # a run killed after its first chunk of the large one
        first = conn.execute("SELECT min(xact_seqno)::text FROM airflow_repl.transactions").fetchone()[0]
        from airflow_repl.engine.state import retention

        assert retention.delete_commands(conn, "p", first, first, 7) == 7
    assert _stored(env) == (3, ROWS + 2 - 7)
    one = cleanup_agent.run_cleanup(topo, "p", batch_commands=5, max_batches=1)  # stopped again after one batch
    assert (one["transactions_deleted"], one["commands_deleted"], one["batches"]) == (1, ROWS - 7, 1)
    rest = cleanup_agent.run_cleanup(topo, "p", batch_commands=5)
    assert (rest["transactions_deleted"], rest["commands_deleted"]) == (2, 2)
    assert _stored(env) == (0, 0)
    _in_sync(topo, "sub1")


def test_bad_input_and_a_running_snapshot_change_nothing(env, spark):
    topo = _setup(env, spark)
    _change(env, 2, "f")
    log_reader_agent.run_log_reader(topo, "p")
    distribution_agent.run_distribution(topo, "p", "sub1")

    def history():
        return env.rows(env.dist, "SELECT count(*) FROM airflow_repl.agent_history WHERE agent = 'cleanup'")[0][0]

    with pytest.raises(ReplError, match="minimum retention -2 is not a number of hours >= 0"):
        cleanup_agent.run_cleanup(topo, "p", min_retention_hours=-2)
    with pytest.raises(TopologyError, match="unknown publication 'nope'"):
        cleanup_agent.run_cleanup(topo, "nope")
    undeployed = env.topology(["public.items"], publication="other")
    with pytest.raises(NotInitialized, match="publication 'other' is not deployed"):
        cleanup_agent.run_cleanup(undeployed, "other")
    with psycopg.connect(env.dist, autocommit=True) as snapshot:  # a Snapshot Agent holding its lock
        snapshot.execute("SELECT pg_advisory_lock(hashtext('airflow_repl.snapshot.p'))")
        with pytest.raises(AgentBusy, match="the Snapshot Agent is running for publication 'p'"):
            cleanup_agent.run_cleanup(topo, "p")
        with pytest.raises(AgentBusy, match=r"\(the Cleanup Agent holds this lock too while it runs\)"):
            snapshot_agent.run_snapshot(topo, "p", spark, reinitialize=True)  # as it is when a cleanup runs
    assert _stored(env) == (2, 2) and history() == 0
    assert cleanup_agent.run_cleanup(topo, "p")["transactions_deleted"] == 2 and history() == 1


# ---------------------------------------------------------------------- CLI, operator, WAL retention
def _json_out(capsys):
    """The JSON the command printed (after any log lines Airflow's logging sent to stdout)."""
    out = capsys.readouterr().out
    return json.loads(out[out.index("{\n") :])


def _fill_wal(env, mb: int) -> None:
    """Write about ``mb`` MB of WAL at the publisher, in a table that is not published."""
    env.run(env.pub, "CREATE TABLE IF NOT EXISTS filler (v text)")
    env.run(env.pub, "INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, %s)", (mb * 1100,))


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_cli_cleanup_operator_and_wal_retention(env, spark, tmp_path, capsys):
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_repl.operators.retention import CleanupOperator

    _setup(env, spark)
    path = topology_file(env, tmp_path, ["public.items"], snapshot_folder=str(tmp_path / "snaps"), max_slot_wal_mb=1)
    _change(env, 2, "g")
    _fill_wal(env, 3)
    records = _Records()  # on the engine's logger itself: Airflow's logging set-up may replace the root's handlers
    logging.getLogger("airflow_repl.engine.monitoring.wal_retention").addHandler(records)
    try:
        assert cli.main(["logreader", "-t", path]) == 0
    finally:
        logging.getLogger("airflow_repl.engine.monitoring.wal_retention").removeHandler(records)
    out = capsys.readouterr().out
    read = json.loads(out[out.index("{\n") :])
    assert read["slot_retained_wal_mb"] > 1 and "above its limit of 1 MB" in read["wal_retention_warning"]
    logged = [r for r in records.records if "above its limit of 1 MB" in r.getMessage()]
    assert len(logged) == 1 and logged[0].levelno == logging.WARNING  # the log line, at WARNING
    assert cli.main(["wal-retention", "-t", path, "--max-wal-mb", "100000"]) == 0
    measured = _json_out(capsys)
    assert measured["exceeded"] is False and measured["limit_mb"] == 100000 and measured["retained_bytes"] >= 0
    assert cli.main(["distribution", "-t", path]) == 0
    capsys.readouterr()
    assert cli.main(["cleanup", "-t", path, "--min-retention", "-1"]) == USAGE_EXIT_CODE
    assert capsys.readouterr().err.strip().splitlines() == [
        "airflow-repl: error: cleanup: argument --min-retention: '-1' is not a number >= 0 (see 'airflow-repl cleanup --help')"
    ]
    assert _stored(env) == (2, 2)
    assert cli.main(["cleanup", "-t", path, "--min-retention", "0", "--max-retention", "24"]) == 0
    summary = _json_out(capsys)
    assert (summary["transactions_deleted"], summary["commands_deleted"], summary["expired"]) == (2, 2, [])
    assert summary["max_retention_hours"] == 24.0
    _change(env, 1, "h")
    log_reader_agent.run_log_reader(env_topology := env.topology(["public.items"]), "p")
    distribution_agent.run_distribution(env_topology, "p", "sub1")
    result = CleanupOperator(task_id="cleanup", topology=path, publication="p").execute({})
    assert (result["transactions_deleted"], result["commands_deleted"]) == (1, 1)
    with pytest.raises(AirflowFailException, match="unknown publication 'nope'"):
        CleanupOperator(task_id="cleanup", topology=path, publication="nope").execute({})
    with pytest.raises(AirflowFailException, match="maximum retention is 0 hours"):
        CleanupOperator(task_id="c", topology=path, publication="p", max_retention_hours=0).execute({})


def test_wal_retention_sensor_poke_and_deferred(env, spark, tmp_path):
    from airflow.sdk.exceptions import AirflowFailException, AirflowSensorTimeout, TaskDeferred

    from airflow_repl import get_provider_info
    from airflow_repl.sensors.wal_retention import WalRetentionSensor
    from airflow_repl.triggers.wal_retention import WalRetentionTrigger

    info = get_provider_info()
    assert "airflow_repl.sensors.wal_retention" in info["sensors"][0]["python-modules"]
    assert "airflow_repl.triggers.wal_retention" in info["triggers"][0]["python-modules"]
    assert "airflow_repl.operators.retention" in info["operators"][0]["python-modules"]
    _setup(env, spark)
    path = topology_file(env, tmp_path, ["public.items"], snapshot_folder=str(tmp_path / "snaps"))
    _fill_wal(env, 3)
    # no limit anywhere: a clear failure
    with pytest.raises(AirflowFailException, match="no WAL retention limit for publication 'p'"):
        WalRetentionSensor(task_id="w", topology=path, publication="p").poke({})
    # a guard: fails at once above the limit, succeeds below it
    guard = WalRetentionSensor(task_id="w", topology=path, publication="p", max_wal_mb=1, fail_when_exceeded=True)
    with pytest.raises(
        AirflowFailException, match=r"retains [\d.]+ MB of WAL at the publisher, above its limit of 1 MB"
    ):
        guard.execute({})
    ok = WalRetentionSensor(task_id="w", topology=path, publication="p", max_wal_mb=100000, fail_when_exceeded=True)
    assert ok.execute({})["exceeded"] is False
    # a wait, poke mode: times out naming the measurement
    waiting = WalRetentionSensor(
        task_id="w", topology=path, publication="p", max_wal_mb=1, poke_interval=0.1, timeout=0.3
    )
    assert waiting.poke({}).is_done is False
    with pytest.raises(AirflowSensorTimeout, match=r"timed out after 0.3s: .*above its limit of 1 MB"):
        waiting.execute({})
    # deferred: checks once, then defers to the trigger, whose state holds no secret
    deferred = WalRetentionSensor(
        task_id="w", topology=path, publication="p", max_wal_mb=1, deferrable=True, poke_interval=0.1, timeout=0.5
    )
    with pytest.raises(TaskDeferred) as info:
        deferred.execute({})
    trigger = info.value.trigger
    assert isinstance(trigger, WalRetentionTrigger) and info.value.method_name == "execute_complete"
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_repl.triggers.wal_retention.WalRetentionTrigger"
    # named as the quiescing triggers' arguments; the deferral has a timeout past the trigger's own
    assert set(kwargs) == {"topology_path", "publication", "max_wal_mb", "poll_interval", "end_time"}
    assert kwargs["topology_path"] == path and "postgresql://" not in json.dumps(kwargs)
    assert info.value.timeout is not None and 0.5 < info.value.timeout.total_seconds() <= 0.5 + 2 * 0.1 + 1e-9
    # a trigger serialized before the arguments were renamed resumes (its old names are accepted)
    old = WalRetentionTrigger(topology=path, publication="p", max_wal_mb=1, poll_interval=0.1, deadline=1.5)
    assert old.serialize()[1] == {**kwargs, "end_time": 1.5}
    timeout = asyncio.run(_first_event(WalRetentionTrigger(**kwargs)))  # still above 1 MB at its deadline
    assert timeout.payload["status"] == "timeout" and timeout.payload["retention"]["exceeded"] is True
    with pytest.raises(AirflowSensorTimeout, match="above its limit of 1 MB"):
        deferred.execute_complete({}, timeout.payload)
    success = asyncio.run(_first_event(WalRetentionTrigger(**{**kwargs, "max_wal_mb": 100000})))
    assert success.payload["status"] == "success"
    assert deferred.execute_complete({}, success.payload)["exceeded"] is False
    error = asyncio.run(_first_event(WalRetentionTrigger(**{**kwargs, "publication": "nope"})))
    assert error.payload == {"status": "error", "message": error.payload["message"]}
    assert "unknown publication 'nope'" in error.payload["message"]


async def _first_event(trigger):
    async for event in trigger.run():
        return event
    raise AssertionError("the trigger ended without an event")


def test_a_cleanup_killed_mid_run_leaves_what_is_needed_and_the_next_run_finishes(env, tmp_path):
    """A real kill (SIGKILL) of ``airflow-repl cleanup`` between its batches (each DELETE of
    commands is slowed by a statement trigger, so the run is still going when it is killed)."""
    with psycopg.connect(env.dist) as conn:
        dist_schema.ensure_schema(conn)
    n, per = 300, 10
    env.run(
        env.dist,
        f"""
        INSERT INTO airflow_repl.publications (name, pg_publication, slot_name) VALUES ('p', 'x', 'slot_p');
        INSERT INTO airflow_repl.transactions (publication, xact_seqno, xid, commit_time, end_lsn, command_count)
            SELECT 'p', ('0/' || to_hex(g * 256))::pg_lsn, g, now(), ('0/' || to_hex(g * 256))::pg_lsn, {per}
            FROM generate_series(1, {n}) g;
        INSERT INTO airflow_repl.commands (publication, xact_seqno, command_id, article, op, data)
            SELECT 'p', ('0/' || to_hex(g * 256))::pg_lsn, k, 'items', 'I', '{{}}'
            FROM generate_series(1, {n}) g, generate_series(1, {per}) k;
        -- a subscription that has received the first 200 transactions only
        INSERT INTO airflow_repl.subscriptions (publication, subscriber, status, delivered_xact_seqno, delivered_at)
            VALUES ('p', 'sub1', 'active', ('0/' || to_hex(200 * 256))::pg_lsn, now());
        CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN PERFORM pg_sleep(0.05); RETURN NULL; END$$;
        CREATE TRIGGER slow AFTER DELETE ON airflow_repl.commands FOR EACH STATEMENT EXECUTE FUNCTION slow();
        """,
    )
    path = topology_file(env, tmp_path, ["public.items"], snapshot_folder=str(tmp_path / "snaps"))
    code = "import sys; from airflow_repl.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "cleanup", "-t", path, "--batch-commands", "50"], stdout=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 60
    while not env.rows(env.dist, "SELECT 1 FROM airflow_repl.cleanup_state"):
        assert proc.poll() is None and time.monotonic() < deadline, "the cleanup ended before it could be killed"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    (cleaned,) = env.rows(env.dist, "SELECT cleaned_xact_seqno::text FROM airflow_repl.cleanup_state")[0]
    left = dict(
        env.rows(
            env.dist,
            "SELECT t.xact_seqno::text, count(c.command_id) FROM airflow_repl.transactions t LEFT JOIN "
            "airflow_repl.commands c USING (publication, xact_seqno) GROUP BY 1",
        )
    )
    assert 0 < lsn_to_int(cleaned) < 200 * 256  # stopped part way
    assert all(lsn_to_int(x) > lsn_to_int(cleaned) for x in left)  # what it recorded as done is gone
    assert all(left[pos(i - 1)] == per for i in range(201, n + 1))  # what sub1 needs is all there
    env.run(env.dist, "DROP TRIGGER slow ON airflow_repl.commands")
    again = cleanup_agent.run_cleanup(env.topology(["public.items"]), "p")
    assert again["held_by"] == ["sub1"]
    remaining = env.rows(env.dist, "SELECT min(xact_seqno)::text, count(*) FROM airflow_repl.transactions")[0]
    assert remaining == (pos(200), n - 200)
    assert env.rows(env.dist, "SELECT count(*) FROM airflow_repl.commands")[0][0] == (n - 200) * per
    history = env.rows(env.dist, "SELECT status FROM airflow_repl.agent_history WHERE agent = 'cleanup' ORDER BY 1")
    assert history == [("abandoned",), ("succeeded",)]  # the killed run, recorded by the next one


def test_a_queued_subscribers_change_keeps_its_transaction_row_so_later_publisher_changes_still_apply(env2, spark):
    """A queued subscriber remembers which publisher transactions took its queued rows until its
    watermark passes them; the Distribution Agent finds them by transaction id.  The cleanup keeps
    those transaction rows (not their commands), so a later publisher change of the same row is
    applied there, not mistaken for a change still in flight."""
    from airflow_repl.engine.agents import queue_reader_agent
    from airflow_repl.engine.model.topology import from_dict
    from airflow_repl.engine.postgres.connections import resolve_topology

    env2.run(env2.pub, "CREATE TABLE items (id int PRIMARY KEY, v text)")
    env2.run(env2.pub, "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 5) g")
    topo = resolve_topology(
        from_dict(
            {
                **env2.servers(),
                "publications": [{"name": "p", "articles": ["public.items"], "allow_queued_tran": True}],
                "subscriptions": [
                    {"publication": "p", "subscriber": s, "update_mode": "queued tran"} for s in env2.subs
                ],
            }
        )
    )
    snapshot_agent.run_snapshot(topo, "p", spark)
    env2.run(env2.subs["sub1"], "UPDATE items SET v = 'from sub1' WHERE id = 1")
    assert queue_reader_agent.run_queue_reader(topo, "p", "sub1")["transactions"] == 1
    log_reader_agent.run_log_reader(topo, "p")
    assert distribution_agent.run_distribution(topo, "p", "sub1")["own_queued"] == 1
    assert distribution_agent.run_distribution(topo, "p", "sub2")["transactions"] == 1
    cleaned = cleanup_agent.run_cleanup(topo, "p")
    assert (cleaned["transactions_deleted"], cleaned["commands_deleted"], cleaned["origin_transactions_kept"]) == (
        0,
        1,
        1,
    )
    assert cleanup_agent.run_cleanup(topo, "p")["origin_transactions_kept"] == 0  # not counted (or read) again
    env2.run(env2.pub, "UPDATE items SET v = 'publisher later' WHERE id = 1")
    log_reader_agent.run_log_reader(topo, "p")
    for s in ("sub1", "sub2"):
        distribution_agent.run_distribution(topo, "p", s)
        assert env2.rows(env2.subs[s], "SELECT v FROM items WHERE id = 1") == [("publisher later",)]
        _in_sync(topo, s)


def test_an_older_distribution_database_learns_the_expired_status(env):
    """The status check of a distribution database made before 'expired' is rewritten by
    ensure_schema (idempotently: twice is the same)."""
    with psycopg.connect(env.dist) as conn:
        dist_schema.ensure_schema(conn)
    env.run(
        env.dist,
        "ALTER TABLE airflow_repl.subscriptions DROP CONSTRAINT subscriptions_status_check; "
        "ALTER TABLE airflow_repl.subscriptions ADD CONSTRAINT subscriptions_status_check "
        "CHECK (status IN ('pending', 'initializing', 'active', 'reinitialize')); "
        "DROP TABLE airflow_repl.cleanup_state; "
        "INSERT INTO airflow_repl.publications (name, pg_publication, slot_name) VALUES ('p', 'x', 's'); "
        "DELETE FROM airflow_repl.schema_version WHERE version > 1",  # made by the first version
    )
    with pytest.raises(psycopg.errors.CheckViolation):
        env.run(
            env.dist,
            "INSERT INTO airflow_repl.subscriptions (publication, subscriber, status) VALUES ('p', 'a', 'expired')",
        )
    for _ in range(2):
        with psycopg.connect(env.dist) as conn:
            dist_schema.ensure_schema(conn)
    env.run(
        env.dist,
        "INSERT INTO airflow_repl.subscriptions (publication, subscriber, status) VALUES ('p', 'a', 'expired')",
    )
    assert env.rows(env.dist, "SELECT count(*) FROM airflow_repl.cleanup_state") == [(0,)]
    with pytest.raises(psycopg.errors.CheckViolation):
        env.run(
            env.dist,
            "INSERT INTO airflow_repl.subscriptions (publication, subscriber, status) VALUES ('p', 'b', 'bogus')",
        )
