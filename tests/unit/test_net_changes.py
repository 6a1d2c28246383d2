"""The net effect of a batch's commands per key (bulk_apply), without a server."""

from __future__ import annotations

import psycopg
import pytest
from article_builder import text_article

from airflow_repl.engine.articles.commands import DELETE, INSERT, TRUNCATE, UPDATE, Command
from airflow_repl.engine.subscriber import bulk_apply
from airflow_repl.engine.subscriber.bulk_apply import NotNetApplicable

ART = {"t": text_article()}
#: an article whose UPDATEs set only the columns they changed: the net effect counts them
MASKED = {"t": text_article(update="SCALL")}


def ins(i, a="a", b="b"):
    return Command(INSERT, "t", new=[str(i), a, b])


def upd(i, old, new):
    return Command(UPDATE, "t", old=[str(i), *old], new=[str(i), *new])


def dele(i, a="a", b="b"):
    return Command(DELETE, "t", old=[str(i), a, b])


def _net(*cmds, articles=MASKED):
    return {
        k: (s.existed, s.final, s.deleted, sorted(s.changed))
        for k, s in bulk_apply.net_changes(cmds, articles)["t"].items()
    }


def test_updates_of_one_row_collapse_to_the_last_image_and_the_union_of_changed_columns():
    assert _net(upd(1, ["a", "b"], ["x", "b"]), upd(1, ["x", "b"], ["x", "y"])) == {
        ("1",): (True, ["1", "x", "y"], False, [1, 2])
    }


def test_the_changed_columns_are_counted_only_where_updates_set_no_others():
    """CALL sets every column: nothing reads which ones changed, so nothing counts them."""
    cmds = (upd(1, ["a", "b"], ["x", "b"]), upd(1, ["x", "b"], ["x", "y"]), upd(2, ["a", "b"], ["a", "z"]))
    assert _net(*cmds, articles=ART) == {
        ("1",): (True, ["1", "x", "y"], False, []),
        ("2",): (True, ["2", "a", "z"], False, []),
    }
    assert bulk_apply.split(ART["t"], bulk_apply.net_changes(cmds, ART)["t"]).updates == {
        (0, 1, 2): [["1", "x", "y"], ["2", "a", "z"]]
    }
    assert bulk_apply.split(MASKED["t"], bulk_apply.net_changes(cmds, MASKED)["t"]).updates == {
        (1, 2): [["1", "x", "y"]],
        (2,): [["2", "a", "z"]],
    }


def test_an_insert_then_delete_is_no_change_and_a_delete_then_insert_is_both():
    assert _net(ins(1), upd(1, ["a", "b"], ["c", "b"]), dele(1, "c")) == {}
    assert _net(dele(2), ins(2, "new")) == {("2",): (True, ["2", "new", "b"], True, [])}
    assert _net(ins(3), upd(3, ["a", "b"], ["z", "b"])) == {("3",): (False, ["3", "z", "b"], False, [1])}


@pytest.mark.parametrize(
    "cmds",
    [
        [ins(1), ins(1)],  # a duplicate key one by one would hit too
        [dele(1), upd(1, ["a", "b"], ["c", "b"])],  # a row not found one by one
        [dele(1), dele(1)],
        [Command(TRUNCATE, "t")],
        [Command(INSERT, "unknown", new=["1"])],
    ],
)
def test_what_one_by_one_would_fail_on_or_what_it_does_not_cover_falls_back(cmds):
    with pytest.raises(NotNetApplicable):
        bulk_apply.net_changes(cmds, ART)


def test_custom_procedures_and_none_are_not_covered():
    assert bulk_apply.eligible(text_article())
    assert bulk_apply.eligible(text_article(update="SQL", insert="SQL", delete="SQL"))
    assert not bulk_apply.eligible(text_article(update="CALL my_proc"))
    assert not bulk_apply.eligible(text_article(delete="NONE"))


def test_a_key_change_kept_as_one_update_leaves_one_key_for_the_other():
    moved = Command(UPDATE, "t", old=["1", "a", "b"], new=["2", "a", "b"])
    assert _net(moved) == {("1",): (True, None, True, []), ("2",): (False, ["2", "a", "b"], False, [])}


