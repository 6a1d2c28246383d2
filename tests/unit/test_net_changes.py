"""The net effect of a batch's commands per key (bulk_apply), without a server."""

from __future__ import annotations

import pytest
from article_builder import text_article

from airflow_repl.engine.articles.commands import DELETE, INSERT, TRUNCATE, UPDATE, Command
from airflow_repl.engine.subscriber import bulk_apply
from airflow_repl.engine.subscriber.bulk_apply import NotNetApplicable

ART = {"t": text_article()}


def ins(i, a="a", b="b"):
    return Command(INSERT, "t", new=[str(i), a, b])


def upd(i, old, new):
    return Command(UPDATE, "t", old=[str(i), *old], new=[str(i), *new])


def dele(i, a="a", b="b"):
    return Command(DELETE, "t", old=[str(i), a, b])


def _net(*cmds):
    return {
        k: (s.existed, s.final, s.deleted, sorted(s.changed)) for k, s in bulk_apply.net_changes(cmds, ART)["t"].items()
    }


def test_updates_of_one_row_collapse_to_the_last_image_and_the_union_of_changed_columns():
    assert _net(upd(1, ["a", "b"], ["x", "b"]), upd(1, ["x", "b"], ["x", "y"])) == {
        ("1",): (True, ["1", "x", "y"], False, [1, 2])
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
    runs = [(op, params, expected) for _art, op, params, expected, _what in prepared.runs]
    assert runs == [
        ("D", ["{null}", '{"3"}', "{null}", "{null}"], 1),
        ("U", ["{null}", '{"2"}', '{"x"}', '{"b"}'], 1),  # CALL: every column (no mask)
        ("I", ["{null}", '{"1"}', '{"q\\"u\\\\ote"}', "{null}"], 1),
    ]
    with pytest.raises(NotNetApplicable):
        bulk_apply.prepare([ins(1), ins(1)], ART)
