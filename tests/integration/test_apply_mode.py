"""``apply_mode``: with the default ``auto`` a batch goes by net change where nothing at the
subscriber can tell it from command by command, and command by command where something can (a
trigger firing for replicated changes, a custom procedure, an updatable subscriber); the run's
summary and ``status`` say which path each article took and why.  The property: from the same
start, a subscriber delivered command by command and one delivered with ``auto`` end with the
same rows, whatever the publisher committed."""

from __future__ import annotations

import textwrap

import psycopg
import pytest
from harness import (
    AGENT_RUNNER,
    EVERY_KIND,
    PROPERTY_SETTINGS,
    Env,
    assert_in_sync,
    commit_on_every_table,
    create_net_change_tables,
    cycle,
    resolved_topology,
    run_agent_process,
    spec_file,
)
from harness import net_change_steps as _steps
from harness import net_change_transactions as transactions
from hypothesis import example, given, settings

from airflow_repl.engine.agents import distribution_agent, log_reader_agent, snapshot_agent
from airflow_repl.engine.monitoring import status

# ---------------------------------------------------------------------- the property
TABLES = {  # table -> article options: every way net change covers
    "a_call": {"upd_cmd": "CALL", "del_cmd": "CALL"},
    "a_scall": {},
    "a_mcall": {"upd_cmd": "MCALL"},
    "a_xcall": {"upd_cmd": "XCALL", "del_cmd": "XCALL"},
    "a_sql": {"ins_cmd": "SQL", "upd_cmd": "SQL", "del_cmd": "SQL"},
    "a_filtered": {"row_filter": "a % 2 = 0 OR b IS NULL", "columns": ["k1", "k2", "a", "b", "u"]},
    "a_pairs": {"updates_as_delete_insert": "all"},
    "a_single": {"updates_as_delete_insert": "multi_row_key_changes"},
}


def _two_subscriptions(env: Env, articles: list, **auto_options):
    """Publication ``p`` subscribed by ``sub1`` command by command and by ``sub2`` with the
    default apply mode (``auto``) and ``auto_options``."""
    return resolved_topology(
        {
            **env.servers(),
            "publications": [{"name": "p", "articles": articles}],
            "subscriptions": [
                {"publication": "p", "subscriber": "sub1", "apply_mode": "per_command"},
                {"publication": "p", "subscriber": "sub2", **auto_options},
            ],
        }
    )


@pytest.fixture(scope="module")
def world(sandbox, spark, tmp_path_factory):
    env = Env(sandbox, tmp_path_factory.mktemp("apply_mode"), n_subscribers=2)
    create_net_change_tables(env, TABLES)
    topo = _two_subscriptions(env, [{"table": t, **o} for t, o in TABLES.items()], commit_batch_size=2)
    snapshot_agent.run_snapshot(topo, "p", spark)
    yield env, topo
    env.drop()


def _rows(conninfo: str) -> dict[str, list[tuple]]:
    with psycopg.connect(conninfo) as conn:
        return {t: conn.execute(f"SELECT * FROM {t} ORDER BY k1, k2").fetchall() for t in TABLES}


@settings(max_examples=25, **PROPERTY_SETTINGS)
@given(transactions)
@example(EVERY_KIND)
def test_auto_and_command_by_command_end_with_the_same_rows(world, txns):
    env, topo = world
    commit_on_every_table(env.pub, txns, TABLES, _steps)
    log_reader_agent.run_log_reader(topo, "p")
    literal = distribution_agent.run_distribution(topo, "p", "sub1")
    auto = distribution_agent.run_distribution(topo, "p", "sub2")
    assert literal.get("net_batches", 0) == 0 and auto["transactions"] == literal["transactions"]
    assert {p["apply"] for p in auto["apply"]} == {"net_change"}
    assert _rows(env.subs["sub2"]) == _rows(env.subs["sub1"])
    assert_in_sync(topo, "sub2")


def test_the_property_run_went_by_net_change(world):
    """The examples above did go by net change at ``sub2`` (and not at ``sub1``), key changes,
    deletes and inserts included."""
    env, _ = world
    net = env.rows(
        env.dist,
        "SELECT subscriber, sum(coalesce((details->>'net_batches')::int, 0)), count(*) FROM airflow_repl.agent_history "
        "WHERE agent = 'distribution' AND status = 'succeeded' GROUP BY subscriber ORDER BY subscriber",
    )
    assert net[0][:2] == ("sub1", 0) and net[1][0] == "sub2" and net[1][1] >= 10
    seen = set(env.rows(env.dist, "SELECT DISTINCT op FROM airflow_repl.commands"))
    assert {("I",), ("U",), ("D",)} <= seen


