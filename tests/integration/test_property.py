"""Property: whatever mix of transactions the publisher commits (inserts, updates of key and
non-key columns, multi-row key shifts, deletes, NULLs, wide rows), delivering it under every
call syntax and propagation method leaves each subscriber table equal to the publisher's rows
and columns that pass the article's filters.  The subscription uses two streams and small
batches, spread over both streams even when small, so stream planning and two-phase commit are
exercised too."""

from __future__ import annotations

import pytest
from harness import PROPERTY_SETTINGS, Env, commit_on_every_table
from hypothesis import example, given, settings
from hypothesis import strategies as st

from airflow_repl.engine.agents import distribution_agent, log_reader_agent, snapshot_agent, stream_planning
from airflow_repl.engine.subscriber import validation

TABLES = {  # table -> article options
    "t_call": {"upd_cmd": "CALL"},
    "t_scall": {},
    "t_mcall": {"upd_cmd": "MCALL"},
    "t_xcall": {"upd_cmd": "XCALL", "del_cmd": "XCALL"},
    "t_sql": {"ins_cmd": "SQL", "upd_cmd": "SQL", "del_cmd": "SQL"},
    "t_custom": {"ins_cmd": "CALL custom.ins", "upd_cmd": "XCALL custom.upd", "del_cmd": "CALL custom.del"},
    "t_filtered": {"row_filter": "a % 2 = 0 OR b IS NULL", "columns": ["a", "b"]},
    "t_pairs": {"updates_as_delete_insert": "all"},
    "t_single": {"updates_as_delete_insert": "multi_row_key_changes"},
}
DDL = "CREATE TABLE {t} (k1 int, k2 text, a int, b text, c numeric(12,3), w text, PRIMARY KEY (k1, k2))"
CUSTOM = """
CREATE SCHEMA custom;
CREATE PROCEDURE custom.ins(k1 int, k2 text, a int, b text, c numeric, w text) LANGUAGE plpgsql AS
$$BEGIN INSERT INTO t_custom VALUES (k1, k2, a, b, c, w); END$$;
CREATE PROCEDURE custom.upd(ok1 int, ok2 text, oa int, ob text, oc numeric, ow text,
                            nk1 int, nk2 text, na int, nb text, nc numeric, nw text) LANGUAGE plpgsql AS
$$BEGIN
    UPDATE t_custom SET k1 = nk1, k2 = nk2, a = na, b = nb, c = nc, w = nw WHERE k1 = ok1 AND k2 = ok2;
    IF NOT FOUND THEN RAISE EXCEPTION USING ERRCODE = 'RP598', MESSAGE = 'row not found'; END IF;
END$$;
CREATE PROCEDURE custom.del(pk1 int, pk2 text) LANGUAGE plpgsql AS
$$BEGIN
    DELETE FROM t_custom WHERE k1 = pk1 AND k2 = pk2;
    IF NOT FOUND THEN RAISE EXCEPTION USING ERRCODE = 'RP598', MESSAGE = 'row not found'; END IF;
END$$;
"""

keys = st.tuples(st.integers(0, 24), st.sampled_from(["a", "a", "b", "é", "x'y"]))
values = st.tuples(
    st.one_of(st.none(), st.integers(-5, 50)),
    st.one_of(st.none(), st.text(st.characters(blacklist_characters="\x00"), max_size=8)),
    st.one_of(st.none(), st.decimals(-1000, 1000, places=3, allow_nan=False)),
    st.one_of(st.none(), st.integers(0, 3000).map(lambda n: "w" * n)),
)
op = st.one_of(
    st.tuples(st.just("insert"), keys, values),
    st.tuples(st.just("update"), keys, values),
    st.tuples(st.just("rekey"), keys, keys),
    st.tuples(st.just("shift"), st.integers(0, 2), st.integers(1, 40)),
    st.tuples(st.just("delete"), keys),
)
transactions = st.lists(st.lists(op, min_size=1, max_size=6), min_size=1, max_size=5)