def test_a_batch_is_prepared_without_a_connection():
    """prepare() makes the statements' array parameters (the read-ahead's thread does it while
    the batch before is applied); only execute() needs the subscriber."""
    prepared = bulk_apply.prepare([dele(3), upd(2, ["a", "b"], ["x", "b"]), ins(1, 'q"u\\ote', None)], ART)
    assert prepared.commands == 3
    runs = [(op, columns, params, expected) for _art, op, columns, params, expected, _what in prepared.runs]
    assert runs == [
        ("D", (0,), ['{"3"}'], 1),  # the key only
        ("U", (0, 1, 2), ['{"2"}', '{"x"}', '{"b"}'], 1),  # CALL: every column
        ("I", (0, 1, 2), ['{"1"}', '{"q\\"u\\\\ote"}', "{null}"], 1),
    ]
    with pytest.raises(NotNetApplicable):
        bulk_apply.prepare([ins(1), ins(1)], ART)


SCALL = {"t": text_article(("a", "b", "c"), update="SCALL")}


def _update_runs(cmds):
    return [
        (op, columns, params, expected)
        for _art, op, columns, params, expected, _what in bulk_apply.prepare(cmds, SCALL).runs
    ]


def test_scall_updates_carry_only_the_key_and_the_columns_they_change_one_statement_per_set():
    assert _update_runs(
        [
            upd(1, ["a", "b", "c"], ["A", "b", "c"]),
            upd(2, ["a", "b", "c"], ["A2", "b", "c"]),
            upd(3, ["a", "b", "c"], ["a", "b", "C"]),
            upd(1, ["A", "b", "c"], ["A", "b", "c"]),  # changes nothing more
        ]
    ) == [
        ("U", (1,), ['{"1","2"}', '{"A","A2"}'], 2),  # id and a
        ("U", (3,), ['{"3"}', '{"C"}'], 1),  # id and c
    ]


def test_an_update_that_changed_nothing_is_still_one_row_to_find():
    assert _update_runs([upd(7, ["a", "b", "c"], ["a", "b", "c"])]) == [("U", (), ['{"7"}'], 1)]


def test_more_sets_of_changed_columns_than_statements_update_by_mask_in_one():
    sets = [["x", "b", "c"], ["a", "x", "c"], ["a", "b", "x"], ["x", "x", "c"], ["x", "b", "x"]]
    assert len(sets) > bulk_apply.MASK_STATEMENTS
    runs = _update_runs([upd(i, ["a", "b", "c"], new) for i, new in enumerate(sets)])
    assert runs == [
        (
            "M",
            (0, 1, 2, 3),
            [
                '{"0100","0010","0001","0110","0101"}',
                '{"0","1","2","3","4"}',
                '{"x","a","a","x","x"}',
                '{"b","x","b","x","b"}',
                '{"c","c","x","c","x"}',
            ],
            5,
        )
    ]


def test_the_composed_statements_kept_per_connection_are_bounded(monkeypatch):
    """Rows changed in ever new sets of columns (a long continuous run) do not grow the cache of
    composed statements without end."""

    class Context:  # what composing needs of a connection: its adapters (no server)
        adapters = psycopg.adapters
        connection = None

    context = Context()
    monkeypatch.setattr(bulk_apply, "STATEMENTS_KEPT", 3)
    art = SCALL["t"]
    for cols in [(1,), (2,), (3,), (1, 2), (1, 3), (2, 3)]:
        statement = bulk_apply._statement(context, art, "U", cols)  # type: ignore[arg-type]
        assert statement.startswith('UPDATE "public"."t" AS t SET ') and len(bulk_apply._STATEMENTS[context]) <= 3
    assert bulk_apply._statement(context, art, "U", (1, 3)) == (  # type: ignore[arg-type]
        'UPDATE "public"."t" AS t SET "a" = s."c2"::text, "c" = s."c4"::text '
        'FROM unnest($1::text[], $2::text[], $3::text[]) AS s("c1", "c2", "c4") WHERE t."id" = s."c1"::integer'
    )