# ---------------------------------------------------------------------- what makes auto go command by command
AUDIT = """
CREATE TABLE audit (n serial, tbl text, op text, id int);
CREATE FUNCTION audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO audit (tbl, op, id) VALUES (TG_TABLE_NAME, TG_OP, coalesce(NEW.id, OLD.id));
    RETURN NULL;
END $$;
"""


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _orders(env, spark, *names, **options):
    for t in names:
        env.run(
            env.pub,
            f"CREATE TABLE {_q(t)} (id int PRIMARY KEY, qty int, note text);"
            f"INSERT INTO {_q(t)} SELECT g, g, NULL FROM generate_series(1, 10) g",
        )
    topo = env.topology([{"table": f"public.{t}"} for t in names], **options)
    snapshot_agent.run_snapshot(topo, "p", spark)
    env.run(env.sub, AUDIT)
    return topo


def _changes(env, *names):
    """One transaction of 5 commands per table: 3 updates of a row, an insert and its delete
    (net change: one UPDATE)."""
    with psycopg.connect(env.pub) as conn:
        for t in names:
            for q in (1, 2, 3):
                conn.execute(f"UPDATE {_q(t)} SET qty = %s WHERE id = 1", (q,))
            conn.execute(f"INSERT INTO {_q(t)} VALUES (100, 0, NULL)")
            conn.execute(f"DELETE FROM {_q(t)} WHERE id = 100")


@pytest.mark.parametrize("enabled", ["ALWAYS", "REPLICA"])
def test_a_trigger_firing_for_replicated_changes_gets_every_command(env, spark, enabled):
    """``ENABLE ALWAYS`` or ``ENABLE REPLICA``: that article goes command by command under
    ``auto`` (its trigger sees each of the 5 commands), the other by net change; the summary and
    ``status`` say why."""
    name = 'ord"ers\nx'
    topo = _orders(env, spark, name, "plain")
    env.run(
        env.sub,
        f'CREATE TRIGGER "au\'dit" AFTER INSERT OR UPDATE OR DELETE ON {_q(name)} FOR EACH ROW EXECUTE FUNCTION audit();'
        f'ALTER TABLE {_q(name)} ENABLE {enabled} TRIGGER "au\'dit";'
        "CREATE TRIGGER plain_audit AFTER INSERT OR UPDATE OR DELETE ON plain FOR EACH ROW EXECUTE FUNCTION audit()",
    )
    _changes(env, name, "plain")
    _, delivered = cycle(topo)
    assert env.rows(env.sub, "SELECT tbl, op, id FROM audit ORDER BY n") == [
        (name, "UPDATE", 1),
        (name, "UPDATE", 1),
        (name, "UPDATE", 1),
        (name, "INSERT", 100),
        (name, "DELETE", 100),
    ]  # the ordinary trigger on plain does not fire for replicated changes at all
    why = f'trigger(s) firing for replicated changes at the subscriber: "au\'dit" (ENABLE {enabled})'
    assert delivered["apply"] == [
        {"article": name, "apply": "per_command", "why": why},
        {
            "article": "plain",
            "apply": "net_change",
            "why": "nothing at the subscriber (trigger, custom procedure, updating) can tell it from command by command",
        },
    ]
    assert delivered.get("net_batches", 0) == 0  # the batch holds a command of the watched article
    _changes(env, "plain")
    _, delivered = cycle(topo)
    assert delivered["net_batches"] == 1
    assert status.subscription_status(topo)[0].to_json()["apply"] == delivered["apply"]
    assert_in_sync(topo)