def _sql(table: str, step) -> tuple[str, tuple]:
    kind = step[0]
    if kind == "insert":
        (k1, k2), v = step[1], step[2]
        return f"INSERT INTO {table} VALUES (%s, %s, %s, %s, %s, %s)", (k1, k2, *v)
    if kind == "update":
        (k1, k2), (a, b, c, w) = step[1], step[2]
        return f"UPDATE {table} SET a = %s, b = %s, c = %s, w = coalesce(%s, w) WHERE k1 = %s AND k2 = %s", (
            a,
            b,
            c,
            w,
            k1,
            k2,
        )
    if kind == "rekey":
        (k1, k2), (n1, n2) = step[1], step[2]
        return f"UPDATE {table} SET k1 = %s, k2 = %s WHERE k1 = %s AND k2 = %s", (n1, n2, k1, k2)
    if kind == "shift":
        return f"UPDATE {table} SET k1 = k1 + %s WHERE k1 %% 3 = %s", (step[2] + 100, step[1])
    (k1, k2) = step[1]
    return f"DELETE FROM {table} WHERE k1 = %s AND k2 = %s", (k1, k2)


@pytest.fixture(scope="module")
def world(sandbox, spark, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:  # spread even these small batches over the streams,
        mp.setattr(stream_planning, "PARALLEL_MIN_COMMANDS", 2)  # every one of them (not only when faster)
        mp.setattr(stream_planning, "ADAPTIVE_STREAMS", False)
        yield from _world(sandbox, spark, tmp_path_factory)


def _world(sandbox, spark, tmp_path_factory):
    env = Env(sandbox, tmp_path_factory.mktemp("property"))
    env.run(env.pub, ";".join(DDL.format(t=t) for t in TABLES))
    env.run(
        env.pub,
        ";".join(
            f"INSERT INTO {t} SELECT g, 'a', g, 'b' || g, g * 1.5, NULL FROM generate_series(1, 20) g" for t in TABLES
        ),
    )
    env.run(env.sub, CUSTOM)
    topo = env.topology([{"table": t, **o} for t, o in TABLES.items()], subscription_streams=2, commit_batch_size=3)
    snapshot_agent.run_snapshot(topo, "p", spark)
    yield env, topo
    env.drop()


EVERY_KIND = [
    [
        ("insert", (21, "b"), (4, "new", None, "w" * 3000)),
        ("update", (1, "a"), (None, None, 2, None)),
        ("rekey", (2, "a"), (40, "é")),
        ("delete", (3, "a")),
    ],
    [("shift", 1, 7), ("update", (21, "b"), (6, "x'y", 1, None))],
]


@settings(max_examples=30, **PROPERTY_SETTINGS)
@given(transactions)
@example(EVERY_KIND)  # every kind of change, whatever the random examples turn out to be
def test_any_transaction_mix_leaves_subscribers_equal(world, txns):
    env, topo = world
    commit_on_every_table(env.pub, txns, TABLES, lambda table, step: [_sql(table, step)])
    log_reader_agent.run_log_reader(topo, "p")
    distribution_agent.run_distribution(topo, "p", "sub1")
    report = validation.compare(topo, "p", "sub1")
    assert all(r["match"] for r in report), validation.format_report(report)


def test_the_property_run_exercised_every_article_and_operation(world):
    env, _ = world
    seen = set(env.rows(env.dist, "SELECT DISTINCT article, op FROM airflow_repl.commands"))
    for table in TABLES:
        assert {(table, "I"), (table, "D")} <= seen, table
    assert {(t, "U") for t in TABLES if t != "t_pairs"} <= seen  # t_pairs turns every update into D + I
    assert ("t_pairs", "U") not in seen
    runs = env.rows(
        env.dist,
        "SELECT count(*), sum(transactions) FROM airflow_repl.agent_history "
        "WHERE agent = 'distribution' AND status = 'succeeded'",
    )[0]
    assert runs[0] >= 10 and runs[1] >= 10
    spread = env.rows(
        env.dist,
        "SELECT sum((details->>'parallel_batches')::int) FROM airflow_repl.agent_history WHERE agent = 'distribution'",
    )[0][0]
    assert spread >= 5  # two-phase commit over both streams was exercised
