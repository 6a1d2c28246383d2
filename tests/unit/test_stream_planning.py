"""The batch planner of several subscription streams, without a server: which commands may run on
separate streams (no key value on two streams), and when spreading is worth it.  Delivery over
several streams at a real subscriber is in ``tests/integration/test_streams.py``."""

from __future__ import annotations

import random

from airflow_repl.engine.agents import stream_planning
from airflow_repl.engine.agents.stream_planning import plan_streams
from airflow_repl.engine.articles.commands import DELETE, INSERT, UPDATE, Command
from airflow_repl.engine.articles.resolved import ResolvedArticle
from airflow_repl.engine.subscriber.applier import Applier


def _check_plan(touched, shares):
    """Shares partition the batch, each in commit order, and no key value is on two streams."""
    assert sorted(i for share in shares for i in share) == list(range(len(touched)))
    assert all(share == sorted(share) for share in shares)
    stream_of_key = {}
    for s, share in enumerate(shares):
        for i in share:
            for key in touched[i]:
                assert stream_of_key.setdefault(key, s) == s, f"key {key} on streams {stream_of_key[key]} and {s}"


def test_stream_chooser_spreads_only_while_spreading_is_faster():
    chooser = stream_planning.StreamChooser(probe_every=4)
    assert chooser.may_spread()  # batch 1: try spreading
    chooser.record(True, 1000, 2.0)  # 500 commands/s spread
    assert not chooser.may_spread()  # batch 2: one stream, to compare
    chooser.record(False, 1000, 1.0)  # 1000 commands/s on one stream
    assert not chooser.may_spread()  # batch 3: one stream is faster
    assert chooser.may_spread()  # batch 4: probe spreading again
    chooser.record(True, 1000, 0.25)  # spread now 4000/s on average (500 + 4000) / 2 = 2250/s
    assert chooser.rate[True] == 2250.0
    assert chooser.may_spread() and chooser.may_spread() and chooser.may_spread()  # batches 5-7: spread wins
    assert not chooser.may_spread()  # batch 8: probe one stream
    chooser.record(False, 10, 0.001)  # too small a batch to count
    assert chooser.rate[False] == 1000.0


def test_stream_chooser_resumes_from_an_earlier_runs_rates():
    earlier = stream_planning.StreamChooser()
    earlier.record(True, 1000, 2.0)
    earlier.record(False, 1000, 1.0)
    later = stream_planning.StreamChooser(probe_every=4)
    later.resume(earlier.rates())
    assert later.rates() == {"spread": 500.0, "one": 1000.0}
    assert [later.may_spread() for _ in range(4)] == [False, False, False, True]  # probes at 4 only


def test_stream_chooser_not_adaptive_always_lets_batches_spread():
    chooser = stream_planning.StreamChooser(adaptive=False)
    chooser.record(True, 1000, 10.0)
    chooser.record(False, 1000, 0.1)
    assert all(chooser.may_spread() for _ in range(50))


def test_independent_rows_are_balanced_over_the_streams():
    touched = [[("pk", i)] for i in range(300)]
    shares = plan_streams(touched, 3)
    _check_plan(touched, shares)
    assert sorted(len(s) for s in shares) == [100, 100, 100]


def test_a_chain_of_key_updates_and_a_reused_unique_value_stay_on_one_stream():
    touched = [[("pk", i), ("u", f"u{i}")] for i in range(200)]
    # pk 1 -> 1001 -> 2001 over three commands (delete/insert pairs), and row 7 takes the
    # unique value row 150 gave up
    touched += [
        [("pk", 1), ("u", "u1")],
        [("pk", 1001), ("u", "u1")],
        [("pk", 1001), ("u", "u1")],
        [("pk", 2001), ("u", "u1")],
        [("pk", 150), ("u", "u150")],
        [("pk", 7), ("u", "u150"), ("u", "u7")],
    ]
    shares = plan_streams(touched, 3)
    _check_plan(touched, shares)
    assert len(shares) == 3
    chain = next(s for s in shares if 200 in s)
    assert {1, 200, 201, 202, 203} <= set(chain)
    assert {7, 150, 204, 205} <= set(next(s for s in shares if 204 in s))


def test_a_dominant_group_a_small_batch_or_a_truncate_use_one_stream():
    hot = [[("pk", 0)]] * 200 + [[("pk", i)] for i in range(1, 60)]  # one row updated 200 times
    assert plan_streams(hot, 3) == [list(range(259))]
    small = [[("pk", i)] for i in range(20)]
    assert plan_streams(small, 3) == [list(range(20))]
    assert len(plan_streams(small, 3, min_commands=10)) == 3
    truncate = [[("pk", i)] for i in range(100)] + [None]
    assert plan_streams(truncate, 3) == [list(range(101))]
    assert plan_streams([[("pk", i)] for i in range(100)], 1) == [list(range(100))]
    assert plan_streams([], 3) == [[]]


def test_random_batches_never_share_a_key_between_streams():
    rng = random.Random(8)
    for _ in range(200):
        n = rng.randint(0, 400)
        keys = rng.randint(1, 600)
        touched = [[("k", rng.randrange(keys)) for _ in range(rng.randint(0, 4))] for _ in range(n)]
        shares = plan_streams(touched, rng.randint(1, 5), min_commands=rng.choice([0, 64]))
        _check_plan(touched, shares)


def _article(**overrides) -> ResolvedArticle:
    table = {
        "schema": "public",
        "name": "t",
        "oid": 1,
        "primary_key": ["id"],
        "unique_keys": [["code"], ["a", "b"]],
        "columns": [
            {"name": c, "type": "text", "not_null": c == "id", "type_oid": 25} for c in ("id", "code", "a", "b", "v")
        ],
    }
    data = {
        "publication": "p",
        "name": "t",
        "table": table,
        "dest_schema": "public",
        "dest_table": "t",
        "propagation": {"insert": "SQL", "update": "SQL", "delete": "SQL"},
        "default_procs": {},
        "column_list": None,
        "row_filter": None,
        "update_mode": "key_changes",
        **overrides,
    }
    return ResolvedArticle.from_dict(data)


def test_commands_touch_every_key_of_both_images():
    applier = Applier({"t": _article()})
    old, new = ["1", "c1", "x", None, "v"], ["2", "c2", "x", "y", "v"]
    keys = applier.touched(Command(UPDATE, "t", old=old, new=new))
    pk, code, ab = ("public", "t", ("id",)), ("public", "t", ("code",)), ("public", "t", ("a", "b"))
    assert set(keys) == {
        (pk, ("1",)),
        (code, ("c1",)),
        (pk, ("2",)),
        (code, ("c2",)),
        (ab, ("x", "y")),
    }  # (x, NULL) conflicts with nothing
    assert applier.touched(Command(DELETE, "t", old=old)) == [(pk, ("1",)), (code, ("c1",))]
    assert applier.touched(Command(INSERT, "t", new=new))[0] == (pk, ("2",))
    assert applier.touched(Command("T", "t")) is None
    assert applier.touched(Command(INSERT, "unknown", new=new)) == []
    not_replicated = Applier({"t": _article(propagation={"insert": "NONE", "update": "SQL", "delete": "SQL"})})
    assert not_replicated.touched(Command(INSERT, "t", new=new)) == []