def test_a_trigger_enabled_during_a_run_stops_net_change_before_its_first_batch(env, spark, monkeypatch):
    """The paths are chosen when the run starts; a trigger set ``ENABLE ALWAYS`` after that is
    found when the batch locks its tables, and gets every command all the same."""
    topo = _orders(env, spark, "orders")
    env.run(
        env.sub, "CREATE TRIGGER audit AFTER INSERT OR UPDATE OR DELETE ON orders FOR EACH ROW EXECUTE FUNCTION audit()"
    )
    chosen = distribution_agent._Delivery.choose_paths

    def choose_then_enable(self, *args):
        chosen(self, *args)
        assert self.paths["orders"].apply == "net_change"
        env.run(env.sub, "ALTER TABLE orders ENABLE ALWAYS TRIGGER audit")

    monkeypatch.setattr(distribution_agent._Delivery, "choose_paths", choose_then_enable)
    _changes(env, "orders")
    _, delivered = cycle(topo)
    assert env.rows(env.sub, "SELECT count(*) FROM audit") == [(5,)]
    assert delivered.get("net_batches", 0) == 0 and delivered["apply"][0]["apply"] == "per_command"
    assert_in_sync(topo)


def _enable_after_first_batch(env, monkeypatch, statement: str) -> None:
    """Run ``statement`` at the subscriber once the run's first batch is committed (the next
    batch's watermark locked in the transaction its commit began)."""
    delivered = distribution_agent._Delivery._delivered

    def then_enable(self, *args, **kwargs):
        delivered(self, *args, **kwargs)
        if self.totals["commits"] == 1:
            assert self.locked_watermark is not None  # the commit locked the next batch's watermark
            env.run(env.sub, statement)

    monkeypatch.setattr(distribution_agent._Delivery, "_delivered", then_enable)


def test_a_trigger_enabled_between_two_batches_of_a_run_gets_every_command_of_the_next(env, spark, monkeypatch):
    """The first batch goes by net change; a trigger set ``ENABLE ALWAYS`` before the second
    makes its pipeline stop before any statement ran, and it gets every command of it (and
    the article goes command by command from then on)."""
    name = 'or"d\nérs'  # its LOCK TABLE in the batch's pipeline
    topo = _orders(env, spark, name, commit_batch_size=1)
    env.run(
        env.sub,
        f"CREATE TRIGGER audit AFTER INSERT OR UPDATE OR DELETE ON {_q(name)} FOR EACH ROW EXECUTE FUNCTION audit()",
    )
    _enable_after_first_batch(env, monkeypatch, f"ALTER TABLE {_q(name)} ENABLE ALWAYS TRIGGER audit")
    for _ in range(3):
        _changes(env, name)
    _, delivered = cycle(topo)
    assert delivered["transactions"] == 3 and delivered["net_batches"] == 1
    assert env.rows(env.sub, "SELECT op, id FROM audit ORDER BY n") == 2 * [
        ("UPDATE", 1),
        ("UPDATE", 1),
        ("UPDATE", 1),
        ("INSERT", 100),
        ("DELETE", 100),
    ]
    why = "trigger(s) firing for replicated changes at the subscriber: 'audit' (ENABLE ALWAYS)"
    assert delivered["apply"] == [{"article": name, "apply": "per_command", "why": why}]
    assert_in_sync(topo)


def test_a_trigger_on_another_table_enabled_during_a_run_costs_one_batch_by_command(env, spark, monkeypatch):
    """A trigger firing for replicated changes on a table no article has: the batch whose
    pipeline met it goes command by command, the next ones by net change again (their tables
    asked in round trips of their own); the article keeps its path."""
    topo = _orders(env, spark, "orders", commit_batch_size=1)
    env.run(
        env.sub,
        "CREATE TABLE elsewhere (id int); "
        "CREATE TRIGGER audit AFTER INSERT ON elsewhere FOR EACH ROW EXECUTE FUNCTION audit()",
    )
    _enable_after_first_batch(env, monkeypatch, "ALTER TABLE elsewhere ENABLE ALWAYS TRIGGER audit")
    for _ in range(4):
        _changes(env, "orders")
    _, delivered = cycle(topo)
    assert delivered["transactions"] == 4 and delivered["net_batches"] == 3
    assert delivered["apply"][0]["apply"] == "net_change"
    assert env.rows(env.sub, "SELECT count(*) FROM audit") == [(0,)]
    assert_in_sync(topo)


