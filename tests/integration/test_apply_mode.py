"""``apply_mode``: with the default ``auto`` a batch goes by net change where nothing at the
subscriber can tell it from command by command, and command by command where something can (a
trigger firing for replicated changes, a custom procedure, an updatable subscriber); the run's
summary and ``status`` say which path each article took and why.  The property: from the same
start, a subscriber delivered command by command and one delivered with ``auto`` end with the
same rows, whatever the publisher committed."""

from __future__ import annotations

import psycopg
import pytest
from harness import PROPERTY_SETTINGS, Env, assert_in_sync, commit_on_every_table, cycle, resolved_topology
from hypothesis import example, given, settings
from hypothesis import strategies as st

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
DDL = "CREATE TABLE {t} (k1 int, k2 text, a int, b text, c numeric(12,3), u int UNIQUE, PRIMARY KEY (k1, k2))"

keys = st.tuples(st.integers(0, 12), st.sampled_from(["a", "a", "b", "é", "x'y"]))
values = st.tuples(
    st.one_of(st.none(), st.integers(-5, 50)),
    st.one_of(st.none(), st.text(st.characters(blacklist_characters="\x00"), max_size=6)),
    st.one_of(st.none(), st.decimals(-1000, 1000, places=3, allow_nan=False)),
)
op = st.one_of(
    st.tuples(st.just("insert"), keys, values, st.integers(1000, 1100)),
    st.tuples(st.just("update"), keys, values),
    st.tuples(st.just("rekey"), keys, keys),
    st.tuples(st.just("swap"), keys, keys),  # the unique values of two rows exchanged
    st.tuples(st.just("shift"), st.integers(0, 2), st.integers(1, 40)),
    st.tuples(st.just("delete"), keys),
)
transactions = st.lists(st.lists(op, min_size=1, max_size=8), min_size=1, max_size=6)


def _steps(table: str, step) -> list[tuple[str, tuple]]:
    kind = step[0]
    where = "WHERE k1 = %s AND k2 = %s"
    if kind == "insert":
        (k1, k2), v, u = step[1], step[2], step[3]
        return [(f"INSERT INTO {table} VALUES (%s, %s, %s, %s, %s, %s)", (k1, k2, *v, u))]
    if kind == "update":
        (k1, k2), (a, b, c) = step[1], step[2]
        return [(f"UPDATE {table} SET a = %s, b = %s, c = %s {where}", (a, b, c, k1, k2))]
    if kind == "rekey":
        (k1, k2), (n1, n2) = step[1], step[2]
        return [(f"UPDATE {table} SET k1 = %s, k2 = %s {where}", (n1, n2, k1, k2))]
    if kind == "swap":  # as an application swaps unique values: through a value nobody has
        (x1, x2), (y1, y2) = step[1], step[2]
        hold = f"(SELECT u FROM {table} WHERE k1 = %s AND k2 = %s)"
        return [
            ("CREATE TEMP TABLE IF NOT EXISTS held (u int)", None),
            ("TRUNCATE held", None),
            (f"INSERT INTO held {hold[1:-1]}", (x1, x2)),
            (f"UPDATE {table} SET u = -1000000 {where}", (x1, x2)),
            (
                f"UPDATE {table} SET u = (SELECT u FROM held) WHERE k1 = %s AND k2 = %s AND EXISTS (SELECT FROM held)",
                (y1, y2),
            ),
            (f"UPDATE {table} SET u = {hold} WHERE u = -1000000", (y1, y2)),
        ]
    if kind == "shift":
        return [(f"UPDATE {table} SET k1 = k1 + %s WHERE k1 %% 3 = %s", (step[2] + 100, step[1]))]
    (k1, k2) = step[1]
    return [(f"DELETE FROM {table} {where}", (k1, k2))]


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
    env.run(env.pub, ";".join(DDL.format(t=t) for t in TABLES))
    env.run(
        env.pub,
        ";".join(
            f"INSERT INTO {t} SELECT g, 'a', g, CASE WHEN g % 4 = 0 THEN NULL ELSE 'b' || g END, g * 1.5, g "
            f"FROM generate_series(1, 12) g"
            for t in TABLES
        ),
    )
    topo = _two_subscriptions(env, [{"table": t, **o} for t, o in TABLES.items()], commit_batch_size=2)
    snapshot_agent.run_snapshot(topo, "p", spark)
    yield env, topo
    env.drop()


def _rows(conninfo: str) -> dict[str, list[tuple]]:
    with psycopg.connect(conninfo) as conn:
        return {t: conn.execute(f"SELECT * FROM {t} ORDER BY k1, k2").fetchall() for t in TABLES}


EVERY_KIND = [
    [
        ("insert", (13, "b"), (4, "new", None), 1001),
        ("update", (1, "a"), (None, None, 2)),
        ("update", (1, "a"), (3, "again", None)),
        ("rekey", (2, "a"), (40, "é")),
        ("swap", (3, "a"), (5, "a")),
        ("delete", (6, "a")),
        ("insert", (6, "a"), (1, None, None), 1002),
    ],
    [
        ("shift", 1, 7),
        ("update", (13, "b"), (6, "x'y", 1)),
        ("delete", (13, "b")),
        ("insert", (13, "b"), (0, "", 0), 1003),
    ],
]


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
        {"article": "plain", "apply": "net_change", "why": "nothing at the subscriber can tell"},
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
        {"article": "g_orders", "apply": "net_change", "why": "nothing at the subscriber can tell"},
    ]
    assert delivered["net_batches"] == 1 and delivered["commits"] == 2  # c_orders' batch went command by command
    assert env.rows(env.sub, "SELECT id, qty FROM my.calls ORDER BY n") == [(2, 10), (2, 20), (2, 30)]
    assert env.rows(env.sub, "SELECT qty FROM g_orders WHERE id = 2") == [(30,)]