def test_a_subscriber_with_a_trigger_elsewhere_at_the_start_goes_by_net_change(env, spark):
    """A trigger firing for replicated changes on another table when the run starts: every
    batch goes by net change (its tables asked in round trips of their own)."""
    topo = _orders(env, spark, "orders", commit_batch_size=1)
    env.run(
        env.sub,
        "CREATE TABLE elsewhere (id int); "
        "CREATE TRIGGER audit AFTER INSERT ON elsewhere FOR EACH ROW EXECUTE FUNCTION audit(); "
        "ALTER TABLE elsewhere ENABLE REPLICA TRIGGER audit",
    )
    for _ in range(3):
        _changes(env, "orders")
    _, delivered = cycle(topo)
    assert delivered["transactions"] == 3 and delivered["net_batches"] == 3
    assert_in_sync(topo)


#: Runs AGENT_RUNNER with the second batch's commit held (committed, the next batch's watermark
#: locked in the transaction it began) until the test kills the process.
HELD_AFTER_COMMIT = textwrap.dedent(
    """
    import runpy, sys, time
    from pathlib import Path
    from airflow_repl.engine.state import subscriber_state

    committed = subscriber_state.commit_and_lock
    calls = [0]

    def held(conn, publication):
        watermark = committed(conn, publication)
        calls[0] += 1
        if calls[0] == 2:
            Path({flag!r}).write_text(str(watermark))
            time.sleep(120)
        return watermark

    subscriber_state.commit_and_lock = held
    sys.argv[0] = {runner!r}
    runpy.run_path({runner!r}, run_name="__main__")
    """
)


def test_an_agent_killed_between_a_commit_and_the_next_batch_delivers_the_rest_once(env, spark, tmp_path):
    """Killed with its second batch committed and the watermark locked for the third: the
    lock ends with its session, and the next run delivers the three batches left, once."""
    topo = _orders(env, spark, "orders", commit_batch_size=1)
    for _ in range(5):
        _changes(env, "orders")
    log_reader_agent.run_log_reader(topo, "p")
    flag, runner = tmp_path / "held", tmp_path / "held_runner.py"
    runner.write_text(HELD_AFTER_COMMIT.format(flag=str(flag), runner=AGENT_RUNNER))
    outcome = run_agent_process(
        "distribution", spec_file(topo, tmp_path), {}, kill_when=flag.exists, runner=str(runner)
    )
    assert outcome.killed, outcome
    assert env.rows(env.sub, "SELECT transactions FROM airflow_repl.subscription_state") == [(2,)]
    again = distribution_agent.run_distribution(topo, "p", "sub1")
    assert again["transactions"] == 3 and again["net_batches"] == 3
    assert env.rows(env.sub, "SELECT transactions FROM airflow_repl.subscription_state") == [(5,)]
    assert status.subscription_status(topo)[0].to_json()["backlog"] == {"transactions": 0, "commands": 0}
    assert_in_sync(topo)


def test_a_custom_procedure_article_goes_command_by_command(env, spark):
    """Its procedure is called for every command; the generated article beside it goes by net
    change in batches of its own."""
    env.run(
        env.pub,
        "CREATE TABLE c_orders (id int PRIMARY KEY, qty int); INSERT INTO c_orders SELECT g, g FROM generate_series(1, 5) g;"
        "CREATE TABLE g_orders (id int PRIMARY KEY, qty int); INSERT INTO g_orders SELECT g, g FROM generate_series(1, 5) g",
    )
    topo = env.topology(
        [{"table": "public.c_orders", "upd_cmd": "CALL my.upd_orders"}, {"table": "public.g_orders"}],
        commit_batch_size=1,
    )
    env.run(
        env.sub,
        "CREATE SCHEMA my; CREATE TABLE my.calls (n serial, id int, qty int);"
        "CREATE PROCEDURE my.upd_orders(n_id int, n_qty int, pk int) LANGUAGE plpgsql AS $$ BEGIN "
        "UPDATE c_orders SET id = n_id, qty = n_qty WHERE c_orders.id = pk; "
        "INSERT INTO my.calls (id, qty) VALUES (n_id, n_qty); END $$",
    )
    snapshot_agent.run_snapshot(topo, "p", spark)
    with psycopg.connect(env.pub) as conn:
        for q in (10, 20, 30):
            conn.execute("UPDATE c_orders SET qty = %s WHERE id = 2", (q,))
        conn.commit()
        for q in (10, 20, 30):
            conn.execute("UPDATE g_orders SET qty = %s WHERE id = 2", (q,))
    _, delivered = cycle(topo)
    assert delivered["apply"] == [
        {"article": "c_orders", "apply": "per_command", "why": "custom procedure"},
        {
            "article": "g_orders",
            "apply": "net_change",
            "why": "nothing at the subscriber (trigger, custom procedure, updating) can tell it from command by command",
        },
    ]
    assert delivered["net_batches"] == 1 and delivered["commits"] == 2  # c_orders' batch went command by command
    assert env.rows(env.sub, "SELECT id, qty FROM my.calls ORDER BY n") == [(2, 10), (2, 20), (2, 30)]
    assert env.rows(env.sub, "SELECT qty FROM g_orders WHERE id = 2") == [(30,)]


def test_a_batch_whose_commit_fails_at_the_subscriber_moves_nothing_and_the_next_run_delivers_it(env, spark):
    """A deferred constraint trigger at the subscriber that the batch breaks (``apply_mode:
    net_change``: it fires for replicated changes): the batch's COMMIT, sent with the next
    batch's lock, fails; nothing after it runs and the watermark stays; once the trigger is
    gone the next run delivers the batch, once."""
    topo = _orders(env, spark, "orders", commit_batch_size=1, apply_mode="net_change")
    env.run(
        env.sub,
        "CREATE FUNCTION no_qty_3() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN "
        "IF EXISTS (SELECT FROM orders WHERE id = 1 AND qty = 3) THEN RAISE EXCEPTION 'qty 3 refused'; END IF; "
        "RETURN NULL; END $$; "
        "CREATE CONSTRAINT TRIGGER no_qty_3 AFTER UPDATE ON orders DEFERRABLE INITIALLY DEFERRED "
        "FOR EACH ROW EXECUTE FUNCTION no_qty_3(); ALTER TABLE orders ENABLE ALWAYS TRIGGER no_qty_3",
    )
    _changes(env, "orders")  # row 1 ends with qty 3
    log_reader_agent.run_log_reader(topo, "p")
    with pytest.raises(Exception, match="qty 3 refused"):
        distribution_agent.run_distribution(topo, "p", "sub1")
    assert env.rows(env.sub, "SELECT transactions FROM airflow_repl.subscription_state") == [(0,)]
    assert env.rows(env.sub, "SELECT qty FROM orders WHERE id = 1") == [(1,)]
    env.run(env.sub, "DROP TRIGGER no_qty_3 ON orders")
    again = distribution_agent.run_distribution(topo, "p", "sub1")
    assert again["transactions"] == 1 and again["net_batches"] == 1
    assert env.rows(env.sub, "SELECT transactions FROM airflow_repl.subscription_state") == [(1,)]
    assert_in_sync(topo)


def test_a_table_and_columns_named_with_percent_signs_go_by_net_change(env, spark):
    """A % in a table's or a column's name is no placeholder in the set-based statements: the
    batch goes by net change (it fell back to command by command, silently, before)."""
    name = "ord%sers%"
    env.run(
        env.pub,
        f'CREATE TABLE {_q(name)} (id int PRIMARY KEY, "q%sty" int, "n%(x)s" text);'
        f"INSERT INTO {_q(name)} SELECT g, g, NULL FROM generate_series(1, 10) g",
    )
    topo = env.topology([{"table": f"public.{name}"}])
    snapshot_agent.run_snapshot(topo, "p", spark)
    with psycopg.connect(env.pub) as conn:
        for q in (1, 2, 3):
            conn.execute(f'UPDATE {_q(name)} SET "q%sty" = {q}, "n%(x)s" = \'a%sb\' WHERE id = 1')  # no parameters
        conn.execute(f"INSERT INTO {_q(name)} VALUES (100, 0, 'x'), (101, 1, NULL)")
        conn.execute(f"DELETE FROM {_q(name)} WHERE id IN (2, 100)")
    _, delivered = cycle(topo)
    assert delivered["net_batches"] == 1 and delivered["apply"][0]["apply"] == "net_change"
    assert env.rows(env.sub, f'SELECT id, "q%sty", "n%(x)s" FROM {_q(name)} WHERE id IN (1, 2, 101) ORDER BY id') == [
        (1, 3, "a%sb"),
        (101, 1, None),
    ]
    assert_in_sync(topo)
